"""The tracking URI a command is given: resolved and checked once (``nre_ray.tracking.store.resolve_tracking_uri``),
before Ray starts; a URI no run could use is one ``error:`` line and exit status 2 from every command that takes
one."""

from __future__ import annotations

import http.server
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from nre_ray.cluster.local_settings import MLFLOW_SERVER_ENV
from nre_ray.cluster.session import UsageError
from nre_ray.tracking import store as tracking
from tests.procs import free_port, start, stop_tree, wait_for

MLFLOW = str(Path(sys.executable).parent / "mlflow")
ROOT = Path(__file__).resolve().parents[2]
SAMPLE_TEST = ROOT / "nre_ray" / "data" / "sample" / "test.csv"


@pytest.fixture
def in_tmp(tmp_path, monkeypatch):
    """An empty working folder, and no MLFLOW_TRACKING_URI from the caller's environment."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    return tmp_path


def refused(uri: str | None) -> str:
    """The message ``resolve_tracking_uri`` refuses ``uri`` with."""
    with pytest.raises(UsageError) as err:
        tracking.resolve_tracking_uri(uri)
    message = str(err.value)
    assert "\n" not in message
    return message


def test_a_folder_is_refused_with_the_sqlite_uri_to_give(in_tmp, monkeypatch):
    default = f"sqlite:///{in_tmp / 'mlflow.db'}"
    assert refused("mlruns") == (f"--tracking-uri mlruns: a folder is MLflow's old file store, which MLflow 3 no "
                                 f"longer writes; give {default} (the default) or an MLflow server http://HOST:PORT")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "./mlruns")
    assert refused(None).startswith("MLFLOW_TRACKING_URI=./mlruns: a folder is MLflow's old file store")
    assert refused(f"file://{in_tmp}/elsewhere/runs").endswith(
        f"give sqlite:///{in_tmp / 'elsewhere' / 'mlflow.db'} or an MLflow server http://HOST:PORT")
    (in_tmp / "old.db").write_bytes(b"")
    assert refused("old.db") == f"--tracking-uri old.db: a file is not a tracking URI; give sqlite:///{in_tmp}/old.db"
    # the artifact folder of a sqlite store (experiment folders without meta.yaml) is not a file store
    (in_tmp / "mlruns" / "1" / "abc" / "artifacts").mkdir(parents=True)
    assert "a folder is MLflow's old file store" in refused("mlruns")
    assert sorted(p.name for p in in_tmp.iterdir()) == ["mlruns", "old.db"]  # nothing created


def test_an_existing_file_store_is_named_with_the_command_that_copies_it(in_tmp, monkeypatch):
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # only to write an old file store for the test
    old = MlflowClient(f"file://{in_tmp / 'mlruns'}")
    run = old.create_run(old.create_experiment("old"))
    old.log_metric(run.info.run_id, "acc", 0.5)
    monkeypatch.delenv("MLFLOW_ALLOW_FILE_STORE")

    message = refused("mlruns")
    assert message.startswith(f"--tracking-uri mlruns: {in_tmp / 'mlruns'} is an MLflow file store, which MLflow 3 "
                              "no longer writes; copy its runs into a sqlite store with `mlflow migrate-filestore")
    command = message.split("`")[1].split()
    target = command[command.index("--target") + 1]
    done = subprocess.run([MLFLOW, *command[1:], "--no-progress"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert tracking.resolve_tracking_uri(target) == target  # the migrated store is one a run can use
    assert MlflowClient(target).get_run(run.info.run_id).data.metrics == {"acc": 0.5}


def test_sqlite_uris_are_made_absolute_and_their_path_checked(in_tmp):
    assert tracking.resolve_tracking_uri(None) == f"sqlite:///{in_tmp / 'mlflow.db'}"
    assert tracking.resolve_tracking_uri("sqlite:///runs.db") == f"sqlite:///{in_tmp / 'runs.db'}"
    assert tracking.resolve_tracking_uri(f"sqlite:///{in_tmp}/a.db") == f"sqlite:///{in_tmp}/a.db"
    assert not (in_tmp / "runs.db").exists() and not (in_tmp / "a.db").exists()  # checked, not created

    missing = in_tmp / "no" / "such"
    assert refused(f"sqlite:///{missing}/mlflow.db") == (
        f"--tracking-uri sqlite:///{missing}/mlflow.db: the folder {missing} does not exist; create it, or give a "
        "database in a folder that exists")
    assert not (in_tmp / "no").exists()
    assert refused(f"sqlite:///{in_tmp}").endswith(f"{in_tmp} is a folder; give the database file in it: "
                                                   f"sqlite:///{in_tmp / 'mlflow.db'}")
    (in_tmp / "notes.db").write_text("not a database\n")
    assert refused("sqlite:///notes.db").endswith(f"{in_tmp / 'notes.db'} is not a sqlite database; give another "
                                                  "file (a new one is created)")
    assert "a database in memory keeps nothing" in refused("sqlite:///:memory:")
    assert "three slashes" in refused("sqlite://mlflow.db")

    real = f"sqlite:///{in_tmp / 'real.db'}"
    tracking.start_run(real, "e", "r", {})
    assert tracking.resolve_tracking_uri(real) == real


def test_other_schemes_are_mlflows_own_or_refused(in_tmp):
    for uri in ("databricks", "databricks://profile", "postgresql://u@db.internal:5432/mlflow",
                "mysql+pymysql://u@db/mlflow", "mssql://u@db/mlflow"):
        assert tracking.resolve_tracking_uri(uri) == uri  # not contacted here: MLflow's first call says what is wrong
    assert refused("s3://bucket/mlruns") == (
        f"--tracking-uri s3://bucket/mlruns: MLflow has no tracking store for s3: URIs; give sqlite:///{in_tmp}/"
        "mlflow.db (the default), an MLflow server http://HOST:PORT or a database (postgresql://, mysql://, mssql://)")


def test_a_server_that_does_not_answer_is_refused_at_once(in_tmp, monkeypatch):
    port = free_port()  # nothing listens there
    started = time.monotonic()
    message = refused(f"http://127.0.0.1:{port}")
    assert message.startswith(f"--tracking-uri http://127.0.0.1:{port}: no MLflow server answers there (")
    assert "start one (mlflow server" in message and time.monotonic() - started < 2
    assert "no MLflow server answers there" in refused("http://no-such-host.invalid:5000")

    monkeypatch.setattr(tracking, "HEALTH_TIMEOUT_S", 0.5)
    with socket.socket() as silent:  # accepts connections (the kernel's backlog), never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen(4)
        started = time.monotonic()
        message = refused(f"http://127.0.0.1:{silent.getsockname()[1]}")
    assert "no MLflow server answers there (no answer" in message and time.monotonic() - started < 3


def test_a_server_that_answers_but_is_not_mlflow_fails_at_the_first_call_in_one_line(in_tmp):
    """What answers HTTP passes the check; MLflow's own error at the command's first call (store_errors) is one
    line too."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), http.server.SimpleHTTPRequestHandler)  # 404s
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        uri = tracking.resolve_tracking_uri(f"http://127.0.0.1:{server.server_address[1]}")
        with pytest.raises(UsageError) as err, tracking.store_errors(uri):
            tracking.start_run(uri, "e", "r", {})
    finally:
        server.shutdown()
        server.server_close()
    message = str(err.value)
    assert message.startswith(f"tracking URI {uri}: MLflow cannot use it (") and "\n" not in message
    assert message.endswith("check --tracking-uri or MLFLOW_TRACKING_URI")
    with pytest.raises(KeyError), tracking.store_errors(uri):  # anything else is not the store's: as it was
        raise KeyError("x")


@pytest.fixture(scope="module")
def mlflow_server(tmp_path_factory):
    """A real ``mlflow server`` on 127.0.0.1 (up in about 8 s), stopped afterwards."""
    folder = tmp_path_factory.mktemp("server")
    port = free_port()
    proc = start([MLFLOW, "server", "--backend-store-uri", f"sqlite:///{folder / 'mlflow.db'}", "--host", "127.0.0.1",
                  "--port", str(port), "--workers", "1"], folder / "mlflow.log", folder, MLFLOW_SERVER_ENV)
    try:
        uri = f"http://127.0.0.1:{port}"
        wait_for("the MLflow server", lambda: tracking.tracking_uri_problem(uri) is None, 120, 0.5, proc,
                 folder / "mlflow.log")
        yield uri
    finally:
        stop_tree(proc)


def test_a_real_mlflow_server_is_used(in_tmp, mlflow_server, monkeypatch):
    assert tracking.resolve_tracking_uri(mlflow_server + "/") == mlflow_server + "/"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", mlflow_server)
    uri = tracking.resolve_tracking_uri(None)
    with tracking.store_errors(uri):
        run_id = tracking.start_run(uri, "e", "r", {"nre_ray.run_name": "r", "storage_path": "s"})
    assert tracking.find_run(uri, "e", "r", "s").info.run_id == run_id
    assert not (in_tmp / "mlflow.db").exists()


# --------------------------------------------------------------------------------------------------------------------
# every command that takes a tracking URI: one line, exit 2, before Ray


DEAD = f"http://127.0.0.1:{free_port()}"  # nothing listens there
CASES = {  # each command with one of the forms: command line, environment, what the error line says
    "train": (["nre_ray.train", "--epochs", "1", "--tracking-uri", "mlruns"], {},
              "--tracking-uri mlruns: a folder is MLflow's old file store"),
    "train, from the environment": (["nre_ray.train", "--epochs", "1"], {"MLFLOW_TRACKING_URI": "./mlruns"},
                                    "MLFLOW_TRACKING_URI=./mlruns: a folder is MLflow's old file store"),
    "tune": (["nre_ray.tune", "--epochs", "1", "--num-samples", "1", "--tracking-uri", DEAD], {},
             f"--tracking-uri {DEAD}: no MLflow server answers there"),
    "evaluate": (["nre_ray.evaluate", "--model", "models:/nre/1", "--data", str(SAMPLE_TEST)],
                 {"MLFLOW_TRACKING_URI": "s3://bucket/mlruns"}, "MLflow has no tracking store for s3: URIs"),
    "predict": (["nre_ray.predict", "--model", "runs:/0123abcd/model", "--input", str(SAMPLE_TEST), "--output",
                 "out.csv", "--tracking-uri", "sqlite:///no/such/mlflow.db"],
                {"MLFLOW_DISABLE_TELEMETRY": "false"},  # a user who turned MLflow's telemetry on
                "the folder"),
}
#: Variables by which MLflow takes itself to run in a test or CI and keeps its telemetry off whatever the settings
#: (mlflow.telemetry.utils._is_ci_env_or_testing): a user's shell has none of them.
CI_VARIABLES = ("PYTEST_CURRENT_TEST", "CI", "GITHUB_ACTIONS", "GITLAB_CI", "JENKINS_URL", "BUILDKITE", "TF_BUILD")


@pytest.mark.parametrize("case", list(CASES))
def test_every_command_refuses_a_tracking_uri_it_cannot_use_before_ray(case, tmp_path, tmp_path_factory):
    """And MLflow's telemetry stays off unless the user turned it on: evaluate and predict import MLflow before they
    refuse, and MLflow then writes its installation id to $XDG_CONFIG_HOME/mlflow/telemetry.json."""
    args, extra_env, said = CASES[case]
    config = tmp_path_factory.mktemp("config")  # the user's XDG_CONFIG_HOME
    left_out = ("RAY_ADDRESS", "MLFLOW_TRACKING_URI", "MLFLOW_DISABLE_TELEMETRY", "DO_NOT_TRACK", *CI_VARIABLES)
    env = {k: v for k, v in os.environ.items() if k not in left_out}
    done = subprocess.run([sys.executable, "-m", *args], cwd=tmp_path, capture_output=True, text=True, timeout=120,
                          env={**env, **extra_env, "PYTHONPATH": str(ROOT), "XDG_CONFIG_HOME": str(config)})
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert done.returncode == 2 and len(errors) == 1 and said in errors[0], done.stdout + done.stderr[-3000:]
    assert "Traceback" not in done.stderr and "ray:" not in done.stdout, done.stdout + done.stderr
    assert list(tmp_path.iterdir()) == []  # no cache, checkpoints, store or output: nothing started
    telemetry = config / "mlflow" / "telemetry.json"
    assert telemetry.exists() == (extra_env.get("MLFLOW_DISABLE_TELEMETRY") == "false"), case


def test_a_model_uri_never_creates_a_store(in_tmp, monkeypatch, capsys):
    """evaluate, predict and serve with ``runs:/`` or ``models:/`` and no store where they look (env.sh's
    TRACKING_URI is not MLflow's variable): one line naming the store and what to pass; no ./mlflow.db made, with
    MLflow's migrations, only to say the run is not found."""
    from nre_ray.evaluate import main as evaluate
    from nre_ray.predict import main as predict
    from nre_ray.serve.__main__ import main as serve

    default = f"sqlite:///{in_tmp / 'mlflow.db'}"
    fix = ("pass --tracking-uri with the store the model was logged to (e.g. http://HOST:5000 or "
           "sqlite:///PATH/mlflow.db), or set MLFLOW_TRACKING_URI")
    for run, model, args in (
            (evaluate, "runs:/0123456789abcdef/model", ["--data", str(SAMPLE_TEST)]),
            (predict, "models:/nre-model/1", ["--input", str(SAMPLE_TEST), "--output", "out.csv"]),
            (predict, "models:/nre-model@champion", ["--input", str(SAMPLE_TEST), "--output", "out.csv"]),
            (serve, "runs:/0123456789abcdef/model", ["--port", str(free_port())])):
        assert run(["--model", model, *args]) == 2
        errors = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
        assert errors == [f"error: --model {model}: the MLflow tracking store {default} (the default: no "
                          f"--tracking-uri, and MLFLOW_TRACKING_URI is not set) does not exist, so it has no run or "
                          f"registered model to load; {fix}"], errors
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "sqlite:///runs.db")
    (in_tmp / "runs.db").write_bytes(b"")  # empty: no MLflow store either
    assert evaluate(["--model", "runs:/0123456789abcdef/model", "--data", str(SAMPLE_TEST)]) == 2
    assert (f"store sqlite:///{in_tmp / 'runs.db'} (MLFLOW_TRACKING_URI) holds no MLflow store"
            in capsys.readouterr().err)
    assert sorted(p.name for p in in_tmp.iterdir()) == ["runs.db"] and (in_tmp / "runs.db").stat().st_size == 0


def test_the_workers_get_mlflows_telemetry_switch_as_the_driver_has_it(monkeypatch):
    """On a cluster the workers (which import MLflow) do not inherit the driver's environment: the switch goes in
    their runtime env, off by default, the user's own choice where there is one."""
    from nre_ray.cluster.session import quiet_env_for_workers, quiet_environ, ray_quiet_env

    monkeypatch.delenv("MLFLOW_DISABLE_TELEMETRY", raising=False)
    assert ray_quiet_env()["MLFLOW_DISABLE_TELEMETRY"] == "true"
    monkeypatch.setenv("MLFLOW_DISABLE_TELEMETRY", "false")
    quiet_environ(("MLFLOW_DISABLE_TELEMETRY",))  # (only that one: this is the test session's own environment)
    assert os.environ["MLFLOW_DISABLE_TELEMETRY"] == "false"
    assert quiet_env_for_workers()["MLFLOW_DISABLE_TELEMETRY"] == "false"


def test_one_parser_reads_every_tracking_uri(in_tmp):
    """:mod:`nre_ray.tracking.uris` is where the commands, the sqlite store, the cluster checks and the summary read
    a tracking URI: the scheme (case aside), a sqlite store's file (none for one in memory), a server and its host;
    and what each of its users decides from it agrees."""
    from nre_ray.cluster.session import local_tracking
    from nre_ray.tracking import sqlite_store, uris

    assert [uris.scheme(u) for u in ("sqlite:///x.db", "HTTP://h:1", "file:///m", "postgresql+psycopg2://h/d",
                                      "databricks", "./mlruns", "/abs/mlruns")] == \
        ["sqlite", "http", "file", "postgresql+psycopg2", "", "", ""]
    assert uris.sqlite_path("sqlite:///rel/m.db") == Path("rel/m.db")
    assert uris.sqlite_path("sqlite:////abs/m.db") == Path("/abs/m.db")
    assert uris.sqlite_path(uris.MEMORY) is None and uris.sqlite_path("http://h:5000") is None
    assert uris.sqlite_uri(in_tmp / "m.db") == f"sqlite:///{in_tmp / 'm.db'}"
    assert uris.sqlite_path(uris.sqlite_uri(in_tmp / "m.db")) == in_tmp / "m.db"
    assert uris.is_server("https://h") and uris.is_server("HTTP://h") and not uris.is_server("sqlite:///h")
    assert uris.server_host("http://LocalHost:5000/x") == "localhost" and uris.server_host("http://[::1]:5") == "::1"
    assert uris.file_path("file:///a/b") == "/a/b" and uris.file_path("file://host/a") == "/a"
    assert uris.file_path("file:a") == "a" and uris.file_path("/a") == "/a"
    # its users: the resolved default, a relative sqlite path made absolute, the artifact folder beside the store
    assert tracking.resolve_tracking_uri(None) == uris.sqlite_uri(in_tmp / "mlflow.db")
    (in_tmp / "sub").mkdir()
    assert tracking.resolve_tracking_uri("sqlite:///sub/m.db") == uris.sqlite_uri(in_tmp / "sub" / "m.db")
    assert sqlite_store.default_artifact_location(uris.sqlite_uri(in_tmp / "m.db")) == (in_tmp / "mlruns").as_uri()
    assert sqlite_store.default_artifact_location("http://h:5000") is None
    assert local_tracking("SQLITE:///x.db") and local_tracking("http://LOCALHOST:5000")


def test_the_workers_that_run_the_model_get_glibcs_allocator_settings(monkeypatch):
    """Training and serve's workers (and evaluate's) keep freed memory and map no block afresh
    (:data:`nre_ray.cluster.session.CPU_ALLOCATOR_ENV`); a value the user set in the driver's environment wins."""
    from nre_ray.cluster.session import cpu_allocator_env, quiet_env_for_workers

    monkeypatch.delenv("MALLOC_MMAP_MAX_", raising=False)
    monkeypatch.delenv("MALLOC_TRIM_THRESHOLD_", raising=False)
    assert cpu_allocator_env() == {"MALLOC_MMAP_MAX_": "0", "MALLOC_TRIM_THRESHOLD_": str(2 ** 34)}
    monkeypatch.setenv("MALLOC_MMAP_MAX_", "65536")
    env = quiet_env_for_workers()
    assert env["MALLOC_MMAP_MAX_"] == "65536" and env["MALLOC_TRIM_THRESHOLD_"] == str(2 ** 34)
    assert env["RAY_worker_niceness"] == "0"

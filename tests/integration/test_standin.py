"""The cluster path as a cloud user takes it, rehearsed on this machine with ``python -m nre_ray.standin``: a Ray
head whose autoscaler adds worker nodes when a run asks for them, an S3-compatible object store, and an MLflow server
with its artifacts in that store.

The job is submitted with ``ray job submit --working-dir .`` exactly as docs/cluster.md says. Inputs, checkpoints and
artifacts live only in the object store (the fake nodes share this host's disk, so a local path would work by
accident): the tests check that nothing lands in the job's working directory. The stand-in is the session's
(tests/standin_session.py, shared with tests/integration/test_command_matrix.py); its teardown stops exactly the
stand-in's processes (never ``ray stop``). These tests run first among its users, in this order; the last
(``standin_order(2)``: after every other user) stops the stand-in as a user does, checks /proc for anything left,
and starts it again on the same ports.
"""

from __future__ import annotations

import base64
import json
import re
import secrets
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from nre_ray.cluster import processes
from nre_ray.cluster import standin_cluster as standin
from tests.procs import env, environ, free_port, wait_for
from tests.standin_session import left_of

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600), pytest.mark.standin_order(0)]
REPO = Path(__file__).resolve().parents[2]
RAY = str(Path(sys.executable).parent / "ray")
SAMPLE = REPO / "nre_ray" / "data" / "sample"
#: Files Ray Train and the driver would write into the working directory if a default path were used.
LOCAL_LEFTOVERS = {"ray_results", "mlflow.db", "mlruns", ".nre_ray_cache", "rejected_rows.csv", "mlartifacts"}


@pytest.fixture(scope="module")
def cluster(standin_cluster):
    """The session's stand-in (tests/standin_session.py: started on free ports with its folder open to all, which
    ``up`` made private; the bundled sample in s3://nre-ray/nre_ray/data), as ``up`` left it: this module's tests
    run first among its users (``standin_order(0)``). This test's MLflow client logs in."""
    with environ(standin_cluster.state.mlflow_login()):
        yield standin_cluster.state


_left = left_of


def _standin_cli(folder: Path, *args: str) -> str:
    """``python -m nre_ray.standin --dir FOLDER ARGS`` as a user runs it; its output."""
    done = subprocess.run([sys.executable, "-m", "nre_ray.standin", "--dir", str(folder), *args], cwd=REPO,
                          capture_output=True, text=True, env=env(), timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def _log(state: standin.Standin, name: str) -> Path:
    """Where a job's console goes: beside the stand-in's folder, for the secret scan to read again."""
    folder = Path(f"{state.folder}-jobs")
    folder.mkdir(exist_ok=True)
    return folder / f"{name}.log"


def _submit(state: standin.Standin, run_name: str, *extra: str, log: Path,
            job_env: dict[str, str] | None = None) -> subprocess.Popen:
    """``ray job submit --working-dir . -- python -m nre_ray.train ...`` as docs/cluster.md has it (logs streamed);
    ``job_env``: variables of the job's runtime environment (``--runtime-env-json``)."""
    runtime_env = ["--runtime-env-json", json.dumps({"env_vars": job_env})] if job_env else []
    with open(log, "wb") as out:
        return subprocess.Popen(
            [RAY, "job", "submit", "--working-dir", ".", *runtime_env, "--", "python", "-m", "nre_ray.train",
             "--storage-path", f"s3://{state.bucket}/nre_ray/checkpoints", "--tracking-uri", state.tracking_uri,
             "--data-dir", f"s3://{state.bucket}/nre_ray/data", "--run-name", run_name, *extra],
            # (state.env() also sets RAY_API_SERVER_ADDRESS, which `ray job` reads first: the test session points
            # it at a closed port)
            cwd=REPO, stdout=out, stderr=subprocess.STDOUT, env=env(**state.env()))


def _run(client: MlflowClient, run_name: str):
    runs = client.search_runs([e.experiment_id for e in client.search_experiments()],
                              f"tags.`nre_ray.run_name` = '{run_name}'")
    return runs[0] if runs else None


def _keys(state: standin.Standin, prefix: str) -> list[str]:
    import pyarrow.fs

    fs = state.filesystem()
    return [i.path for i in fs.get_file_info(pyarrow.fs.FileSelector(f"{state.bucket}/{prefix}", recursive=True,
                                                                     allow_not_found=True))]


def _job_dirs(state: standin.Standin) -> list[Path]:
    """The job's working directory on the head, as Ray unpacked it (``runtime_resources/working_dir_files``)."""
    return [p for p in Path(state.ray_temp).glob("session_*/runtime_resources*/working_dir_files/_ray_pkg_*")
            if p.is_dir()]


def test_a_submitted_job_trains_on_autoscaled_nodes_with_everything_in_the_bucket(cluster):
    log = _log(cluster, "job")
    assert not standin.worker_nodes(cluster)  # min_workers 0: no worker node before a run asks
    # A seed of its own: its preprocessing cache key is new, so this job builds it (the job's driver would reuse a
    # local cache that another run on this host built, in <tmp>/nre_ray-<uid>/cache, and publish that instead).
    seed = str(secrets.randbelow(10**9) + 2)
    job = _submit(cluster, "standin-job", "--num-workers", "2", "--epochs", "2", "--seed", seed, log=log)
    # The node the autoscaler adds joins the authenticated cluster because it has the token: its raylet runs in
    # token mode with the stand-in's token file, as the head does (a node without it is refused, see below).
    nodes = wait_for("an autoscaled node", lambda: standin.worker_nodes(cluster), 240, proc=job, log=log)
    raylets = [p for found in nodes.values() for p in found if p.cmdline.split(" ")[0].endswith("/raylet")]
    assert raylets and all(_auth_of(p.pid) == ("token", str(cluster.token_path)) for p in raylets), raylets
    assert job.wait(timeout=300) == 0, log.read_text(errors="replace")[-4000:]
    text = log.read_text(errors="replace")
    assert "succeeded" in text
    assert "waiting up to 900 s (--placement-timeout) for the autoscaler to add nodes" in text
    assert "Adding 1 node(s) of type cpu_worker" in text  # the autoscaler's own event, streamed with the logs
    # Not Ray's or MLflow's chatter: the raylets' warning about many worker processes (1-CPU nodes), MLflow's links
    assert "worker processes have been started" not in text and "View run" not in text
    assert text.count("epoch   2/2") == 1, "each worker line streamed once"
    assert "best epoch" in text and "model: runs:/" in text

    client = MlflowClient(cluster.tracking_uri)
    run = _run(client, "standin-job")
    assert run.info.status == "FINISHED" and "test/macro_f1" in run.data.metrics
    assert sorted(m.step for m in client.get_metric_history(run.info.run_id, "epoch/valid_macro_f1")) == [1, 2]
    assert run.info.artifact_uri.startswith("mlflow-artifacts:/")
    artifacts = _keys(cluster, "mlflow-artifacts")
    assert any(k.endswith("best_checkpoint/state.pt") for k in artifacts)
    assert any("/model/" in k or k.endswith("MLmodel") for k in artifacts)  # the logged model, in the bucket
    checkpoints = _keys(cluster, "nre_ray/checkpoints/standin-job")
    assert any(k.endswith("/state.pt") for k in checkpoints)
    # The preprocessing, shared for the next job: built in the bucket by tasks that may run on the autoscaled
    # nodes (the cluster can grow), with no build folder left there.
    assert "preprocess: building in the object store: s3://nre-ray/nre_ray/checkpoints/.nre_ray_cache/" in text
    cached = _keys(cluster, "nre_ray/checkpoints/.nre_ray_cache")
    assert any(k.endswith("/meta.json") for k in cached) and not any(".tmp-" in k for k in cached), cached
    for folder in _job_dirs(cluster):
        assert not {p.name for p in folder.iterdir()} & LOCAL_LEFTOVERS, sorted(p.name for p in folder.iterdir())

    # Submitted again: the preprocessing comes from the bucket, not from a local folder.
    again = _submit(cluster, "standin-job-2", "--num-workers", "2", "--epochs", "1", "--seed", seed,
                    log=_log(cluster, "again"))
    assert again.wait(timeout=300) == 0, _log(cluster, "again").read_text(errors="replace")[-4000:]
    assert "reused from the cache" in _log(cluster, "again").read_text(errors="replace")  # the preprocess phase


def test_the_object_store_refuses_strangers_and_the_standins_files_are_private(cluster):
    """The object store admits only requests signed with the stand-in's own key pair: an unsigned list, GET and PUT
    (curl's) are refused, and so are boto3 with made-up keys, with the right key id and a wrong secret, and moto's
    own API (which would turn its checks off). The keys are kept in secrets/, not in env.sh, which reads them (and
    exports MLFLOW_TRACKING_URI). The folder is private, and so is every file the stand-in made (MLflow's stores,
    the logs)."""
    import boto3
    import botocore.exceptions

    key = f"{cluster.endpoint}/{cluster.bucket}/nre_ray/data/train.csv"
    for method, url, body in (("GET", f"{cluster.endpoint}/{cluster.bucket}?list-type=2", None), ("GET", key, None),
                              ("PUT", f"{cluster.endpoint}/{cluster.bucket}/planted", b"x"),
                              ("POST", f"{cluster.endpoint}/moto-api/reset-auth", b"inf")):
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(urllib.request.Request(url, data=body, method=method), timeout=10)
        assert refused.value.code == 403, (method, url)
    keys = cluster.store_credentials()
    for key_id, secret, code in (("AKIA" + secrets.token_hex(8).upper(), secrets.token_urlsafe(30),
                                  "InvalidAccessKeyId"),
                                 (keys["AWS_ACCESS_KEY_ID"], secrets.token_urlsafe(30), "SignatureDoesNotMatch")):
        client = boto3.client("s3", endpoint_url=cluster.endpoint, aws_access_key_id=key_id,
                              aws_secret_access_key=secret, region_name="us-east-1")
        for call in (lambda c: c.list_objects_v2(Bucket=cluster.bucket),
                     lambda c: c.put_object(Bucket=cluster.bucket, Key="planted", Body=b"x")):
            with pytest.raises(botocore.exceptions.ClientError) as refused:
                call(client)
            assert refused.value.response["Error"]["Code"] == code
    assert not [k for k in _keys(cluster, "") if k.endswith("/planted")]

    folder = Path(cluster.folder)
    shell = (folder / "env.sh").read_text()
    assert keys["AWS_ACCESS_KEY_ID"] not in shell and keys["AWS_SECRET_ACCESS_KEY"] not in shell
    sourced = subprocess.run(["bash", "-c", f"source {folder / 'env.sh'} && env"], capture_output=True, text=True,
                             env={"PATH": "/usr/bin:/bin"}, check=True).stdout.splitlines()
    assert {f"{k}={v}" for k, v in keys.items()} <= set(sourced)
    assert f"MLFLOW_TRACKING_URI={cluster.tracking_uri}" in sourced
    assert folder.stat().st_mode & 0o777 == 0o700
    made = [p for p in folder.rglob("*")]
    assert {"mlflow.db", "mlflow_auth.db", "s3.log"} <= {p.name for p in made}
    assert not [(str(p), oct(p.stat().st_mode)) for p in made if p.stat().st_mode & 0o077]


def test_serve_joined_to_the_standin_frees_its_port_at_ctrl_c(cluster):
    """``python -m nre_ray.serve --address`` on the stand-in, with the model the first job logged: it answers, and
    after Ctrl-C nothing listens on its port any more (Serve's proxy, which it started, went on answering 404 on
    /health until ``standin down``)."""
    model = re.search(r"model: (runs:/\S+)", _log(cluster, "job").read_text(errors="replace"))[1]
    port = free_port()
    log = _log(cluster, "serve")
    with open(log, "wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "nre_ray.serve", "--model", model, "--address",
                                 cluster.gcs_address, "--tracking-uri", cluster.tracking_uri, "--port", str(port)],
                                cwd=REPO, stdout=out, stderr=subprocess.STDOUT, env=env(**cluster.env()))
    try:
        wait_for("the URL line", lambda: "serving " in log.read_text(errors="replace"), 300, proc=proc, log=log)
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=30) as reply:
            assert reply.status == 200
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=120) == 130, log.read_text(errors="replace")[-3000:]
        wait_for("the port to be free", lambda: _closed(port), 30)
    finally:
        if proc.poll() is None:
            proc.kill()


def _closed(port: int) -> bool:
    """Nothing listens on ``port`` of 127.0.0.1."""
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) != 0


def _auth_of(pid: int) -> tuple[str | None, str | None]:
    """RAY_AUTH_MODE and RAY_AUTH_TOKEN_PATH in the environment of process ``pid``."""
    variables = processes.environ(pid)
    return variables.get("RAY_AUTH_MODE"), variables.get("RAY_AUTH_TOKEN_PATH")


def test_a_lost_node_is_replaced_and_training_continues_in_the_same_run(cluster):
    log = _log(cluster, "lost-node")
    client = MlflowClient(cluster.tracking_uri)
    job = _submit(cluster, "standin-lost-node", "--num-workers", "3", "--epochs", "6", "--batch-size", "4",
                  "--max-failures", "2", log=log)
    run = wait_for("the run's first epoch in MLflow",
                   lambda: (r := _run(client, "standin-lost-node")) and "epoch/valid_macro_f1" in r.data.metrics and r,
                   300, interval=0.5, proc=job, log=log)
    before = set(standin.worker_nodes(cluster))
    # No training worker on the head (it has no CPU, as cluster.yaml's head takes none): each is on a worker node,
    # which a spot interruption or a lost machine can take (as /proc shows them: this process's Ray client is in
    # the test session's auth mode, not the stand-in's)
    nodes = standin.worker_nodes(cluster)
    on_nodes = {p.pid for found in nodes.values() for p in found}
    hosting = [n for n, found in nodes.items() if any("RayTrainWorker" in p.cmdline for p in found)]
    on_head = [p for p in standin.own_processes(cluster) if "RayTrainWorker" in p.cmdline and p.pid not in on_nodes]
    assert len(hosting) == 3 and not on_head, (hosting, on_head)
    lost = standin.kill_node(cluster, hosting="RayTrainWorker")
    assert lost in before
    assert job.wait(timeout=420) == 0, log.read_text(errors="replace")[-4000:]
    text = log.read_text(errors="replace")
    run = client.get_run(run.info.run_id)
    assert run.info.status == "FINISHED" and "nre_ray.resumed_from_epoch" in run.data.tags, text[-3000:]
    steps = [m.step for m in client.get_metric_history(run.info.run_id, "epoch/valid_macro_f1")]
    assert sorted(steps) == [1, 2, 3, 4, 5, 6], steps  # every epoch logged once, in the same run
    # One plain line for the lost node (what, failure 1 of 2, where the run goes on from); Ray's, gloo's and the
    # GCS's messages about it are in the run's log file, not in the job's log.
    failures = [line for line in text.splitlines() if "; failure " in line]
    assert len(failures) == 1, failures
    assert re.search(r"\] lost a node: node \S+ \(id \.\.\.\w{8}, ranks? [\d, ]+\) is gone; failure 1 of "
                     r"--max-failures 2; going on from epoch [1-5], checkpoint s3://nre-ray/nre_ray/checkpoints/standin-lost-node/"
                     r"checkpoint_\S+$", failures[0]), failures[0]
    for noise in ("Traceback", "Connection reset by peer", "ActorDiedError", "ActorUnavailableError", "marked dead",
                  "(raylet)", "gcs_server", "pid="):
        assert noise not in text, (noise, text[-3000:])
    # The autoscaler started a node in place of the lost one (3 workers on 3 nodes: the head holds none).
    replaced = wait_for("a replacement node", lambda: set(standin.worker_nodes(cluster)) - before, 60)
    assert lost not in standin.worker_nodes(cluster) and replaced


def _workers(client: MlflowClient, run_id: str) -> dict[int, int]:
    """Each logged epoch's world size (the metric ``workers``)."""
    return {m.step: int(m.value) for m in client.get_metric_history(run_id, "workers")}


def test_an_elastic_run_goes_on_with_fewer_workers_through_a_preemption_and_grows_back(cluster):
    """A spot interruption rehearsed: an elastic run (``--num-workers 1-3``: three autoscaled nodes; the head takes
    none) loses a node to ``preempt-node --deadline 20`` in the middle of an epoch. The workers save a mid-epoch
    checkpoint before the deadline and train on until the node goes; the run then goes on at once with the 2 workers
    left, from its latest checkpoint (that mid-epoch one, or the end of an epoch trained after it); it grows back to
    3 when the autoscaler's replacement node has come (Ray looks for room every
    ``NRE_RAY_ELASTIC_RESIZE_INTERVAL_S`` seconds, 30 here instead of 60), and succeeds in one MLflow run with every
    epoch logged once. (The grow-back restarts the group again from its latest checkpoint: when it comes before the
    2 workers have ended an epoch, as it did once with 15 s, no epoch is logged with 2 workers; the console's
    restart lines show the 2.)"""
    log = _log(cluster, "preempted")
    client = MlflowClient(cluster.tracking_uri)
    epochs = 16
    # --patience 0: no early stop (the run must outlast the node's replacement); --model bilstm: epochs of seconds
    job = _submit(cluster, "standin-preempted", "--num-workers", "1-3", "--epochs", str(epochs), "--patience", "0",
                  "--model", "bilstm", "--batch-size", "8", "--no-log-model", log=log,
                  job_env={"NRE_RAY_ELASTIC_RESIZE_INTERVAL_S": "30"})
    # An epoch trained by 3 workers first (the run starts with those it can place, and grows to 3 when it can)
    run = wait_for("an epoch with 3 workers",
                   lambda: (r := _run(client, "standin-preempted")) and 3 in _workers(client, r.info.run_id).values()
                   and r, 360, interval=0.5, proc=job, log=log)
    before = max(_workers(client, run.info.run_id))
    # A user's shell without the stand-in's settings (the test session's RAY_AUTH_MODE=disabled): preempt-node
    # takes them from --dir
    notice = subprocess.Popen([sys.executable, "-m", "nre_ray.standin", "--dir", cluster.folder, "preempt-node",
                               "--deadline", "20"], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True, env=env())
    # The workers hear of it (Ray's preemption watcher polls every 5 s), finish their step and save a mid-epoch
    # checkpoint, which the console names once Ray has registered it: before the node's end at the deadline.
    wait_for("the just-in-time checkpoint", lambda: "saved a mid-epoch checkpoint" in log.read_text(errors="replace"),
             60, interval=0.5, proc=job, log=log)
    assert notice.poll() is None, "the node was lost before the checkpoint was registered"
    said, _ = notice.communicate(timeout=120)
    assert notice.returncode == 0 and "lost at its deadline" in said, said
    assert job.wait(timeout=420) == 0, log.read_text(errors="replace")[-4000:]
    text = "\n".join(log.read_text(errors="replace").splitlines())  # (any \r of the streamed lines dropped)
    assert "succeeded" in text

    # The just-in-time checkpoint: in an epoch after `before`, some seconds before the node went
    saved = re.findall(r"preemption 1: a node of the worker group is being taken back; saved a mid-epoch checkpoint "
                       r"at step (\d+) of epoch (\d+), (\d+) s before the node goes", text)
    assert len(saved) == 1 and int(saved[0][0]) >= 1 and int(saved[0][1]) > before and int(saved[0][2]) >= 1, saved
    # One line for the restart (a preemption, counted apart from failures), from that checkpoint or a later epoch's
    went_on = re.findall(r"; preemption 1 \(preemptions do not count against --max-failures\); going on from "
                         r"(?:step (\d+) of epoch (\d+)|epoch (\d+)), checkpoint "
                         r"s3://nre-ray/nre_ray/checkpoints/standin-preempted/checkpoint_\S+$", text, re.MULTILINE)
    assert len(went_on) == 1, text[-4000:]
    step, in_epoch, after_epoch = went_on[0]
    if step:
        assert (step, in_epoch) == saved[0][:2], (went_on, saved)
    else:
        assert int(after_epoch) >= int(saved[0][1]), (went_on, saved)
    lost_in = int(in_epoch) if step else int(after_epoch) + 1  # the epoch the node was lost in

    # Going on at once with the 2 workers left, then 3 again: the console's restart lines, in that order
    restarts = re.findall(r"workers: (\d+) started again", text)
    assert restarts[:1] == ["2"] and "3" in restarts[1:], restarts

    # One MLflow run, every epoch once; the epochs from the one the node was lost in were trained by 2 or 3 workers,
    # a later one by 3 again
    (found,) = client.search_runs([run.info.experiment_id], "tags.`nre_ray.run_name` = 'standin-preempted'")
    assert found.info.status == "FINISHED" and found.data.tags["preemptions"] == "1"
    steps = sorted(m.step for m in client.get_metric_history(found.info.run_id, "epoch/train_loss"))
    assert steps == list(range(1, epochs + 1)), steps
    workers = _workers(client, found.info.run_id)
    assert workers[before] == 3 and {workers[e] for e in range(lost_in, epochs + 1)} <= {2, 3}, (lost_in, workers)
    assert any(workers[e] == 3 for e in range(lost_in + 1, epochs + 1)), (lost_in, workers)


def test_a_client_without_the_token_or_the_password_is_refused(cluster, tmp_path):
    """The GCS (``ray.init``), the job API (``ray job submit``) and the MLflow server (401) turn strangers away: a
    client with no token (``RAY_AUTH_MODE=disabled``, or MLflow without a password) and one with a wrong one. An
    nre_ray command says so in one ``error:`` line."""
    wrong = tmp_path / "wrong_token"
    wrong.write_text(secrets.token_hex(32), encoding="utf-8")
    store = {"AWS_ENDPOINT_URL": cluster.endpoint, **cluster.store_credentials()}
    no_token, wrong_token = {"RAY_AUTH_MODE": "disabled"}, {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(wrong)}
    train = [sys.executable, "-m", "nre_ray.train", "--address", cluster.gcs_address, "--tracking-uri",
             cluster.tracking_uri, "--data-dir", f"s3://{cluster.bucket}/nre_ray/data", "--storage-path",
             f"s3://{cluster.bucket}/nre_ray/checkpoints", "--run-name", "stranger", "--epochs", "1"]
    # Both GCS refusals at once: each waits out Ray's retries (about 20 s).
    started = {
        "ray.init": subprocess.Popen([sys.executable, "-c", f"import ray; ray.init(address='{cluster.gcs_address}')"],
                                     env=env(**no_token), cwd=tmp_path, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True),
        "train": subprocess.Popen(train, env=env(**store, **wrong_token, **cluster.mlflow_login()), cwd=REPO,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True),
    }
    # The job API, with no token and with a wrong one.
    for variables, answer in ((no_token, "Unauthorized: Missing authentication token"),
                              (wrong_token, "Forbidden: Invalid authentication token")):
        job = subprocess.run([RAY, "job", "submit", "--no-wait", "--", "echo", "in"], capture_output=True, text=True,
                             env=env(**variables, RAY_API_SERVER_ADDRESS=cluster.dashboard), timeout=120)
        assert job.returncode != 0 and answer in job.stdout + job.stderr, job.stdout + job.stderr
    # MLflow: no password, a wrong one; and an nre_ray command without one stops before it starts anything.
    search = f"{cluster.tracking_uri}/api/2.0/mlflow/experiments/search?max_results=1"
    for headers in ({}, {"Authorization": "Basic " + base64.b64encode(b"admin:not-the-password").decode()}):
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(urllib.request.Request(search, headers=headers), timeout=10)
        assert refused.value.code == 401
    no_login = subprocess.run([*train, "--run-name", "stranger-2"], cwd=REPO, capture_output=True, text=True,
                              env={**env(**store, **cluster.credentials()), "MLFLOW_TRACKING_PASSWORD": ""},
                              timeout=120)
    assert no_login.returncode == 2 and no_login.stderr.startswith("error: --tracking-uri"), no_login.stderr
    assert "asks for a user and password (401)" in no_login.stderr and "Traceback" not in no_login.stderr

    # A stranger's train (no token, RAY_AUTH_MODE=disabled, default storage in its folder) is refused in seconds, in
    # one line, before it creates anything; so is the dashboard's port given as the GCS's.
    stranger_dir = tmp_path / "stranger"
    stranger_dir.mkdir()
    stranger = [sys.executable, "-m", "nre_ray.train", "--tracking-uri", cluster.tracking_uri, "--data-dir",
                str(SAMPLE), "--epochs", "1"]
    for address, variables, wanted in (
            (cluster.gcs_address, no_token, "the Ray cluster did not admit this client: Authentication token is "
                                            "missing or incorrect. It runs with token authentication"),
            (f"127.0.0.1:{cluster.dashboard_port}", {**cluster.credentials(), **store},
             "not Ray's GCS. Give the head's GCS port (6379 by default), or submit the command with ray job submit")):
        began = time.monotonic()
        done = subprocess.run([*stranger, "--address", address], cwd=stranger_dir, capture_output=True, text=True,
                              env=env(**{**variables, **cluster.mlflow_login()}), timeout=120)
        took = time.monotonic() - began
        errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
        assert done.returncode == 2 and len(errors) == 1 and wanted in errors[0], done.stdout + done.stderr
        assert "gcs_client.cc" not in done.stdout + done.stderr and "Traceback" not in done.stderr, done.stderr
        assert took < 10, (took, done.stderr)
        assert not list(stranger_dir.iterdir()), list(stranger_dir.iterdir())  # no ray_results/, no mlflow.db

    said = {name: proc.communicate(timeout=180) for name, proc in started.items()}
    assert started["ray.init"].returncode != 0
    assert "Authentication token is missing or incorrect" in said["ray.init"][0], said["ray.init"][0][-2000:]
    out, err = said["train"]
    assert started["train"].returncode == 2 and "Traceback" not in out + err, (out + err)[-3000:]
    assert err.strip().splitlines()[-1:] == [line for line in err.splitlines() if line.startswith("error:")], err
    assert "the Ray cluster did not admit this client: Authentication token is missing or incorrect" in err, err
    assert not _run(MlflowClient(cluster.tracking_uri), "stranger"), "a refused stranger created an MLflow run"


def test_no_secret_is_recorded_in_the_bucket_the_mlflow_store_the_runs_or_the_logs(cluster):
    """After the jobs above (run with the Ray token, the MLflow password and the object store's keys, all new for
    this stand-in), none of these secrets is in the bucket (checkpoints, each run's ray_output.log, MLflow's
    artifacts, the preprocessing cache), in the stand-in's folder (MLflow's store, the logs of its servers and its
    Ray head, its records and env.sh: all but secrets/, where they are kept on purpose), in the jobs' working
    directories (the code they packaged) or on the jobs' consoles."""
    wanted = {"the Ray token": cluster.token_path.read_text(), "the MLflow password": cluster.password_path.read_text(),
              "the AWS key id": cluster.store_credentials()["AWS_ACCESS_KEY_ID"],
              "the AWS secret": cluster.store_credentials()["AWS_SECRET_ACCESS_KEY"]}
    import pyarrow.fs

    fs = cluster.filesystem()
    places = {}
    for info in fs.get_file_info(pyarrow.fs.FileSelector(cluster.bucket, recursive=True)):
        if info.type == pyarrow.fs.FileType.File:
            with fs.open_input_stream(info.path) as stream:
                places[f"s3://{info.path}"] = stream.read()
    folder = Path(cluster.folder)
    local = [p for p in folder.rglob("*") if standin.SECRETS_DIR not in p.relative_to(folder).parts]
    local += [*Path(f"{cluster.folder}-jobs").rglob("*"), *(p for d in _job_dirs(cluster) for p in d.rglob("*"))]
    places.update({str(p): p.read_bytes() for p in local if p.is_file()})
    assert any(k.endswith("/ray_output.log") for k in places) and str(folder / "mlflow.db") in places, sorted(places)
    assert any(k.endswith("MLmodel") for k in places) and len(places) > 50, sorted(places)
    found = [(what, where) for where, data in places.items() for what, secret in wanted.items()
             if secret.encode() in data]
    # (env.sh reads the keys from secrets/ when sourced, as it reads the password: the code the jobs packaged, and
    # each logged model's code/, hold no key either, as they did when the keys were a fixed string in the source)
    assert found == [], found


def test_a_local_ray_beside_the_standin_does_not_take_its_node_types(cluster, ray_cluster):
    """The driver reads node types from the monitor of the cluster it joined: the stand-in's autoscaler, running on
    the same machine, is not the test session's local Ray's."""
    from nre_ray.cluster import session

    info = session.cluster()
    assert info.node_types == [] and not info.can_grow


@pytest.mark.standin_order(2)
def test_down_stops_all_that_up_started_and_up_starts_it_again(cluster, standin_cluster):
    """Run last among the users of the session's stand-in: it stops it and starts it again (the session's fixture
    stops that one, and gives it to any user after this one with the sample uploaded again)."""
    first, last = cluster.worker_ports
    assert not first <= cluster.gcs_port <= last  # the head's workers keep off the GCS port
    raylet = [p for p in cluster.processes if p.cmdline.split(" ")[0].endswith("/raylet")]
    assert f"--min_worker_port={first} --max_worker_port={last}" in raylet[0].cmdline
    # The head's Ray Client proxy, which Ray leaves to init: up recorded it, and it runs
    proxy = [p for p in cluster.processes if "ray.util.client.server" in p.cmdline and "--mode=proxy" in p.cmdline]
    assert proxy and proxy[0].current() and proxy[0].pid in _left(cluster)
    # The MLflow server without MLflow's job runner and its Huey consumers (local_settings.MLFLOW_SERVER_ENV)
    assert not [line for line in _left(cluster).values() if "mlflow.server.jobs" in line or "huey" in line]

    folder = Path(cluster.folder)
    running = _left(cluster)
    token, keys = cluster.token_path.read_text(), cluster.store_credentials()
    said = _standin_cli(folder, "down")
    stopped = re.fullmatch(r"stopped (\d+) processes of the stand-in in \S+\n", said)
    # Every process that lives as long as the stand-in was stopped; Ray's worker processes (an idle one, ``ray::IDLE``,
    # ends by itself after Ray's idle timeout) may have gone before down came to them.
    lasting = {pid for pid, line in running.items()
               if not line.startswith("ray::") or line.startswith(("ray::DashboardAgent", "ray::RuntimeEnvAgent"))}
    assert stopped and int(stopped[1]) >= len(lasting), (said, running)
    assert not _left(cluster), _left(cluster)
    assert not (folder / standin.STATE_FILE).exists() and not Path(cluster.ray_temp).exists()
    assert not (folder / standin.SECRETS_DIR).exists() and not (folder / standin.AUTH_DB).exists()  # gone with it
    assert _standin_cli(folder, "down") == f"the stand-in in {folder} is already down: nothing of it runs\n"

    ports = {"--s3-port": cluster.s3_port, "--gcs-port": cluster.gcs_port, "--dashboard-port": cluster.dashboard_port,
             "--mlflow-port": cluster.mlflow_port}
    said = _standin_cli(folder, "up", *[str(x) for kv in ports.items() for x in kv])
    assert f"worker ports {first}-{last}" in said, said
    again = standin.Standin.load(folder)
    assert again.session != cluster.session and _left(again)
    assert again.auth and again.token_path.read_text() != token  # new secrets, in the same places
    assert again.store_credentials() != keys
    # The bucket went with the stand-in (moto keeps nothing), and so do the runs whose artifacts were in it: up
    # starts MLflow's store afresh and says so (MLflow once listed runs whose every runs:/ model pointed at nothing)
    assert ("removed the MLflow store of the stand-in stopped before" in said
            and "runs and bucket start empty" in said), said
    assert _keys(again, "") == []
    with environ(again.mlflow_login()):  # the server answers to its new password, with no run of before
        client = MlflowClient(again.tracking_uri)
        assert client.search_runs([e.experiment_id for e in client.search_experiments()]) == []
    standin_cluster.restarted()


"""Online serving on Ray Serve, for real: the application of ``nre_ray.serve.app:build`` on the session's Ray answers
as the predict CLI does, with MLflow's protocol; bad rows get a 400 with the reason, a missing type is said in the
answer; a replica killed under load is replaced and every request ends with an answer; ``python -m nre_ray.serve``
prints its URL and shuts everything down on Ctrl-C, and leaves nothing running when it is killed outright; bad options
are one ``error:`` line."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import requests

from nre_ray.cluster import processes
from nre_ray.cluster.processes import cmdline
from nre_ray.predict import main as predict_main
from nre_ray.serve.__main__ import main as serve_main
from tests import procs
from tests.helpers import tiny_frame
from tests.unit.test_inference import make_checkpoint

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]
APP = "nre_ray_test"
COLUMNS = ["sentence", "head", "head_offset", "tail", "tail_offset", "head_type", "tail_type"]
UP_TIMEOUT_S = 120


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> Path:
    """A small checkpoint whose vocabulary has typed entity markers (a model trained with entity types)."""
    return make_checkpoint(tmp_path_factory.mktemp("serve") / "checkpoint", typed=True)


@pytest.fixture(scope="module")
def url(ray_cluster, model):
    """The application of the Serve config-file builder, two replicas, on the session's Ray; its base URL."""
    from ray import serve

    from nre_ray.serve.app import build

    port = procs.free_port_between(20000, 32000)  # outside the ranges Ray takes ports from
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    try:
        app = build({"model": str(model), "min_replicas": "2", "max_batch_size": "8", "batch_wait_timeout_s": "0.01"})
        serve.run(app, name=APP, route_prefix="/")
        yield f"http://127.0.0.1:{port}"
    finally:
        serve.shutdown()


def rows(n: int = 12) -> pd.DataFrame:
    frame = tiny_frame(4).iloc[:n].reset_index(drop=True)
    return frame.assign(head_type="ORG", tail_type="PER")[COLUMNS]


def post(url: str, payload: dict, timeout: float = 30) -> requests.Response:
    return requests.post(f"{url}/invocations", json=payload, timeout=timeout)


def split(frame: pd.DataFrame) -> dict:
    return json.loads(frame.to_json(orient="split", index=False))


def test_answers_equal_the_predict_cli_in_every_input_format(url, model, tmp_path, capsys):
    frame = rows()
    frame.to_csv(tmp_path / "rows.csv", index=False)
    assert predict_main(["--model", str(model), "--input", str(tmp_path / "rows.csv"), "--output",
                         str(tmp_path / "out.jsonl"), "--top-k", "2", "--no-progress"]) == 0
    expected = pd.read_json(tmp_path / "out.jsonl", lines=True)
    records = json.loads(frame.to_json(orient="records"))
    for payload in ({"dataframe_split": split(frame)}, {"dataframe_records": records}, {"instances": records}):
        response = post(url, {**payload, "params": {"top_k": 2}})
        assert response.status_code == 200, response.text
        got = pd.DataFrame(response.json()["predictions"])
        assert list(got.columns) == ["predicted_relation", "score", "top_k_labels", "top_k_scores"]
        assert "warnings" not in response.json()
        assert got["predicted_relation"].tolist() == expected["predicted_relation"].tolist()
        np.testing.assert_allclose(got["score"], expected["score"], rtol=0, atol=1e-6)
        assert got["top_k_labels"].tolist() == expected["top_k_labels"].tolist()
    # MLflow's own parsing (CSV; and a JSON request it must read itself: offsets as floats) answers the same
    csv = requests.post(f"{url}/invocations", data=frame.to_csv(index=False), headers={"Content-Type": "text/csv"},
                        timeout=30)
    floats = post(url, {"dataframe_split": split(frame.astype({"head_offset": float}))})
    for response in (csv, floats):
        assert response.status_code == 200, response.text
        got = pd.DataFrame(response.json()["predictions"])
        assert list(got.columns) == ["predicted_relation", "score"]
        assert got["predicted_relation"].tolist() == expected["predicted_relation"].tolist()
        np.testing.assert_allclose(got["score"], expected["score"], rtol=0, atol=1e-6)
    # one-row requests at once are labelled in shared batches, each answered with its own row (top-k as asked)
    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(lambda i: post(url, {"dataframe_records": records[i:i + 1],
                                                      "params": {"top_k": i % 3}}), range(len(records))))
    for i, response in enumerate(answers):
        (prediction,) = response.json()["predictions"]
        assert prediction["predicted_relation"] == expected["predicted_relation"][i]
        assert prediction["score"] == pytest.approx(expected["score"][i], abs=1e-6)
        assert prediction.get("top_k_labels", []) == expected["top_k_labels"][i][:i % 3]


def test_bad_rows_get_400_with_the_reason_and_do_not_spoil_a_shared_batch(url):
    frame = rows(4)
    bad = frame.copy()
    bad.loc[1, "head_offset"] = 3
    response = post(url, {"dataframe_split": split(bad)})
    assert response.status_code == 400
    assert response.json()["error_code"] == "INVALID_PARAMETER_VALUE"
    assert "row 2: head_offset: the sentence does not have head at offset 3" in response.json()["message"]
    missing = post(url, {"dataframe_split": split(frame.drop(columns=["tail_offset"]))})
    assert missing.status_code == 400 and "tail_offset" in missing.json()["message"]
    assert post(url, {"rows": []}).status_code == 400  # not one of MLflow's input fields
    with ThreadPoolExecutor(6) as pool:  # good and bad requests at once: only the bad ones fail
        answers = list(pool.map(lambda i: post(url, {"dataframe_split": split(bad if i % 2 else frame)}), range(6)))
    assert [r.status_code for r in answers] == [200, 400] * 3


def test_a_missing_type_is_said_in_the_answer(url):
    response = post(url, {"dataframe_split": split(rows(2).drop(columns=["head_type", "tail_type"]))})
    assert response.status_code == 200
    assert len(response.json()["predictions"]) == 2
    assert "trained with entity types" in response.json()["warnings"][0]


def test_ping_and_health_say_which_model(url, model):
    assert requests.get(f"{url}/ping", timeout=10).status_code == 200
    health = requests.get(f"{url}/health", timeout=10).json()
    assert health["status"] == "ok" and health["model"]["uri"] == str(model)
    assert health["settings"]["max_batch_size"] == 8 and health["settings"]["device"] == "cpu"


def replica_pids(url: str, want: int, timeout: float = 60) -> set[int]:
    """The replicas' process ids, from /health (each answer names its replica), once ``want`` distinct ones answer."""
    seen: set[int] = set()
    deadline = time.monotonic() + timeout
    while len(seen) < want:
        assert time.monotonic() < deadline, f"only replicas {seen} answered"
        try:
            response = requests.get(f"{url}/health", timeout=10)
        except requests.ConnectionError:
            continue
        if response.status_code == 200:
            seen.add(response.json()["replica"]["pid"])
    return seen


#: What :func:`kill_one_under_load` records for a connection closed without an answer, or an answer cut short.
CLOSED = 0


def kill_one_under_load(url: str, victim: int) -> tuple[list[int], list[int]]:
    """Kill replica ``victim`` while 4 clients send 160 one-row requests, each retried (at most 10 times) while it
    gets anything but 200: the final status of each request, and the statuses that were retried (:data:`CLOSED`
    for a connection closed without an answer)."""
    payload = {"dataframe_split": split(rows(1))}
    failures: list[int] = []

    def request(i: int) -> int:
        status = CLOSED
        for _ in range(10):  # bounded retries: a clean 5xx is fixed by sending again
            try:
                status = post(url, payload).status_code
            except (requests.ConnectionError, requests.exceptions.ChunkedEncodingError):  # no answer, or cut short
                status = CLOSED
            if status == 200:
                return 200
            failures.append(status)
            time.sleep(0.3)
        return status

    with ThreadPoolExecutor(4) as pool:
        answers = [pool.submit(request, i) for i in range(160)]
        time.sleep(0.5)
        os.kill(victim, signal.SIGKILL)
        return [a.result() for a in answers], failures


def test_a_replica_killed_under_load_is_replaced_and_every_request_is_answered(url):
    from ray import serve

    before = replica_pids(url, 2)
    victim = min(before)
    assert cmdline(victim).startswith("ray::ServeReplica"), cmdline(victim)  # one of this session's replicas
    codes, failures = kill_one_under_load(url, victim)
    assert codes == [200] * 160
    assert all(code >= 500 for code in failures), failures
    procs.wait_for("two running replicas again", lambda: serve.status().applications[APP].deployments[
        "RelationServer"].replica_states.get("RUNNING") == 2, timeout=90, interval=0.5)
    after = replica_pids(url, 2)
    assert victim not in after and len(after - before) == 1


#: The command's one-line refusals of a start that the machine's load cut short (Ray's node registration, Serve's
#: proxy start): in a start_serve, each gets one more try.
LOAD_REFUSALS = ("its node did not register within", "Serve's proxy did not start")


def start_serve(args: list[str], log: Path, tmp_path: Path) -> subprocess.Popen:
    """``python -m nre_ray.serve ARGS``, up to its URL line. The command starts a Ray of its own (Serve is one per
    cluster), whose raylet must register within Ray's fixed 30 s: with the suite in two processes the load once
    reached 67 on 2 cores and the command refused in one line, as it should; that refusal, and Serve's proxy given
    up before it started (seen at a load of 16), and only they, get one more try (:data:`LOAD_REFUSALS`), since these
    tests are about the serving, not about the start."""
    for attempt in (1, 2):
        proc = procs.start([sys.executable, "-m", "nre_ray.serve", *args], log, cwd=tmp_path)
        procs.wait_for("the URL line", lambda p=proc: "serving " in log.read_text() or p.poll() is not None,
                       timeout=UP_TIMEOUT_S, interval=0.5)
        said = log.read_text()
        if proc.poll() is None or attempt == 2 or not any(refusal in said for refusal in LOAD_REFUSALS):
            return proc
        procs.stop_tree(proc)  # (what its Ray had started)
        log.write_text(f"(the first try refused on the load: {log.read_text()})\n")
    raise AssertionError("unreachable")


def test_through_haproxy_a_killed_replica_is_replaced_and_every_request_is_answered(model, tmp_path):
    """The same through the command's default ingress (Serve's HAProxy, on a Ray the command starts), which listens
    on the address the user chose (the default 127.0.0.1) and nowhere else."""
    port = procs.free_port_between(20000, 32000)  # outside the ranges Ray takes ports from
    log = tmp_path / "serve.log"
    proc = start_serve(["--model", str(model), "--port", str(port), "--min-replicas", "2", "--max-batch-size", "8"],
                       log, tmp_path)
    try:
        assert proc.poll() is None, log.read_text()
        url = f"http://127.0.0.1:{port}"
        before = replica_pids(url, 2)
        # Nothing of it listens beyond the default --host 127.0.0.1: its Ray, Serve's proxy and replicas, and
        # HAProxy (its frontend, statistics page and Prometheus metrics)
        sockets = procs.listening([proc.pid, *procs.descendants(proc.pid)])
        assert len([s for s in sockets if "haproxy" in s[1]]) >= 3, sockets
        assert [s for s in sockets if not procs.loopback(s[2])] == []
        victim = min(before)
        assert victim in procs.descendants(proc.pid) and cmdline(victim).startswith("ray::ServeReplica")
        codes, failures = kill_one_under_load(url, victim)
        assert codes == [200] * 160
        # a clean 500 for a request the replica died under, never a connection closed without an answer (HAProxy's
        # "http-reuse always", which Serve writes and the command makes "safe": ray_private.serve_setup)
        assert all(code >= 500 for code in failures), failures
        after = replica_pids(url, 2, timeout=90)  # the replacement answers through the same URL
        assert victim not in after and len(after - before) == 1
        # Killed outright (kill -9, the OOM killer): its watchdog stops what Ray's fate-sharing leaves, HAProxy
        # (which holds the port) and Ray's agents among them. (The clean Ctrl-C stop: the test below.)
        started = procs.descendants(proc.pid)  # HAProxy included, restarted when the replicas changed
        assert any("nre_ray.cluster.watchdog" in cmdline(p) for p in started)
        os.kill(proc.pid, signal.SIGKILL)
        assert proc.wait(timeout=10) == -signal.SIGKILL
        deadline = time.monotonic() + 30
        while (left := leftovers(started, proc.pid)) and time.monotonic() < deadline:
            time.sleep(0.5)
        assert not left, left
        with socket.socket() as sock:  # nothing listens on the port any more (as a server binds: SO_REUSEADDR,
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # past the clients' TIME_WAIT)
            sock.bind(("127.0.0.1", port))
            sock.listen()
    finally:
        procs.stop_tree(proc)


def leftovers(started: list[int], command: int) -> list[str]:
    """What still runs of ``started``, and any HAProxy of ``command``'s (one Serve restarted after ``started`` was
    taken: its files are in the command's /tmp/nre_hap<pid>)."""
    mine = f"/tmp/nre_hap{command}/"
    haproxies = [p for p in processes.parents() if mine in cmdline(p)]
    return [cmdline(p)[:120] for p in sorted({*started, *haproxies}) if procs.alive(p)]


def test_command_prints_its_url_and_ctrl_c_shuts_everything_down(model, tmp_path):
    port = procs.free_port_between(20000, 32000)  # outside the ranges Ray takes ports from
    log = tmp_path / "serve.log"
    proc = start_serve(["--model", str(model), "--port", str(port)], log, tmp_path)
    try:
        assert proc.poll() is None, log.read_text()
        assert f"at http://127.0.0.1:{port}/invocations" in log.read_text()
        response = post(f"http://127.0.0.1:{port}", {"dataframe_split": split(rows(2))})
        assert response.status_code == 200 and len(response.json()["predictions"]) == 2
        started = procs.descendants(proc.pid)
        assert any(cmdline(p).startswith("ray::ServeReplica") for p in started)
        assert any("haproxy" in cmdline(p).split(" ")[0] for p in started)  # the default ingress: Serve's HAProxy
        os.kill(proc.pid, signal.SIGINT)
        assert proc.wait(timeout=60) == 130, log.read_text()
        procs.wait_for("no process left", lambda: not leftovers(started, proc.pid), timeout=30)
        assert log.read_text().rstrip().endswith("interrupted: the application was shut down"), log.read_text()
        assert "graceful_shutdown" not in log.read_text(), log.read_text()  # Ray's "(raylet) Task ... failed"
        assert not Path(f"/tmp/nre_hap{proc.pid}").exists()  # HAProxy's files
    finally:
        procs.stop_tree(proc)


@pytest.mark.parametrize(("argv", "says"), [
    (["--max-replicas", "0"], "--max-batch-size and --max-replicas must be >= 1"),
    (["--min-replicas", "3", "--max-replicas", "2"], "--max-replicas 2 is below --min-replicas 3"),
    (["--max-batch-size", "64", "--max-ongoing-requests", "8"], "a batch could never fill"),
    (["--model", "no/such/folder"], "--model no/such/folder: no such folder"),
    (["--address", "127.0.0.1:1", "--ingress", "proxy"], "--ingress proxy: only for the Ray this command starts"),
])
def test_bad_options_are_one_error_line_and_exit_2(model, argv, says, capsys):
    assert serve_main(["--model", str(model), *argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and says in err[0], err


def test_use_gpu_is_refused_without_a_gpu(ray_cluster, model, capsys):
    if ray_cluster.cluster_resources().get("GPU"):
        pytest.skip("this machine has a GPU")
    assert serve_main(["--model", str(model), "--use-gpu"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and "GPU" in err[0], err

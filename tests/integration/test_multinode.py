"""Several nodes, proven on one machine: a real 2-node Ray cluster (two ``ray start`` processes on 127.0.0.1), the
training CLI joining it with ``--address``, one worker on each node, checkpoints in a storage folder both nodes use,
and MLflow through a real ``mlflow server`` process, as on a cluster.

Everything runs in subprocesses with its own Ray temp folder: the test session's in-process Ray (``ray_cluster``)
and other Ray clusters on this host are neither joined nor touched. Teardown stops exactly the processes this test
started and their descendants (never ``ray stop``, which stops every Ray on the machine).
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
import urllib.request
from pathlib import Path

import pytest
import ray.train
from mlflow.tracking import MlflowClient

from nre_ray.cluster.local_settings import MLFLOW_SERVER_ENV
from nre_ray.run.checkpoint import load_checkpoint
from tests.procs import (
    alive,
    cli,
    descendants,
    free_port,
    kill_all,
    mentioning,
    start,
    stop_tree,
    train_workers,
    wait_for,
)

pytestmark = [pytest.mark.integration, pytest.mark.timeout(420)]
RAY = str(Path(sys.executable).parent / "ray")
MLFLOW = str(Path(sys.executable).parent / "mlflow")


def _healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return response.status == 200
    except OSError:
        return False


@pytest.fixture
def workdir():
    """A short folder under /tmp (Ray's unix socket paths must stay under ~100 characters), removed afterwards."""
    folder = Path(tempfile.mkdtemp(prefix="nre2n_", dir="/tmp"))
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def _start_node(started: list, workdir: Path, name: str, args: list[str]):
    """``ray start ARGS`` (blocking, so the test owns the node's processes); a second try if Ray's fixed 30 s for a
    raylet to register runs out, which happens when the machine is very busy."""
    log = workdir / f"{name}.log"
    for attempt in (1, 2):
        proc = start([RAY, "start", *args], log, workdir)
        started.append(proc)
        try:
            wait_for(f"the {name} node", lambda: "Ray runtime started" in log.read_text(), 120, proc=proc, log=log)
            return proc
        except AssertionError:
            if attempt == 2 or proc.poll() is None or "timed out during startup" not in log.read_text():
                raise
            stop_tree(proc)
            kill_all(mentioning(str(workdir / "ray")))  # what the failed start left (only the head names it)
    raise AssertionError("unreachable")


def _cluster(started: list, workdir: Path, head_cpus: int, node_cpus: int):
    """An MLflow tracking server (sqlite store, artifacts proxied by the server into ./mlartifacts, its cwd), a Ray
    head and one more node on 127.0.0.1; returns ``(tracking URI, GCS port, head, node)`` (the processes are added to
    ``started``)."""
    mlflow_port = free_port()
    server = start([MLFLOW, "server", "--backend-store-uri", f"sqlite:///{workdir / 'mlflow.db'}", "--host",
                    "127.0.0.1", "--port", str(mlflow_port), "--workers", "1"], workdir / "mlflow.log", workdir,
                   MLFLOW_SERVER_ENV)
    started.append(server)
    port = free_port()
    common = ["--block", "--node-ip-address=127.0.0.1", "--disable-usage-stats"]
    head = _start_node(started, workdir, "head", [
        "--head", f"--port={port}", f"--temp-dir={workdir / 'ray'}", "--include-dashboard=false",
        f"--ray-client-server-port={free_port()}", f"--dashboard-agent-listen-port={free_port()}",
        f"--num-cpus={head_cpus}", *common])
    node = _start_node(started, workdir, "node", [
        f"--address=127.0.0.1:{port}", f"--dashboard-agent-listen-port={free_port()}", f"--num-cpus={node_cpus}",
        *common])
    tracking_uri = f"http://127.0.0.1:{mlflow_port}"
    wait_for("the MLflow server", lambda: _healthy(f"{tracking_uri}/health"), 120, interval=0.5, proc=server,
             log=workdir / "mlflow.log")
    return tracking_uri, port, head, node


def test_two_nodes_with_an_mlflow_server(workdir):
    started = []
    try:
        # Head and one more node, 1 CPU each: two 1-CPU workers must go one to each node.
        tracking_uri, port, head, node = _cluster(started, workdir, 1, 1)

        storage, summary, log = workdir / "storage", workdir / "summary.json", workdir / "train.log"
        train = start(cli("--address", f"127.0.0.1:{port}", "--num-workers", "2", "--epochs", "2",
                          "--run-name", "two-nodes", "--experiment-name", "multinode", "--tracking-uri", tracking_uri,
                          "--storage-path", str(storage),
                          # the two nodes share this machine's disk, as NFS would: a local path is allowed, with a
                          # warning (without the flag it is refused on a cluster of several nodes), and the
                          # preprocessing cache goes under it, where every node reads it (no --cache-dir)
                          "--allow-local-storage", "--summary-json", str(summary)), log, workdir)
        started.append(train)
        # The worker processes are children of each node's raylet: one below each `ray start`.
        placed = wait_for("a training worker on each node",
                          lambda: (train_workers(head.pid), train_workers(node.pid))
                          if train_workers(head.pid) and train_workers(node.pid) else None,
                          240, interval=0.5, proc=train, log=log)
        assert train.wait(timeout=300) == 0, log.read_text()[-4000:]

        # The run, through the server's REST API, as a user on a laptop would see it.
        result = json.loads(summary.read_text())
        assert result["tracking_uri"] == tracking_uri
        client = MlflowClient(tracking_uri)
        run = client.get_run(result["run_id"])
        assert run.info.status == "FINISHED" and run.data.tags["workers"] == "2"
        assert sorted(m.step for m in client.get_metric_history(run.info.run_id, "epoch/train_loss")) == [1, 2]
        assert "test/macro_f1" in run.data.metrics and run.data.params["train.num_workers"] == "2"
        assert run.data.params["data.cache_dir"] == str(storage / ".nre_ray_cache")
        assert len(list((storage / ".nre_ray_cache").glob("*/meta.json"))) == 1  # built and published there
        assert run.info.artifact_uri.startswith("mlflow-artifacts:/")  # the server decides where artifacts go
        listed = {a.path for a in client.list_artifacts(run.info.run_id, "best_checkpoint")}
        assert {"best_checkpoint/state.pt", "best_checkpoint/meta.json", "best_checkpoint/vocab.json"} <= listed
        assert "reports/test_confusion_matrix.png" in {a.path for a in client.list_artifacts(run.info.run_id,
                                                                                             "reports")}
        downloaded = Path(client.download_artifacts(run.info.run_id, "best_checkpoint", str(workdir / "dl")))
        assert load_checkpoint(downloaded).meta["epoch"] == result["best_epoch"]
    finally:
        tree = [p for proc in started for p in [proc.pid, *descendants(proc.pid)]]
        for proc in reversed(started):
            stop_tree(proc)
        kill_all(mentioning(str(workdir)))  # anything of this test's Ray that outlived its parent
    text = log.read_text()
    assert "2 worker(s), {'CPU': 1.0} each" in text  # sized from both nodes' CPUs
    assert f"warning: --storage-path {storage} is a folder on this machine" in text  # --allow-local-storage
    assert len(placed[0]) == 1 and len(placed[1]) == 1, placed
    wait_for("every process this test started to end", lambda: not any(alive(p) for p in tree), 30)

    # Where things landed: artifacts in the server's ./mlartifacts, checkpoints in the shared storage folder.
    assert list((workdir / "mlartifacts").rglob("best_checkpoint/state.pt"))
    latest = ray.train.Result.from_path(str(storage / "two-nodes"))  # Ray Train's own record of the run
    assert latest.metrics["epoch"] == 2
    assert load_checkpoint(Path(latest.checkpoint.path)).meta["epoch"] == 2


def test_a_driver_node_without_cpus_preprocesses_on_the_other_node_through_the_bucket(workdir, object_store):
    """A small driver machine: the head (where the driver attaches: Ray prefers the head among the nodes of one
    host) offers no CPU, so every preprocessing task that needs one must run on the other node. With the storage
    path in an object store, they build in the bucket, the splits go straight to the shared cache, and the driver
    only downloads them (a task pinned to the driver's node can never run here: before, preprocessing failed with
    Ray's TaskUnschedulableError)."""
    from nre_ray import storage as fs

    started = []
    try:
        tracking_uri, port, _, node = _cluster(started, workdir, 0, 1)
        storage = fs.join(object_store, "small-driver", "checkpoints")
        cache, summary, log = workdir / "cache", workdir / "summary.json", workdir / "train.log"
        train = start(cli("--address", f"127.0.0.1:{port}", "--num-workers", "1", "--epochs", "1",
                          "--run-name", "small-driver", "--experiment-name", "multinode", "--tracking-uri",
                          tracking_uri, "--storage-path", storage, "--cache-dir", str(cache),
                          "--summary-json", str(summary)), log, workdir)
        started.append(train)
        wait_for("a training worker on the node with CPUs", lambda: train_workers(node.pid), 300, interval=0.5,
                 proc=train, log=log)
        assert train.wait(timeout=300) == 0, log.read_text()[-4000:]
        run = MlflowClient(tracking_uri).get_run(json.loads(summary.read_text())["run_id"])
        assert run.info.status == "FINISHED" and "test/macro_f1" in run.data.metrics

        # a cache folder on this machine only: the tasks would have to run on the driver's node, which cannot
        local_log = workdir / "local.log"
        refused = start(cli("--address", f"127.0.0.1:{port}", "--num-workers", "1", "--epochs", "1",
                            "--tracking-uri", tracking_uri, "--storage-path", str(workdir / "nfs"),
                            "--allow-local-storage", "--cache-dir", str(workdir / "own_cache")), local_log, workdir)
        started.append(refused)
        assert refused.wait(timeout=300) == 2, local_log.read_text()[-3000:]
    finally:
        for proc in reversed(started):
            stop_tree(proc)
        kill_all(mentioning(str(workdir)))

    shared = fs.join(storage, ".nre_ray_cache")
    text = log.read_text()
    assert f"preprocess: building in the object store: {shared}/" in text and "Traceback" not in text, text[-3000:]
    (key,) = {p[len(shared) + 1:].split("/")[0] for p in fs.list_files(shared, recursive=True)}  # no build folder
    assert fs.is_file(fs.join(shared, key, "meta.json"))
    published = sorted(fs.name_of(p) for p in fs.list_files(fs.join(shared, key)))
    assert sorted(p.name for p in (cache / key).iterdir()) == published  # the driver's copy
    refusal = local_log.read_text()
    assert "error: preprocessing cannot run: on a cluster of several nodes its tasks must run on this machine's" \
        in refusal and "Traceback" not in refusal, refusal[-3000:]

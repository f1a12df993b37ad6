"""The cluster path as a cloud user takes it, rehearsed on this machine with ``python -m nre_ray.standin``: a Ray
head whose autoscaler adds worker nodes when a run asks for them, an S3-compatible object store, and an MLflow server
with its artifacts in that store.

The job is submitted with ``ray job submit --working-dir .`` exactly as docs/cluster.md says. Inputs, checkpoints and
artifacts live only in the object store (the fake nodes share this host's disk, so a local path would work by
accident): the tests check that nothing lands in the job's working directory. Teardown stops exactly the stand-in's
processes (never ``ray stop``). The last test stops the stand-in as a user does, checks /proc for anything left, and
starts it again on the same ports.
"""

from __future__ import annotations

import re
import secrets
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from nre_ray.cluster import processes, standin
from tests.procs import env, free_port, free_port_between, mentioning, wait_for, with_env

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]
REPO = Path(__file__).resolve().parents[2]
RAY = str(Path(sys.executable).parent / "ray")
SAMPLE = REPO / "nre_ray" / "data" / "sample"
#: Files Ray Train and the driver would write into the working directory if a default path were used.
LOCAL_LEFTOVERS = {"ray_results", "mlflow.db", "mlruns", ".nre_ray_cache", "rejected_rows.csv", "mlartifacts"}


@pytest.fixture(scope="module")
def cluster():
    """The stand-in on free ports, its GCS port among the ports ``ray start`` would give its workers, with the
    bundled sample uploaded to s3://nre-ray/nre_ray/data."""
    folder = Path(tempfile.mkdtemp(prefix="nrs_", dir="/tmp"))
    state = standin.up(folder, ports={"s3": free_port(), "gcs": free_port_between(*standin.RAY_WORKER_PORTS),
                                      "dashboard": free_port(), "mlflow": free_port()})
    try:
        fs = state.filesystem()
        for path in SAMPLE.iterdir():
            with fs.open_output_stream(f"{state.bucket}/nre_ray/data/{path.name}") as out:
                out.write(path.read_bytes())
        yield state
    finally:
        last = standin.Standin.load(folder) if (folder / standin.STATE_FILE).exists() else state  # (started again)
        standin.down(folder)
        assert not _left(state) and not _left(last), "stand-in processes left behind"


def _left(state: standin.Standin) -> dict[int, str]:
    """What runs of ``state``'s stand-in: its recorded processes, those with its session mark or naming its Ray
    folder (as /proc shows them)."""
    pids = {p.pid for p in state.processes if p.current()} | set(with_env(standin.SESSION_ENV, state.session))
    return {pid: p.cmdline for pid in pids | set(mentioning(state.ray_temp)) if (p := processes.identify(pid))}


def _standin_cli(folder: Path, *args: str) -> str:
    """``python -m nre_ray.standin --dir FOLDER ARGS`` as a user runs it; its output."""
    done = subprocess.run([sys.executable, "-m", "nre_ray.standin", "--dir", str(folder), *args], cwd=REPO,
                          capture_output=True, text=True, env=env(), timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def _submit(state: standin.Standin, run_name: str, *extra: str, log: Path) -> subprocess.Popen:
    """``ray job submit --working-dir . -- python -m nre_ray.train ...`` as docs/cluster.md has it (logs streamed)."""
    with open(log, "wb") as out:
        return subprocess.Popen(
            [RAY, "job", "submit", "--working-dir", ".", "--", "python", "-m", "nre_ray.train",
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


def test_a_submitted_job_trains_on_autoscaled_nodes_with_everything_in_the_bucket(cluster, tmp_path):
    log = tmp_path / "job.log"
    assert not standin.worker_nodes(cluster)  # min_workers 0: no worker node before a run asks
    # A seed of its own: its preprocessing cache key is new, so this job builds it (the job's driver would reuse a
    # local cache that another run on this host built, in <tmp>/nre_ray-<uid>/cache, and publish that instead).
    seed = str(secrets.randbelow(10**9) + 2)
    job = _submit(cluster, "standin-job", "--num-workers", "2", "--epochs", "2", "--seed", seed, log=log)
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
                    log=tmp_path / "again.log")
    assert again.wait(timeout=300) == 0, (tmp_path / "again.log").read_text(errors="replace")[-4000:]
    assert "reused from the cache" in (tmp_path / "again.log").read_text(errors="replace")  # the preprocess phase


def test_a_lost_node_is_replaced_and_training_continues_in_the_same_run(cluster, tmp_path):
    log = tmp_path / "job.log"
    client = MlflowClient(cluster.tracking_uri)
    job = _submit(cluster, "standin-lost-node", "--num-workers", "3", "--epochs", "6", "--batch-size", "4",
                  "--max-failures", "2", log=log)
    run = wait_for("the run's first epoch in MLflow",
                   lambda: (r := _run(client, "standin-lost-node")) and "epoch/valid_macro_f1" in r.data.metrics and r,
                   300, interval=0.5, proc=job, log=log)
    before = set(standin.worker_nodes(cluster))
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
    # The autoscaler started a node in place of the lost one (3 workers: the head holds one, two need nodes).
    replaced = wait_for("a replacement node", lambda: set(standin.worker_nodes(cluster)) - before, 60)
    assert lost not in standin.worker_nodes(cluster) and replaced


def test_a_local_ray_beside_the_standin_does_not_take_its_node_types(cluster, ray_cluster):
    """The driver reads node types from the monitor of the cluster it joined: the stand-in's autoscaler, running on
    the same machine, is not the test session's local Ray's."""
    from nre_ray.cluster import session

    info = session.cluster()
    assert info.node_types == [] and not info.can_grow


def test_down_stops_all_that_up_started_and_up_starts_it_again(cluster):
    """Run last: it stops the module's stand-in and starts it again (the fixture stops that one)."""
    first, last = cluster.worker_ports
    assert not first <= cluster.gcs_port <= last  # the head's workers keep off the GCS port
    raylet = [p for p in cluster.processes if p.cmdline.split(" ")[0].endswith("/raylet")]
    assert f"--min_worker_port={first} --max_worker_port={last}" in raylet[0].cmdline
    # The head's Ray Client proxy, which Ray leaves to init: up recorded it, and it runs
    proxy = [p for p in cluster.processes if "ray.util.client.server" in p.cmdline and "--mode=proxy" in p.cmdline]
    assert proxy and proxy[0].current() and proxy[0].pid in _left(cluster)

    folder = Path(cluster.folder)
    running = _left(cluster)
    said = _standin_cli(folder, "down")
    stopped = re.fullmatch(r"stopped (\d+) processes of the stand-in in \S+\n", said)
    assert stopped and int(stopped[1]) >= len(running), (said, running)
    assert not _left(cluster), _left(cluster)
    assert not (folder / standin.STATE_FILE).exists() and not Path(cluster.ray_temp).exists()

    ports = {"--s3-port": cluster.s3_port, "--gcs-port": cluster.gcs_port, "--dashboard-port": cluster.dashboard_port,
             "--mlflow-port": cluster.mlflow_port}
    said = _standin_cli(folder, "up", *[str(x) for kv in ports.items() for x in kv])
    assert f"worker ports {first}-{last}" in said, said
    again = standin.Standin.load(folder)
    assert again.session != cluster.session and _left(again)
    assert MlflowClient(again.tracking_uri).search_experiments()  # the server answers, on its old database

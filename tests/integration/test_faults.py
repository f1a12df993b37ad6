"""Faults, for real: a worker killed mid-epoch, Ctrl-C then ``--resume``, a crash in the middle of a checkpoint save.

The CLI tests run ``python -m nre_ray.train`` as a subprocess with its own local Ray (as a user would) and find its
Ray Train workers among its descendant processes. They wait until Ray Train has *registered* a checkpoint (the run's
``checkpoint_manager_snapshot.json``, read with ``ray.train.Result.from_path``) before striking, so "the latest
checkpoint" is known exactly; Ray registers a reported checkpoint at its next poll of the workers (every 2 s), and
the epoch's metrics reach MLflow then (``nre_ray.tracking.callback``), so each epoch is in MLflow exactly once.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import ray
import ray.train
from mlflow.tracking import MlflowClient
from ray.train.torch import TorchTrainer

from nre_ray.config import Config
from nre_ray.run.checkpoint import CheckpointError, load_checkpoint
from nre_ray.run.runner import _existing_checkpoints
from tests.helpers import tiny_data
from tests.procs import alive, cli, cmdline, descendants, env, start, stop_tree, train_workers, wait_for

pytestmark = pytest.mark.integration
EXPERIMENT = "faults"
#: The CLI runs start a private local Ray: the test finds their workers among their descendants, and checks that a
#: Ctrl-C leaves no process of theirs.
OWN_RAY = {"NRE_RAY_OWN_RAY": "1"}
# The worker-side wrapper below is shipped by value: Ray workers cannot import this test module.
ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory) -> Path:
    """One preprocessing cache for the session's CLI runs (the first run fills it)."""
    return tmp_path_factory.getbasetemp() / "nre_ray_cache"


def _args(tmp_path: Path, cache_dir: Path, name: str, *extra: str) -> list[str]:
    # Batches of 8 make an epoch of the 3000-row sample take a few seconds: room to strike in the middle of one.
    return ["--num-workers", "2", "--batch-size", "8", "--word-dim", "32", "--hidden-size", "64",
            "--run-name", name, "--storage-path", str(tmp_path / "storage"), "--experiment-name", EXPERIMENT,
            "--tracking-uri", f"sqlite:///{tmp_path / 'mlflow.db'}", "--cache-dir", str(cache_dir), *extra]


def _registered_epoch(run_dir: Path) -> int:
    """The epoch of the latest checkpoint Ray Train has registered for the run (0: none yet)."""
    try:
        result = ray.train.Result.from_path(str(run_dir))
    except Exception:  # not there yet, or the snapshot is being rewritten at this moment
        return 0
    return int(result.metrics["epoch"]) if result.metrics else 0


def _the_run(tmp_path: Path):
    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    runs = client.search_runs([client.get_experiment_by_name(EXPERIMENT).experiment_id])
    assert len(runs) == 1, [r.info.run_id for r in runs]  # one MLflow run, whatever happened to the processes
    return client, runs[0]


def _epoch_steps(client: MlflowClient, run_id: str) -> list[int]:
    return sorted(m.step for m in client.get_metric_history(run_id, "epoch/train_loss"))


def _check_history(steps: list[int], epochs: int) -> None:
    """Every epoch is in MLflow exactly once: none lost, none logged twice by a redone epoch."""
    assert steps == list(range(1, epochs + 1)), steps


@pytest.mark.timeout(420)
def test_ctrl_c_then_resume_then_a_killed_worker_all_in_one_mlflow_run(tmp_path, cache_dir, capsys):
    """One run through everything a run can meet: Ctrl-C (stops within seconds, no process left, MLflow KILLED);
    the same name again without --resume (refused); --resume (same MLflow run, from the latest checkpoint); a worker
    SIGKILLed mid-epoch with --max-failures 1 (the worker group restarts from the latest checkpoint and the run
    completes). Two CLI runs instead of three keep the test within a couple of minutes on 2 cores."""
    epochs, log, run_dir = 6, tmp_path / "train.log", tmp_path / "storage" / "faults"
    args = _args(tmp_path, cache_dir, "faults", "--epochs", str(epochs))

    # 1. Ctrl-C once a checkpoint is registered.
    proc = start(cli(*args), log, tmp_path, OWN_RAY)
    try:
        wait_for("a registered checkpoint", lambda: _registered_epoch(run_dir) >= 1, 240, proc=proc, log=log)
        tree = descendants(proc.pid)
        assert len(train_workers(proc.pid)) == 2
        at_signal, started = _registered_epoch(run_dir), time.monotonic()
        os.killpg(proc.pid, signal.SIGINT)  # what Ctrl-C in a terminal does: the whole foreground process group
        code = proc.wait(timeout=90)
        stopped_s = time.monotonic() - started  # printed below; the bound is on work done after the signal
        wait_for("every process of the run to end", lambda: not any(alive(p) for p in tree), 30)
        gone_s = time.monotonic() - started
    finally:
        stop_tree(proc)
    text = log.read_text()
    assert code == 130, text[-3000:]
    assert "interrupted: the MLflow run is marked KILLED" in text
    client, run = _the_run(tmp_path)
    assert run.info.status == "KILLED"
    interrupted_at = _registered_epoch(run_dir)
    # Ctrl-C stops the run in the epoch it is in: at most that epoch's checkpoint comes after it, no later one.
    assert 1 <= at_signal <= interrupted_at <= at_signal + 1 and interrupted_at < epochs, (at_signal, interrupted_at)

    # 2. The same name again without --resume is refused: nothing is overwritten, the message says what to do.
    again = subprocess.run(cli(*args), capture_output=True, text=True, cwd=tmp_path, env=env(), timeout=120)
    assert again.returncode == 2 and "Continue that run with --resume" in again.stderr, again.stderr[-2000:]

    # 3. --resume (here with --max-failures 1), and a worker killed in the middle of an epoch after the restart.
    log2 = tmp_path / "resume.log"
    summary = tmp_path / "summary.json"
    proc = start(cli(*args, "--resume", "--max-failures", "1", "--summary-json", str(summary)), log2, tmp_path,
                 OWN_RAY)
    try:
        wait_for("a checkpoint after the resume",
                 lambda: _registered_epoch(run_dir) > interrupted_at, 240, proc=proc, log=log2)
        workers = train_workers(proc.pid)
        assert len(workers) == 2
        killed_after = _registered_epoch(run_dir)
        os.kill(workers[-1], signal.SIGKILL)
        assert proc.wait(timeout=240) == 0, log2.read_text()[-3000:]
        assert not any(alive(p) for p in workers)
    finally:
        stop_tree(proc)
    text = log2.read_text()
    assert f"resuming run 'faults' (MLflow run {run.info.run_id}) after epoch {interrupted_at}" in text
    assert f"resuming after epoch {interrupted_at} from" in text  # the resumed worker group
    # The killed worker is one plain line: what was lost, which failure of how many, where the run goes on from.
    # Ray's and gloo's messages and tracebacks are in the run's log file, not on the console.
    failures = [line for line in text.splitlines() if "; failure " in line]
    assert len(failures) == 1, failures
    said = re.search(rf"\] lost a worker: rank \d \(pid {workers[-1]} on node \S+ \(id \.\.\.\w{{8}}\)\) exited "
                     rf"unexpectedly \(killed, [^)]+\); failure 1 of --max-failures 1; going on from epoch (\d+), "
                     rf"checkpoint {re.escape(str(run_dir))}/checkpoint_\S+$", failures[0])
    assert said, failures[0]
    for noise in ("Traceback", "Connection reset by peer", "ActorDiedError", "ActorUnavailableError", "(raylet)",
                  "pid=", "gloo"):
        assert noise not in text, (noise, text[-3000:])
    assert f"Ray's own messages (its processes' output, tracebacks) go to {run_dir / 'ray_output.log'}, and to " \
        "the MLflow run (logs/ray_output.log) when it ends" in text
    details = (run_dir / "ray_output.log").read_text()
    assert "Traceback" in details and f"Worker PID: {workers[-1]}" in details, details[-3000:]
    client, run = _the_run(tmp_path)  # still exactly one MLflow run
    assert json.loads(summary.read_text())["run_id"] == run.info.run_id
    assert run.info.status == "FINISHED"
    assert run.data.tags["nre_ray.resumes"] == "1"
    assert json.loads(run.data.tags["nre_ray.resume_changes"]) == {"train.max_failures": "0 -> 1"}
    restarted_from = int(run.data.tags["nre_ray.resumed_from_epoch"])  # set by rank 0 of the replacement group
    assert killed_after <= restarted_from < epochs
    assert int(said.group(1)) == restarted_from  # the failure line said where the replacement group started
    assert "logs/ray_output.log" in {a.path for a in client.list_artifacts(run.info.run_id, "logs")}
    assert run.data.params["train.epochs"] == str(epochs) and run.data.params["train.max_failures"] == "0"
    _check_history(_epoch_steps(client, run.info.run_id), epochs)
    assert "test/macro_f1" in run.data.metrics
    assert _registered_epoch(run_dir) == epochs
    with capsys.disabled():
        print(f"\nfaults: Ctrl-C exit {stopped_s:.1f} s, all processes gone {gone_s:.1f} s; resumed after epoch "
              f"{interrupted_at}; worker killed after epoch {killed_after}, restarted from {restarted_from}")


def _crash_once_during_the_epoch_2_save(loop_config: dict) -> None:
    """Runs in the Ray Train worker: the loop, but the save of epoch 2 dies once after state.pt and the JSON files
    are written and before meta.json (a full disk, say). Records where each attempt starts from."""
    import nre_ray.run.checkpoint as ckpt
    from nre_ray.run.loop import train_loop_per_worker

    marker = Path(loop_config["marker"])
    start = ray.train.get_checkpoint()
    epoch = 0
    if start:
        with start.as_directory() as folder:
            epoch = load_checkpoint(Path(folder), weights=False).meta["epoch"]
    with open(marker.with_suffix(".starts"), "a") as fh:
        fh.write(f"{epoch}\n")
    real = ckpt._write_atomic

    def write(path: Path, data: bytes) -> None:
        if path.name == "meta.json" and json.loads(data)["epoch"] == 2 and not marker.exists():
            marker.write_text(str(path.parent))
            shutil.copytree(path.parent, marker.with_suffix(".left"))  # what the crash leaves, for the test to read
            raise OSError(28, "No space left on device (simulated)")
        real(path, data)

    ckpt._write_atomic = write
    train_loop_per_worker(loop_config)


@pytest.mark.timeout(180)
def test_a_crash_during_a_save_leaves_the_previous_checkpoint_as_the_latest(ray_cluster, tmp_path):
    """The half-written folder is never reported (``ray.train.report`` comes after the save returns), so Ray Train
    never copies or registers it: the restarted worker group starts from epoch 1's checkpoint, and its worker removes
    the folder the dead one left in the temporary folder (:mod:`nre_ray.core.tempfiles`)."""
    cfg = Config.from_dict({"train": {"epochs": 3, "batch_size": 8, "lr": 0.01, "num_workers": 1},
                            "model": {"word_dim": 16, "pos_dim": 4, "hidden_size": 16}})
    marker = tmp_path / "crashed"
    trainer = TorchTrainer(
        _crash_once_during_the_epoch_2_save,
        train_loop_config={"config": cfg.to_dict(), "data": tiny_data(), "tracking_uri": None, "run_id": None,
                           "marker": str(marker)},
        scaling_config=ray.train.ScalingConfig(num_workers=1, resources_per_worker={"CPU": 0.5}),
        run_config=ray.train.RunConfig(name="crash", storage_path=str(tmp_path / "storage"),
                                       checkpoint_config=ray.train.CheckpointConfig(num_to_keep=None),
                                       failure_config=ray.train.FailureConfig(max_failures=1)),
    )
    result = trainer.fit()
    assert marker.with_suffix(".starts").read_text().split() == ["0", "1"]
    assert not Path(marker.read_text()).exists()  # removed by the restarted worker: its maker's process is gone
    half_written = marker.with_suffix(".left")
    assert (half_written / "state.pt").exists() and not (half_written / "meta.json").exists()
    with pytest.raises(CheckpointError, match=re.escape("missing meta.json")):
        load_checkpoint(half_written)
    assert result.metrics["epoch"] == 3
    registered = [load_checkpoint(Path(c.path)).meta["epoch"] for c, _ in result.best_checkpoints]
    assert sorted(registered) == [1, 2, 3]  # epoch 2 is the redone one, complete
    # The refusal to reuse the name sees the run on a URI storage path too (as s3:// on a cluster).
    latest = Path(result.checkpoint.path).name
    assert _existing_checkpoints(f"file://{tmp_path / 'storage'}", "crash") == [latest]
    assert _existing_checkpoints(f"file://{tmp_path / 'storage'}", "other") == []


@pytest.mark.timeout(180)
def test_ctrl_c_while_a_resume_starts_ray_marks_the_run_killed(tmp_path, cache_dir):
    """A run a SIGKILL left RUNNING, continued with --resume and interrupted while that command starts its Ray (its
    GCS has appeared among the command's processes; nothing trains yet): exit 130, and the MLflow run is KILLED, as
    the console says, not left RUNNING for a command that no longer runs (the fault drill found it left so)."""
    from nre_ray.tracking import store as tracking

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    run_id = tracking.start_run(uri, EXPERIMENT, "cut", {"nre_ray.run_name": "cut",
                                                        "storage_path": str(tmp_path / "storage")})
    (tmp_path / "storage" / "cut").mkdir(parents=True)  # what the killed command had made of the run
    log = tmp_path / "resume.log"
    proc = start(cli(*_args(tmp_path, cache_dir, "cut", "--epochs", "1", "--resume")), log, tmp_path, OWN_RAY)
    try:
        wait_for("the command's own Ray to start", lambda: any("gcs_server" in cmdline(p)
                                                                for p in descendants(proc.pid)),
                 120, interval=0.05, proc=proc, log=log)
        os.killpg(proc.pid, signal.SIGINT)
        code = proc.wait(timeout=90)
    finally:
        stop_tree(proc)
    text = log.read_text()
    assert code == 130, text[-3000:]
    assert "] ray: " in text and "] workers: " not in text, text[-3000:]  # interrupted in the ray phase
    assert "interrupted: the MLflow run is marked KILLED" in text
    assert tracking.run_status(uri, run_id) == "KILLED"

"""Runs started together in one fresh folder, as from four terminals: four real ``python -m nre_ray.train``
processes on the defaults a new user has (the sqlite store ``mlflow.db``, ``ray_results/``, the cache
``.nre_ray_cache`` and a run name of model and time, all in the working directory, and the local Ray that nre_ray
runs on one machine share: nre_ray.cluster.shared_ray). All finish, each with its own run name, metrics and rejected
rows, on one Ray that stops when the last of them ends, and the store opens afterwards. A run killed with SIGKILL
leaves nothing of its own on the shared Ray, and nothing is left once the last run has ended."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pandas as pd
import pytest
from mlflow.tracking import MlflowClient

from tests.integration.test_command_matrix import TINY
from tests.integration.test_data_pipeline import bad_data
from tests.procs import alive, cli, env, kill_all, start, stop_tree, wait_for, with_env

pytestmark = [pytest.mark.integration, pytest.mark.timeout(420)]

RUNS = 4


@pytest.fixture
def ray_tmpdir() -> Iterator[str]:
    """A RAY_TMPDIR of the test's own (short: Ray's socket paths live under it): the shared Ray's registry and its
    sessions, apart from any other Ray on this machine. Whatever still runs with it is stopped afterwards."""
    folder = tempfile.mkdtemp(prefix="nreshr", dir="/tmp")
    try:
        yield folder
    finally:
        kill_all(with_env("RAY_TMPDIR", folder))
        shutil.rmtree(folder, ignore_errors=True)


def shared_env(ray_tmpdir: str) -> dict[str, str]:
    """The environment of runs that share the local Ray (the test session's opt-out, NRE_RAY_OWN_RAY, cleared)."""
    return {"NRE_RAY_OWN_RAY": "", "RAY_TMPDIR": ray_tmpdir}


def nothing_left(ray_tmpdir: str) -> bool:
    """No process of the shared Ray (its host, Ray's own, the watchdog) runs, and its record is gone."""
    record = Path(ray_tmpdir) / f"nre_ray-{os.getuid()}" / "local-ray" / "record.json"
    return not with_env("RAY_TMPDIR", ray_tmpdir) and not record.exists()


def test_four_runs_started_together_in_a_fresh_folder_all_finish_on_one_ray(tmp_path: Path, ray_tmpdir: str) -> None:
    bad_data(tmp_path / "data")  # 26 bad rows, skipped and listed by each run
    work = tmp_path / "work"
    work.mkdir()
    args = ["--data-dir", str(tmp_path / "data"), *TINY, "--on-bad-rows", "skip"]
    # no RAY_API_SERVER_ADDRESS from the test session: the runs pin the State API to the shared Ray, as for a user
    # and with its dashboard, as a user's has
    extra = {"RAY_API_SERVER_ADDRESS": "", "NRE_RAY_DASHBOARD": "1", **shared_env(ray_tmpdir)}
    procs = [start(cli(*args), tmp_path / f"run-{i}.log", work, extra) for i in range(RUNS)]
    try:
        codes = [proc.wait(timeout=360) for proc in procs]
    finally:
        for proc in procs:
            stop_tree(proc)
    logs = [(tmp_path / f"run-{i}.log").read_text(errors="replace") for i in range(RUNS)]
    assert codes == [0] * RUNS, "\n----\n".join(log[-3000:] for log in logs)
    assert not [log for log in logs if "Traceback" in log or "Failed to query" in log]
    # one Ray, started by one run and joined by the others
    assert sum("ray: started a local Ray (shared with later runs" in log for log in logs) == 1, logs[0][:3000]
    assert sum("ray: joined the local Ray shared by nre_ray runs" in log for log in logs) == RUNS - 1
    wait_for("the shared Ray to stop after its last run", lambda: nothing_left(ray_tmpdir), 30)

    client = MlflowClient(f"sqlite:///{work / 'mlflow.db'}")  # the store opens afterwards
    runs = client.search_runs([client.get_experiment_by_name("nre_ray").experiment_id])
    names = sorted(run.data.tags["nre_ray.run_name"] for run in runs)
    assert len(runs) == RUNS and len(set(names)) == RUNS, names  # default names of their own, even in one second
    assert names == sorted(p.name for p in (work / "ray_results").iterdir())
    for run in runs:
        name = run.data.tags["nre_ray.run_name"]
        assert run.info.status == "FINISHED"
        assert {"epoch/train_loss", "epoch/valid_macro_f1", "test/macro_f1"} <= set(run.data.metrics), name
        assert run.data.tags["rejected_rows"] == "26"
        listed = work / "ray_results" / name / "rejected_rows.csv"
        assert len(pd.read_csv(listed)) == 26
        logged = client.download_artifacts(run.info.run_id, "data/rejected_rows.csv", str(tmp_path / name))
        assert Path(logged).read_bytes() == listed.read_bytes()
        assert f"listed in {listed}" in "".join(logs)
    assert sorted(p.name for p in work.iterdir()) == [".nre_ray_cache", "mlflow.db", "mlruns", "ray_results"]


#: A command's stand-in: joins (or starts) the shared local Ray, places an actor on it, prints the actor's process id
#: and holds on until its stdin closes.
PROBE = """
import os, sys, ray
from nre_ray.cluster import session
session.start_ray(None, log_to_driver=False)

@ray.remote(num_cpus=0)
class Actor:
    def pid(self):
        return os.getpid()

actor = Actor.remote()
print(ray.get(actor.pid.remote()), flush=True)
sys.stdin.read()
"""


def test_a_killed_run_leaves_nothing_once_the_last_run_ends(ray_tmpdir: str) -> None:
    def probe() -> tuple[subprocess.Popen, int]:
        proc = subprocess.Popen([sys.executable, "-c", PROBE], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                text=True, env=env(**shared_env(ray_tmpdir)), start_new_session=True)
        return proc, int(proc.stdout.readline() or 0)

    first, first_actor = probe()  # starts the shared Ray
    joined, joined_actor = probe()
    try:
        assert alive(first_actor) and alive(joined_actor)
        record = json.loads((Path(ray_tmpdir) / f"nre_ray-{os.getuid()}" / "local-ray" / "record.json").read_text())
        assert [run[0] for run in record["runs"]] == [first.pid, joined.pid]
        joined.send_signal(signal.SIGKILL)
        joined.wait(10)
        # Ray ends the killed driver's workers; the shared Ray goes on for the first run
        wait_for("the killed run's actor to end", lambda: not alive(joined_actor), 30)
        assert alive(first_actor) and alive(record["host"][0])
        first.communicate("", timeout=30)  # the last run ends
        wait_for("the shared Ray to stop after its last run", lambda: nothing_left(ray_tmpdir), 30)
    finally:
        for proc in (first, joined):
            stop_tree(proc)

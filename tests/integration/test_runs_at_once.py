"""Runs started together in one fresh folder, as from two terminals: two real ``python -m nre_ray.train`` processes,
each with its own local Ray, on the defaults a new user has (the sqlite store ``mlflow.db``, ``ray_results/``, the
cache ``.nre_ray_cache`` and a run name of model and time, all in the working directory). Both finish, each with its
own run name, metrics and rejected rows, and the store opens afterwards."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest
from mlflow.tracking import MlflowClient

from tests.integration.test_command_matrix import TINY
from tests.integration.test_data_pipeline import bad_data
from tests.procs import cli, start, stop_tree

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]


def test_two_runs_started_together_in_a_fresh_folder_both_finish(tmp_path: Path) -> None:
    bad_data(tmp_path / "data")  # 26 bad rows, skipped and listed by each run
    work = tmp_path / "work"
    work.mkdir()
    args = ["--data-dir", str(tmp_path / "data"), *TINY, "--on-bad-rows", "skip"]
    # no RAY_API_SERVER_ADDRESS from the test session: each run pins the State API to its own Ray, as for a user
    procs = [start(cli(*args), tmp_path / f"run-{i}.log", work, {"RAY_API_SERVER_ADDRESS": ""}) for i in range(2)]
    try:
        codes = [proc.wait(timeout=240) for proc in procs]
    finally:
        for proc in procs:
            stop_tree(proc)
    logs = [(tmp_path / f"run-{i}.log").read_text(errors="replace") for i in range(2)]
    assert codes == [0, 0], "\n----\n".join(log[-3000:] for log in logs)
    assert not [log for log in logs if "Traceback" in log or "Failed to query" in log]

    client = MlflowClient(f"sqlite:///{work / 'mlflow.db'}")  # the store opens afterwards
    runs = client.search_runs([client.get_experiment_by_name("nre_ray").experiment_id])
    names = sorted(run.data.tags["nre_ray.run_name"] for run in runs)
    assert len(runs) == 2 and len(set(names)) == 2, names  # default names of their own, even in the same second
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

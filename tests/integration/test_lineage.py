"""Lineage: the same content at two locations, trained on one after the other, with one preprocessing cache and one
real MLflow sqlite store. Each run's ``data.source.*`` parameters and MLflow dataset inputs name its own files,
whatever the cache held: the second local folder reuses the first one's cache (same bytes), the second ``s3://``
prefix gets a cache of its own (an object's key is its URI and version); either way the run names its own inputs.

The driver's own steps run (``resolve_target``, ``prepare_data``, ``open_tracking``): everything a run records about
its data, without the training."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
from mlflow.tracking import MlflowClient

from nre_ray import storage
from nre_ray.config import config_from_args
from nre_ray.data.pipeline import sample_dir
from nre_ray.run.runner import open_tracking, prepare_data, resolve_target
from nre_ray.train import cli_parser

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]


def sample_slice(folder: Path) -> Path:
    """A small slice of the bundled sample (train 300, valid and test 60 rows, relation.txt) in ``folder``."""
    folder.mkdir(parents=True)
    for name, rows in (("train", 300), ("valid", 60), ("test", 60)):
        pd.read_csv(sample_dir() / f"{name}.csv", keep_default_na=False).head(rows).to_csv(folder / f"{name}.csv",
                                                                                          index=False)
    (folder / "relation.txt").write_bytes((sample_dir() / "relation.txt").read_bytes())
    return folder


def recorded_inputs(data_dir: str, work: Path) -> tuple[bool, dict[str, str], dict[str, str]]:
    """Run the driver's data steps on ``data_dir`` with the cache and MLflow store in ``work``; returns whether the
    cache was reused, the run's ``data.source.*`` params and its dataset inputs (split -> the source's URI)."""
    argv = ["--data-dir", data_dir, "--cache-dir", str(work / "cache"), "--storage-path", str(work / "runs"),
            "--tracking-uri", f"sqlite:///{work / 'mlflow.db'}", "--experiment-name", "lineage"]
    cfg = config_from_args(cli_parser().parse_args(argv))
    target = resolve_target(cfg)
    prepared = prepare_data(cfg, target)
    run_id, _ = open_tracking(cfg, target, prepared, threads=1)
    run = MlflowClient(target.tracking_uri).get_run(run_id)
    params = {k[len("data.source."):]: v for k, v in run.data.params.items() if k.startswith("data.source.")}
    datasets = {next(t.value for t in d.tags if t.key == "mlflow.data.context"): json.loads(d.dataset.source)["uri"]
                for d in run.inputs.dataset_inputs}
    return prepared.cache_hit, params, datasets


def expected(base: str) -> dict[str, str]:
    return {name: storage.join(base, file) for name, file in (("train", "train.csv"), ("valid", "valid.csv"),
                                                               ("test", "test.csv"), ("labels", "relation.txt"))}


def test_two_local_folders_with_the_same_files_each_name_their_own(ray_cluster, tmp_path: Path) -> None:
    first, moved = sample_slice(tmp_path / "a"), tmp_path / "moved"
    hit, params, datasets = recorded_inputs(str(first), tmp_path)
    assert not hit and params == expected(str(first))
    assert datasets == {s: str(first / f"{s}.csv") for s in ("train", "valid", "test")}

    first.rename(moved)  # the same files, elsewhere: the first folder is gone
    hit, params, datasets = recorded_inputs(str(moved), tmp_path)
    assert hit  # the same bytes: the cache the first run built
    assert params == expected(str(moved))
    assert datasets == {s: str(moved / f"{s}.csv") for s in ("train", "valid", "test")}


def test_two_prefixes_in_the_store_with_the_same_objects_each_name_their_own(ray_cluster, object_store: str,
                                                                             tmp_path: Path) -> None:
    local = sample_slice(tmp_path / "data")
    first, moved = storage.join(object_store, "lineage", "a"), storage.join(object_store, "lineage", "moved")
    storage.upload(local, first)
    storage.upload(local, moved)
    for base in (first, moved):
        _, params, datasets = recorded_inputs(base, tmp_path)
        assert params == expected(base)
        assert datasets == {s: f"{base}/{s}.csv" for s in ("train", "valid", "test")}

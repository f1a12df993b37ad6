"""The document and bag tasks' preprocessing cache shared through a storage path in an object store (a real
S3-compatible server, moto_server), as the sentence task's is (tests/unit/test_remote_inputs.py): the first run
publishes its result to ``<storage-path>/.nre_ray_cache/<key>/``, a run on another machine (an empty local cache)
copies it instead of preprocessing, byte for byte, and a training worker on a node without the driver's folder reads
its splits from that copy (:func:`nre_ray.run.loop.open_splits`)."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from nre_ray import storage
from nre_ray.config import DataConfig
from nre_ray.run.loop import open_splits
from nre_ray.tasks.bag import grouping
from nre_ray.tasks.bag.bag_task import BAG
from nre_ray.tasks.document.document_task import DocumentTask
from nre_ray.tasks.document.sample import write_sample


def _files(folder: Path) -> dict[str, bytes]:
    """Every file under ``folder`` by its relative path."""
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("kind", ["document", "bag"])
def test_a_document_or_bag_cache_is_published_then_copied_on_another_machine_and_read_by_a_worker(
        kind: str, ray_cluster, object_store: str, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    local = tmp_path / "data"
    if kind == "document":
        task = DocumentTask()
        write_sample(local, seed=3, sizes={"train": 12, "valid": 5, "test": 5})
    else:
        task = BAG
        local.mkdir()
        for path in grouping.sample_dir().iterdir():
            (local / path.name).write_bytes(path.read_bytes())
    uri = storage.join(object_store, f"shared-{kind}", "data")
    storage.upload(local, uri)
    shared = storage.join(object_store, f"shared-{kind}", "runs", ".nre_ray_cache")

    first_cfg = DataConfig(data_dir=uri, cache_dir=str(tmp_path / "first"))
    assert not task.is_cached(first_cfg, 1, shared_cache=shared)
    first = task.prepare(first_cfg, 1, shared_cache=shared)
    key = Path(first.cache_dir).name
    assert not first.cache_hit and first.shared_cache_dir == f"{shared}/{key}"
    assert storage.is_file(f"{shared}/{key}/meta.json")

    second_cfg = DataConfig(data_dir=uri, cache_dir=str(tmp_path / "second"))  # another machine: nothing local
    assert task.is_cached(second_cfg, 1, shared_cache=shared) and not task.is_cached(second_cfg, 1)
    with caplog.at_level(logging.INFO, logger="nre_ray"):
        second = task.prepare(second_cfg, 1, shared_cache=shared)
    assert f"reused the shared cache {shared}/{key}" in caplog.text
    assert second.cache_hit and second.shared_cache_dir == f"{shared}/{key}"
    assert second.cache_dir == str(tmp_path / "second" / key)
    assert _files(Path(second.cache_dir)) == _files(Path(first.cache_dir))
    assert second.labels == first.labels and list(second.splits) == list(first.splits)

    # a worker on a node without the driver's folder copies the shared one (once per node) and reads every split
    names = list(first.splits)
    splits = open_splits({"cache": {"dir": str(tmp_path / "not-on-this-node" / key), "shared": f"{shared}/{key}",
                                    "splits": names}}, task)
    assert {name: len(split) for name, split in splits.items()} == {n: len(s) for n, s in first.splits.items()}
    assert all(len(split) > 0 for split in splits.values())

    # --no-cache rebuilds here and publishes the whole folder again (a file lost from the shared copy is back)
    storage.remove(f"{shared}/{key}/audit.json")
    again = task.prepare(DataConfig(data_dir=uri, cache_dir=str(tmp_path / "second"), no_cache=True), 1,
                         shared_cache=shared)
    assert not again.cache_hit and again.shared_cache_dir == f"{shared}/{key}"
    assert storage.read_bytes(f"{shared}/{key}/audit.json") == (Path(again.cache_dir) / "audit.json").read_bytes()

"""What a training worker opens (:func:`nre_ray.run.loop.open_splits`): the splits' files in the local cache folder,
read by rows, else a per-node copy of the shared cache; in-memory arrays (tests, local runs) as they are."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from nre_ray.core import buildonce
from nre_ray.data.batches import EncodedSplit
from nre_ray.data.pipeline import Prepared, save_prepared, split_files_complete
from nre_ray.data.rowfile import RowFile
from nre_ray.data.vocab import Vocab
from nre_ray.run.loop import open_splits
from tests.helpers import tiny_data


def _cache(folder: Path) -> Path:
    data = tiny_data()
    prepared = Prepared({name: EncodedSplit(arrays, name) for name, arrays in data["splits"].items()},
                        Vocab(data["vocab"]), data["labels"], {})
    save_prepared(prepared, folder)
    return folder


def test_a_worker_opens_the_local_cache_folder_to_read_by_rows(tmp_path: Path) -> None:
    folder = _cache(tmp_path / "cache")
    assert split_files_complete(folder, ["train", "valid", "test"])
    splits = open_splits({"cache": {"dir": str(folder), "shared": None, "splits": ["train", "valid", "test"]}})
    assert list(splits) == ["train", "valid", "test"]
    assert isinstance(splits["train"].flat["tokens"], RowFile)
    expected = tiny_data()["splits"]
    for name, split in splits.items():
        assert np.array_equal(split.arrays["tokens"], expected[name]["tokens"])


def test_a_worker_without_the_local_folder_uses_the_shared_cache(tmp_path: Path) -> None:
    shared = _cache(tmp_path / "shared" / "key")  # a local path stands for the URI (local_copy returns it as is)
    splits = open_splits({"cache": {"dir": str(tmp_path / "elsewhere" / "key"), "shared": str(shared),
                                    "splits": ["train"]}})
    assert Path(splits["train"].flat["tokens"].path).parent == shared
    with pytest.raises(FileNotFoundError, match="not on this node"):
        open_splits({"cache": {"dir": str(tmp_path / "elsewhere" / "key"), "shared": None, "splits": ["train"]}})


def test_in_memory_splits_padded_or_flat_still_work() -> None:
    padded = tiny_data()["splits"]
    from_padded = open_splits({"splits": padded})
    from_flat = open_splits({"splits": {k: EncodedSplit(v).flat for k, v in padded.items()}})
    for name in padded:
        assert np.array_equal(from_padded[name].flat["tokens"], from_flat[name].flat["tokens"])
        assert from_padded[name].name == name


def test_a_worker_on_another_node_copies_the_shared_cache_in_the_bucket_once(
        tmp_path: Path, object_store: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from nre_ray import storage
    from nre_ray.data import shared_cache

    local = _cache(tmp_path / "driver" / "key")
    shared = storage.join(object_store, "worker-data", ".nre_ray_cache", "key")
    assert shared_cache.publish(local, shared)
    monkeypatch.setattr(buildonce, "default_cache_root", lambda: tmp_path / "node-copies")  # this test's "node"
    description = {"cache": {"dir": str(tmp_path / "not-on-this-node" / "key"), "shared": shared,
                             "splits": ["train", "test"]}}
    splits = open_splits(description)
    copy = Path(splits["train"].flat["tokens"].path).parent
    assert copy.is_relative_to(tmp_path / "node-copies") and isinstance(splits["test"].flat["labels"], RowFile)
    for name in ("train", "test"):
        assert np.array_equal(splits[name].arrays["tokens"], tiny_data()["splits"][name]["tokens"])
    again = open_splits(description)  # a second worker of the node: the same copy
    assert Path(again["train"].flat["tokens"].path).parent == copy
    assert len([p for p in (tmp_path / "node-copies").iterdir() if p.is_dir()]) == 1

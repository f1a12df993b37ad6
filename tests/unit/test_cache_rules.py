"""The preprocessing cache folder's rules without Ray (the protocol of :mod:`nre_ray.core.buildonce`): an older layout
is rebuilt, a builder that loses the race to another machine's uses the published cache, and only dead builders' private
folders are cleaned up. ``pipeline._prepare`` is replaced by a stand-in that writes what a build writes; the race of two
real runs on one machine is in tests/integration/test_cache_concurrency.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from nre_ray.config import DataConfig
from nre_ray.core import buildonce
from nre_ray.data import pipeline
from nre_ray.data.batches import ARRAY_KEYS, EncodedSplit
from nre_ray.data.rowfile import RowFile
from nre_ray.data.vocab import Vocab


def _stand_in(calls: list[Path], tag: str = "built") -> object:
    """A ``pipeline._prepare`` that records the folder it builds in and writes rejected.csv and pretrained/ there."""

    def build(cfg: DataConfig, files: dict, seed: int, folder: Path, pretrained: str | None = None,
              on_every_node: bool = False) -> object:
        calls.append(folder)
        assert folder.is_dir()
        arrays = {k: np.arange(6, dtype=np.int32).reshape(3, 2) if k.endswith("span") else
                  np.ones((3, 4), dtype=np.int32) if k in ("tokens", "head_pos", "tail_pos", "segments") else
                  np.arange(3, dtype=np.int64 if k == "labels" else np.int32) for k in ARRAY_KEYS}
        rejected = pd.DataFrame([["f.csv", 7, "row: bad", "s", "h", "t", "r"]], columns=pipeline.REJECTED_COLUMNS)
        rejected.to_csv(folder / "rejected.csv", index=False)
        (folder / "pretrained").mkdir()
        (folder / "pretrained" / "config.json").write_text("{}")
        return pipeline.Prepared({"train": EncodedSplit(arrays)}, Vocab(["<pad>", "<unk>", "x"]), [tag, "b"],
                                 {"train": "f.csv"}, rejected=rejected, rejected_count=1,
                                 rejected_csv=str(folder / "rejected.csv"), cache_dir=str(folder),
                                 pretrained_dir=str(folder / "pretrained"))

    return build


@pytest.fixture
def data_cfg(tmp_path: Path) -> DataConfig:
    train = tmp_path / "train.csv"
    train.write_text("sentence,head,head_offset,tail,tail_offset,relation\nA b .,A,0,b,2,r\n")
    return DataConfig(train=str(train), cache_dir=str(tmp_path / "cache"))


def _assert_points_into(prepared: pipeline.Prepared, cache: Path) -> None:
    assert prepared.cache_dir == str(cache)
    assert prepared.rejected_csv == str(cache / "rejected.csv") and Path(prepared.rejected_csv).is_file()
    assert prepared.pretrained_dir == str(cache / "pretrained") and Path(prepared.pretrained_dir).is_dir()


def test_an_older_layout_is_rebuilt_and_paths_point_into_the_published_folder(
        data_cfg: DataConfig, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[Path] = []
    monkeypatch.setattr(pipeline, "_prepare", _stand_in(calls))
    cache = pipeline.cache_folder(data_cfg, 1)
    built = pipeline.prepare(data_cfg, 1)
    assert not built.cache_hit and len(calls) == 1 and calls[0].parent == cache.parent and calls[0] != cache
    _assert_points_into(built, cache)
    assert pipeline.is_cached(data_cfg, 1)
    assert sorted(p.name for p in cache.parent.iterdir()) == [cache.name]

    again = pipeline.prepare(data_cfg, 1)
    assert again.cache_hit and len(calls) == 1
    _assert_points_into(again, cache)

    meta = json.loads((cache / pipeline.MARKER).read_text())  # as written before layouts were versioned
    del meta["layout"]
    (cache / pipeline.MARKER).write_text(json.dumps(meta))
    (cache / "stray-file-of-the-old-build").write_text("x")
    assert not pipeline.is_cached(data_cfg, 1)
    rebuilt = pipeline.prepare(data_cfg, 1)
    assert not rebuilt.cache_hit and len(calls) == 2
    _assert_points_into(rebuilt, cache)
    assert json.loads((cache / pipeline.MARKER).read_text())["layout"] == pipeline.LAYOUT
    assert not (cache / "stray-file-of-the-old-build").exists()
    assert sorted(p.name for p in cache.parent.iterdir()) == [cache.name]


@pytest.mark.parametrize("layout", [2, 3])
def test_a_cache_of_an_older_layout_is_rebuilt_not_misread(
        data_cfg: DataConfig, monkeypatch: pytest.MonkeyPatch, layout: int) -> None:
    """The cache as layout 2 wrote it (each split one padded ``.npz``) or layout 3 (flat ``.npy`` files with the
    positions and segments, no ``<split>.json``) is not a cache now: rebuilt, and the new folder holds this layout's
    files, none of the old ones."""
    calls: list[Path] = []
    monkeypatch.setattr(pipeline, "_prepare", _stand_in(calls))
    cache = pipeline.cache_folder(data_cfg, 1)
    pipeline.prepare(data_cfg, 1)
    for file in EncodedSplit.files("train"):
        (cache / file).unlink()
    old_files = [cache / "train.npz"] if layout == 2 else \
        [cache / f"train.{k}.npy" for k in ("tokens", "head_pos", "tail_pos", "segments", "offsets", "lengths")]
    for path in old_files:
        if path.suffix == ".npz":
            np.savez(path, tokens=np.full((3, 4), 7, dtype=np.int32), lengths=np.full(3, 4, dtype=np.int32))
        else:
            np.save(path, np.full(3, 7, dtype=np.int32))
    meta = json.loads((cache / pipeline.MARKER).read_text())
    (cache / pipeline.MARKER).write_text(json.dumps({**meta, "layout": layout}))
    assert pipeline.LAYOUT == 4 and not pipeline.is_cached(data_cfg, 1)
    assert not pipeline.split_files_complete(cache, ["train"])  # a training worker would not open it either

    rebuilt = pipeline.prepare(data_cfg, 1)
    assert not rebuilt.cache_hit and len(calls) == 2
    assert not any(path.exists() for path in old_files if path.name not in EncodedSplit.files("train"))
    assert all((cache / file).is_file() for file in EncodedSplit.files("train"))
    assert pipeline.split_files_complete(cache, ["train"])
    again = pipeline.prepare(data_cfg, 1)
    assert again.cache_hit and len(calls) == 2
    assert again.splits["train"].arrays["lengths"].tolist() == [0, 1, 2]  # the stand-in's rows, read back flat
    assert again.splits["train"].arrays["tokens"].tolist() == [[0, 0], [1, 0], [1, 1]]
    assert isinstance(again.splits["train"].flat["tokens"], RowFile)


def test_a_builder_that_loses_the_race_uses_the_published_cache(data_cfg: DataConfig,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    cache = pipeline.cache_folder(data_cfg, 1)
    calls: list[Path] = []
    build = _stand_in(calls, tag="mine")

    def lose(cfg: DataConfig, files: dict, seed: int, folder: Path, pretrained: str | None = None,
             on_every_node: bool = False) -> object:
        other = cache.parent / "other-run"  # the other run publishes first
        other.mkdir()
        pipeline.save_prepared(_stand_in([], tag="theirs")(cfg, files, seed, other), other)
        os.rename(other, cache)
        return build(cfg, files, seed, folder, pretrained)

    monkeypatch.setattr(pipeline, "_prepare", lose)
    prepared = pipeline.prepare(data_cfg, 1)
    assert prepared.labels == ["theirs", "b"] and len(calls) == 1
    _assert_points_into(prepared, cache)
    assert sorted(p.name for p in cache.parent.iterdir()) == [cache.name]

    monkeypatch.setattr(pipeline, "_prepare", build)
    rebuilt = pipeline.prepare(DataConfig(train=data_cfg.train, cache_dir=data_cfg.cache_dir, no_cache=True), 1)
    assert rebuilt.labels == ["mine", "b"] and not rebuilt.cache_hit  # --no-cache replaces the published cache
    assert pipeline.load_prepared(cache).labels == ["mine", "b"]
    _assert_points_into(rebuilt, cache)


def test_a_failed_build_leaves_nothing_and_only_dead_builders_folders_are_cleaned(
        data_cfg: DataConfig, monkeypatch: pytest.MonkeyPatch) -> None:
    cache = pipeline.cache_folder(data_cfg, 1)
    root = cache.parent
    root.mkdir(parents=True)
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    host = buildonce.HOST
    folders = {
        "dead": root / f"{cache.name}.tmp-{dead.pid}-0badc0de-{host}",
        "live": root / f"{cache.name}.tmp-{os.getpid()}-0badc0de-{host}",
        "old elsewhere": root / f"{'0' * 20}.tmp-1-0badc0de-{'f' * 8}",
        "recent elsewhere": root / f"{'0' * 20}.tmp-2-0badc0de-{'e' * 8}",
        "not ours": root / "notes.tmp-1-x",
    }
    for folder in folders.values():
        (folder / "staging").mkdir(parents=True)
    week_ago = time.time() - 7 * 86400
    for path in (folders["old elsewhere"] / "staging", folders["old elsewhere"]):
        os.utime(path, (week_ago, week_ago))

    def fail(cfg: DataConfig, files: dict, seed: int, folder: Path, pretrained: str | None = None,
             on_every_node: bool = False) -> object:
        (folder / "staging").mkdir()
        raise pipeline.DataError([pipeline.Problem("f.csv", 1, None, "bad")])

    monkeypatch.setattr(pipeline, "_prepare", fail)
    with pytest.raises(pipeline.DataError):
        pipeline.prepare(data_cfg, 1)
    left = {name for name, folder in folders.items() if folder.exists()}
    assert left == {"live", "recent elsewhere", "not ours"}
    assert sorted(p.name for p in root.iterdir()) == sorted(folders[name].name for name in left)


def test_the_shared_cache_is_fetched_through_a_private_folder_and_an_older_layout_there_is_replaced(
        data_cfg: DataConfig, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[Path] = []
    monkeypatch.setattr(pipeline, "_prepare", _stand_in(calls))
    shared = str(tmp_path / "shared")  # a local folder stands for the object store (same storage API)
    built = pipeline.prepare(data_cfg, 1, shared_cache=shared)
    key = pipeline.cache_folder(data_cfg, 1).name
    assert built.shared_cache_dir == f"{shared}/{key}" and len(calls) == 1

    other = DataConfig(train=data_cfg.train, cache_dir=str(tmp_path / "other-machine"))
    cache = pipeline.cache_folder(other, 1)
    assert not pipeline.is_cached(other, 1) and pipeline.is_cached(other, 1, shared_cache=shared)
    fetched = pipeline.prepare(other, 1, shared_cache=shared)
    assert fetched.cache_hit and len(calls) == 1
    _assert_points_into(fetched, cache)
    assert sorted(p.name for p in cache.parent.iterdir()) == [key]

    published = Path(shared) / key / pipeline.MARKER  # an older layout in the shared cache: not used, replaced
    meta = json.loads(published.read_text())
    del meta["layout"]
    published.write_text(json.dumps(meta))
    third = DataConfig(train=data_cfg.train, cache_dir=str(tmp_path / "third-machine"))
    assert not pipeline.is_cached(third, 1, shared_cache=shared)
    rebuilt = pipeline.prepare(third, 1, shared_cache=shared)
    assert not rebuilt.cache_hit and len(calls) == 2 and rebuilt.shared_cache_dir == f"{shared}/{key}"
    assert json.loads(published.read_text())["layout"] == pipeline.LAYOUT

"""The driver-side parts of the streaming pipeline, without Ray: the staging of out-of-order blocks, the validation
split, and the cache key."""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from nre_ray.config import DataConfig
from nre_ray.data import pipeline
from nre_ray.data.batches import token_counts, token_counts_arrow
from nre_ray.data.errors import DataError
from nre_ray.data.read import read_chunks


def old_split_valid(good: pd.DataFrame, fraction: float, seed: int) -> pd.DataFrame:
    """The in-memory version this pipeline replaced (whole frame with text): the draw must not change."""
    rng = np.random.default_rng(seed)
    train_idx = good.index[good["split"] == "train"]
    chosen = []
    for _, rows in good.loc[train_idx].groupby("relation", sort=True):
        if len(rows) < 2:
            continue
        take = max(1, round(len(rows) * fraction))
        chosen.extend(rng.choice(rows.index.to_numpy(), size=min(take, len(rows) - 1), replace=False).tolist())
    good.loc[chosen, "split"] = "valid"
    return good


@pytest.mark.parametrize("seed", [1, 7])
def test_valid_split_draws_the_same_rows_as_before_from_labels_and_lines_only(seed: int) -> None:
    rng = np.random.default_rng(0)
    n = 500
    relations = rng.choice(["b", "a", "no_relation", "c", "singleton_" + "x"], size=n, p=[.3, .3, .2, .199, .001])
    lines = np.cumsum(rng.integers(1, 3, size=n)) + 1  # blank lines and multi-line records skip numbers
    good = rng.random(n) > 0.05
    frame = pd.DataFrame({"split": "train", "relation": relations, "line": lines})[good]
    expected = old_split_valid(frame.copy(), 0.1, seed)
    codes, names = pd.factorize(relations)
    moved = pipeline._split_valid({"line": lines, "relation": codes.astype(np.int32)}, good, list(names), 0.1, seed)
    assert moved.tolist() == sorted(expected.loc[expected["split"] == "valid", "line"].tolist())


def staged_tables(path: Path, rows_per_chunk: int) -> list[pa.Table]:
    """What pass 1 yields for one train file: one STAGED table per chunk."""
    tables = []
    for seq, chunk in enumerate(read_chunks(path, rows_per_chunk=rows_per_chunk)):
        tables.append(pipeline._check_and_tokenize(chunk.assign(split="train", seq=seq, chunk_rows=len(chunk),
                                                                fatal=""), "regex", True))
    return tables


def test_stage_writes_blocks_that_arrive_out_of_order_and_sliced_in_file_order(tmp_path: Path,
                                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    source = pipeline.sample_dir() / "train.csv"
    tables = staged_tables(source, rows_per_chunk=37)
    pieces = []
    for table in tables:  # Ray may slice a block and deliver the slices in any order
        cut = random.Random(len(pieces)).randint(0, table.num_rows)
        pieces += [table.slice(0, cut), table.slice(cut)]
    random.Random(3).shuffle(pieces)
    monkeypatch.setattr(pipeline, "ROWS_PER_FILE", 100)
    (tmp_path / "st").mkdir()
    stage = pipeline._Stage(tmp_path / "st", ["train"])
    for piece in pieces:
        stage.add(piece)
    rows = stage.finish()
    expected = pa.concat_tables(tables)
    assert len(stage.files["train"]) > 1
    written = pa.concat_tables(pq.read_table(p) for p in stage.files["train"])
    assert written.column("line").to_pylist() == expected.column("line").to_pylist()
    assert written.column("tokens").to_pylist() == expected.column("tokens").to_pylist()
    assert rows["train"]["line"].tolist() == expected.column("line").to_pylist()
    assert rows["train"]["ntok"].tolist() == expected.column("ntok").to_pylist()
    relations = list(stage.relations)
    assert [relations[c] for c in rows["train"]["relation"]] == expected.column("relation").to_pylist()
    assert not stage.fatal


def test_stage_notices_a_missing_piece(tmp_path: Path) -> None:
    tables = staged_tables(pipeline.sample_dir() / "train.csv", rows_per_chunk=50)
    stage = pipeline._Stage(tmp_path, ["train"])
    stage.add(tables[0].slice(0, 10))
    with pytest.raises(RuntimeError, match="lost rows"):
        stage.finish()


def test_cache_key_follows_content_and_settings(tmp_path: Path) -> None:
    train = tmp_path / "train.csv"
    train.write_bytes((pipeline.sample_dir() / "train.csv").read_bytes())
    cfg = DataConfig(train=str(train), cache_dir=str(tmp_path / "cache"))
    first = pipeline.cache_folder(cfg, 1)
    assert pipeline.cache_folder(cfg, 1) == first and first.parent == tmp_path / "cache"
    assert pipeline.cache_folder(cfg, 2) != first
    assert pipeline.cache_folder(DataConfig(train=str(train), cache_dir=cfg.cache_dir, max_length=64), 1) != first
    data = bytearray(train.read_bytes())
    data[-2] = ord("x") if data[-2] != ord("x") else ord("y")  # one byte
    train.write_bytes(bytes(data))
    assert pipeline.cache_folder(cfg, 1) != first
    assert not pipeline.is_cached(cfg, 1)


def test_a_missing_input_file_is_a_data_error(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="file not found"):
        pipeline.cache_folder(DataConfig(train=str(tmp_path / "nope.csv")), 1)


def test_arrow_token_counts_equal_the_pandas_ones() -> None:
    rows = [["the", "acme", "the"], [], ["张", "the", "Acme"]]
    expected = token_counts(pd.DataFrame({"tokens": rows}))
    got = token_counts_arrow(pa.chunked_array([pa.array(rows[:2], pa.list_(pa.string())),
                                               pa.array(rows[2:], pa.list_(pa.string()))])).to_pandas()
    assert dict(zip(got["token"], got["count"], strict=True)) == dict(zip(expected["token"], expected["count"],
                                                                          strict=True))
    assert token_counts_arrow(pa.array([], pa.list_(pa.string()))).num_rows == 0


def test_ray_data_console_shows_warnings_only():
    """In a fresh process, as in the CLI: Ray Data configures its logger when imported, quiet_ray_data after it."""
    import subprocess
    import sys

    code = (
        "import logging\n"
        "from nre_ray.data.pipeline import quiet_ray_data\n"
        "quiet_ray_data()\n"
        "quiet_ray_data()\n"  # twice: still one filter, one line per warning
        "log = logging.getLogger('ray.data._internal.execution.streaming_executor')\n"
        "log.info('Starting execution of Dataset dataset_1')\n"
        "log.warning('Progress bars disabled. To enable, set ...')\n"
        "log.warning('a real warning')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert out.stderr.count("a real warning") == 1, out.stderr
    assert "Starting execution" not in out.stderr and "Progress bars" not in out.stderr

"""The parts of the streaming pipeline, without Ray: blocks staged, encoded and assembled out of order, the
validation split, and the cache key."""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

from nre_ray.config import DataConfig
from nre_ray.data import pipeline, stages
from nre_ray.data.batches import EncodedSplit, encode_split, token_counts, token_counts_arrow, tokenize_batch
from nre_ray.data.errors import DataError
from nre_ray.data.read import check_rows, read_chunks


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
def test_valid_split_draws_the_same_rows_as_before_from_the_counts_per_class(seed: int) -> None:
    rng = np.random.default_rng(0)
    n = 500
    relations = rng.choice(["b", "a", "no_relation", "c", "singleton_" + "x"], size=n, p=[.3, .3, .2, .199, .001])
    lines = np.cumsum(rng.integers(1, 3, size=n)) + 1  # blank lines and multi-line records skip numbers
    good = rng.random(n) > 0.05
    frame = pd.DataFrame({"split": "train", "relation": relations, "line": lines})[good]
    expected = old_split_valid(frame.copy(), 0.1, seed)
    drawn = stages.draw_valid(frame["relation"].value_counts().to_dict(), 0.1, seed)
    # the rows each block finds by their rank in their class, blocks of 37 rows with their starts
    table = pa.table({"relation": relations, "problem": np.where(good, "", "bad"), "line": lines})
    moved, starts = [], {}
    for first in range(0, n, 37):
        block = table.slice(first, 37)
        moved += block.column("line").to_numpy()[stages.moved_rows(block, "train", drawn, starts)].tolist()
        for name, count in pd.Series(block.filter(pa.array(good[first:first + 37])).column("relation")
                                     .to_numpy(zero_copy_only=False)).value_counts().items():
            starts[name] = starts.get(name, 0) + int(count)
    assert moved == sorted(expected.loc[expected["split"] == "valid", "line"].tolist())
    assert stages.moved_rows(table, "test", drawn, {}).sum() == 0


def test_blocks_staged_encoded_and_assembled_in_any_order_come_back_in_file_order(tmp_path: Path) -> None:
    """Passes 1, 3 and 4 without Ray: blocks sliced and handled in a shuffled order, as Ray may, give the arrays of
    the rows in file order, the driver sees only summaries, and the moved rows form valid."""
    source = pipeline.sample_dir() / "train.csv"
    pieces = []
    for chunk in read_chunks(source, rows_per_chunk=37):  # Ray may slice a block and run the slices in any order
        cut = random.Random(len(pieces)).randint(1, len(chunk))
        pieces += [chunk.iloc[:cut], chunk.iloc[cut:]]
    random.Random(3).shuffle(pieces)
    work = tmp_path / "work"
    scan = pipeline._Scan(["train"])
    for piece in pieces:
        if len(piece):
            scan.add(stages.stage_block(piece.assign(split="train", fatal=""), "regex", True, str(work)))
    whole = tokenize_batch(check_rows(pd.concat(list(read_chunks(source)), ignore_index=True)), "regex", True)
    good = whole[whole["problem"] == ""]
    assert {r: n for r, (n, _) in scan.relations["train"].items()} == good["relation"].value_counts().to_dict()
    assert scan.problem_rows["train"] == len(whole) - len(good) and not scan.fatal

    labels = sorted(set(good["relation"]))
    drawn = stages.draw_valid(good["relation"].value_counts().to_dict(), 0.1, 1)
    paths = pd.DataFrame(scan.block_items("train"))
    counts = pd.concat([t.to_pandas() for t in stages.train_token_counts(paths, labels, drawn)])
    vocab = ["<pad>", "<unk>", *sorted(set(counts["token"]))]
    written = pa.concat_tables(stages.encode_files(paths, str(work), labels, drawn, 24, 5,
                                                   {"labels": labels, "where": "x"}, vocab=vocab))
    assert sum(written.column("rows").to_pylist()) == len(good)
    rank = good.groupby("relation").cumcount().to_numpy()  # each good row's rank in its class, in file order
    moved = good["line"].to_numpy()[[r in drawn and k in drawn[r] for r, k in zip(good["relation"], rank,
                                                                                  strict=True)]]
    assert len(moved) == sum(len(v) for v in drawn.values()) > 0
    result = stages.assemble_split(str(work), "train", labels, 24, 5, 1)
    valid = stages.assemble_split(str(work), "valid", labels, 24, 5, 1, train_keys=str(work / "train_keys.npy"))
    to_valid = good["line"].isin(moved)
    for name, rows, info in (("train", good[~to_valid], result), ("valid", good[to_valid], valid)):
        expected = encode_split(rows, vocab, labels, 24, 5).arrays
        got = EncodedSplit.open(work, name).arrays  # positions and segments derived from the stored spans
        for key, array in expected.items():
            assert np.array_equal(got[key], array), (name, key)
        assert info["rows"] == len(rows) and info["info"]["rows"] == len(rows)
    assert "shared_with_train" in valid["info"] and "shared_with_train" not in result["info"]


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

"""The streaming preprocessing on the session's real Ray: the same arrays as a plain single-process computation, bad
rows skipped or reported (first 20 and a count), a file that breaks half-way, the cache, and the inspect CLI."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from nre_ray.config import DataConfig
from nre_ray.data import pipeline
from nre_ray.data.__main__ import main as data_main
from nre_ray.data.batches import EncodedSplit, encode_batch, token_counts, tokenize_batch
from nre_ray.data.errors import DataError
from nre_ray.data.read import check_rows, read_labels, read_table
from nre_ray.data.vocab import Vocab

pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]
HEADER = "sentence,head,head_offset,tail,tail_offset,relation"


def reference(files: dict[str, Path], cfg: DataConfig) -> tuple[dict[str, EncodedSplit], Vocab, list[str]]:
    """The same steps in one process over whole files (for data whose splits are all given and all good)."""
    frames = {s: tokenize_batch(check_rows(read_table(files[s])), cfg.tokenizer, cfg.lowercase, cfg.entity_markers,
                                cfg.typed_markers)
              for s in ("train", "valid", "test")}
    assert all((f["problem"] == "").all() for f in frames.values())
    labels = read_labels(files["labels"])
    counts = token_counts(frames["train"])
    vocab = Vocab.build(dict(zip(counts["token"], counts["count"], strict=True)), cfg.min_freq)
    splits = {s: EncodedSplit.from_frame(encode_batch(f, vocab.tokens, labels, cfg.max_length, cfg.position_window))
              for s, f in frames.items()}
    return splits, vocab, labels


def test_streamed_preprocessing_equals_the_single_process_steps(ray_cluster, tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch,
                                                                capsys: pytest.CaptureFixture[str],
                                                                caplog: pytest.LogCaptureFixture) -> None:
    # Tiny chunks, blocks and staged files: many out-of-order pieces to put back together.
    monkeypatch.setattr(pipeline, "ROWS_PER_CHUNK", 97)
    monkeypatch.setattr(pipeline, "BLOCK_BYTES", 30_000)
    cache = tmp_path / "cache"
    audit_json = tmp_path / "audit.json"
    assert data_main(["inspect", "--cache-dir", str(cache), "--max-length", "24", "--json", str(audit_json)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("# Data audit") and "| train | 3000 | 0 |" in out

    cfg = DataConfig(cache_dir=str(cache), max_length=24)
    with caplog.at_level(logging.INFO, logger="nre_ray"):
        prepared = pipeline.prepare(cfg, 1)  # what inspect left in the cache
    assert prepared.cache_hit and "reused the cache" in caplog.text
    splits, vocab, labels = reference(pipeline.resolve_files(cfg), cfg)
    assert prepared.labels == labels and prepared.vocab.tokens == vocab.tokens
    assert list(prepared.splits) == ["train", "valid", "test"]
    for name, split in splits.items():
        for key, expected in split.arrays.items():
            got = prepared.splits[name].arrays[key]
            assert got.dtype == expected.dtype and np.array_equal(got, expected), (name, key)

    audit = json.loads(audit_json.read_text(encoding="utf-8"))
    assert audit == prepared.audit
    assert {s: audit["splits"][s]["rows"] for s in audit["splits"]} == {"train": 3000, "valid": 500, "test": 500}
    assert sum(audit["splits"]["test"]["labels"].values()) == 500
    truncated = int((prepared.splits["train"].arrays["lengths"] == 24).sum())
    assert audit["splits"]["train"]["truncated"] <= truncated
    unk = sum(int((s.arrays["tokens"][:, :] == 1).sum()) for s in [prepared.splits["test"]])
    assert audit["splits"]["test"]["oov_tokens"] == unk


def bad_data(folder: Path, bad_train_rows: int = 25) -> dict[str, Path]:
    """A slice of the sample with bad training rows appended and one unknown label in valid."""
    sample = pipeline.sample_dir()
    folder.mkdir(parents=True, exist_ok=True)
    train = pd.read_csv(sample / "train.csv", keep_default_na=False).head(300)
    lines = train.to_csv(index=False).splitlines()
    sentences = [f"row {i} has its head elsewhere" for i in range(bad_train_rows - 2)]
    bad = [f"tr-{i},{s},row,3,elsewhere,{s.index('elsewhere')},born_in,," for i, s in enumerate(sentences)]
    bad += ["tr-x,,,0,B,3,born_in,,", "tr-y,too,few"]  # an empty sentence and head, a short row
    (folder / "train.csv").write_text("\n".join(lines + bad) + "\n", encoding="utf-8")
    valid = pd.read_csv(sample / "valid.csv", keep_default_na=False).head(60)
    valid.loc[len(valid)] = ["v-x", "A likes B.", "A", 0, "B", 8, "likes", "", ""]
    valid.to_csv(folder / "valid.csv", index=False)
    pd.read_csv(sample / "test.csv", keep_default_na=False).head(60).to_csv(folder / "test.csv", index=False)
    return {"train": folder / "train.csv", "valid": folder / "valid.csv"}


def test_bad_rows_error_lists_twenty_then_counts_and_skip_trains_on_the_rest(ray_cluster, tmp_path: Path,
                                                                             caplog: pytest.LogCaptureFixture) -> None:
    files = bad_data(tmp_path / "data")
    cfg = DataConfig(data_dir=str(tmp_path / "data"), cache_dir=str(tmp_path / "cache"))
    with pytest.raises(DataError) as info:
        pipeline.prepare(cfg, 1)
    err = info.value
    train = str(files["train"])
    assert err.total == 27 and len(err.problems) == 20  # 25 bad training rows (one with two problems), 1 in valid
    assert [p.line for p in err.problems] == list(range(302, 322))
    assert str(err.problems[0]) == (f"{train}:302: head_offset: the sentence does not have head at offset 3 "
                                    "(expected 'row', found ' 0 '), but head 'row' occurs at offset 0")
    lines = str(err).splitlines()
    assert lines[20] == "... and 7 more problems" and "--on-bad-rows skip" in lines[21]
    assert not pipeline.is_cached(cfg, 1)

    skip = DataConfig(data_dir=cfg.data_dir, cache_dir=cfg.cache_dir, on_bad_rows="skip")
    prepared = pipeline.prepare(skip, 1)
    assert not prepared.cache_hit and prepared.rejected_count == 26
    assert {s: len(x) for s, x in prepared.splits.items()} == {"train": 300, "valid": 60, "test": 60}
    rejected = pd.read_csv(prepared.rejected_csv, keep_default_na=False)
    assert rejected.columns.tolist() == pipeline.REJECTED_COLUMNS and len(rejected) == 26
    assert rejected["line"].tolist() == [*range(302, 327), 62]
    assert rejected["file"].tolist() == [train] * 25 + [str(files["valid"])]
    assert rejected["problem"].iloc[-2] == ("row: wrong number of fields (expected 9 like the header, found 3)")
    assert rejected["problem"].iloc[-1].startswith("relation: label 'likes' is not in the training split")
    assert rejected["problem"].iloc[-3].startswith("sentence: empty (expected the sentence text); head: empty")
    pd.testing.assert_frame_equal(prepared.rejected, rejected, check_dtype=False)
    assert {s: i["rejected"] for s, i in prepared.audit["splits"].items()} == {"train": 25, "valid": 1, "test": 0}

    with caplog.at_level(logging.INFO, logger="nre_ray"):
        again = pipeline.prepare(skip, 1)
    assert again.cache_hit and "reused the cache" in caplog.text
    assert again.rejected_count == 26 and len(again.rejected) == 26 and again.audit == prepared.audit
    for name, split in prepared.splits.items():
        assert all(np.array_equal(v, again.splits[name].arrays[k]) for k, v in split.arrays.items())

    rebuilt = pipeline.prepare(DataConfig(data_dir=cfg.data_dir, cache_dir=cfg.cache_dir, on_bad_rows="skip",
                                          no_cache=True), 1)
    assert not rebuilt.cache_hit and rebuilt.rejected_count == 26
    assert np.array_equal(rebuilt.splits["train"].arrays["tokens"], prepared.splits["train"].arrays["tokens"])
    data = bytearray(files["valid"].read_bytes())
    data[data.index(b"A likes B")] = ord("a")  # one byte of one input
    files["valid"].write_bytes(bytes(data))
    assert not pipeline.is_cached(skip, 1)


def test_a_file_that_breaks_half_way_is_one_clean_error(ray_cluster, tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pipeline, "ROWS_PER_CHUNK", 20)
    good = "张三是ABC公司的董事长,张三,0,ABC公司,3,董事长"
    path = tmp_path / "train.csv"
    path.write_bytes("\n".join([HEADER] + [good] * 100).encode() + b"\n" + good.encode("gbk") + b"\n")
    with pytest.raises(DataError) as info:
        pipeline.prepare(DataConfig(train=str(path), cache_dir=str(tmp_path / "cache")), 1)
    [problem] = info.value.problems
    assert (problem.file, problem.line) == (str(path), 102)
    assert problem.message.startswith("not valid UTF-8: byte 0xd5") and "GB18030" in problem.message
    assert "iconv" in info.value.hint


def test_inspect_command_on_bad_rows_exits_2_without_a_traceback(tmp_path: Path) -> None:
    bad_data(tmp_path / "data")
    env = {**os.environ, "RAY_DATA_DISABLE_PROGRESS_BARS": "1"}
    done = subprocess.run([sys.executable, "-m", "nre_ray.data", "inspect", "--data-dir", str(tmp_path / "data"),
                           "--cache-dir", str(tmp_path / "cache")], capture_output=True, text=True, env=env,
                          timeout=600)
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr and "Traceback" not in done.stdout
    err = done.stderr.splitlines()
    start = err.index("error: bad input data")
    listed = err[start + 1:start + 21]
    assert all(line.startswith(str(tmp_path / "data" / "train.csv") + ":3") for line in listed)
    assert err[start + 21] == "... and 7 more problems"

"""Checks on the bundled sample dataset in ``nre_ray/data/sample`` and its generator script."""

from __future__ import annotations

import csv
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SAMPLE_DIR = ROOT / "nre_ray" / "data" / "sample"
SCRIPT = ROOT / "scripts" / "make_sample.py"
SPLITS = ("train", "valid", "test")
FILES = (*(f"{split}.csv" for split in SPLITS), "relation.txt")
HEADER = ["id", "sentence", "head", "head_offset", "tail", "tail_offset", "relation", "head_type", "tail_type"]
NEGATIVE = "no_relation"


def read_split(split: str) -> tuple[list[str], list[dict[str, str]]]:
    """Return (header, rows) of one shipped split, read with the csv module."""
    with open(SAMPLE_DIR / f"{split}.csv", encoding="utf-8", newline="") as f:
        reader = csv.reader(f)
        header = next(reader)
        return header, [dict(zip(header, row, strict=True)) for row in reader]


def read_labels() -> list[str]:
    """Return the labels listed in ``relation.txt``, in file order."""
    return (SAMPLE_DIR / "relation.txt").read_text(encoding="utf-8").splitlines()


@pytest.mark.parametrize("split", SPLITS)
def test_header_and_line_endings(split: str) -> None:
    header, rows = read_split(split)
    assert header == HEADER
    assert rows, f"{split}.csv is empty"
    assert b"\r" not in (SAMPLE_DIR / f"{split}.csv").read_bytes()


@pytest.mark.parametrize("split", SPLITS)
def test_offsets_hold_on_every_row(split: str) -> None:
    _, rows = read_split(split)
    for row in rows:
        sentence = row["sentence"]
        for entity, offset in ((row["head"], int(row["head_offset"])), (row["tail"], int(row["tail_offset"]))):
            assert entity, row
            assert offset >= 0, row
            assert sentence[offset : offset + len(entity)] == entity, row
        assert row["head_type"] and row["tail_type"], row


@pytest.mark.parametrize("split", SPLITS)
def test_every_split_has_negative_and_at_least_six_relations(split: str) -> None:
    _, rows = read_split(split)
    labels = {row["relation"] for row in rows}
    assert NEGATIVE in labels
    assert len(labels - {NEGATIVE}) >= 6


def test_relation_txt_lists_exactly_the_labels() -> None:
    listed = read_labels()
    assert len(listed) == len(set(listed)), "duplicate label in relation.txt"
    assert all(label and label == label.strip() for label in listed)
    used = {row["relation"] for split in SPLITS for row in read_split(split)[1]}
    assert set(listed) == used
    for split in SPLITS:  # stratified: every class is present in every split
        assert {row["relation"] for row in read_split(split)[1]} == used


def test_ids_unique_and_no_duplicate_sentences() -> None:
    rows = [row for split in SPLITS for row in read_split(split)[1]]
    assert len({row["id"] for row in rows}) == len(rows)
    assert len({row["sentence"] for row in rows}) == len(rows)


def test_no_sentence_shared_between_train_and_test() -> None:
    train = {row["sentence"] for row in read_split("train")[1]}
    test = {row["sentence"] for row in read_split("test")[1]}
    assert not train & test


def test_script_reproduces_shipped_files(tmp_path: Path) -> None:
    subprocess.run([sys.executable, str(SCRIPT), "--out", str(tmp_path)], check=True, capture_output=True)
    for name in FILES:
        assert (tmp_path / name).read_bytes() == (SAMPLE_DIR / name).read_bytes(), name

"""The data audit's pure computation: per-row numbers, the audit dict, its warnings and its Markdown."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd

from nre_ray.data.audit import build_audit, row_stats, to_markdown, write_audit
from nre_ray.data.batches import tokenize_batch
from nre_ray.data.read import check_rows


def tokenized(rows: list[tuple[str, str, int, str, int, str]]) -> pd.DataFrame:
    frame = pd.DataFrame(rows, columns=["sentence", "head", "head_offset", "tail", "tail_offset", "relation"])
    return tokenize_batch(check_rows(frame.assign(problem="")), "regex", True)


def split(labels: list[int], keys: list[int], ntok: list[int] | None = None, gap: list[int] | None = None,
          reach: list[int] | None = None, overlap: list[bool] | None = None) -> dict[str, np.ndarray]:
    n = len(labels)
    return {"label": np.asarray(labels), "key": np.asarray(keys, dtype=np.uint64),
            "ntok": np.asarray(ntok or [10] * n), "gap": np.asarray(gap or [1] * n),
            "reach": np.asarray(reach or [3] * n), "overlap": np.asarray(overlap or [False] * n)}


def test_row_stats_lengths_distances_overlap_and_keys() -> None:
    frame = tokenized([
        ("Acme hired Ann in Paris .", "Acme", 0, "Ann", 11, "hired"),       # 1 token between them
        ("Ann works at Acme", "Acme", 13, "Ann", 0, "works"),               # tail first: 2 between
        ("The University of Oxford Press", "University of Oxford Press", 4, "Oxford", 18, "part"),  # nested
        ("Acme hired Ann in Paris .", "Acme", 0, "Ann", 11, "other"),       # same example, another label
    ])
    stats = row_stats(frame)
    assert stats["ntok"].tolist() == [6, 4, 5, 6]
    assert stats["gap"].tolist() == [1, 2, 0, 1]
    assert stats["reach"].tolist() == [3, 4, 4, 3]
    assert stats["overlap"].tolist() == [False, False, True, False]
    keys = stats["key"]
    assert keys.dtype == np.uint64 and keys[0] == keys[3] and len(set(keys[:3].tolist())) == 3


def test_audit_counts_duplicates_overlap_truncation_oov_and_labels() -> None:
    labels = ["a", "b", "c"]
    rows = {
        "train": split([0, 0, 1, 1, 0, 2], [1, 1, 2, 3, 3, 4], ntok=[5, 5, 20, 8, 8, 200], gap=[0, 0, 3, 1, 1, 150],
                       reach=[2, 2, 6, 3, 3, 160], overlap=[False, False, True, False, False, False]),
        "valid": split([0, 1], [5, 2]),
        "test": split([0, 0, 1], [1, 6, 7]),
    }
    audit = build_audit(rows, labels, max_length=128, rejected={"train": 2, "test": 1},
                        oov={"valid": (1, 20), "test": (5, 25)})
    train, valid, test = (audit["splits"][s] for s in ("train", "valid", "test"))
    assert train["rows"] == 6 and train["rejected"] == 2 and test["rejected"] == 1
    assert train["labels"] == {"a": 3, "b": 2, "c": 1} and valid["labels"] == {"a": 1, "b": 1, "c": 0}
    assert train["duplicates"] == 2 and train["conflicting_duplicates"] == 2  # key 3 carries labels b and a
    assert valid["shared_with_train"] == 1 and test["shared_with_train"] == 1 and "shared_with_train" not in train
    assert train["truncated"] == 1 and train["entity_cut"] == 1 and train["overlapping_entities"] == 1
    assert train["length"] == {"mean": 41.0, "p50": 8, "p90": 200, "p95": 200, "p99": 200, "max": 200}
    assert train["distance"]["max"] == 150 and train["distance"]["p50"] == 1
    assert valid["oov_rate"] == 0.05 and test["oov_tokens"] == 5 and test["tokens"] == 25
    assert "oov_rate" not in train
    json.dumps(audit)  # JSON-serialisable as it is


def test_warnings_name_what_spoils_a_result() -> None:
    labels = ["a", "b", "c", "rare"]
    rows = {
        "train": split([0] * 6 + [1] * 6 + [2] * 6 + [3] * 2, list(range(20)),
                       reach=[3] * 19 + [300]),
        "valid": split([0, 1], [100, 101]),
        "test": split([0, 1, 2, 3], [0, 1, 102, 103]),  # two rows also in train
    }
    warnings = build_audit(rows, labels, max_length=128)["warnings"]
    assert any(w.startswith("train/test overlap: 2 of 4 test rows (50.0%)") for w in warnings)
    assert "2 classes with training rows have no validation rows: c, rare" in warnings
    assert "1 class with fewer than 5 training examples: rare (2)" in warnings
    assert any(w.startswith("train: in 1 rows the entities are more than --max-length 128") for w in warnings)
    assert not any("valid overlap" in w for w in warnings)


def test_clean_data_has_no_warnings_and_markdown_lists_every_split(tmp_path: Path) -> None:
    rows = {"train": split([0] * 5 + [1] * 5, list(range(10))), "valid": split([0, 1], [20, 21]),
            "test": split([0, 1], [30, 31])}
    audit = build_audit(rows, ["x", "y"], max_length=64, oov={"test": (0, 10)}, valid_from_train=True)
    assert audit["warnings"] == []
    text = to_markdown(audit)
    assert text.startswith("# Data audit\n\nNo warnings.")
    assert "## Rows (valid drawn from train)" in text and "| test | 2 | 0 | 0 | 0 | 0 | 0 | 0 | 0.0% |" in text
    assert "| x | 5 | 1 | 1 |" in text and "## Sentence length in tokens" in text
    md, js = write_audit(audit, tmp_path / "out")
    assert md.read_text(encoding="utf-8") == text and json.loads(js.read_text(encoding="utf-8")) == audit


def test_frames_work_as_well_as_arrays() -> None:
    rows = {"train": pd.DataFrame(split([0, 1, 1], [1, 2, 2]))}
    audit = build_audit(rows, ["x", "y"], max_length=8)
    assert audit["splits"]["train"]["duplicates"] == 1 and audit["splits"]["train"]["labels"] == {"x": 1, "y": 2}

"""The data audit: what the data looks like before anyone spends GPU hours on it. Pure functions, no Ray.

* :func:`row_stats` adds a few numbers to each tokenized row (run per block by the pipeline, next to tokenization).
* :func:`build_audit` turns the numbers of the rows that are trained on into the audit dict: rows per split, label
  distribution, duplicates, rows shared with train, length and distance percentiles, truncation, out-of-vocabulary
  rate, overlapping entities, and warnings for what silently spoils a result.
* :func:`to_markdown` renders it for people (``python -m nre_ray.data inspect``, MLflow ``data/audit.md``);
  :func:`write_audit` writes ``audit.md`` and ``audit.json``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

ROW_STATS = ("ntok", "gap", "reach", "key", "overlap")
"""Columns :func:`row_stats` adds (see there)."""
KEY_COLUMNS = ("sentence", "head", "head_offset", "tail", "tail_offset")
"""Two rows are the same example when these are equal (the relation may differ: then they conflict)."""
PERCENTILES = (50, 90, 95, 99)
MIN_EXAMPLES = 5
"""A class with fewer training examples than this gets a warning."""
SPLIT_ORDER = ("train", "valid", "test")


def row_stats(tokenized: pd.DataFrame) -> dict[str, np.ndarray]:
    """Per-row numbers of a tokenized batch (``tokenize_batch`` output: checked offsets, tokens, token spans).

    Returns arrays of ``len(tokenized)``: ``ntok`` (tokens in the sentence, int32), ``gap`` (tokens between the two
    entities, 0 when they touch or overlap, int32), ``reach`` (tokens from the start of the first entity to the end
    of the last: a ``--max-length`` below it cuts an entity, int32), ``key`` (uint64 hash of sentence, head,
    head_offset, tail, tail_offset: equal rows have equal keys) and ``overlap`` (the head and tail character spans
    share a character). Values of rows with a ``problem`` are meaningless (they are not trained on).
    """
    n = len(tokenized)
    ntok = np.fromiter((len(t) for t in tokenized["tokens"]), dtype=np.int64, count=n)
    hs, he, ts, te = (tokenized[c].to_numpy(dtype=np.int64) for c in ("head_start", "head_end", "tail_start",
                                                                      "tail_end"))
    gap = np.maximum(np.maximum(hs, ts) - np.minimum(he, te), 0)
    reach = np.maximum(he, te) - np.minimum(hs, ts)
    head_at, tail_at = (tokenized[c].to_numpy(dtype=np.int64) for c in ("head_offset", "tail_offset"))
    head_len = np.fromiter(map(len, tokenized["head"]), dtype=np.int64, count=n)
    tail_len = np.fromiter(map(len, tokenized["tail"]), dtype=np.int64, count=n)
    overlap = (head_at >= 0) & (tail_at >= 0) & (head_at < tail_at + tail_len) & (tail_at < head_at + head_len)
    if n:
        key = pd.util.hash_pandas_object(tokenized[list(KEY_COLUMNS)], index=False).to_numpy(dtype=np.uint64)
    else:
        key = np.zeros(0, dtype=np.uint64)
    return {"ntok": ntok.astype(np.int32), "gap": gap.astype(np.int32), "reach": reach.astype(np.int32),
            "key": key, "overlap": overlap}


def _summary(values: np.ndarray) -> dict[str, float]:
    if not len(values):
        return {}
    out = {"mean": round(float(values.mean()), 1)}
    for p, v in zip(PERCENTILES, np.percentile(values, PERCENTILES, method="higher"), strict=True):
        out[f"p{p}"] = int(v)
    out["max"] = int(values.max())
    return out


def _column(rows: Any, name: str) -> np.ndarray:
    return np.asarray(rows[name])


def build_audit(
    rows: Mapping[str, Any],
    labels: Sequence[str],
    max_length: int,
    rejected: Mapping[str, int] | None = None,
    oov: Mapping[str, tuple[int, int]] | None = None,
    valid_from_train: bool = False,
) -> dict[str, Any]:
    """The audit of the rows that are trained on.

    Args:
        rows: split name -> the split's rows as a DataFrame or a dict of arrays with ``label`` (class id into
            ``labels``) and the :data:`ROW_STATS` columns.
        labels: the class names.
        max_length: ``--max-length``: rows with more tokens are truncated.
        rejected: split name -> rows left out as bad (``--on-bad-rows skip``).
        oov: split name -> ``(tokens that are not in the vocabulary, tokens)`` over the encoded (truncated) rows.
        valid_from_train: the validation split was drawn from train (no validation file).

    Returns:
        A JSON-serialisable dict: ``max_length``, ``valid_from_train``, ``labels``, ``splits`` (per split: ``rows``,
        ``rejected``, ``labels`` (count per class), ``duplicates`` (rows repeating an earlier row of the split),
        ``conflicting_duplicates`` (such rows whose relation differs), ``shared_with_train`` (valid/test rows also in
        train), ``length`` and ``distance`` (mean, p50, p90, p95, p99, max: sentence length and tokens between the
        entities), ``truncated`` (rows longer than max_length), ``entity_cut`` (rows whose entities do not fit in
        max_length together), ``overlapping_entities``, ``tokens``, ``oov_tokens``, ``oov_rate``) and ``warnings``.
    """
    rejected = dict(rejected or {})
    oov = dict(oov or {})
    names = [s for s in SPLIT_ORDER if s in rows] + [s for s in rows if s not in SPLIT_ORDER]
    train_keys = np.unique(_column(rows["train"], "key")) if "train" in rows else np.zeros(0, dtype=np.uint64)
    splits: dict[str, dict[str, Any]] = {}
    for name in names:
        split = rows[name]
        label = _column(split, "label").astype(np.int64)
        key = _column(split, "key").astype(np.uint64)
        ntok = _column(split, "ntok")
        counts = np.bincount(label[label >= 0], minlength=len(labels))
        info: dict[str, Any] = {
            "rows": len(label),
            "rejected": int(rejected.get(name, 0)),
            "labels": {str(lab): int(c) for lab, c in zip(labels, counts, strict=False)},
            "duplicates": int(len(key) - len(np.unique(key))),
            "conflicting_duplicates": _conflicts(key, label),
        }
        if name != "train":
            info["shared_with_train"] = int(np.isin(key, train_keys).sum())
        info["length"] = _summary(ntok)
        info["distance"] = _summary(_column(split, "gap"))
        info["truncated"] = int((ntok > max_length).sum())
        info["entity_cut"] = int((_column(split, "reach") > max_length).sum())
        info["overlapping_entities"] = int(_column(split, "overlap").astype(bool).sum())
        if name in oov:
            unknown, total = oov[name]
            info.update(tokens=int(total), oov_tokens=int(unknown),
                        oov_rate=round(unknown / total, 4) if total else 0.0)
        splits[name] = info
    for name in [s for s in rejected if s not in splits and rejected[s]]:
        splits[name] = {"rows": 0, "rejected": int(rejected[name])}
    audit = {"max_length": int(max_length), "valid_from_train": bool(valid_from_train), "labels": list(labels),
             "splits": splits}
    audit["warnings"] = warnings_of(audit)
    return audit


def _conflicts(key: np.ndarray, label: np.ndarray) -> int:
    """Rows whose key occurs with more than one label in the split."""
    if not len(key):
        return 0
    pairs = pd.DataFrame({"key": key, "label": label})
    labels_per_key = pairs.drop_duplicates().groupby("key")["label"].size()
    conflicted = labels_per_key.index[labels_per_key.to_numpy() > 1]
    return int(pairs["key"].isin(conflicted).sum())


def _names(items: Sequence[str], limit: int = 8) -> str:
    shown = ", ".join(items[:limit])
    return shown + (f", ... ({len(items)} in all)" if len(items) > limit else "")


def warnings_of(audit: Mapping[str, Any]) -> list[str]:
    """Plain-language warnings about what silently spoils a result (see :func:`build_audit` for the fields)."""
    splits = audit["splits"]
    labels = audit["labels"]
    out = []
    train = splits.get("train", {})
    for name in ("test", "valid"):
        shared = splits.get(name, {}).get("shared_with_train", 0)
        if shared:
            rows = splits[name]["rows"]
            where = " (the validation split is drawn from train, so duplicates in train end up on both sides)" \
                if name == "valid" and audit.get("valid_from_train") else ""
            out.append(f"train/{name} overlap: {shared} of {rows} {name} rows ({shared / rows:.1%}) have the same "
                       f"sentence, head, tail and offsets as a training row; {name} scores are optimistic{where}")
    for name, word in (("valid", "validation"), ("test", "test")):
        if name in splits and splits[name].get("rows"):
            missing = [lab for lab in labels if splits[name]["labels"].get(lab, 0) == 0
                       and train.get("labels", {}).get(lab, 0) > 0]
            if missing:
                out.append(f"{len(missing)} class{'es' if len(missing) > 1 else ''} with training rows "
                           f"{'have' if len(missing) > 1 else 'has'} no {word} rows: {_names(missing)}")
    if train:
        few = [f"{lab} ({n})" for lab, n in train["labels"].items() if n < MIN_EXAMPLES]
        if few:
            out.append(f"{len(few)} class{'es' if len(few) > 1 else ''} with fewer than {MIN_EXAMPLES} training "
                       f"examples: {_names(few)}")
    for name in SPLIT_ORDER:
        info = splits.get(name, {})
        if info.get("conflicting_duplicates"):
            out.append(f"{name}: {info['conflicting_duplicates']} rows repeat the same sentence, head, tail and "
                       "offsets with different relations")
        if info.get("entity_cut"):
            out.append(f"{name}: in {info['entity_cut']} rows the entities are more than --max-length "
                       f"{audit['max_length']} tokens apart, so truncation cuts one of them; raise --max-length")
    return out


def _cell(value: Any) -> str:
    return "" if value is None else f"{value:.1f}" if isinstance(value, float) else str(value)


def _percent(value: float | None) -> str | None:
    return None if value is None else f"{value:.1%}"


def _table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" if i == 0 else "---:" for i in range(len(header)))
             + "|"]
    lines += ["| " + " | ".join(_cell(v) for v in row) + " |" for row in rows]
    return lines


def to_markdown(audit: Mapping[str, Any]) -> str:
    """The audit as a Markdown report: warnings, then tables per split, then the label distribution."""
    splits = audit["splits"]
    names = [s for s in splits if splits[s].get("rows")]
    lines = ["# Data audit", ""]
    if audit["warnings"]:
        lines += ["## Warnings", ""] + [f"- {w}" for w in audit["warnings"]] + [""]
    else:
        lines += ["No warnings.", ""]
    note = " (valid drawn from train)" if audit.get("valid_from_train") else ""
    lines += [f"## Rows{note}", ""]
    rows = []
    for name in splits:
        info = splits[name]
        rows.append([name, info.get("rows", 0), info.get("rejected", 0), info.get("duplicates"),
                     info.get("shared_with_train"), info.get("overlapping_entities"), info.get("truncated"),
                     info.get("entity_cut"), _percent(info.get("oov_rate"))])
    lines += _table(["split", "rows", "rejected", "duplicates", "also in train", "overlapping head/tail",
                     f"longer than {audit['max_length']} tokens", "entity cut by truncation", "OOV rate"], rows)
    for key, title in (("length", "Sentence length in tokens"),
                       ("distance", "Tokens between head and tail")):
        header = ["split", "mean", *[f"p{p}" for p in PERCENTILES], "max"]
        body = [[name, *[splits[name][key].get(h) for h in header[1:]]] for name in names]
        lines += ["", f"## {title}", "", *_table(header, body)]
    lines += ["", "## Labels", ""]
    body = [[label, *[splits[name]["labels"].get(label, 0) for name in names]] for label in audit["labels"]]
    lines += _table(["label", *names], body)
    return "\n".join(lines) + "\n"


def write_audit(audit: Mapping[str, Any], folder: Path) -> list[Path]:
    """Write ``audit.md`` and ``audit.json`` into ``folder``; returns their paths."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    md, js = folder / "audit.md", folder / "audit.json"
    md.write_text(to_markdown(audit), encoding="utf-8")
    js.write_text(json.dumps(audit, indent=2, ensure_ascii=False), encoding="utf-8")
    return [md, js]

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
    return histogram_summary(np.bincount(np.asarray(values, dtype=np.int64))) if len(values) else {}


def histogram_summary(counts: np.ndarray) -> dict[str, float]:
    """Mean, percentiles (``numpy.percentile(method="higher")``, exactly) and max of the non-negative integers whose
    histogram is ``counts`` (``counts[v]`` values equal ``v``)."""
    total = int(counts.sum())
    if not total:
        return {}
    values = np.arange(len(counts))
    cumulative = np.cumsum(counts)
    out = {"mean": round(float((values * counts).sum() / total), 1)}
    for p in PERCENTILES:
        rank = int(np.ceil(p / 100 * (total - 1)))  # "higher": the sorted value at the rounded-up position
        out[f"p{p}"] = int(np.searchsorted(cumulative, rank, side="right"))
    out["max"] = int(values[counts > 0][-1])
    return out


class SplitNumbers:
    """The audit numbers of one split, added a block of rows at a time (a split too large for one process's memory
    streams through it, keeping per row only the duplicate key and the label).

    :meth:`add` takes arrays of the :data:`ROW_STATS` columns and ``label``; :meth:`info` gives the split's part of
    the audit (see :func:`build_audit`)."""

    def __init__(self, num_labels: int, max_length: int) -> None:
        self.max_length = max_length
        self.labels = np.zeros(num_labels, dtype=np.int64)
        self.length = np.zeros(1, dtype=np.int64)  # histogram of ntok
        self.distance = np.zeros(1, dtype=np.int64)  # histogram of gap
        self.truncated = self.entity_cut = self.overlapping = 0
        self.keys: list[np.ndarray] = []
        self.label_parts: list[np.ndarray] = []
        self._unique: np.ndarray | None = None

    @staticmethod
    def _grow(histogram: np.ndarray, values: np.ndarray) -> np.ndarray:
        counts = np.bincount(values.astype(np.int64))
        if len(counts) > len(histogram):
            histogram = np.pad(histogram, (0, len(counts) - len(histogram)))
        histogram[:len(counts)] += counts
        return histogram

    def add(self, rows: Mapping[str, Any]) -> None:
        """Add a block of rows (a DataFrame or dict of arrays with ``label`` and the :data:`ROW_STATS` columns)."""
        label = _column(rows, "label").astype(np.int64)
        self.labels += np.bincount(label[label >= 0], minlength=len(self.labels))[:len(self.labels)]
        ntok = _column(rows, "ntok")
        self.length = self._grow(self.length, ntok)
        self.distance = self._grow(self.distance, _column(rows, "gap"))
        self.truncated += int((ntok > self.max_length).sum())
        self.entity_cut += int((_column(rows, "reach") > self.max_length).sum())
        self.overlapping += int(_column(rows, "overlap").astype(bool).sum())
        self.keys.append(_column(rows, "key").astype(np.uint64))
        self.label_parts.append(label)
        self._unique = None

    def unique_keys(self) -> np.ndarray:
        """The split's distinct duplicate keys, sorted (computed once for :meth:`info` and the other splits)."""
        if self._unique is None:
            self._unique = np.unique(np.concatenate(self.keys)) if self.keys else np.zeros(0, dtype=np.uint64)
        return self._unique

    def info(self, label_names: Sequence[str], train_keys: np.ndarray | None = None) -> dict[str, Any]:
        """The split's numbers (``shared_with_train`` when ``train_keys``, the training split's distinct keys)."""
        key = np.concatenate(self.keys) if self.keys else np.zeros(0, dtype=np.uint64)
        label = np.concatenate(self.label_parts) if self.label_parts else np.zeros(0, dtype=np.int64)
        info: dict[str, Any] = {
            "rows": len(key),
            "labels": {str(lab): int(c) for lab, c in zip(label_names, self.labels, strict=False)},
            "duplicates": int(len(key) - len(self.unique_keys())),
            "conflicting_duplicates": _conflicts(key, label),
        }
        if train_keys is not None:
            info["shared_with_train"] = int(np.isin(key, train_keys).sum())
        info["length"] = histogram_summary(self.length)
        info["distance"] = histogram_summary(self.distance)
        info["truncated"] = self.truncated
        info["entity_cut"] = self.entity_cut
        info["overlapping_entities"] = self.overlapping
        return info


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
    numbers = {}
    for name, split in rows.items():
        numbers[name] = SplitNumbers(len(labels), max_length)
        numbers[name].add(split)
    train_keys = numbers["train"].unique_keys() if "train" in numbers else np.zeros(0, dtype=np.uint64)
    infos = {name: n.info(labels, None if name == "train" else train_keys) for name, n in numbers.items()}
    return assemble_audit(infos, labels, max_length, rejected, oov, valid_from_train)


def assemble_audit(infos: Mapping[str, dict[str, Any]], labels: Sequence[str], max_length: int,
                   rejected: Mapping[str, int] | None = None, oov: Mapping[str, tuple[int, int]] | None = None,
                   valid_from_train: bool = False) -> dict[str, Any]:
    """The audit dict (see :func:`build_audit`) from each split's :meth:`SplitNumbers.info`."""
    rejected = dict(rejected or {})
    oov = dict(oov or {})
    names = [s for s in SPLIT_ORDER if s in infos] + [s for s in infos if s not in SPLIT_ORDER]
    splits: dict[str, dict[str, Any]] = {}
    for name in names:
        info = dict(infos[name])
        info = {"rows": info.pop("rows"), "rejected": int(rejected.get(name, 0)), **info}
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


def names(items: Sequence[str], limit: int = 8) -> str:
    """At most ``limit`` of ``items``, comma-separated, and how many there are when some are left out."""
    shown = ", ".join(items[:limit])
    return shown + (f", ... ({len(items)} in all)" if len(items) > limit else "")


def label_warnings(splits: Mapping[str, Any], labels: Sequence[str], unit: str, label_word: tuple[str, str],
                   few_unit: str) -> list[str]:
    """The warnings about labels every audit gives: labels with training ``unit`` (``rows``, ``bags``: each split's
    count key too) that the validation or test split lacks, and labels with fewer than :data:`MIN_EXAMPLES` in
    training (``few_unit``: what the count counts). ``label_word``: the singular and plural the text uses."""
    out = []
    train = splits.get("train", {})

    def word(n: int) -> str:
        return label_word[n > 1]

    for name, split_word in (("valid", "validation"), ("test", "test")):
        if splits.get(name, {}).get(unit):
            missing = [lab for lab in labels if splits[name]["labels"].get(lab, 0) == 0
                       and train.get("labels", {}).get(lab, 0) > 0]
            if missing:
                out.append(f"{len(missing)} {word(len(missing))} with training {unit} "
                           f"{'have' if len(missing) > 1 else 'has'} no {split_word} {unit}: {names(missing)}")
    if train:
        few = [f"{lab} ({n})" for lab, n in train["labels"].items() if n < MIN_EXAMPLES]
        if few:
            out.append(f"{len(few)} {word(len(few))} with fewer than {MIN_EXAMPLES} training {few_unit}: "
                       f"{names(few)}")
    return out


def warnings_of(audit: Mapping[str, Any]) -> list[str]:
    """Plain-language warnings about what silently spoils a result (see :func:`build_audit` for the fields)."""
    splits = audit["splits"]
    labels = audit["labels"]
    out = []
    for name in ("test", "valid"):
        shared = splits.get(name, {}).get("shared_with_train", 0)
        if shared:
            rows = splits[name]["rows"]
            where = " (the validation split is drawn from train, so duplicates in train end up on both sides)" \
                if name == "valid" and audit.get("valid_from_train") else ""
            out.append(f"train/{name} overlap: {shared} of {rows} {name} rows ({shared / rows:.1%}) have the same "
                       f"sentence, head, tail and offsets as a training row; {name} scores are optimistic{where}")
    out += label_warnings(splits, labels, "rows", ("class", "classes"), "examples")
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


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> list[str]:
    """A Markdown table's lines: ``header``, then ``rows`` (floats with one decimal, None empty), the columns after
    the first right-aligned."""
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
    lines += markdown_table(["split", "rows", "rejected", "duplicates", "also in train", "overlapping head/tail",
                     f"longer than {audit['max_length']} tokens", "entity cut by truncation", "OOV rate"], rows)
    for key, title in (("length", "Sentence length in tokens"),
                       ("distance", "Tokens between head and tail")):
        header = ["split", "mean", *[f"p{p}" for p in PERCENTILES], "max"]
        body = [[name, *[splits[name][key].get(h) for h in header[1:]]] for name in names]
        lines += ["", f"## {title}", "", *markdown_table(header, body)]
    lines += ["", "## Labels", ""]
    body = [[label, *[splits[name]["labels"].get(label, 0) for name in names]] for label in audit["labels"]]
    lines += markdown_table(["label", *names], body)
    return "\n".join(lines) + "\n"


def write_audit(audit: Mapping[str, Any], folder: Path, markdown: str | None = None) -> list[Path]:
    """Write ``audit.md`` (``markdown``, the task's rendering; default :func:`to_markdown`'s) and ``audit.json``
    into ``folder``; returns their paths."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    md, js = folder / "audit.md", folder / "audit.json"
    md.write_text(to_markdown(audit) if markdown is None else markdown, encoding="utf-8")
    js.write_text(json.dumps(audit, indent=2, ensure_ascii=False), encoding="utf-8")
    return [md, js]

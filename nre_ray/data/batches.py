"""Batch functions over pandas frames (run by Ray Data ``map_batches``) and the encoded arrays the loop trains on.

Each function is pure: a batch in, a batch out, no state. ``tokenize_batch`` adds the tokens and entity spans;
``token_counts`` feeds the vocabulary; ``encode_batch`` turns tokens into ids, position features, PCNN segments and
label ids, after truncating to a window that keeps both entities. :class:`EncodedSplit` holds a split as padded
arrays.

This module does not import torch: the Ray Data workers that run these functions start in a second instead of
several, and stay some 200 MB smaller. :mod:`nre_ray.data.encode` re-exports everything here, next to the torch
``EncodedDataset`` the loop reads batches from.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from nre_ray.data.tokenize import (
    clip_span,
    pcnn_segments,
    relative_positions,
    tokenize_example,
    truncation_window,
)
from nre_ray.data.vocab import Vocab

#: Arrays of an encoded split; every 2-D array is (N, T) with 0 as padding.
ARRAY_KEYS = ("tokens", "head_pos", "tail_pos", "segments", "lengths", "labels", "head_span", "tail_span")


def tokenize_batch(batch: pd.DataFrame, tokenizer: str, lowercase: bool) -> pd.DataFrame:
    """Add ``tokens`` (list of str), ``head_start/head_end/tail_start/tail_end`` (token spans) to rows without a
    ``problem``; a row whose entity covers no token gets a ``problem`` instead."""
    out = batch.copy()
    tokens, spans, problems = [], [], []
    for sentence, ho, head, to, tail, problem in zip(
        out["sentence"], out["head_offset"], out["head"], out["tail_offset"], out["tail"], out["problem"],
        strict=True,
    ):
        if problem:
            tokens.append([])
            spans.append((0, 0, 0, 0))
            problems.append(problem)
            continue
        try:
            t = tokenize_example(sentence, int(ho), len(head), int(to), len(tail), tokenizer, lowercase)
        except ValueError as err:
            tokens.append([])
            spans.append((0, 0, 0, 0))
            problems.append(str(err))
            continue
        tokens.append(t.tokens)
        spans.append((*t.head, *t.tail))
        problems.append("")
    out["tokens"] = tokens
    span_array = np.asarray(spans, dtype=np.int64).reshape(-1, 4)
    for i, name in enumerate(("head_start", "head_end", "tail_start", "tail_end")):
        out[name] = span_array[:, i]
    out["problem"] = problems
    return out


def token_counts(batch: pd.DataFrame) -> pd.DataFrame:
    """Token frequencies of a batch of tokenized rows, as a ``token, count`` frame (summed later by a groupby)."""
    counts: Counter[str] = Counter()
    for tokens in batch["tokens"]:
        counts.update(tokens)
    return pd.DataFrame({"token": list(counts), "count": np.fromiter(counts.values(), dtype=np.int64)})


def token_counts_arrow(tokens: pa.Array | pa.ChunkedArray) -> pa.Table:
    """:func:`token_counts` of an Arrow ``list<string>`` column of tokens, counted in Arrow (no Python object per
    token): a ``token, count`` table."""
    flat = pc.list_flatten(tokens)
    counts = pc.value_counts(flat.combine_chunks() if isinstance(flat, pa.ChunkedArray) else flat)
    return pa.table({"token": counts.field("values").cast(pa.string()),
                     "count": counts.field("counts").cast(pa.int64())})


def encode_batch(batch: pd.DataFrame, vocab: list[str], labels: list[str] | None, max_length: int,
                 window: int) -> pd.DataFrame:
    """Ids and features per row (lists), truncated to ``max_length`` tokens around the entities.

    Adds ``token_ids, head_pos, tail_pos, segments`` (lists of int), ``length``, ``head_span``/``tail_span`` (token
    spans after truncation) and ``label`` (class id, or -1 without a ``relation`` column / labels).
    """
    v = Vocab(vocab)
    label_index = {name: i for i, name in enumerate(labels or [])}
    cols: dict[str, list] = {k: [] for k in ("token_ids", "head_pos", "tail_pos", "segments", "length",
                                             "head_span", "tail_span")}
    for tokens, hs, he, ts, te in zip(batch["tokens"], batch["head_start"], batch["head_end"], batch["tail_start"],
                                      batch["tail_end"], strict=True):
        win = truncation_window(len(tokens), (int(hs), int(he)), (int(ts), int(te)), max_length)
        head, tail = clip_span((int(hs), int(he)), win), clip_span((int(ts), int(te)), win)
        n = win[1] - win[0]
        cols["token_ids"].append(v.encode(list(tokens)[win[0]:win[1]]))
        cols["head_pos"].append(relative_positions(n, head, window))
        cols["tail_pos"].append(relative_positions(n, tail, window))
        cols["segments"].append(pcnn_segments(n, head, tail))
        cols["length"].append(n)
        cols["head_span"].append(list(head))
        cols["tail_span"].append(list(tail))
    out = batch.drop(columns=["tokens"]).copy()
    for key, values in cols.items():
        out[key] = values
    if labels is not None and "relation" in out.columns:
        out["label"] = [label_index.get(r, -1) for r in out["relation"]]
    else:
        out["label"] = -1
    return out


@dataclass
class EncodedSplit:
    """One split as padded arrays. ``tokens``, ``head_pos``, ``tail_pos``, ``segments``: (N, T) int32;
    ``lengths``, ``labels``: (N,); ``head_span``, ``tail_span``: (N, 2)."""

    arrays: dict[str, np.ndarray]

    def __len__(self) -> int:
        return len(self.arrays["lengths"])

    @classmethod
    def from_frame(cls, frame: pd.DataFrame) -> EncodedSplit:
        """Pad the list columns written by :func:`encode_batch` into arrays."""
        n = len(frame)
        lengths = frame["length"].to_numpy(dtype=np.int32) if n else np.zeros(0, dtype=np.int32)
        width = int(lengths.max()) if n else 1
        arrays = {"lengths": lengths, "labels": frame["label"].to_numpy(dtype=np.int64) if n else
                  np.zeros(0, dtype=np.int64)}
        for key, column in (("tokens", "token_ids"), ("head_pos", "head_pos"), ("tail_pos", "tail_pos"),
                            ("segments", "segments")):
            padded = np.zeros((n, width), dtype=np.int32)
            for i, row in enumerate(frame[column]):
                padded[i, : len(row)] = row
            arrays[key] = padded
        for key in ("head_span", "tail_span"):
            arrays[key] = np.asarray([list(s) for s in frame[key]], dtype=np.int32).reshape(n, 2)
        return cls(arrays)

    def save(self, path: Path) -> None:
        """Write as an uncompressed ``.npz`` (no pickle)."""
        np.savez(path, **self.arrays)

    @classmethod
    def load(cls, path: Path) -> EncodedSplit:
        """Read a split written by :meth:`save`."""
        with np.load(path, allow_pickle=False) as data:
            return cls({k: data[k] for k in ARRAY_KEYS})

"""Batch functions over pandas frames (run by Ray Data ``map_batches``) and the encoded arrays the loop trains on.

Each function is pure: a batch in, a batch out, no state. ``tokenize_batch`` adds the tokens and entity spans;
``token_counts`` feeds the vocabulary; ``encode_batch`` turns tokens into ids, position features, PCNN segments and
label ids, after truncating to a window that keeps both entities. :class:`EncodedSplit` holds a split without padding
(flat arrays and row offsets) and pads batches as they are made.

This module does not import torch: the Ray Data workers that run these functions start in a second instead of
several, and stay some 200 MB smaller. The torch ``EncodedDataset`` the loop reads batches from is in
:mod:`nre_ray.data.encode`.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from nre_ray.core.special_tokens import UNK_ID
from nre_ray.data.markers import MARKER_PATTERN, MARKERS, clean_type, typed_markers, untyped
from nre_ray.data.rowfile import open_rows
from nre_ray.data.tokenize import tokenize_example

#: The padded arrays of a batch (and of :attr:`EncodedSplit.arrays`); every 2-D one is (B, T) with 0 as padding.
ARRAY_KEYS = ("tokens", "head_pos", "tail_pos", "segments", "lengths", "labels", "head_span", "tail_span")


def tokenize_batch(batch: pd.DataFrame, tokenizer: str, lowercase: bool, markers: bool = False,
                   typed: bool = False) -> pd.DataFrame:
    """Add ``tokens`` (list of str), ``head_start/head_end/tail_start/tail_end`` (token spans) to rows without a
    ``problem``; a row whose entity covers no token gets a ``problem`` instead.

    ``markers``: wrap the entities in marker tokens (:mod:`nre_ray.data.markers`; the spans then include them),
    ``typed`` ones where the row has a ``head_type``/``tail_type``."""
    out = batch.copy()
    tokens, spans, problems = [], [], []
    row_markers = _row_markers(out, typed) if markers else []
    columns = (out[c].tolist() for c in ("sentence", "head_offset", "head", "tail_offset", "tail", "problem"))
    for row, (sentence, ho, head, to, tail, problem) in enumerate(zip(*columns, strict=True)):  # lists: faster
        if problem:
            tokens.append([])
            spans.append((0, 0, 0, 0))
            problems.append(problem)
            continue
        try:
            t = tokenize_example(sentence, int(ho), len(head), int(to), len(tail), tokenizer, lowercase,
                                 row_markers[row] if markers else None)
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


def _row_markers(batch: pd.DataFrame, typed: bool) -> list[tuple[str, str, str, str]]:
    """Each row's four markers: typed ones (:func:`~nre_ray.data.markers.typed_markers`) where ``typed`` and the row
    has the entity's type, else the untyped ones."""
    if not typed or not ({"head_type", "tail_type"} & set(batch.columns)):
        return [MARKERS] * len(batch)
    heads, tails = (batch[c].tolist() if c in batch.columns else [None] * len(batch) for c in ("head_type",
                                                                                                "tail_type"))
    return [typed_markers(clean_type(h), clean_type(t)) for h, t in zip(heads, tails, strict=True)]


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


def _window_starts(length: np.ndarray, spans: np.ndarray, max_length: int) -> np.ndarray:
    """:func:`~nre_ray.data.tokenize.truncation_window`'s start for every row at once: ``length`` (N,) tokens per
    row, ``spans`` (N, 4) head start/end, tail start/end. The window is ``[start, start + min(length, max_length))``."""
    lo = np.minimum(spans[:, 0], spans[:, 2])
    hi = np.maximum(spans[:, 1], spans[:, 3])
    centred = np.where(hi - lo >= max_length, lo, np.maximum(0, lo - (max_length - (hi - lo)) // 2))
    return np.where(length <= max_length, 0, np.minimum(centred, length - max_length))


def _relative(index: np.ndarray, start: np.ndarray, end: np.ndarray, window: int) -> np.ndarray:
    """:func:`~nre_ray.data.tokenize.relative_positions` of token ``index`` (flat) to the span ``[start, end)`` (the
    span of each token's row, repeated per token)."""
    rel = np.where(index < start, index - start, np.where(index >= end, index - end + 1, 0))
    return (np.clip(rel, -window, window) + window + 1).astype(np.int32)


def encode_flat(tokens: pa.Array | pa.ChunkedArray | list[list[str]], spans: np.ndarray, vocab: list[str] | pa.Array,
                max_length: int, window: int) -> dict[str, np.ndarray]:
    """Ids and features of a batch of tokenized rows, computed on whole arrays (no Python per row or token).

    Args:
        tokens: (N,) rows of tokens, an Arrow ``list<string>`` array (or Python lists).
        spans: (N, 4) token spans: head start, head end, tail start, tail end (half-open).
        vocab: the vocabulary's tokens in id order (:attr:`Vocab.tokens`; an Arrow string array spares the
            conversion); a token not in it gets ``UNK_ID``.
        max_length: rows longer than this keep a window around both entities
            (:func:`~nre_ray.data.tokenize.truncation_window`).
        window: relative positions are clipped to ``+-window`` (:func:`~nre_ray.data.tokenize.relative_positions`).

    Returns:
        The flat arrays of :class:`EncodedSplit` but ``labels``: ``tokens``, ``head_pos``, ``tail_pos``,
        ``segments`` (T_total,) int32, every row's values at its (truncated) length one after another; ``offsets``
        (N + 1,) int64; ``lengths`` (N,) int32; ``head_span``, ``tail_span`` (N, 2) int32, after truncation.
    """
    if not isinstance(tokens, pa.Array | pa.ChunkedArray):
        tokens = pa.array(tokens, pa.list_(pa.string()))
    if isinstance(tokens, pa.ChunkedArray):
        tokens = tokens.combine_chunks() if tokens.num_chunks else pa.array([], pa.list_(pa.string()))
    spans = np.asarray(spans, dtype=np.int64).reshape(-1, 4)
    n = len(tokens)
    full = pc.list_value_length(tokens).to_numpy(zero_copy_only=False).astype(np.int64)  # (N,)
    start = _window_starts(full, spans, max_length)
    length = np.minimum(full, max_length)
    offsets = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(length, out=offsets[1:])
    row = np.repeat(np.arange(n), length)  # (T_total,) the row of each kept token
    index = np.arange(int(offsets[-1]), dtype=np.int64) - offsets[row]  # its place in the window
    source = np.asarray(tokens.offsets)[:-1].astype(np.int64)[row] + start[row] + index  # its place in the row
    values = tokens.values.take(pa.array(source)) if len(source) else pa.array([], pa.string())
    value_set = vocab if isinstance(vocab, pa.Array) else pa.array(vocab, pa.string())
    found = pc.index_in(values, value_set=value_set)
    ids = pc.fill_null(found, UNK_ID).to_numpy(zero_copy_only=False)
    if found.null_count:  # a typed marker of a type the training split never had reads as its untyped marker
        unknown = np.flatnonzero(found.is_null().to_numpy(zero_copy_only=False))
        typed = unknown[pc.match_substring_regex(values.take(pa.array(unknown)), MARKER_PATTERN).to_numpy(
            zero_copy_only=False)]
        if len(typed):
            plain = pa.array([untyped(t) for t in values.take(pa.array(typed)).to_pylist()], pa.string())
            ids = ids.copy()
            ids[typed] = pc.fill_null(pc.index_in(plain, value_set=value_set), UNK_ID).to_numpy(zero_copy_only=False)
    clipped = np.clip(spans - start[:, None], 0, length[:, None])  # clip_span, every row: (N, 4)
    derived = derived_features(index, length[row], clipped[row, 0:2], clipped[row, 2:4], window)
    return {
        "tokens": ids.astype(np.int32),
        **derived,
        "offsets": offsets,
        "lengths": length.astype(np.int32),
        "head_span": clipped[:, 0:2].astype(np.int32),
        "tail_span": clipped[:, 2:4].astype(np.int32),
    }


def label_ids(relations: pd.Series | np.ndarray, labels: list[str]) -> np.ndarray:
    """Class ids of ``relations`` (-1 where a relation is not in ``labels``)."""
    index = {name: i for i, name in enumerate(labels)}
    return np.fromiter((index.get(r, -1) for r in relations), dtype=np.int64, count=len(relations))


def encode_split(batch: pd.DataFrame, vocab: list[str], labels: list[str] | None, max_length: int,
                 window: int) -> EncodedSplit:
    """The tokenized rows of ``batch`` encoded (:func:`encode_flat`) as an :class:`EncodedSplit`; labels are class
    ids into ``labels`` (-1 without labels or a ``relation`` column)."""
    spans = batch[["head_start", "head_end", "tail_start", "tail_end"]].to_numpy(dtype=np.int64).reshape(-1, 4)
    flat = encode_flat([list(t) for t in batch["tokens"]], spans, vocab, max_length, window)
    flat["labels"] = label_ids(batch["relation"], labels) if labels is not None and "relation" in batch.columns \
        else np.full(len(batch), -1, dtype=np.int64)
    return EncodedSplit(flat)


def encode_batch(batch: pd.DataFrame, vocab: list[str], labels: list[str] | None, max_length: int,
                 window: int) -> pd.DataFrame:
    """Ids and features per row (lists), truncated to ``max_length`` tokens around the entities
    (:func:`encode_flat` does the work).

    Adds ``token_ids, head_pos, tail_pos, segments`` (lists of int), ``length``, ``head_span``/``tail_span`` (token
    spans after truncation) and ``label`` (class id, or -1 without a ``relation`` column / labels).
    """
    spans = np.stack([batch[c].to_numpy(dtype=np.int64) for c in ("head_start", "head_end", "tail_start",
                                                                    "tail_end")], axis=1) if len(batch) else \
        np.zeros((0, 4), dtype=np.int64)
    flat = encode_flat([list(t) for t in batch["tokens"]], spans, vocab, max_length, window)
    cut = flat["offsets"][1:-1]
    out = batch.drop(columns=["tokens"]).copy()
    for key, column in (("tokens", "token_ids"), ("head_pos", "head_pos"), ("tail_pos", "tail_pos"),
                        ("segments", "segments")):
        out[column] = [part.tolist() for part in np.split(flat[key], cut)] if len(batch) else []
    out["length"] = flat["lengths"].astype(np.int64)
    out["head_span"] = flat["head_span"].tolist()
    out["tail_span"] = flat["tail_span"].tolist()
    out["label"] = label_ids(out["relation"], labels) if labels is not None and "relation" in out.columns else -1
    return out


#: The per-token arrays, flat: every row's values at its real length, one row after another.
LIST_KEYS = ("tokens", "head_pos", "tail_pos", "segments")
#: The per-token arrays that follow from a row's length and entity spans (and the position window), so that they are
#: computed when a batch is made rather than stored: :func:`derived_features`.
DERIVED_KEYS = ("head_pos", "tail_pos", "segments")
#: The per-row arrays: ``lengths``, ``labels`` (N,); ``head_span``, ``tail_span`` (N, 2).
ROW_KEYS = ("lengths", "labels", "head_span", "tail_span")
#: What an :class:`EncodedSplit` may hold: ``offsets`` (N + 1, int64) says where row ``i`` is in the flat arrays
#: (``offsets[i]:offsets[i + 1]``).
FLAT_KEYS = (*LIST_KEYS, "offsets", *ROW_KEYS)
#: What a saved split stores, one ``.npy`` file each (plus ``<split>.json`` with the position window): the token ids,
#: offsets and the per-row arrays; about 4 bytes per token and 36 per row.
STORED_KEYS = ("tokens", "offsets", *ROW_KEYS)


def derived_features(index: np.ndarray, lengths: np.ndarray, head: np.ndarray, tail: np.ndarray,
                     window: int) -> dict[str, np.ndarray]:
    """Relative positions to each entity and PCNN segments of tokens, from their rows' lengths and (truncated) spans:
    what :func:`encode_flat` computes, for any array shape.

    ``index``: each token's place in its row; ``lengths``, ``head`` and ``tail`` (``[..., 2]``): its row's, broadcast
    to ``index``'s shape. Returns int32 arrays of that shape (values past a row's length are meaningless: callers
    mask them)."""
    head_first = (head[..., 0] < tail[..., 0]) | ((head[..., 0] == tail[..., 0]) & (head[..., 1] <= tail[..., 1]))
    first_end = np.where(head_first, head[..., 1], tail[..., 1])
    second_end = np.where(head_first, tail[..., 1], head[..., 1])
    cut1 = np.minimum(first_end, lengths)
    cut2 = np.maximum(cut1, np.minimum(second_end, lengths))
    return {"head_pos": _relative(index, head[..., 0], head[..., 1], window),
            "tail_pos": _relative(index, tail[..., 0], tail[..., 1], window),
            "segments": np.where(index < cut1, 1, np.where(index < cut2, 2, 3)).astype(np.int32)}


def _infer_window(flat: dict[str, np.ndarray]) -> int | None:
    """The position window of explicit relative positions: inside its entity a token's position is ``window + 1``."""
    if "head_pos" not in flat:
        return None
    rows = np.flatnonzero(np.asarray(flat["lengths"]) > 0)
    if not len(rows):
        return None
    row = int(rows[0])
    return int(flat["head_pos"][int(flat["offsets"][row]) + int(flat["head_span"][row][0])]) - 1


def flatten(arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The flat form of padded arrays (:data:`ARRAY_KEYS`, 2-D ones (N, T) with 0 as padding). Already flat arrays
    (with ``offsets``) are returned as they are, with or without the :data:`DERIVED_KEYS`."""
    if "offsets" in arrays:
        return {k: arrays[k] for k in FLAT_KEYS if k in arrays}
    lengths = np.asarray(arrays["lengths"])
    n = len(lengths)
    offsets = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    flat = {"offsets": offsets, **{k: np.asarray(arrays[k]) for k in ROW_KEYS}}
    for key in LIST_KEYS:
        padded = np.asarray(arrays[key])
        real = np.arange(padded.shape[1] if padded.ndim == 2 else 0) < lengths[:, None]  # (N, T)
        flat[key] = padded[real] if n else np.zeros(0, dtype=padded.dtype)  # row-major: rows in order
    return flat


class EncodedSplit:
    """One split of encoded rows, stored without padding: ``tokens`` are the int32 ids of all rows at their real
    lengths, concatenated; ``offsets`` (N + 1, int64) says where each row starts; ``lengths``, ``labels`` (N,);
    ``head_span``, ``tail_span`` (N, 2). The relative positions and PCNN segments follow from the lengths and spans
    (:func:`derived_features`, with the position ``window``): in memory they may be there (``head_pos``,
    ``tail_pos``, ``segments``, flat like ``tokens``); saved splits leave them out and batches compute them.

    Made from padded arrays (``EncodedSplit({"tokens": (N, T), ...})``, as written by older code and tests) or flat
    ones; :meth:`open` opens a saved split's files without reading them (:class:`nre_ray.data.rowfile.RowFile`), so a
    worker that reads only its shard's rows reads only their bytes. :meth:`rows` pads a batch to its own longest row;
    :attr:`arrays` is the whole split padded (small splits: tests, prediction).
    """

    def __init__(self, arrays: dict[str, np.ndarray], name: str = "", folder: Path | str | None = None,
                 window: int | None = None) -> None:
        self.flat = flatten(arrays)
        self.name = name
        self.folder = folder
        """The folder the split's files were opened from (:meth:`open`), or None."""
        self.window = _infer_window(self.flat) if window is None else int(window)
        """``--position-window``: relative positions run from 1 to ``2 * window + 1``."""

    def __len__(self) -> int:
        return len(self.flat["lengths"])

    def rows(self, indices: np.ndarray | list[int]) -> dict[str, np.ndarray]:
        """The rows ``indices`` as :data:`ARRAY_KEYS` arrays, the 2-D ones (B, T) padded with 0 to the longest of
        these rows (at least 1 wide)."""
        f = self.flat
        idx = np.asarray(indices, dtype=np.int64)
        lengths = np.asarray(f["lengths"][idx])  # (B,)
        width = max(int(lengths.max()), 1) if len(idx) else 1
        grid = np.arange(width)  # (T,)
        real = grid < lengths[:, None]  # (B, T)
        where = (np.asarray(f["offsets"][idx])[:, None] + grid)[real]  # flat positions of real cells
        out = {"lengths": lengths, **{k: np.asarray(f[k][idx]) for k in ("labels", "head_span", "tail_span")}}
        stored = [k for k in LIST_KEYS if k in f]
        for key in stored:
            padded = np.zeros((len(idx), width), dtype=f[key].dtype)
            padded[real] = f[key][where]
            out[key] = padded
        if len(stored) < len(LIST_KEYS):
            if self.window is None:
                raise ValueError("an encoded split without positions needs its position window")
            derived = derived_features(grid[None, :], lengths[:, None], out["head_span"][:, None, :],
                                       out["tail_span"][:, None, :], self.window)
            for key in DERIVED_KEYS:
                out[key] = np.where(real, derived[key], 0).astype(np.int32)
        return out

    @property
    def arrays(self) -> dict[str, np.ndarray]:
        """The whole split as padded arrays (:data:`ARRAY_KEYS`; as wide as the longest row)."""
        n = len(self)
        lengths = np.asarray(self.flat["lengths"])
        out = self.rows(np.arange(n))
        width = int(lengths.max()) if n else 1
        for key in LIST_KEYS:  # exactly as wide as the longest row, even when that is 0 (rows() makes it 1 at least)
            out[key] = out[key][:, :width] if n else np.zeros((0, 1), dtype=out[key].dtype)
        return out

    @classmethod
    def from_frame(cls, frame: pd.DataFrame, window: int | None = None) -> EncodedSplit:
        """Flatten the list columns written by :func:`encode_batch` (or the subword encoder, which writes no
        positions or segments: give its position ``window``, and batches derive them)."""
        n = len(frame)
        lengths = frame["length"].to_numpy(dtype=np.int32) if n else np.zeros(0, dtype=np.int32)
        offsets = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        flat = {"offsets": offsets, "lengths": lengths,
                "labels": frame["label"].to_numpy(dtype=np.int64) if n else np.zeros(0, dtype=np.int64)}
        for key, column in (("tokens", "token_ids"), ("head_pos", "head_pos"), ("tail_pos", "tail_pos"),
                            ("segments", "segments")):
            if column not in frame.columns:
                continue
            rows = [np.asarray(row, dtype=np.int32)[:length] for row, length in zip(frame[column], lengths,
                                                                                      strict=True)]
            flat[key] = np.concatenate(rows) if rows else np.zeros(0, dtype=np.int32)
        for key in ("head_span", "tail_span"):
            flat[key] = np.asarray([list(s) for s in frame[key]], dtype=np.int32).reshape(n, 2)
        return cls(flat, window=window)

    @staticmethod
    def files(name: str) -> list[str]:
        """The file names a split called ``name`` is saved as (in the cache folder)."""
        return [f"{name}.{key}.npy" for key in STORED_KEYS] + [f"{name}.json"]

    def save(self, folder: Path, name: str) -> None:
        """Write :data:`STORED_KEYS` as one ``.npy`` file each (no pickle), readable with ``mmap_mode``, and the
        position window as ``<name>.json``."""
        write_split_info(folder, name, self.window)
        for key in STORED_KEYS:
            np.save(Path(folder) / f"{name}.{key}.npy", np.ascontiguousarray(self.flat[key]), allow_pickle=False)

    @classmethod
    def open(cls, folder: Path | str, name: str, lazy: bool = True) -> EncodedSplit:
        """The split ``name`` saved by :meth:`save` in ``folder``: read by rows when a batch asks for them
        (:func:`nre_ray.data.rowfile.open_rows`: nothing is read before, nothing kept after) unless ``lazy`` is
        False (read whole)."""
        files = {key: Path(folder) / f"{name}.{key}.npy" for key in STORED_KEYS}
        flat = {key: open_rows(path) if lazy else np.load(path, allow_pickle=False) for key, path in files.items()}
        info = json.loads((Path(folder) / f"{name}.json").read_text(encoding="utf-8"))
        return cls(flat, name, folder, info["window"])


def write_split_info(folder: Path | str, name: str, window: int | None) -> None:
    """``<name>.json`` next to a saved split's arrays: its position window."""
    (Path(folder) / f"{name}.json").write_text(json.dumps({"window": window}), encoding="utf-8")

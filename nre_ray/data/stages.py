"""The preprocessing work that runs in Ray tasks, file in, file out: the driver sees only small summaries.

Each function reads its input from files, writes its output as files under the run's private build folder, and
returns a few numbers per block (see :mod:`nre_ray.data.pipeline` for the order):

1. :func:`read_files` streams records out of a split file in chunks; :func:`stage_block` checks and tokenizes a
   block, writes it as Parquet to ``staged/<split>/<first line>.parquet`` and returns what the driver decides from:
   problem counts and the first problems, the good rows per relation (with their first lines) and the entity types.
   The seeded validation split is drawn from the counts per class (:func:`draw_valid`); later tasks find the drawn
   rows by their rank in their class (:func:`moved_rows`).
2. :func:`train_token_counts` counts the tokens of the rows trained on, a table per task that the driver adds up
   (:func:`add_counts`: the vocabulary's size, not the data's).
3. :func:`encode_files` encodes the rows trained on, block by block, into ``parts/<final split>/<block>.npz`` (flat
   arrays, no padding, with the audit's per-row numbers) and writes the rejected rows next to them.
4. :func:`assemble_split` (a plain Ray task per split) concatenates a split's parts, in file order, into the
   memory-mappable ``<split>.<array>.npy`` files of :class:`~nre_ray.data.batches.EncodedSplit`, and audits it on the
   way.

Blocks are named by their split and first line: line numbers rise through a file, so sorting the names restores file
order whatever order Ray ran the tasks in.

The work folder is a local path (on the driver's node, or mounted on every node) or a URI in the object store of a
cluster's storage path (see :func:`nre_ray.data.pipeline.prepare`): then the tasks read and write their files there,
through ``pyarrow.fs``, and may run on any node. :func:`assemble_split` then assembles on its node's disk and uploads.
"""

from __future__ import annotations

import io
import json
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path, PurePosixPath
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from nre_ray import storage
from nre_ray.core import buildonce
from nre_ray.data import audit as data_audit
from nre_ray.data import subword
from nre_ray.data.batches import (
    STORED_KEYS,
    EncodedSplit,
    encode_flat,
    label_ids,
    token_counts_arrow,
    tokenize_batch,
    write_split_info,
)
from nre_ray.data.errors import MAX_SHOWN, DataError
from nre_ray.data.read import CANONICAL, check_rows, read_chunks, split_problem

SPLITS = ("train", "valid", "test")
STAGED = pa.schema([
    ("file", pa.string()), ("line", pa.int64()), ("problem", pa.string()),
    ("sentence", pa.string()), ("head", pa.string()), ("tail", pa.string()), ("relation", pa.string()),
    ("tokens", pa.list_(pa.string())),
    ("head_start", pa.int32()), ("head_end", pa.int32()), ("tail_start", pa.int32()), ("tail_end", pa.int32()),
    ("ntok", pa.int32()), ("gap", pa.int32()), ("reach", pa.int32()), ("key", pa.uint64()), ("overlap", pa.bool_()),
    ("head_offset", pa.int64()), ("tail_offset", pa.int64()), ("head_type", pa.string()), ("tail_type", pa.string()),
])
"""A tokenized row as staged: the record and where it came from, its problem ("" for good rows), tokens and token
spans, the audit's numbers (:data:`~nre_ray.data.audit.ROW_STATS`), and what subword encoding (``--model bert``)
reads: the checked character offsets and the entity types."""
SUMMARY = pa.schema([
    ("split", pa.string()), ("path", pa.string()), ("first_line", pa.int64()), ("rows", pa.int64()),
    ("fatal", pa.string()), ("problem_rows", pa.int64()), ("problem_count", pa.int64()), ("problems", pa.string()),
    ("relations", pa.string()), ("types", pa.string()),
])
"""One row per staged block (:func:`stage_block`): see there."""
AUDIT_COLUMNS = ("ntok", "gap", "reach", "overlap", "key")
REJECTED_COLUMNS = ["file", "line", "problem", "sentence", "head", "tail", "relation"]


def block_name(split: str, first_line: int) -> str:
    """A block's file name stem: sorts in file order, splits in :data:`SPLITS` order."""
    return f"{SPLITS.index(split)}-{first_line:012d}"


# --------------------------------------------------------------------------------------------------------------------
# 1. read, check, tokenize, stage


def read_files(specs: pd.DataFrame, fmt: str | None, column_map: dict[str, str] | None,
               rows_per_chunk: int) -> Iterator[pd.DataFrame]:
    """Ray Data UDF: each input row names one split file (``split``, ``path``); yields its records in chunks.

    A problem with the file itself becomes one row whose ``fatal`` holds the error (errors travel as data, so a bad
    file ends in a clean message rather than a failed Ray task with its traceback)."""
    for split, path in zip(specs["split"], specs["path"], strict=True):
        try:
            for chunk in read_chunks(path if storage.is_uri(path) else Path(path), fmt, column_map, rows_per_chunk):
                yield chunk.assign(split=split, fatal="")
        except DataError as err:
            payload = {"problems": [[p.file, p.line, p.field, p.message] for p in err.problems],
                       "hint": err.hint, "total": err.total}
            row: dict[str, Any] = dict.fromkeys(CANONICAL, "")
            row.update(file=path, line=0, problem="row: the file cannot be read", split=split,
                       fatal=json.dumps(payload, ensure_ascii=False))
            yield pd.DataFrame([row])


def stage_block(batch: pd.DataFrame, tokenizer: str, lowercase: bool, folder: str, markers: bool = False,
                typed: bool = False) -> pa.Table:
    """Ray Data UDF: check and tokenize a block of records, write it to ``folder/staged/<split>/`` (:data:`STAGED`)
    and return one :data:`SUMMARY` row per split in it:

    * ``path``, ``first_line``, ``rows``: the staged file, and ``fatal``: a file-level error (then nothing is staged);
    * ``problem_rows``, ``problem_count`` (a row may have several), ``problems``: JSON ``[[file, line, problem],
      ...]`` of the first :data:`MAX_SHOWN` rows with a problem;
    * ``relations``: JSON ``{relation: [good rows, [their first MAX_SHOWN lines]]}`` (the validation split is
      drawn from the counts: :func:`moved_rows`); ``types``: JSON ``[head types, tail types]`` of the good rows.
    """
    out = []
    for split in pd.unique(batch["split"]).tolist():
        part = batch[batch["split"] == split]
        fatal = part["fatal"][part["fatal"] != ""]
        if len(fatal):
            out.append(_summary(split, "", int(part["line"].min()), 0, fatal=str(fatal.iloc[0])))
            continue
        out.append(_stage(part.sort_values("line", kind="stable").drop(columns=["split", "fatal"]), split, tokenizer,
                          lowercase, folder, markers, typed))
    return pa.Table.from_pylist(out, schema=SUMMARY) if out else SUMMARY.empty_table()


def _stage(part: pd.DataFrame, split: str, tokenizer: str, lowercase: bool, folder: str, markers: bool,
           typed: bool) -> dict[str, Any]:
    tokenized = tokenize_batch(check_rows(part), tokenizer, lowercase, markers, typed)
    stats = data_audit.row_stats(tokenized)
    columns: dict[str, Any] = {}
    for name in STAGED.names:
        if name in stats:
            columns[name] = stats[name]
        elif name == "tokens":
            columns[name] = list(tokenized["tokens"])
        else:
            values = tokenized[name].fillna("") if name in ("head_type", "tail_type") else tokenized[name]
            columns[name] = values.to_numpy() if STAGED.field(name).type != pa.string() else values.astype(str)
    table = pa.Table.from_pydict(columns, schema=STAGED)
    first_line = int(tokenized["line"].iloc[0])
    path = storage.join(folder, "staged", split, f"{block_name(split, first_line)}.parquet")
    store, inner = storage.pyarrow_path(path)
    store.create_dir(os.path.dirname(inner), recursive=True)
    pq.write_table(table, inner, filesystem=store)

    problem = tokenized["problem"].to_numpy(dtype=object)
    bad = problem != ""
    lines = tokenized["line"].to_numpy(dtype=np.int64)
    files = tokenized["file"].astype(str).to_numpy()
    shown = np.flatnonzero(bad)[:MAX_SHOWN]
    good = tokenized[~bad]
    relations: dict[str, list] = {}
    for relation, line in zip(good["relation"].astype(str), good["line"], strict=True):
        entry = relations.setdefault(relation, [0, []])
        entry[0] += 1
        if len(entry[1]) < MAX_SHOWN:
            entry[1].append(int(line))
    types = [sorted({str(t) for t in good[c].dropna()} - {""}) if c in good.columns else []
             for c in ("head_type", "tail_type")]
    return _summary(
        split, path, first_line, len(tokenized),
        problem_rows=int(bad.sum()),
        problem_count=sum(len(split_problem(p)) for p in problem[bad]),
        problems=json.dumps([[files[i], int(lines[i]), problem[i]] for i in shown], ensure_ascii=False),
        relations=json.dumps(relations, ensure_ascii=False),
        types=json.dumps(types, ensure_ascii=False))


def _summary(split: str, path: str, first_line: int, rows: int, fatal: str = "", problem_rows: int = 0,
             problem_count: int = 0, problems: str = "[]", relations: str = "{}",
             types: str = "[[], []]") -> dict[str, Any]:
    return {"split": split, "path": path, "first_line": first_line, "rows": rows, "fatal": fatal,
            "problem_rows": problem_rows, "problem_count": problem_count, "problems": problems,
            "relations": relations, "types": types}


def _read_parquet(path: str, columns: list[str]) -> pa.Table:
    """Columns of a staged file (a local path or a URI)."""
    store, inner = storage.pyarrow_path(path)
    return pq.read_table(inner, columns=columns, filesystem=store)


# --------------------------------------------------------------------------------------------------------------------
# 2. token counts


def _kept(table: pa.Table, labels: list[str]) -> pa.Array:
    """Rows that are trained on: no problem and a known label."""
    return pc.and_(pc.equal(table.column("problem"), ""),
                   pc.is_in(table.column("relation"), value_set=pa.array(labels, pa.string())))


def moved_rows(table: pa.Table, split: str, drawn: dict[str, np.ndarray] | None, starts: dict[str, int]) -> np.ndarray:
    """Rows of a staged block that the validation split takes.

    The draw is made per class over the class's good training rows in file order (:func:`draw_valid`): ``drawn``
    holds each relation's drawn ranks (sorted), and ``starts`` how many good rows of each relation come before this
    block, so a row's rank is its block's start plus its place among the block's good rows of its relation."""
    moved = np.zeros(table.num_rows, dtype=bool)
    if split != "train" or not drawn:
        return moved
    relation = table.column("relation").to_numpy(zero_copy_only=False)
    good = (table.column("problem").to_numpy(zero_copy_only=False) == "")
    for name, ranks in drawn.items():
        rows = np.flatnonzero(good & (relation == name))
        if len(rows):
            moved[rows] = np.isin(starts.get(name, 0) + np.arange(len(rows)), ranks)
    return moved


def draw_valid(class_sizes: dict[str, int], fraction: float, seed: int) -> dict[str, np.ndarray]:
    """The seeded, stratified validation draw: per class (in sorted order), ``max(1, round(n * fraction))`` of its
    ``n`` rows (at most ``n - 1``; classes of fewer than 2 rows stay in train), as sorted ranks into the class's rows
    in file order. The same draw as ``rng.choice(lines_of_the_class, ...)`` over the lines themselves (numpy's
    choice from an array takes the array at the indices it draws), from the counts alone."""
    rng = np.random.default_rng(seed)
    drawn = {}
    for name in sorted(r for r, n in class_sizes.items() if n > 0):
        n = class_sizes[name]
        if n < 2:
            continue
        take = max(1, round(n * fraction))
        drawn[name] = np.sort(rng.choice(n, size=min(take, n - 1), replace=False))
    return drawn


def train_token_counts(paths: pd.DataFrame, labels: list[str],
                       drawn: dict[str, np.ndarray] | None) -> Iterator[pa.Table]:
    """Ray Data UDF: token counts of the kept training rows of staged files (rows moved to valid left out), counted
    in Arrow (:func:`~nre_ray.data.batches.token_counts_arrow`: the tokens never become Python objects)."""
    counts = None
    for path, starts in zip(paths["path"], paths["starts"], strict=True):
        table = _read_parquet(path, ["line", "problem", "relation", "tokens"])
        keep = pc.and_(_kept(table, labels), pa.array(~moved_rows(table, "train", drawn, json.loads(starts))))
        counts = add_counts(counts, token_counts_arrow(table.filter(keep).column("tokens")))
    if counts is not None:  # one table for all the files of this task: fewer rows for the driver to add up
        yield counts


def add_counts(total: pa.Table | None, part: pa.Table) -> pa.Table:
    """Token counts (``token``, ``count``) summed per token, in Arrow: memory bounded by the distinct tokens."""
    if total is None:
        return part
    return pa.concat_tables([total, part]).group_by("token").aggregate([("count", "sum")]).rename_columns(
        ["token", "count"])


# --------------------------------------------------------------------------------------------------------------------
# 3. encode


def encode_files(paths: pd.DataFrame, folder: str, labels: list[str], drawn: dict[str, np.ndarray] | None,
                 max_length: int,
                 window: int, rejected_problem: dict[str, Any], vocab: list[str] | None = None,
                 tokenizer_dir: str | None = None, typed: bool = False) -> Iterator[pa.Table]:
    """Ray Data UDF: encode the kept rows of staged files (``paths``: ``split``, ``path``, ``starts``: JSON, see
    :func:`moved_rows`; ``drawn``: the validation draw) into
    ``folder/parts/<final split>/<block>.npz`` and write their rejected rows to ``folder/rejected/<block>.csv``.

    Words with ``vocab`` (:func:`~nre_ray.data.batches.encode_flat`), or subwords with the pretrained tokenizer in
    ``tokenizer_dir`` and entity markers (``--model bert``). ``rejected_problem`` (``labels``: the sorted labels,
    ``where``: where they come from) words the problem of a row with an unknown label. Yields a row per part:
    ``split``, ``rows``."""
    value_set = pa.array(vocab, pa.string()) if vocab is not None else None
    needed = ["line", "problem", "relation", *AUDIT_COLUMNS]
    needed += ["tokens", "head_start", "head_end", "tail_start", "tail_end"] if value_set is not None else \
        ["sentence", "head", "head_offset", "tail", "tail_offset", "head_type", "tail_type"]
    for split, path, starts in zip(paths["split"], paths["path"], paths["starts"], strict=True):
        table = _read_parquet(path, needed)  # not the text columns that words do not need
        name = PurePosixPath(storage.name_of(path)).stem
        keep = _kept(table, labels).to_numpy(zero_copy_only=False)
        if not keep.all():
            rejected = _read_parquet(path, REJECTED_COLUMNS).filter(pa.array(~keep))
            _write_rejected(rejected, labels, rejected_problem, storage.join(folder, "rejected", f"{name}.csv"))
        kept = table.filter(pa.array(keep))
        to_valid = moved_rows(kept, split, drawn, json.loads(starts))
        written = []
        for final, rows in ((split, ~to_valid), ("valid", to_valid)):
            if not rows.any():
                continue
            part = kept.filter(pa.array(rows))
            if value_set is not None:
                flat = _encode_words(part, value_set, max_length, window)
            else:
                flat = _encode_subwords(part, str(tokenizer_dir), labels, max_length, typed, window)
            flat["labels"] = label_ids(part.column("relation").to_numpy(zero_copy_only=False), labels)
            for column in AUDIT_COLUMNS:
                flat[column] = part.column(column).to_numpy(zero_copy_only=False)
            buffer = io.BytesIO()
            np.savez(buffer, **{k: flat[k] for k in (*STORED_KEYS, *AUDIT_COLUMNS)})
            storage.write_bytes(storage.join(folder, "parts", final, f"{name}.npz"), buffer.getvalue())
            written.append({"split": final, "rows": part.num_rows})
        yield pa.Table.from_pylist(written, schema=pa.schema([("split", pa.string()), ("rows", pa.int64())]))


def _encode_words(part: pa.Table, value_set: pa.Array, max_length: int, window: int) -> dict[str, np.ndarray]:
    spans = np.stack([part.column(c).to_numpy() for c in ("head_start", "head_end", "tail_start", "tail_end")],
                     axis=1) if part.num_rows else np.zeros((0, 4), dtype=np.int64)
    return encode_flat(part.column("tokens"), spans, value_set, max_length, window)


def _encode_subwords(part: pa.Table, tokenizer_dir: str, labels: list[str], max_length: int, typed: bool,
                     window: int) -> dict[str, np.ndarray]:
    frame = part.select(["sentence", "head", "head_offset", "tail", "tail_offset", "head_type", "tail_type",
                         "relation", "problem", "line"]).to_pandas()
    local = str(buildonce.local_copy(tokenizer_dir))  # in the object store: copied once per node
    encoded = subword.encode_subword_batch(frame, local, max_length, typed, labels)
    lost = (encoded["problem"] != "").to_numpy()
    if lost.any():  # not expected: the row checks passed
        raise ValueError(f"line {frame['line'].to_numpy()[lost][0]}: {encoded['problem'].to_numpy()[lost][0]}")
    return EncodedSplit.from_frame(encoded, window).flat


def _write_rejected(table: pa.Table, labels: list[str], rejected_problem: dict[str, Any], path: str) -> None:
    """The rejected rows of a block as CSV rows without a header (:data:`REJECTED_COLUMNS`), their problem filled
    in for rows whose only fault is an unknown label."""
    if not table.num_rows:
        return
    frame = table.select(REJECTED_COLUMNS).to_pandas()
    unknown = frame["problem"] == ""
    frame.loc[unknown, "problem"] = [label_problem(r, **rejected_problem) for r in frame.loc[unknown, "relation"]]
    storage.write_bytes(path, frame.to_csv(header=False, index=False).encode("utf-8"))


def label_problem(relation: str, labels: list[str], where: str) -> str:
    """The problem of a row whose relation is not among the (sorted) labels."""
    return (f"relation: label {relation!r} is not in {where} (expected one of {len(labels)} labels, e.g. "
            f"{', '.join(labels[:5])})")


# --------------------------------------------------------------------------------------------------------------------
# 4. assemble


def assemble_split(folder: str, split: str, labels: list[str], max_length: int, window: int, unk_id: int,
                   train_keys: str | None = None, dest: str | None = None) -> dict[str, Any]:
    """Ray task: concatenate ``folder/parts/<split>/*.npz`` in file order into ``folder/<split>.<array>.npy``
    and ``<split>.json`` (:meth:`EncodedSplit.files`: token ids and per-row arrays, no padding; ``window`` is the
    position window), streaming one part at a time, and audit the split on the way.

    ``train_keys``: a ``.npy`` file with the training split's distinct duplicate keys (the valid and test splits
    count their rows also in train); the training split writes it (``folder/train_keys.npy``).

    ``folder`` in an object store: the parts are downloaded to a temporary folder on this node and assembled there;
    the split's files are uploaded to ``dest`` (default ``folder``), and ``train_keys.npy`` to ``folder``.

    Returns ``{"rows", "info": SplitNumbers.info, "oov": (unknown tokens, tokens)}``.
    """
    if not storage.is_uri(folder):
        return _assemble(Path(folder), split, labels, max_length, window, unk_id, train_keys)
    with tempfile.TemporaryDirectory(prefix="nre_ray_assemble_") as tmp:
        local = Path(tmp)
        storage.download(storage.join(folder, "parts", split), local / "parts" / split)
        keys = None
        if train_keys and storage.exists(train_keys):
            keys = str(storage.download(train_keys, local / "train_keys.in.npy"))
        result = _assemble(local, split, labels, max_length, window, unk_id, keys)
        for name in EncodedSplit.files(split):
            storage.upload(local / name, storage.join(dest or folder, name))
        if split == "train":
            storage.upload(local / "train_keys.npy", storage.join(folder, "train_keys.npy"))
    return result


def _assemble(root: Path, split: str, labels: list[str], max_length: int, window: int, unk_id: int,
              train_keys: str | None) -> dict[str, Any]:
    parts = sorted((root / "parts" / split).glob("*.npz"))
    sizes = []
    for path in parts:
        with np.load(path) as part:
            sizes.append((len(part["lengths"]), len(part["tokens"])))
    rows, values = sum(s[0] for s in sizes), sum(s[1] for s in sizes)
    shapes = {"tokens": (values,), "offsets": (rows + 1,), "lengths": (rows,), "labels": (rows,),
              "head_span": (rows, 2), "tail_span": (rows, 2)}
    dtypes = {"tokens": np.int32, "offsets": np.int64, "lengths": np.int32, "labels": np.int64,
              "head_span": np.int32, "tail_span": np.int32}
    out = {key: np.lib.format.open_memmap(root / f"{split}.{key}.npy", mode="w+", dtype=dtypes[key],
                                          shape=shapes[key]) for key in STORED_KEYS}
    write_split_info(root, split, window)
    numbers = data_audit.SplitNumbers(len(labels), max_length)
    row = value = unknown = 0
    out["offsets"][0] = 0
    for path, (n, v) in zip(parts, sizes, strict=True):
        with np.load(path) as part:
            out["tokens"][value:value + v] = part["tokens"]
            out["offsets"][row + 1:row + n + 1] = part["offsets"][1:] + value
            for key in ("lengths", "labels", "head_span", "tail_span"):
                out[key][row:row + n] = part[key]
            unknown += int((part["tokens"] == unk_id).sum())
            numbers.add({"label": part["labels"], **{c: part[c] for c in AUDIT_COLUMNS}})
        row, value = row + n, value + v
    for array in out.values():
        array.flush()
    del out
    if split == "train":
        np.save(root / "train_keys.npy", numbers.unique_keys())
    keys = np.load(train_keys) if train_keys and os.path.exists(train_keys) else None
    return {"rows": rows, "info": numbers.info(labels, keys), "oov": (unknown, values)}

"""Reading one data file in chunks of records, so that inputs larger than memory can be streamed (prediction).

:func:`plan_chunks` scans the file once, streaming (CSV/TSV/DeepKE with Python's csv module, so quoted fields that span
lines stay whole; JSON Lines by line; Parquet from its row-group metadata), and returns an :class:`InputPlan`: the
byte ranges (or row groups) of the chunks and the line where each starts. :meth:`InputPlan.read` copies one chunk
(with the CSV header) to a small file of its own and reads it with :func:`nre_ray.data.read.read_table`, so its rows get
the same canonical values, the same per-row problems and, after shifting, the same ``FILE:LINE`` locations as when the
whole file is read. It also returns each row's original columns (the input's own names, in the input's order) so
that an output can keep them. Ray tasks can read different chunks at the same time.

The file may be a URI (``s3://bucket/rows.csv``, see :mod:`nre_ray.storage`): the scan streams it and each chunk is
read as a byte range (Parquet: its row groups) from the store, on whichever node the reading task runs.

A chunk's frame holds the input columns, then the canonical columns prefixed with :data:`PREFIX` (``_nre_sentence``,
``_nre_head_offset``, ..., ``_nre_file``, ``_nre_line``, ``_nre_problem``). SemEval-2010 text (small by nature) and
files the scan cannot split are read whole.

Values of the input columns: text for CSV/TSV; JSON scalars as parsed for JSON Lines (objects and lists as JSON text;
keys that first appear after the first chunk are not kept); Parquet values as stored.
"""

from __future__ import annotations

import csv
import io
import json
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from nre_ray import storage
from nre_ray.data import read as R
from nre_ray.data.errors import DataError, Problem
from nre_ray.data.formats.common import Source, resolve_columns
from nre_ray.data.sizes import DEFAULT_CHUNK_ROWS

PREFIX = "_nre_"
CANONICAL = ("sentence", "head", "head_offset", "tail", "tail_offset", "relation", "head_type", "tail_type", "file",
             "line", "problem")
_DELIMITED = {"csv": ",", "deepke": ",", "tsv": "\t"}
_JSON = ("jsonl", "opennre")


@dataclass(frozen=True)
class Chunk:
    """A run of records: bytes ``[start, end)`` (row groups / rows for Parquet / whole-file formats), the physical
    line of its first byte (1-based) and its number of records."""

    start: int
    end: int
    first_line: int
    rows: int


@dataclass
class InputPlan:
    """How to read one file chunk by chunk (picklable: Ray tasks read the chunks)."""

    path: str
    fmt: str
    column_map: dict[str, str] | None
    require_relation: bool
    chunks: list[Chunk]
    header: bytes = b""
    columns: list[str] = field(default_factory=list)
    frame: pd.DataFrame | None = None
    bad_rows: int = 0  #: (a file read chunk by chunk: its bad rows are found as they are read, not known ahead)

    @property
    def total_rows(self) -> int:
        """Records in the file (blank lines not counted)."""
        return sum(c.rows for c in self.chunks)

    @property
    def offset_columns(self) -> list[str]:
        """The input columns that hold ``head_offset`` and ``tail_offset`` (under the input's own names)."""
        if self.frame is not None:  # read whole: the columns are the canonical ones
            return ["head_offset", "tail_offset"]
        found = resolve_columns(self.path, self.columns, self.column_map, False, None, self.fmt)
        return [found[c] for c in ("head_offset", "tail_offset")]

    def read(self, index: int) -> pd.DataFrame:
        """The records of chunk ``index``: input columns, then the ``_nre_`` canonical columns.

        Raises :class:`DataError` for problems with the file as a whole (e.g. a missing column), located in the file.
        """
        return self.read_chunk(self.chunks[index])

    def read_chunk(self, chunk: Chunk) -> pd.DataFrame:
        """Like :meth:`read`, for a chunk given by value (a plan shipped without its chunk list can read it)."""
        if self.frame is not None:
            part = self.frame.iloc[chunk.start:chunk.end].reset_index(drop=True)
            return _combine(part[self.columns], part)
        with tempfile.TemporaryDirectory(prefix="nre_ray_chunk_") as tmp:
            # The chunk becomes a small file of its own that read_table reads as it reads any file.
            piece = Path(tmp) / storage.name_of(self.path)
            if self.fmt == "parquet":
                import pyarrow.parquet as pq

                table = _parquet_file(self.path).read_row_groups(list(range(chunk.start, chunk.end)))
                pq.write_table(table, piece)
                raw = table.select(self.columns).to_pandas()
                offset = chunk.first_line - 1
            else:
                data = storage.read_range(self.path, chunk.start, chunk.end - chunk.start)
                if self.fmt in _DELIMITED:
                    data = self.header + data
                    offset = chunk.first_line - (self.header.count(b"\n") + 1)
                else:
                    offset = chunk.first_line - 1
                piece.write_bytes(data)
            with _located(str(piece), self.path, offset):
                canonical = R.read_table(piece, self.fmt, self.column_map, self.require_relation)
        if self.fmt in _DELIMITED:
            raw = _delimited_values(data.decode("utf-8", errors="replace"), _DELIMITED[self.fmt], self.columns)
        elif self.fmt in _JSON:
            raw = _json_values(data.decode("utf-8", errors="replace"), self.columns)
        canonical["line"] = canonical["line"] + offset
        canonical["file"] = self.path
        if len(raw) != len(canonical):  # both parse the same bytes; a mismatch is a bug, not bad data
            raise RuntimeError(f"{self.path}: chunk at line {chunk.first_line}: {len(raw)} rows but "
                               f"{len(canonical)} records")
        return _combine(raw, canonical)


@dataclass
class FramePlan:
    """An input already read whole into ``frame``, one row per example (a task's own rows: a document, a bag), as
    chunks of rows: the shape of :class:`InputPlan` that predict reads (``path``, ``chunks``, ``total_rows``,
    ``read``, ``read_chunk``, ``offset_columns``). For inputs small enough to read at once; a plan shipped to Ray
    tasks carries the frame along."""

    path: str
    chunks: list[Chunk]
    frame: pd.DataFrame
    bad_rows: int = 0  #: rows of the frame that are the input's bad rows (each with its problem), not examples

    @property
    def total_rows(self) -> int:
        """Rows of the frame, bad ones included."""
        return sum(c.rows for c in self.chunks)

    @property
    def offset_columns(self) -> list[str]:
        """No character offsets to keep as integers."""
        return []

    def read(self, index: int) -> pd.DataFrame:
        """The rows of chunk ``index``."""
        return self.read_chunk(self.chunks[index])

    def read_chunk(self, chunk: Chunk) -> pd.DataFrame:
        """The rows ``[chunk.start, chunk.end)`` of the frame (its input columns and ``_nre_`` columns)."""
        return self.frame[chunk.start:chunk.end].reset_index(drop=True)


def frame_plan(path: str, frame: pd.DataFrame, chunk_rows: int) -> FramePlan:
    """``frame`` (the rows of ``path``) as a :class:`FramePlan` of ``chunk_rows`` rows a chunk (the last: the
    rest)."""
    total = len(frame)
    step = max(1, chunk_rows)
    chunks = [Chunk(start, min(total, start + step), 0, min(total, start + step) - start)
              for start in range(0, total, step)]
    bad = int((frame[PREFIX + "problem"] != "").sum()) if PREFIX + "problem" in frame.columns else 0
    return FramePlan(path, chunks, frame, bad)


def _combine(raw: pd.DataFrame, canonical: pd.DataFrame) -> pd.DataFrame:
    out = raw.reset_index(drop=True).copy()
    for column in CANONICAL:
        if column in canonical.columns:
            out[PREFIX + column] = canonical[column].to_numpy()
    return out


def canonical_part(frame: pd.DataFrame) -> pd.DataFrame:
    """The ``_nre_`` columns of a chunk frame, with the prefix removed."""
    return frame[[c for c in frame.columns if c.startswith(PREFIX)]].rename(columns=lambda c: c[len(PREFIX):])


def input_part(frame: pd.DataFrame) -> pd.DataFrame:
    """The input's own columns of a chunk frame."""
    return frame[[c for c in frame.columns if not c.startswith(PREFIX)]]


class _located:
    """Make a DataError raised while reading a chunk's file point into the whole file (its name and line)."""

    def __init__(self, piece: str, name: str, offset: int) -> None:
        self.piece, self.name, self.offset = piece, name, offset

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: type | None, err: BaseException | None, tb: Any) -> bool:
        if isinstance(err, DataError):
            problems = [Problem(self.name if p.file == self.piece else p.file,
                                p.line + self.offset if p.line is not None else None, p.field,
                                p.message.replace(self.piece, self.name)) for p in err.problems]
            raise DataError(problems, hint=err.hint) from None
        return False


# --------------------------------------------------------------------------------------------------------------------
# input columns


def _delimited_values(text: str, delimiter: str, columns: list[str]) -> pd.DataFrame:
    """Every record's fields under the header's names (short records padded with "", long ones cut); blank records
    and the header skipped, as read_table skips them."""
    width = len(columns)
    rows = []
    header = True
    for fields in csv.reader(io.StringIO(text, newline=""), delimiter=delimiter):
        if not fields or (len(fields) == 1 and not fields[0].strip()):
            continue
        if header:
            header = False
            continue
        rows.append((fields + [""] * width)[:width])
    return pd.DataFrame(rows, columns=columns, dtype=object) if rows else pd.DataFrame(columns=columns, dtype=object)


def _json_values(text: str, columns: list[str]) -> pd.DataFrame:
    """The chosen keys of each non-blank JSON line (None where missing; objects and lists as JSON text)."""
    values: dict[str, list[Any]] = {c: [] for c in columns}
    for line in text.split("\n"):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except ValueError:
            record = None
        if not isinstance(record, dict):
            record = {}
        for column in columns:
            value = record.get(column)
            if isinstance(value, dict | list):
                value = json.dumps(value, ensure_ascii=False)
            values[column].append(value)
    return pd.DataFrame(values, dtype=object)


def _header_names(text: str, delimiter: str) -> list[str]:
    reader = csv.reader(io.StringIO(text, newline=""), delimiter=delimiter)
    for fields in reader:
        if fields and not (len(fields) == 1 and not fields[0].strip()):
            return [f.strip().lstrip("\ufeff") for f in fields]
    return []


# --------------------------------------------------------------------------------------------------------------------
# planning


def plan_chunks(path: Source, fmt: str | None = None, column_map: dict[str, str] | None = None,
                chunk_rows: int = DEFAULT_CHUNK_ROWS, require_relation: bool = False) -> InputPlan:
    """Scan ``path`` (a local path or a URI) once, streaming, and plan chunks of about ``chunk_rows`` records.

    The first chunk is parsed here as well, so that problems with the file as a whole (missing columns, a bad
    header, an unknown format) raise :class:`DataError` now rather than in a Ray task.
    """
    name = str(path)
    path = name if storage.is_uri(name) else Path(name)
    if chunk_rows < 1:
        raise ValueError("chunk_rows must be >= 1")
    fmt = fmt or R.detect_format(path)
    if fmt not in R.FORMATS:
        raise DataError([Problem(name, None, None, f"unknown format {fmt!r} (expected one of "
                                                   f"{', '.join(R.FORMATS)})")], hint=R.HINT_FORMAT)
    if column_map:
        R.validate_column_map(column_map)
    plan = None
    if fmt in _DELIMITED:
        plan = _plan_delimited(name, path, fmt, column_map, chunk_rows, require_relation)
    elif fmt in _JSON:
        plan = _plan_json(name, path, fmt, column_map, chunk_rows, require_relation)
    elif fmt == "parquet":
        plan = _plan_parquet(name, path, column_map, chunk_rows, require_relation)
    if plan is None or not plan.chunks:
        plan = _plan_whole(name, path, fmt, column_map, chunk_rows, require_relation)
    elif plan.frame is None:
        first = plan.read(0)
        if not plan.columns:
            plan.columns = list(input_part(first).columns)
    return plan


def _binary_lines(path: Source, state: dict[str, int]) -> Iterator[str]:
    """The lines of ``path`` as text (undecodable bytes replaced), counting bytes and lines read in ``state``."""
    with storage.open_input(path) as fh:
        for raw in fh:
            state["pos"] += len(raw)
            state["line"] += 1
            yield raw.decode("utf-8", errors="replace")


def _plan_delimited(name: str, path: Source, fmt: str, column_map: dict[str, str] | None, chunk_rows: int,
                    require_relation: bool) -> InputPlan | None:
    state = {"pos": 0, "line": 0}
    reader = csv.reader(_binary_lines(path, state), delimiter=_DELIMITED[fmt])
    header_end = None
    chunks: list[Chunk] = []
    start = first_line = rows = 0
    try:
        while True:
            at, at_line = state["pos"], state["line"]
            fields = next(reader, None)
            if fields is None:
                break
            if not fields or (len(fields) == 1 and not fields[0].strip()):
                continue
            if header_end is None:
                header_end = state["pos"]
                continue
            if rows == chunk_rows:
                chunks.append(Chunk(start, at, first_line, rows))
                rows = 0
            if rows == 0:
                start, first_line = at, at_line + 1
            rows += 1
    except csv.Error:
        return None  # read whole: read_table reports the syntax error with its line
    if rows:
        chunks.append(Chunk(start, state["pos"], first_line, rows))
    if header_end is None or not chunks:
        return None
    header = storage.read_range(path, 0, header_end)
    names = _header_names(header.decode("utf-8", errors="replace"), _DELIMITED[fmt])
    return InputPlan(name, fmt, column_map, require_relation, chunks, header=header, columns=names)


def _plan_json(name: str, path: Source, fmt: str, column_map: dict[str, str] | None, chunk_rows: int,
               require_relation: bool) -> InputPlan | None:
    chunks: list[Chunk] = []
    pos = start = first_line = rows = 0
    keys: dict[str, None] = {}
    with storage.open_input(path) as fh:
        for number, raw in enumerate(fh, start=1):
            if raw.decode("utf-8", errors="replace").strip():
                if rows == chunk_rows:
                    chunks.append(Chunk(start, pos, first_line, rows))
                    rows = 0
                if rows == 0:
                    start, first_line = pos, number
                rows += 1
                if not chunks:  # the input columns: the keys of the first chunk, in order of appearance
                    try:
                        record = json.loads(raw)
                    except ValueError:
                        record = None
                    if isinstance(record, dict):
                        keys.update(dict.fromkeys(record))
            pos += len(raw)
    if rows:
        chunks.append(Chunk(start, pos, first_line, rows))
    if not chunks:
        return None
    return InputPlan(name, fmt, column_map, require_relation, chunks, columns=list(keys))


def _parquet_file(path: Source) -> Any:
    """``pyarrow.parquet.ParquetFile`` of a local path or a URI."""
    import pyarrow.parquet as pq

    filesystem, inner = storage.pyarrow_path(path)
    return pq.ParquetFile(inner, filesystem=filesystem)


def _plan_parquet(name: str, path: Source, column_map: dict[str, str] | None, chunk_rows: int,
                  require_relation: bool) -> InputPlan | None:
    import pyarrow as pa

    try:
        meta = _parquet_file(path).metadata
    except (pa.ArrowException, OSError, storage.StorageError):
        return None  # read_table reports it
    chunks: list[Chunk] = []
    group = first_row = rows = 0
    for i in range(meta.num_row_groups):
        if rows >= chunk_rows:
            chunks.append(Chunk(group, i, first_row + 1, rows))
            group, first_row, rows = i, first_row + rows, 0
        rows += meta.row_group(i).num_rows
    if rows:
        chunks.append(Chunk(group, meta.num_row_groups, first_row + 1, rows))
    names = list(meta.schema.to_arrow_schema().names)
    return InputPlan(name, "parquet", column_map, require_relation, chunks, columns=names)


def _plan_whole(name: str, path: Source, fmt: str, column_map: dict[str, str] | None, chunk_rows: int,
                require_relation: bool) -> InputPlan:
    frame = R.read_table(path, fmt, column_map, require_relation)
    columns = [c for c in (*R.CANONICAL, *(c for c in frame.columns if c not in R.CANONICAL))
               if c in frame.columns and c not in ("file", "line", "problem")
               and not (c in R.OPTIONAL and (frame[c] == "").all())]
    chunks = [Chunk(s, min(s + chunk_rows, len(frame)), s + 1, min(chunk_rows, len(frame) - s))
              for s in range(0, len(frame), chunk_rows)]
    return InputPlan(name, fmt, column_map, require_relation, chunks, columns=columns, frame=frame)


__all__ = ["PREFIX", "Chunk", "InputPlan", "canonical_part", "input_part", "plan_chunks"]

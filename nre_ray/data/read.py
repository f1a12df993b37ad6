"""Reading relation-classification data into the canonical record schema, and checking its rows: the entry point.

Canonical columns: ``sentence``, ``head``, ``head_offset``, ``tail``, ``tail_offset``, ``relation`` (offsets are
0-based character offsets of the entity's first character in ``sentence``; head = subject, tail = object), and
optionally ``id``, ``head_type``, ``tail_type`` (:mod:`nre_ray.data.schema`).

* :func:`read_table` reads one file (CSV, TSV, JSON Lines, Parquet, DeepKE CSV, OpenNRE JSON Lines, SemEval-2010
  Task 8 text) into a DataFrame of canonical columns plus ``file``, ``line`` and ``problem``. Problems with the whole
  file raise :class:`~nre_ray.data.errors.DataError`; problems with single records found while reading (a CSV row
  with the wrong number of fields, a line that is not JSON, a SemEval block without its label) are written to the
  record's ``problem`` column so that ``--on-bad-rows skip`` can drop them like any other bad row. Each format's
  reader is a module of :mod:`nre_ray.data.formats`, which also detects formats (:func:`detect_format`).
* :func:`check_rows` is the pure per-batch check that Ray Data runs with ``map_batches(batch_format="pandas")``.
* :func:`problems_of` turns the flagged rows of a checked batch into :class:`~nre_ray.data.errors.Problem` objects
  (both in :mod:`nre_ray.data.checks`).
* :func:`read_labels` and :func:`find_data_files` read label lists and find the split files of a data directory
  (:mod:`nre_ray.data.labels`, :mod:`nre_ray.data.datadir`).

Every file or folder may also be a URI (``s3://bucket/data/train.csv``; see :mod:`nre_ray.storage`): the file is
copied to a temporary local file and read like a local one, and everything reported names the URI.
"""

from __future__ import annotations

import io
import os
from collections.abc import Iterator, Mapping
from pathlib import Path

import pandas as pd

from nre_ray import storage
from nre_ray.data.checks import check_rows, problems_of, split_problem
from nre_ray.data.datadir import find_data_files
from nre_ray.data.errors import DataError, Problem
from nre_ray.data.formats import FORMATS, HINT_FORMAT, READERS, detect_format
from nre_ray.data.formats.common import Source, read_text, remote_frames, split_lines, storage_problem, stream_lines
from nre_ray.data.labels import read_labels
from nre_ray.data.schema import CANONICAL, OPTIONAL, REQUIRED, parse_column_map, validate_column_map

__all__ = [
    "CANONICAL", "FORMATS", "HINT_FORMAT", "OPTIONAL", "REQUIRED", "Source", "check_rows", "detect_format",
    "find_data_files", "parse_column_map", "problems_of", "read_chunks", "read_labels", "read_table", "split_problem",
    "storage_problem", "validate_column_map",
]


def read_table(
    path: Source,
    fmt: str | None = None,
    column_map: dict[str, str] | None = None,
    require_relation: bool = True,
) -> pd.DataFrame:
    """Read one data file into canonical columns.

    Args:
        path: the file (or a URI); ``file`` in the result is ``str(path)``, the path as the user gave it.
        fmt: one of :data:`FORMATS`; detected with :func:`detect_format` when None. ``"deepke"`` is CSV that also
            maps DeepKE's ``entity1,entity2,offset1,offset2`` columns by itself.
        column_map: ``{column in the file: canonical column}`` for csv / tsv / jsonl / parquet / deepke.
        require_relation: when False (prediction input) a missing ``relation`` column is fine and is left out.

    Returns:
        One row per record: ``sentence, head, head_offset, tail, tail_offset, [relation], id, head_type, tail_type``
        as str (offsets are the raw text read, "" when missing, JSON numbers in JSON syntax, so that
        :func:`check_rows` can report bad values; optional columns the file lacks are ""), ``file`` (str),
        ``line`` (int64, the 1-based physical line where the record starts; Parquet: row number + 1) and
        ``problem`` ("" or the reason the record could not be read, in :func:`check_rows`'s format).
        CSV and TSV use the usual double-quote quoting (as pandas writes them); a quoted field may span lines and
        keeps its line breaks as they are in the file.

    Raises:
        DataError: missing, empty or undecodable file, missing header or required column, duplicated header
            column, bad column map, unknown format.
    """
    frames = list(_read_source(path, fmt, column_map, require_relation, None))
    return frames[0] if len(frames) == 1 else pd.concat(frames, ignore_index=True)


def read_chunks(
    path: Source,
    fmt: str | None = None,
    column_map: dict[str, str] | None = None,
    rows_per_chunk: int = 10_000,
    require_relation: bool = True,
) -> Iterator[pd.DataFrame]:
    """:func:`read_table` in pieces of at most ``rows_per_chunk`` records, reading the file as a stream.

    The pieces have :func:`read_table`'s columns, ``line`` is still the physical line in the file, and together they
    are what :func:`read_table` returns; only one piece (and one line of the file) is held at a time. The checks that
    :func:`read_table` makes over the whole file are made over the records read so far: the keys of a JSON Lines
    file, and whether an OpenNRE or SemEval file has any relation. Problems with the file raise :class:`DataError`
    when the reader gets to them (an undecodable byte on line 500,000 after the pieces before it).
    """
    if rows_per_chunk < 1:
        raise ValueError(f"rows_per_chunk must be >= 1, found {rows_per_chunk}")
    yield from _read_source(path, fmt, column_map, require_relation, rows_per_chunk)


def _read_source(
    path: Source, fmt: str | None, column_map: Mapping[str, str] | None, require_relation: bool,
    rows_per_chunk: int | None,
) -> Iterator[pd.DataFrame]:
    """:func:`_read` of a local path, or of a temporary copy of a URI (the frames and problems name the URI)."""
    if storage.is_uri(path):
        yield from remote_frames(os.fspath(path),
                                  lambda local: _read(local, fmt, column_map, require_relation, rows_per_chunk))
    else:
        yield from _read(path, fmt, column_map, require_relation, rows_per_chunk)


def _read(
    path: Path, fmt: str | None, column_map: Mapping[str, str] | None, require_relation: bool,
    rows_per_chunk: int | None,
) -> Iterator[pd.DataFrame]:
    """The frames of :func:`read_table` (``rows_per_chunk`` None: one frame, from the whole text) or
    :func:`read_chunks` (streamed)."""
    path = Path(path) if not isinstance(path, Path) else path
    if fmt is None:
        fmt = detect_format(path)
    if fmt not in FORMATS:
        message = f"unknown format {fmt!r} (expected one of {', '.join(FORMATS)})"
        raise DataError([Problem(str(path), None, None, message)], hint=HINT_FORMAT)
    reader = READERS[fmt]
    if column_map:
        validate_column_map(column_map)
        if not reader.column_map:
            raise DataError([Problem(str(path), None, None, f"a column map does not apply to the {fmt} format")],
                            hint="Leave out --columns for this file.")
    if reader.lines is None:
        yield from reader.read(path, None, column_map, require_relation, rows_per_chunk)
        return
    text = read_text(path) if rows_per_chunk is None else None
    if reader.lines == "records":
        lines = io.StringIO(text, newline="") if text is not None else stream_lines(path, universal=True)
    else:
        lines = text.split("\n") if text is not None else split_lines(stream_lines(path, universal=False))
    yield from reader.read(path, lines, column_map, require_relation, rows_per_chunk)

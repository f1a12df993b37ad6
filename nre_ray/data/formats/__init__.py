"""The input formats: each one's reader behind the one record schema (:mod:`nre_ray.data.schema`), and detection.

:data:`READERS` maps a format name (:data:`FORMATS`) to its :class:`Reader`; :func:`detect_format` names the format
of a file from its extension or its first line. :func:`nre_ray.data.read.read_table` and
:func:`~nre_ray.data.read.read_chunks` are the entry points that use them.

* ``csv``, ``tsv``, ``deepke``: :mod:`.delimited`
* ``jsonl``: :mod:`.jsonl`
* ``opennre``: :mod:`.opennre`
* ``semeval``: :mod:`.semeval`
* ``parquet``: :mod:`.parquet`

What the readers share (UTF-8 text, line streaming, files in an object store, :class:`~.common.RecordColumns`, column
resolution) is in :mod:`.common`.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from functools import partial
from pathlib import Path, PurePosixPath
from typing import Literal, NoReturn

import pandas as pd

from nre_ray import storage
from nre_ray.data.errors import DataError, Problem
from nre_ray.data.formats import delimited, jsonl, opennre, parquet, semeval
from nre_ray.data.formats.common import Source, require_file, storage_problem
from nre_ray.data.formats.opennre import is_opennre
from nre_ray.data.formats.semeval import SEMEVAL_SENTENCE
from nre_ray.data.schema import quote


@dataclass(frozen=True)
class Reader:
    """How the records of one format are read."""

    read: Callable[[Path, Iterable[str] | None, Mapping[str, str] | None, bool, int | None], Iterator[pd.DataFrame]]
    """``read(path, lines, column_map, require_relation, rows_per_chunk)``: frames of
    :func:`~nre_ray.data.read.read_table`'s columns, of at most ``rows_per_chunk`` records (None: one frame)."""
    lines: Literal["records", "split"] | None
    """What ``read`` gets as ``lines``: ``"records"``, the file's lines with their ends where a lone CR also ends a
    line (as the csv module wants them); ``"split"``, the lines without their ends (``text.split("\\n")``); None,
    nothing (the reader opens the file itself)."""
    column_map: bool = True
    """Whether a column map (``--columns``) applies; False for formats with fixed fields."""


READERS: dict[str, Reader] = {
    "csv": Reader(partial(delimited.read, fmt="csv"), "records"),
    "tsv": Reader(partial(delimited.read, fmt="tsv"), "records"),
    "jsonl": Reader(jsonl.read, "split"),
    "parquet": Reader(parquet.read, None),
    "deepke": Reader(partial(delimited.read, fmt="deepke"), "records"),
    "opennre": Reader(opennre.read, "split", column_map=False),
    "semeval": Reader(semeval.read, "split", column_map=False),
}
FORMATS = tuple(READERS)

EXTENSION_FORMATS = {".csv": "csv", ".tsv": "tsv", ".tab": "tsv", ".parquet": "parquet", ".pq": "parquet"}
CONTENT_EXTENSIONS = (".jsonl", ".ndjson", ".json", ".txt")
PEEK_BYTES = 1 << 16
HINT_FORMAT = f"Use one of the supported formats ({', '.join(FORMATS)}); pass --format to force one."


def detect_format(path: Source) -> str:
    """The format of ``path`` (one of :data:`FORMATS`), from its extension and a look at its first line.

    ``.csv`` -> csv, ``.tsv``/``.tab`` -> tsv, ``.parquet``/``.pq`` -> parquet. For ``.jsonl``, ``.json``, ``.txt``
    and other extensions the content decides: a JSON object with ``h``/``t`` and ``token``/``text`` -> opennre, other
    JSON objects -> jsonl, ``8001<TAB>"..."`` -> semeval, tab- or comma-separated text -> tsv / csv.
    Raises :class:`DataError` for missing or empty files and content we cannot place. A URI: only the first bytes
    are read.
    """
    if storage.is_uri(path):
        uri = os.fspath(path)
        try:
            storage.check_file(uri)
            ext = PurePosixPath(storage.name_of(uri)).suffix.lower()
            if ext in EXTENSION_FORMATS:
                return EXTENSION_FORMATS[ext]
            with storage.open_input(uri) as stream:
                head = stream.read(PEEK_BYTES)
        except storage.StorageError as err:
            raise storage_problem(err) from None
        except OSError as err:
            raise DataError([Problem(uri, None, None, f"cannot be read ({err})")],
                            hint=storage.credentials_hint(uri)) from None
        return _format_of_head(uri, head)
    path = Path(path)
    require_file(path)
    ext = path.suffix.lower()
    if ext in EXTENSION_FORMATS:
        return EXTENSION_FORMATS[ext]
    with open(path, "rb") as fh:
        head = fh.read(PEEK_BYTES)
    return _format_of_head(path, head)


def _format_of_head(path: Source, head: bytes) -> str:
    """The format of a file whose extension does not tell, from its first bytes."""
    if head.startswith(b"PAR1"):
        return "parquet"
    if head.startswith(b"PK\x03\x04"):
        _unknown_format(path, "a ZIP archive (an Excel workbook?); save it as CSV UTF-8")
    text = head.decode("utf-8", errors="replace").lstrip("\ufeff")
    first = _first_line(text)
    if not first:
        raise DataError([Problem(str(path), None, None, "file is empty")],
                        hint="Check that you passed the right file; a data file needs at least one record.")
    return _format_of_line(path, first)


def _format_of_line(path: Source, first: str) -> str:
    stripped = first.strip()
    if stripped.startswith("{"):
        try:
            record = json.loads(stripped)
        except ValueError:
            return "jsonl"  # read_table reports the bad line
        return "opennre" if isinstance(record, dict) and is_opennre(record) else "jsonl"
    if stripped.startswith("["):
        _unknown_format(path, "a JSON array; write one JSON object per line (JSON Lines) instead")
    if SEMEVAL_SENTENCE.match(first):
        return "semeval"
    if "\t" in first:
        return "tsv"
    if "," in first:
        return "csv"
    _unknown_format(path, f"not a format we know (first line: {quote(first)})")


def _unknown_format(path: Source, what: str) -> NoReturn:
    raise DataError([Problem(str(path), None, None, f"cannot read this file: it is {what}")], hint=HINT_FORMAT)


def _first_line(text: str) -> str:
    """The first line of ``text`` that is not blank ("" if none)."""
    for line in text.splitlines():
        if line.strip():
            return line
    return ""


"""Reading relation-classification data into the canonical record schema, and checking its rows.

Canonical columns: ``sentence``, ``head``, ``head_offset``, ``tail``, ``tail_offset``, ``relation`` (offsets are
0-based character offsets of the entity's first character in ``sentence``; head = subject, tail = object), and
optionally ``id``, ``head_type``, ``tail_type``.

* :func:`read_table` reads one file (CSV, TSV, JSON Lines, Parquet, DeepKE CSV, OpenNRE JSON Lines, SemEval-2010
  Task 8 text) into a DataFrame of canonical columns plus ``file``, ``line`` and ``problem``. Problems with the whole
  file raise :class:`~nre_ray.data.errors.DataError`; problems with single records found while reading (a CSV row
  with the wrong number of fields, a line that is not JSON, a SemEval block without its label) are written to the
  record's ``problem`` column so that ``--on-bad-rows skip`` can drop them like any other bad row.
* :func:`check_rows` is the pure per-batch check that Ray Data runs with ``map_batches(batch_format="pandas")``.
* :func:`problems_of` turns the flagged rows of a checked batch into :class:`~nre_ray.data.errors.Problem` objects.
* :func:`read_labels` and :func:`find_data_files` read label lists and find the split files of a data directory.

Every file or folder may also be a URI (``s3://bucket/data/train.csv``; see :mod:`nre_ray.storage`): the file is
copied to a temporary local file and read like a local one, and everything reported names the URI.
"""

from __future__ import annotations

import csv
import io
import json
import math
import os
import re
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path, PurePosixPath
from typing import Any, NoReturn, TypeVar

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from nre_ray import storage
from nre_ray.data.errors import DataError, Problem

REQUIRED: tuple[str, ...] = ("sentence", "head", "head_offset", "tail", "tail_offset", "relation")
OPTIONAL: tuple[str, ...] = ("id", "head_type", "tail_type")
FORMATS = ("csv", "tsv", "jsonl", "parquet", "deepke", "opennre", "semeval")

CANONICAL: tuple[str, ...] = REQUIRED + OPTIONAL
TEXT_FIELDS = ("sentence", "head", "tail", "relation")
ENTITIES = ("head", "tail")
DEEPKE_TINY_MAP: dict[str, str] = {
    "entity1": "head", "offset1": "head_offset", "entity2": "tail", "offset2": "tail_offset",
}
"""How DeepKE's first ``sentence,entity1,entity2,offset1,offset2,relation`` layout maps to the canonical one."""
DEEPKE_TINY_OPTION = "--columns " + ",".join(f"{k}={v}" for k, v in DEEPKE_TINY_MAP.items())

EXTENSION_FORMATS = {".csv": "csv", ".tsv": "tsv", ".tab": "tsv", ".parquet": "parquet", ".pq": "parquet"}
CONTENT_EXTENSIONS = (".jsonl", ".ndjson", ".json", ".txt")
DATA_EXTENSIONS = (".csv", ".tsv", ".tab", ".jsonl", ".ndjson", ".json", ".parquet", ".pq", ".txt")
LABEL_FILES = ("relation.txt", "relation.csv", "rel2id.json")

ROW_FIELDS = (*CANONICAL, "row", "json", "token", "text", "h", "t", "h.pos", "t.pos", "h.name", "t.name")
"""Field names that may start a part of a ``problem`` string (used to split joined problems apart again)."""
_PROBLEM_SPLIT = re.compile("; (?=(?:" + "|".join(re.escape(f) for f in ROW_FIELDS) + "): )")
_PROBLEM_PART = re.compile(r"^([A-Za-z_][\w.]*): (.*)$", re.DOTALL)

SEMEVAL_SENTENCE = re.compile(r'^\s*(\d+)\t\s*"(.*)"\s*$')
SEMEVAL_TAG = re.compile(r"</?e[12]>")
MAX_OFFSET = 2**53
MAX_QUOTE = 60
MAX_HINT_OFFSETS = 5
PEEK_BYTES = 1 << 16

HINT_PATH = "Check the path (it is read relative to the current directory)."
HINT_UTF8 = ("Re-save the file as UTF-8 (for example: iconv -f GB18030 -t UTF-8 in.csv > out.csv, "
             "or 'CSV UTF-8' in Excel's Save As).")
HINT_COLUMNS = ("Rename the columns in the file, or map your column names to ours with --columns SOURCE=TARGET,... "
                "(column_map={'SOURCE': 'TARGET'}), e.g. --columns text=sentence,label=relation.")
HINT_FORMAT = f"Use one of the supported formats ({', '.join(FORMATS)}); pass --format to force one."
HINT_LABELS = "Fix the label file: one relation label per line, each label once."

Source = Path | str
"""A data file or folder: a local path, or a URI (``s3://...``, kept as a string)."""
T = TypeVar("T")


# --------------------------------------------------------------------------------------------------------------------
# column maps


def parse_column_map(text: str) -> dict[str, str]:
    """Parse the CLI's ``--columns`` syntax ``SOURCE=TARGET,SOURCE=TARGET`` into ``{SOURCE: TARGET}``.

    Targets must be canonical column names. Raises :class:`DataError` on bad syntax, unknown targets, or a
    source or target named twice. An empty text gives ``{}``.
    """
    mapping: dict[str, str] = {}
    for item in (text or "").split(","):
        if not item.strip():
            continue
        source, sep, target = (part.strip() for part in item.partition("="))
        if not sep or not source or not target:
            _fail_map(f"bad mapping {item.strip()!r} (expected SOURCE=TARGET, e.g. entity1=head)")
        if source in mapping:
            _fail_map(f"column {source!r} is mapped twice")
        mapping[source] = target
    validate_column_map(mapping)
    return mapping


def validate_column_map(column_map: Mapping[str, str]) -> None:
    """Raise :class:`DataError` unless every target is a canonical column, named at most once."""
    seen: dict[str, str] = {}
    for source, target in column_map.items():
        if target not in CANONICAL:
            _fail_map(f"unknown target column {target!r} in {source}={target} (expected one of {', '.join(CANONICAL)})")
        if target in seen:
            _fail_map(f"two columns are mapped to {target!r}: {seen[target]!r} and {source!r}")
        seen[target] = source


def _fail_map(message: str) -> NoReturn:
    raise DataError([Problem("--columns", None, None, message)],
                    hint="Write the mapping as SOURCE=TARGET pairs separated by commas, e.g. " + DEEPKE_TINY_OPTION)


# --------------------------------------------------------------------------------------------------------------------
# files, bytes and text


def _require_file(path: Path) -> None:
    """Raise :class:`DataError` when ``path`` is not an existing regular file."""
    if path.is_dir():
        raise DataError([Problem(str(path), None, None, "is a directory (expected a data file)")], hint=HINT_PATH)
    if not path.is_file():
        raise DataError([Problem(str(path), None, None, "file not found")], hint=HINT_PATH)


def _decode(name: str, data: bytes) -> str:
    """UTF-8 text of ``data`` without a BOM; :class:`DataError` naming the line and byte offset when undecodable."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise DataError([_decode_problem(name, data, err)], hint=HINT_UTF8) from None
    return text[1:] if text.startswith("\ufeff") else text


def _decode_problem(name: str, data: bytes, err: UnicodeDecodeError, first_line: int = 1, offset: int = 0) -> Problem:
    """The problem of undecodable ``data``, the file's bytes from byte ``offset`` on (which is on ``first_line``)."""
    line = data.count(b"\n", 0, err.start) + first_line
    column = err.start - (data.rfind(b"\n", 0, err.start) + 1) + 1
    message = (f"not valid UTF-8: byte 0x{data[err.start]:02x} at byte offset {offset + err.start} "
               f"(byte {column} of the line) cannot be decoded")
    if offset == 0 and data.startswith((b"\xff\xfe", b"\xfe\xff")):
        message += "; the file is UTF-16 encoded"
    elif _decodes(data[data.rfind(b"\n", 0, err.start) + 1:].split(b"\n", 1)[0], "gb18030"):
        message += "; the line decodes as GB18030, so the file was probably saved as GBK/GB18030"
    return Problem(name, line, None, message)


def _decodes(data: bytes, encoding: str) -> bool:
    try:
        data.decode(encoding)
    except UnicodeDecodeError:
        return False
    return True


def _read_text(path: Path) -> str:
    """The whole file as text (UTF-8, BOM removed); :class:`DataError` when missing, undecodable or empty."""
    _require_file(path)
    text = _decode(str(path), path.read_bytes())
    if not text.strip():
        _empty(path)
    return text


def _empty(path: Path) -> NoReturn:
    raise DataError([Problem(str(path), None, None, "file is empty")],
                    hint="Check that you passed the right file; a data file needs at least one record.")


def _stream_lines(path: Path, universal: bool) -> Iterator[str]:
    """The file's lines one at a time, with their line ends, checked as :func:`_read_text` checks the whole text.

    ``universal``: a lone CR also ends a line, as ``io.StringIO(text, newline="")`` splits (for the csv module)."""
    _require_file(path)
    blank, offset = True, 0
    with open(path, "rb") as fh:
        for number, data in enumerate(fh, start=1):
            try:
                line = data.decode("utf-8")
            except UnicodeDecodeError as err:
                raise DataError([_decode_problem(str(path), data, err, number, offset)], hint=HINT_UTF8) from None
            if offset == 0 and line.startswith("\ufeff"):
                line = line[1:]
            offset += len(data)
            blank = blank and not line.strip()
            body = line[:-2] if line.endswith("\r\n") else line[:-1] if line.endswith(("\n", "\r")) else line
            if universal and "\r" in body:  # lone CRs inside the line
                yield from io.StringIO(line, newline="")
            else:
                yield line
    if blank:
        _empty(path)


def _split_lines(lines: Iterable[str]) -> Iterator[str]:
    """What ``text.split("\\n")`` gives, from the lines of ``text`` with their ends."""
    last = "\n"
    for line in lines:
        last = line
        yield line[:-1] if line.endswith("\n") else line
    if last.endswith("\n"):
        yield ""


def _batched(items: Iterable[Any], size: int | None) -> Iterator[list[Any]]:
    """Lists of ``size`` items (the last may be shorter); ``size`` None: one list of everything, even if empty."""
    if size is None:
        yield list(items)
        return
    batch: list[Any] = []
    for item in items:
        batch.append(item)
        if len(batch) >= size:
            yield batch
            batch = []
    if batch:
        yield batch


def _first_line(text: str) -> str:
    """The first line of ``text`` that is not blank ("" if none)."""
    for line in text.splitlines():
        if line.strip():
            return line
    return ""


def _as_text(value: Any) -> str:
    """Any scalar read from a file as text: missing values (None, NaN, NA) become ""; JSON values keep JSON syntax."""
    if type(value) is str:
        return value
    if value is None or value is pd.NA or value is pd.NaT:
        return ""
    if isinstance(value, float | np.floating) and math.isnan(value):
        return ""
    if isinstance(value, bool | np.bool_):
        return "true" if value else "false"
    if isinstance(value, int | float | np.integer | np.floating):
        return str(value.item() if isinstance(value, np.generic) else value)
    try:
        return json.dumps(value, ensure_ascii=False, default=str)
    except (TypeError, ValueError):
        return str(value)


def _quote(text: str) -> str:
    """``repr`` of user text, shortened to :data:`MAX_QUOTE` characters."""
    return repr(text if len(text) <= MAX_QUOTE else text[:MAX_QUOTE] + "…")


# --------------------------------------------------------------------------------------------------------------------
# files in an object store


def storage_problem(err: storage.StorageError) -> DataError:
    """A :class:`DataError` (``URI: reason`` and what to check) for a file of the store that cannot be had."""
    reason = "file not found" if err.reason.startswith("not found") else \
        "is a directory (expected a data file)" if err.reason.startswith("is a folder") else err.reason
    return DataError([Problem(err.uri, None, None, reason)], hint=err.hint or HINT_PATH)


def _renamed(err: DataError, local: str, uri: str) -> DataError:
    """``err`` about the temporary copy ``local``, naming ``uri`` instead."""
    return DataError([Problem(uri if p.file == local else p.file, p.line, p.field, p.message.replace(local, uri))
                      for p in err.problems], hint=err.hint, total=err.total)


def _remote_call(uri: str, read: Callable[[Path], T]) -> T:
    """``read(a temporary local copy of the file uri)``; what it reports names ``uri``."""
    try:
        storage.check_file(uri)
        with storage.temporary_copy(uri) as local:
            try:
                return read(local)
            except DataError as err:
                raise _renamed(err, str(local), uri) from None
    except storage.StorageError as err:
        raise storage_problem(err) from None


def _remote_frames(uri: str, read: Callable[[Path], Iterator[pd.DataFrame]]) -> Iterator[pd.DataFrame]:
    """The frames ``read`` yields from a temporary local copy of the file ``uri`` (removed when done); their
    ``file`` column and what is reported name ``uri``."""
    try:
        storage.check_file(uri)
        with storage.temporary_copy(uri) as local:
            try:
                for frame in read(local):
                    frame["file"] = uri
                    yield frame
            except DataError as err:
                raise _renamed(err, str(local), uri) from None
    except storage.StorageError as err:
        raise storage_problem(err) from None


# --------------------------------------------------------------------------------------------------------------------
# format detection


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
    _require_file(path)
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
        return "opennre" if isinstance(record, dict) and _is_opennre(record) else "jsonl"
    if stripped.startswith("["):
        _unknown_format(path, "a JSON array; write one JSON object per line (JSON Lines) instead")
    if SEMEVAL_SENTENCE.match(first):
        return "semeval"
    if "\t" in first:
        return "tsv"
    if "," in first:
        return "csv"
    _unknown_format(path, f"not a format we know (first line: {_quote(first)})")


def _unknown_format(path: Source, what: str) -> NoReturn:
    raise DataError([Problem(str(path), None, None, f"cannot read this file: it is {what}")], hint=HINT_FORMAT)


def _is_opennre(record: Mapping[str, Any]) -> bool:
    return isinstance(record.get("h"), dict) and isinstance(record.get("t"), dict) and (
        "token" in record or "text" in record)


# --------------------------------------------------------------------------------------------------------------------
# read_table


class _Rows:
    """Column-wise accumulator for the records of one file."""

    def __init__(self, columns: Sequence[str]) -> None:
        self.columns = {name: [] for name in columns}
        self.lines: list[int] = []
        self.problems: list[str] = []

    def add(self, line: int, values: Mapping[str, str], problem: str = "") -> None:
        for name, column in self.columns.items():
            column.append(values.get(name, ""))
        self.lines.append(line)
        self.problems.append(problem)

    def frame(self, name: str) -> pd.DataFrame:
        """The records as a DataFrame: canonical columns (all str), then ``file``, ``line`` and ``problem``."""
        data: dict[str, Any] = {c: self.columns.get(c, [""] * len(self.lines)) for c in _output_columns(self.columns)}
        data["file"] = [name] * len(self.lines)
        data["line"] = np.asarray(self.lines, dtype=np.int64)
        data["problem"] = self.problems
        return pd.DataFrame(data)


def _output_columns(present: Mapping[str, Any]) -> list[str]:
    return [c for c in REQUIRED if c != "relation" or "relation" in present] + list(OPTIONAL)


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
        yield from _remote_frames(os.fspath(path),
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
    if column_map:
        validate_column_map(column_map)
        if fmt in ("opennre", "semeval"):
            raise DataError([Problem(str(path), None, None, f"a column map does not apply to the {fmt} format")],
                            hint="Leave out --columns for this file.")
    if fmt == "parquet":
        yield from _read_parquet(path, column_map, require_relation, rows_per_chunk)
        return
    text = _read_text(path) if rows_per_chunk is None else None
    if fmt in ("csv", "tsv", "deepke"):
        lines = io.StringIO(text, newline="") if text is not None else _stream_lines(path, universal=True)
        yield from _read_delimited(path, lines, fmt, column_map, require_relation, rows_per_chunk)
        return
    lines = text.split("\n") if text is not None else _split_lines(_stream_lines(path, universal=False))
    if fmt == "jsonl":
        yield from _read_jsonl(path, lines, column_map, require_relation, rows_per_chunk)
    elif fmt == "opennre":
        yield from _read_opennre(path, lines, require_relation, rows_per_chunk)
    else:
        yield from _read_semeval(path, lines, require_relation, rows_per_chunk)


def _resolve_columns(
    name: str,
    names: Sequence[str],
    column_map: Mapping[str, str] | None,
    require_relation: bool,
    header_line: int | None,
    fmt: str,
) -> dict[str, str]:
    """``{canonical column: column in the file}`` for the columns we use; :class:`DataError` when required ones lack."""
    column_map = dict(column_map or {})
    if not column_map and fmt == "deepke" and _looks_tiny(names):
        column_map = dict(DEEPKE_TINY_MAP)
    absent = [source for source in column_map if source not in names]
    if absent:
        raise DataError([Problem(name, header_line, None,
                                 f"the column map names column{'s' if len(absent) > 1 else ''} "
                                 f"{', '.join(absent)}, not in the file (found columns: {_list(names)})")],
                        hint=HINT_COLUMNS)
    found: dict[str, str] = {}
    for source in names:
        target = column_map.get(source, source)
        if target not in CANONICAL:
            continue
        if target in found:
            raise DataError([Problem(name, header_line, None,
                                     f"two columns give {target!r}: {found[target]!r} and {source!r}")],
                            hint=HINT_COLUMNS)
        found[target] = source
    needed = [c for c in REQUIRED if c != "relation" or require_relation]
    missing = [c for c in needed if c not in found]
    if missing:
        raise _missing_columns(name, names, missing, found, header_line, fmt)
    return found


def _missing_columns(
    name: str, names: Sequence[str], missing: list[str], found: Mapping[str, str], line: int | None, fmt: str
) -> DataError:
    expected = f"{', '.join(REQUIRED)} (optional: {', '.join(OPTIONAL)})"
    if _looks_tiny(names):
        message = f"missing required columns {', '.join(missing)} (found columns: {_list(names)})"
        return DataError(
            [Problem(name, line, None, message)],
            hint=(f"This looks like DeepKE's sentence,entity1,entity2,offset1,offset2,relation layout: map its columns "
                  f"with {DEEPKE_TINY_OPTION} (column_map={DEEPKE_TINY_MAP}) or pass --format deepke."))
    if not found and fmt in ("csv", "tsv", "deepke"):
        sep = "\t" if fmt == "tsv" else ","
        message = (f"no header row: line {line} names none of the expected columns (found {_list(names)}); "
                   f"expected a header line such as {sep.join(REQUIRED)!r}")
        return DataError([Problem(name, line, None, message)],
                         hint="Add a header line naming the columns, or map your column names with "
                              "--columns SOURCE=TARGET,...")
    word = "column" if len(missing) == 1 else "columns"
    message = f"missing required {word} {', '.join(missing)} (found columns: {_list(names)}; expected: {expected})"
    if len(names) == 1 and fmt in ("csv", "deepke") and ("\t" in names[0] or ";" in names[0]):
        message += "; the header looks separated by " + ("tabs (use --format tsv)" if "\t" in names[0] else "';'")
    return DataError([Problem(name, line, None, message)], hint=HINT_COLUMNS)


def _looks_tiny(names: Sequence[str]) -> bool:
    return {"entity1", "entity2"} <= set(names) and not {"head", "tail"} & set(names)


def _list(names: Sequence[str], limit: int = 20) -> str:
    shown = ", ".join(repr(n) if (not n or n != n.strip() or "," in n) else n for n in list(names)[:limit])
    return shown + (f", ... ({len(names)} in all)" if len(names) > limit else "") if names else "none"


def _check_duplicates(name: str, names: Sequence[str], line: int | None) -> None:
    """:class:`DataError` when a (non-empty) header name occurs twice."""
    first: dict[str, int] = {}
    problems = []
    for index, column in enumerate(names, start=1):
        if not column:
            continue
        if column in first:
            message = f"duplicated header column (columns {first[column]} and {index} are both {column!r})"
            problems.append(Problem(name, line, column, message))
        else:
            first[column] = index
    if problems:
        raise DataError(problems, hint="Give every column its own name in the header line.")


# ------------------------------------------------------------------------------------------------ CSV / TSV / DeepKE


def _records(name: str, reader: Any) -> Iterator[tuple[int, int, list[str]]]:
    """``(first line, last line, fields)`` of each non-blank record of a csv reader."""
    while True:
        start = reader.line_num + 1
        try:
            fields = next(reader)
        except StopIteration:
            return
        except csv.Error as err:
            raise DataError([Problem(name, start, None, f"CSV syntax error: {err}")],
                            hint="Fix the quoting on that line (a field with quotes must be enclosed in double quotes, "
                                 "with inner quotes doubled).") from None
        if not fields or (len(fields) == 1 and not fields[0].strip()):
            continue
        yield start, reader.line_num, fields


def _read_delimited(
    path: Path, lines: Iterable[str], fmt: str, column_map: Mapping[str, str] | None, require_relation: bool,
    rows_per_chunk: int | None,
) -> Iterator[pd.DataFrame]:
    name = str(path)
    delimiter = "\t" if fmt == "tsv" else ","
    reader = csv.reader(lines, delimiter=delimiter)
    records = _records(name, reader)
    header_line, header = _header(name, records)
    names = [column.strip().lstrip("\ufeff") for column in header]
    _check_duplicates(name, names, header_line)
    found = _resolve_columns(name, names, column_map, require_relation, header_line, fmt)
    index = {target: names.index(source) for target, source in found.items()}
    rows = _Rows(_output_columns(found))
    width, done = len(names), 0
    sep_name = "tab" if delimiter == "\t" else "comma"
    for start, end, fields in records:
        if len(fields) != width and not (len(fields) > width and not any(f.strip() for f in fields[width:])):
            rows.add(start, {}, _field_count_problem(len(fields), width, start, end, sep_name))
        else:
            rows.add(start, {target: fields[i] for target, i in index.items()})
        if rows_per_chunk is not None and len(rows.lines) >= rows_per_chunk:
            done += len(rows.lines)
            yield rows.frame(name)
            rows = _Rows(_output_columns(found))
    if not rows.lines and not done:
        raise DataError([Problem(name, header_line, None, "the file has a header but no data rows")],
                        hint="Check that you passed the right file; a data file needs at least one record.")
    if rows.lines:
        yield rows.frame(name)


def _field_count_problem(count: int, width: int, start: int, end: int, sep_name: str) -> str:
    message = f"row: wrong number of fields (expected {width} like the header, found {count})"
    if end > start:
        message += f", this record runs from line {start} to line {end}: check for an unmatched double quote"
    elif count > width:
        message += f", a field that contains a {sep_name} must be enclosed in double quotes"
    return message


def _header(name: str, records: Iterator[tuple[int, int, list[str]]]) -> tuple[int, list[str]]:
    """``(line, fields)`` of the first record; :class:`DataError` when there is none."""
    first = next(records, None)
    if first is None:
        raise DataError([Problem(name, None, None, "file is empty")],
                        hint="Check that you passed the right file; a data file needs at least one record.")
    return first[0], first[2]


# ------------------------------------------------------------------------------------------------------- JSON Lines


def _json_lines(lines: Iterable[str]) -> Iterator[tuple[int, Any, str]]:
    """``(line, value, problem)`` for each non-blank line: the parsed JSON value, or None and the reason."""
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            yield number, json.loads(line), ""
        except ValueError as err:
            where = f" at column {err.colno}" if isinstance(err, json.JSONDecodeError) else ""
            yield number, None, f"json: not valid JSON ({getattr(err, 'msg', str(err))}{where})"


def _json_object_problem(value: Any) -> str:
    if isinstance(value, dict):
        return ""
    return f"json: not a JSON object (expected {{\"sentence\": ..., ...}}, found a {type(value).__name__})"


def _read_jsonl(
    path: Path, lines: Iterable[str], column_map: Mapping[str, str] | None, require_relation: bool,
    rows_per_chunk: int | None,
) -> Iterator[pd.DataFrame]:
    name = str(path)
    keys: dict[str, None] = {}
    for parsed in _batched(_json_lines(lines), rows_per_chunk):
        for _, value, _ in parsed:
            if isinstance(value, dict):
                keys.update(dict.fromkeys(value))
        if not keys and parsed and all(problem for _, _, problem in parsed):
            first_line, _, problem = parsed[0]
            raise DataError([Problem(name, first_line, "json", problem.partition(": ")[2])],
                            hint="Write one JSON object per line (JSON Lines).")
        found = _resolve_columns(name, list(keys), column_map, require_relation, None, "jsonl")
        rows = _Rows(_output_columns(found))
        for line, value, problem in parsed:
            problem = problem or _json_object_problem(value)
            if problem:
                rows.add(line, {}, problem)
                continue
            rows.add(line, {target: _as_text(value.get(source)) for target, source in found.items()})
        yield rows.frame(name)


def _read_opennre(
    path: Path, lines: Iterable[str], require_relation: bool, rows_per_chunk: int | None
) -> Iterator[pd.DataFrame]:
    name = str(path)
    has_relation = False
    for parsed in _batched(_json_lines(lines), rows_per_chunk):
        has_relation = has_relation or any(isinstance(v, dict) and "relation" in v for _, v, _ in parsed)
        if require_relation and not has_relation:
            raise DataError([Problem(name, None, None,
                                     "missing required field relation (no record has a 'relation')")],
                            hint="Add the relation label to every record, or read the file as prediction input.")
        rows = _Rows(_output_columns({"relation": ""} if has_relation else {}))
        for line, value, problem in parsed:
            problem = problem or _json_object_problem(value)
            if problem:
                rows.add(line, {}, problem)
                continue
            values, problem = _opennre_record(value)
            rows.add(line, values, problem)
        yield rows.frame(name)


def _opennre_record(record: Mapping[str, Any]) -> tuple[dict[str, str], str]:
    """Canonical values of one OpenNRE record (token or text form), or ({}, problem)."""
    values = {"relation": _as_text(record.get("relation")), "id": _as_text(record.get("id"))}
    tokens = record.get("token")
    if tokens is not None:
        if not isinstance(tokens, list) or not all(isinstance(t, str) for t in tokens):
            return {}, "token: not a list of strings (expected the sentence's tokens)"
        values["sentence"] = " ".join(tokens)
        starts = np.cumsum([0] + [len(t) + 1 for t in tokens]).tolist()
        limit = len(tokens)
    elif isinstance(record.get("text"), str):
        values["sentence"] = record["text"]
        limit = None
    else:
        return {}, "token: missing (expected 'token': [...] or 'text': '...')"
    for key, entity in (("h", "head"), ("t", "tail")):
        span, problem = _opennre_span(record.get(key), key, limit)
        if problem:
            return {}, problem
        start, end = span
        mention = record[key]
        if tokens is not None:
            values[entity] = " ".join(tokens[start:end])
            values[f"{entity}_offset"] = str(starts[start])
        else:
            name = mention.get("name")
            values[entity] = name if isinstance(name, str) else values["sentence"][start:end]
            values[f"{entity}_offset"] = str(start)
        if isinstance(mention.get("type"), str):
            values[f"{entity}_type"] = mention["type"]
    return values, ""


def _opennre_span(mention: Any, key: str, limit: int | None) -> tuple[tuple[int, int], str]:
    """``(start, end)`` of an OpenNRE mention's ``pos``, or a problem (token positions are checked against limit)."""
    if not isinstance(mention, dict):
        return (0, 0), f"{key}: missing (expected {{\"name\": ..., \"pos\": [start, end]}})"
    pos = mention.get("pos")
    if not (isinstance(pos, list) and len(pos) == 2 and all(type(p) is int for p in pos)):
        return (0, 0), f"{key}.pos: not a [start, end] pair of integers (found {_quote(_as_text(pos))})"
    start, end = pos
    if limit is not None and not 0 <= start < end <= limit:
        return (0, 0), (f"{key}.pos: outside the {limit} tokens (expected 0 <= start < end <= {limit}, "
                        f"found [{start}, {end}])")
    return (start, end), ""


# ------------------------------------------------------------------------------------------------- SemEval-2010 Task 8


def _read_semeval(
    path: Path, lines: Iterable[str], require_relation: bool, rows_per_chunk: int | None
) -> Iterator[pd.DataFrame]:
    name = str(path)
    has_relation = False
    for blocks in _batched(_semeval_blocks(lines), rows_per_chunk):
        has_relation = has_relation or any(label is not None for _, _, _, label, _ in blocks)
        if require_relation and not has_relation:
            raise DataError([Problem(name, None, None,
                                     "no relation labels: this is an unlabelled SemEval file (sentence lines only)")],
                            hint="Use the labelled file (TRAIN_FILE.TXT or TEST_FILE_FULL.TXT), "
                                 "or read this one as prediction input.")
        rows = _Rows(_output_columns({"relation": ""} if has_relation else {}))
        for line, number, body, label, after in blocks:
            if number is None:
                rows.add(line, {}, f"row: not a SemEval sentence line (expected 'NUMBER<TAB>\"sentence\"', "
                                   f"found {body})")
                continue
            values, problem = _semeval_sentence(body)
            values["id"] = number
            if has_relation:
                values["relation"] = label or ""
                if label is None and not problem:
                    problem = ("relation: SemEval block has no label line (expected a label such as 'Other' or "
                               f"'Cause-Effect(e1,e2)' on the line after the sentence, found {after})")
            rows.add(line, values, problem)
        yield rows.frame(name)


_END = object()


def _semeval_blocks(lines: Iterable[str]) -> Iterator[tuple[int, str | None, str, str | None, str]]:
    """``(line, number, quoted sentence, label, what followed)`` per block; number None for a stray line."""
    numbered = enumerate(lines, start=1)
    ahead = next(numbered, _END)
    while ahead is not _END:
        number, current = ahead
        ahead = next(numbered, _END)
        current = current.rstrip("\r")
        if not current.strip():
            continue
        match = SEMEVAL_SENTENCE.match(current)
        if not match:
            yield number, None, _quote(current.strip()), None, ""
            continue
        nxt = ahead[1].rstrip("\r").strip() if ahead is not _END else ""
        after = _quote(nxt) if nxt else "a blank line" if ahead is not _END else "the end of the file"
        label = None
        if nxt and not SEMEVAL_SENTENCE.match(ahead[1]) and not nxt.lower().startswith("comment"):
            label, ahead = nxt, next(numbered, _END)
        if ahead is not _END and ahead[1].strip().lower().startswith("comment"):
            ahead = next(numbered, _END)
        yield number, match.group(1), match.group(2), label, after


def _semeval_sentence(body: str) -> tuple[dict[str, str], str]:
    """Strip ``<e1>``/``<e2>`` tags: sentence, head (e1), tail (e2) and their offsets in the stripped sentence."""
    pieces: list[str] = []
    length, position = 0, 0
    opened: dict[str, int] = {}
    spans: dict[str, tuple[int, int]] = {}
    for match in SEMEVAL_TAG.finditer(body):
        pieces.append(body[position:match.start()])
        length += match.start() - position
        position = match.end()
        tag = match.group().strip("</>")
        if not match.group().startswith("</"):
            if tag in opened or tag in spans:
                return {}, f"sentence: <{tag}> opened twice (expected one <e1>...</e1> and one <e2>...</e2>)"
            opened[tag] = length
        elif tag in opened:
            spans[tag] = (opened.pop(tag), length)
        else:
            return {}, f"sentence: </{tag}> without <{tag}> (expected one <e1>...</e1> and one <e2>...</e2>)"
    pieces.append(body[position:])
    if opened or set(spans) != {"e1", "e2"}:
        found = ", ".join(sorted(spans)) or "none"
        return {}, f"sentence: entity tags incomplete (expected one <e1>...</e1> and one <e2>...</e2>, found {found})"
    sentence = "".join(pieces)
    (h_start, h_end), (t_start, t_end) = spans["e1"], spans["e2"]
    return {"sentence": sentence, "head": sentence[h_start:h_end], "head_offset": str(h_start),
            "tail": sentence[t_start:t_end], "tail_offset": str(t_start)}, ""


# ------------------------------------------------------------------------------------------------------------ Parquet


def _read_parquet(
    path: Path, column_map: Mapping[str, str] | None, require_relation: bool, rows_per_chunk: int | None
) -> Iterator[pd.DataFrame]:
    import pyarrow.parquet as pq

    name = str(path)
    _require_file(path)
    try:
        parquet = pq.ParquetFile(path)
        names = list(parquet.schema_arrow.names)
        num_rows = parquet.metadata.num_rows
    except (pa.ArrowException, OSError) as err:
        _bad_parquet(name, err)
    _check_duplicates(name, names, None)
    if num_rows == 0:
        raise DataError([Problem(name, None, None, "file is empty (no rows)")],
                        hint="Check that you passed the right file; a data file needs at least one record.")
    found = _resolve_columns(name, names, column_map, require_relation, None, "parquet")
    columns = list(found.values())
    start = 0
    try:
        tables = [parquet.read(columns)] if rows_per_chunk is None else \
            parquet.iter_batches(batch_size=rows_per_chunk, columns=columns)
        for table in tables:
            n = table.num_rows
            data: dict[str, Any] = {}
            for target in _output_columns(found):
                data[target] = _arrow_texts(table.column(found[target])) if target in found else [""] * n
            data["file"] = [name] * n
            data["line"] = np.arange(start + 1, start + n + 1, dtype=np.int64)
            data["problem"] = [""] * n
            start += n
            yield pd.DataFrame(data)
    except (pa.ArrowException, OSError) as err:
        _bad_parquet(name, err)


def _bad_parquet(name: str, err: Exception) -> NoReturn:
    raise DataError([Problem(name, None, None, f"not a readable Parquet file ({err})")],
                    hint="Check the file, or pass --format if it is not Parquet.") from None


def _arrow_texts(column: Any) -> list[str]:
    """A pyarrow column as a list of str (nulls -> "", numbers as written)."""
    if pa.types.is_integer(column.type) or pa.types.is_string(column.type) or pa.types.is_large_string(column.type):
        return [_as_text(v) for v in column.cast(pa.large_string()).to_pylist()]
    return [_as_text(v) for v in column.to_pylist()]


# --------------------------------------------------------------------------------------------------------------------
# check_rows


_OK, _NOT_INT, _EMPTY, _SKIPPED, _NEGATIVE, _PAST_END, _MISMATCH = range(7)


class _Texts:
    """One text column of a batch as str values, with its empty mask and lengths (vectorised for Arrow strings)."""

    def __init__(self, series: pd.Series | None, n: int) -> None:
        self.present = series is not None
        self.changed = False
        self._arrow = _arrow_strings(series) if series is not None else None
        self._values: list[str] | None = None
        if series is None:
            self._values = [""] * n
            self.empty = np.ones(n, dtype=bool)
        elif self._arrow is not None:
            self.changed = self._arrow.null_count > 0
            self._arrow = self._arrow.fill_null("") if self.changed else self._arrow
            blank = pc.or_(pc.equal(pc.utf8_length(self._arrow), 0), pc.utf8_is_space(self._arrow))
            self.empty = blank.to_numpy(zero_copy_only=False)
        else:
            raw = series.to_numpy(dtype=object)
            self._values = [v if type(v) is str else _as_text(v) for v in raw]
            self.changed = not all(type(v) is str for v in raw)
            self.empty = np.fromiter((not v or v.isspace() for v in self._values), dtype=bool, count=n)

    @property
    def values(self) -> list[str]:
        """The values as Python str ("" for missing)."""
        if self._values is None:
            self._values = self._arrow.to_pylist()
        return self._values

    def lengths(self) -> np.ndarray:
        """``len()`` of every value, as int64."""
        if self._arrow is not None:
            return pc.utf8_length(self._arrow).to_numpy(zero_copy_only=False).astype(np.int64)
        return np.fromiter(map(len, self.values), dtype=np.int64, count=len(self.values))


def _arrow_strings(series: pd.Series) -> pa.Array | None:
    """The Arrow string array behind a pandas string column (None for object or other columns)."""
    if series.dtype == object or not pd.api.types.is_string_dtype(series.dtype):
        return None
    try:
        array = pa.array(series)
    except (pa.ArrowException, TypeError, ValueError):
        return None
    if isinstance(array, pa.ChunkedArray):
        array = array.combine_chunks()
    if pa.types.is_string(array.type) or pa.types.is_large_string(array.type):
        return array
    return None


def check_rows(batch: pd.DataFrame) -> pd.DataFrame:
    """Check each row of a batch (pure; Ray Data runs it with ``map_batches(batch_format="pandas")``).

    Returns a copy of the batch where ``head_offset``/``tail_offset`` are int64 (-1 unless the offset was verified:
    an integer, in range, and ``sentence[offset:offset+len(entity)] == entity``), the text columns present
    (``sentence``, ``head``, ``tail``, ``relation``) hold str ("" for missing values), and a str column ``problem``
    is "" for good rows, else ``field: what is wrong (expected ..., found ...)``, several joined by ``"; "``. A
    ``problem`` already set by :func:`read_table` is kept as it is. Never raises on odd values.
    """
    out = batch.copy(deep=False)
    n = len(out)
    texts = {column: _Texts(_column(out, column), n) for column in TEXT_FIELDS}
    if not texts["relation"].present:
        del texts["relation"]
    prior = _Texts(_column(out, "problem"), n)
    checks = {entity: _check_entity(out, entity, texts["sentence"], texts[entity]) for entity in ENTITIES}
    bad = ~prior.empty
    for text in texts.values():
        bad |= text.empty
    for status, _ in checks.values():
        bad |= (status != _OK) & (status != _SKIPPED)
    problems = np.full(n, "", dtype=object)
    for i in np.flatnonzero(bad).tolist():
        problems[i] = prior.values[i] if not prior.empty[i] else _row_problem(out, i, texts, checks)
    for column, text in texts.items():
        if text.present and text.changed:
            out[column] = text.values
    for entity, (status, offsets) in checks.items():
        out[f"{entity}_offset"] = np.where(status == _OK, offsets, -1).astype(np.int64)
    out["problem"] = problems
    return out


def _column(batch: pd.DataFrame, column: str) -> pd.Series | None:
    if column not in batch.columns:
        return None
    series = batch[column]
    return series.iloc[:, 0] if isinstance(series, pd.DataFrame) else series


def _texts(batch: pd.DataFrame, column: str) -> list[str] | None:
    """The column as a list of str ("" for missing values), or None if the batch has no such column."""
    series = _column(batch, column)
    if series is None:
        return None
    return [v if type(v) is str else _as_text(v) for v in series.to_numpy(dtype=object)]


def _parse_offsets(series: pd.Series | None, n: int) -> tuple[np.ndarray, np.ndarray]:
    """``(int64 values, parsed ok)``: integers, or integral floats / numeric strings ("3", "3.0"); never raises."""
    if series is None or pd.api.types.is_bool_dtype(series.dtype):
        return np.zeros(n, dtype=np.int64), np.zeros(n, dtype=bool)
    if pd.api.types.is_integer_dtype(series.dtype) and not series.hasnans:
        values = series.to_numpy(dtype=np.int64)
        return values, np.abs(values) <= MAX_OFFSET
    fast = _cast_offsets(series)
    if fast is not None:
        return fast
    try:
        numbers = pd.to_numeric(series, errors="coerce").to_numpy(dtype=np.float64, na_value=np.nan, copy=True)
    except (TypeError, ValueError, OverflowError):
        numbers = np.fromiter((_number(v) for v in series.to_numpy(dtype=object)), dtype=np.float64, count=n)
    if series.dtype == object:
        numbers[[isinstance(v, bool | np.bool_) for v in series.to_numpy(dtype=object)]] = np.nan
    with np.errstate(invalid="ignore"):
        ok = np.isfinite(numbers) & (numbers == np.floor(numbers)) & (np.abs(numbers) <= MAX_OFFSET)
    return np.where(ok, numbers, -1).astype(np.int64), ok


def _cast_offsets(series: pd.Series) -> tuple[np.ndarray, np.ndarray] | None:
    """Fast path for Arrow string columns that hold only plain integers (None when it does not apply)."""
    array = _arrow_strings(series)
    if array is None:
        return None
    try:
        values = pc.cast(array, pa.int64())
    except (pa.ArrowException, TypeError, ValueError):
        return None
    ok = values.is_valid().to_numpy(zero_copy_only=False)
    values = values.fill_null(-1).to_numpy(zero_copy_only=False).astype(np.int64)
    return values, ok & (np.abs(values) <= MAX_OFFSET)


def _number(value: Any) -> float:
    try:
        return float(value) if not isinstance(value, bool | np.bool_) else math.nan
    except (TypeError, ValueError, OverflowError):
        return math.nan


def _check_entity(batch: pd.DataFrame, entity: str, sentence: _Texts, text: _Texts) -> tuple[np.ndarray, np.ndarray]:
    """``(status per row, parsed offsets)`` for one entity; status is one of the ``_OK ... _MISMATCH`` codes."""
    n = len(sentence.empty)
    series = _column(batch, f"{entity}_offset")
    offsets, parsed = _parse_offsets(series, n)
    status = np.full(n, _OK, dtype=np.int8)
    status[~parsed] = _NOT_INT
    if series is None:
        status[:] = _EMPTY
    else:
        unparsed = np.flatnonzero(~parsed).tolist()
        raw = series.iloc[unparsed].to_numpy(dtype=object)
        status[[i for i, v in zip(unparsed, raw, strict=True) if not _as_text(v).strip()]] = _EMPTY
    status[parsed & (sentence.empty | text.empty)] = _SKIPPED
    live = status == _OK
    if not live.any():
        return status, offsets
    sentence_len, entity_len = sentence.lengths(), text.lengths()
    status[live & (offsets < 0)] = _NEGATIVE
    status[live & (offsets >= 0) & (offsets + entity_len > sentence_len)] = _PAST_END
    sentences, entities = sentence.values, text.values
    starts, lengths = offsets.tolist(), entity_len.tolist()
    candidates = np.flatnonzero(status == _OK).tolist()
    mismatched = [i for i in candidates if sentences[i][starts[i]:starts[i] + lengths[i]] != entities[i]]
    status[mismatched] = _MISMATCH
    return status, offsets


def _row_problem(
    batch: pd.DataFrame, i: int, texts: Mapping[str, _Texts], checks: Mapping[str, tuple[np.ndarray, np.ndarray]]
) -> str:
    """The problem text of row ``i`` (called for bad rows only)."""
    parts = []
    what = {"sentence": "the sentence text", "head": "the head entity text", "tail": "the tail entity text",
            "relation": "a relation label"}
    for column, text in texts.items():
        if text.empty[i]:
            parts.append(f"{column}: empty (expected {what[column]})")
    for entity in ENTITIES:
        status, offsets = checks[entity]
        message = _offset_problem(batch, i, entity, int(status[i]), int(offsets[i]), texts)
        if message:
            parts.append(message)
    return "; ".join(parts)


def _offset_problem(
    batch: pd.DataFrame, i: int, entity: str, status: int, offset: int, texts: Mapping[str, _Texts]
) -> str:
    field = f"{entity}_offset"
    sentence, text = texts["sentence"].values[i], texts[entity].values[i]
    if status == _EMPTY:
        return f"{field}: empty (expected the 0-based character offset of {entity} in sentence)"
    if status == _NOT_INT:
        raw = _as_text(_column(batch, field).iloc[i])
        return f"{field}: not an integer (expected a whole number such as 12, found {_quote(raw)})"
    end = offset + len(text)
    if status == _NEGATIVE:
        return (f"{field}: negative (expected 0 <= {field} <= {len(sentence) - len(text)}, found {offset})"
                f"{_where(entity, text, sentence)}")
    if status == _PAST_END:
        return (f"{field}: {entity} runs past the end of the sentence (expected {field} + len({entity}) <= "
                f"{len(sentence)}, found {offset} + {len(text)} = {end}){_where(entity, text, sentence)}")
    if status == _MISMATCH:
        return (f"{field}: the sentence does not have {entity} at offset {offset} (expected {_quote(text)}, found "
                f"{_quote(sentence[offset:end])}){_where(entity, text, sentence)}")
    return ""


def _where(entity: str, text: str, sentence: str) -> str:
    """A hint naming where ``text`` does occur in ``sentence`` (or that it does not)."""
    found = []
    start = sentence.find(text)
    while start >= 0:
        found.append(start)
        start = sentence.find(text, start + 1)
    if not found:
        return f", and {entity} {_quote(text)} does not occur anywhere in the sentence"
    shown = ", ".join(map(str, found[:MAX_HINT_OFFSETS])) + (", ..." if len(found) > MAX_HINT_OFFSETS else "")
    return f", but {entity} {_quote(text)} occurs at offset{'s' if len(found) > 1 else ''} {shown}"


# --------------------------------------------------------------------------------------------------------------------
# problems_of


def split_problem(problem: str) -> list[tuple[str | None, str]]:
    """``[(field, message), ...]`` of a ``problem`` string made by :func:`check_rows` / :func:`read_table`."""
    parts = []
    for part in _PROBLEM_SPLIT.split(problem):
        match = _PROBLEM_PART.match(part)
        parts.append((match.group(1), match.group(2)) if match else (None, part))
    return parts


def problems_of(batch: pd.DataFrame) -> list[Problem]:
    """One :class:`Problem` per problem of each row with a non-empty ``problem`` (file/line from the row)."""
    problems_column = _texts(batch, "problem")
    if not problems_column:
        return []
    files = _texts(batch, "file") or [""] * len(batch)
    lines = _column(batch, "line")
    line_values = lines.to_numpy(dtype=object) if lines is not None else [None] * len(batch)
    result = []
    for i, problem in enumerate(problems_column):
        if not problem:
            continue
        line = _line_number(line_values[i])
        result.extend(Problem(files[i], line, field, message) for field, message in split_problem(problem))
    return result


def _line_number(value: Any) -> int | None:
    number = _number(value)
    return int(number) if math.isfinite(number) else None


# --------------------------------------------------------------------------------------------------------------------
# label files


def read_labels(path: Source) -> list[str]:
    """The relation labels of a label file, in their order.

    * ``relation.txt`` (any other name too): one label per line; blank lines ignored; BOM / CRLF fine.
    * DeepKE ``relation.csv`` (header ``head_type,tail_type,relation,index``): ordered by ``index``.
    * OpenNRE ``rel2id.json`` (``{label: id}``): ordered by id (a JSON list of labels is taken as is).

    Raises :class:`DataError` for a missing / empty / undecodable file, a duplicate label, or a malformed file.
    A URI is read on this machine; the problems name it.
    """
    if storage.is_uri(path):
        return _remote_call(os.fspath(path), read_labels)
    path = Path(path)
    text = _read_text(path)
    suffix = path.suffix.lower()
    if suffix == ".json":
        return _labels_json(str(path), text)
    if suffix == ".csv":
        return _labels_csv(str(path), text)
    return _labels_lines(str(path), text)


def _labels_lines(name: str, text: str) -> list[str]:
    entries = [(number, line.strip()) for number, line in enumerate(text.splitlines(), start=1) if line.strip()]
    return _unique_labels(name, entries)


def _unique_labels(name: str, entries: Sequence[tuple[int | None, str]]) -> list[str]:
    first: dict[str, int | None] = {}
    problems = []
    for line, label in entries:
        if label in first:
            where = f" (first on line {first[label]})" if first[label] is not None else ""
            problems.append(Problem(name, line, None, f"duplicate label {label!r}{where}"))
        else:
            first[label] = line
    if problems:
        raise DataError(problems, hint=HINT_LABELS)
    return list(first)


def _labels_csv(name: str, text: str) -> list[str]:
    reader = csv.reader(io.StringIO(text, newline=""))
    records = _records(name, reader)
    header_line, header = _header(name, records)
    names = [column.strip() for column in header]
    if "relation" not in names:
        raise DataError([Problem(name, header_line, None,
                                 f"no 'relation' column (found columns: {_list(names)}; expected "
                                 "head_type,tail_type,relation,index)")], hint=HINT_LABELS)
    rel = names.index("relation")
    idx = names.index("index") if "index" in names else None
    entries: list[tuple[int, int, str]] = []
    for number, (start, _, fields) in enumerate(records):
        if len(fields) <= max(rel, idx or 0):
            raise DataError([Problem(name, start, None, f"wrong number of fields (expected {len(names)}, found "
                                                        f"{len(fields)})")], hint=HINT_LABELS)
        order = number if idx is None else _label_index(name, start, fields[idx])
        entries.append((order, start, fields[rel].strip()))
    _no_duplicate_index(name, entries)
    return _unique_labels(name, [(line, label) for _, line, label in sorted(entries)])


def _label_index(name: str, line: int, raw: str) -> int:
    try:
        return int(raw)
    except ValueError:
        raise DataError([Problem(name, line, "index", f"not an integer (found {_quote(raw)})")],
                        hint=HINT_LABELS) from None


def _no_duplicate_index(name: str, entries: Sequence[tuple[int, int, str]]) -> None:
    seen: dict[int, int] = {}
    for order, line, _ in entries:
        if order in seen:
            raise DataError([Problem(name, line, "index", f"duplicate index {order} (first on line {seen[order]})")],
                            hint=HINT_LABELS)
        seen[order] = line


def _labels_json(name: str, text: str) -> list[str]:
    def pairs(items: list[tuple[str, Any]]) -> dict[str, Any]:
        keys = [k for k, _ in items]
        duplicates = sorted({k for k in keys if keys.count(k) > 1})
        if duplicates:
            raise DataError([Problem(name, None, None, f"duplicate label {duplicates[0]!r}")], hint=HINT_LABELS)
        return dict(items)

    try:
        value = json.loads(text, object_pairs_hook=pairs)
    except json.JSONDecodeError as err:
        raise DataError([Problem(name, err.lineno, None, f"not valid JSON ({err.msg} at column {err.colno})")],
                        hint=HINT_LABELS) from None
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return _unique_labels(name, [(None, v) for v in value])
    if not isinstance(value, dict) or not all(type(v) is int for v in value.values()):
        raise DataError([Problem(name, None, None, "expected {\"label\": id, ...} with integer ids")], hint=HINT_LABELS)
    ids: dict[int, str] = {}
    for label, ident in value.items():
        if ident in ids:
            raise DataError([Problem(name, None, None, f"labels {ids[ident]!r} and {label!r} share id {ident}")],
                            hint=HINT_LABELS)
        ids[ident] = label
    return [ids[i] for i in sorted(ids)]


# --------------------------------------------------------------------------------------------------------------------
# data directories


_SPLIT_NAMES = {
    "train": re.compile(r"^(?:.*[_.-])?train(?:[_-]file)?$"),
    "valid": re.compile(r"^(?:.*[_.-])?(?:valid|validation|dev|val)$"),
    "test": re.compile(r"^(?:.*[_.-])?test(?:[_-]file(?:[_-]full)?)?$"),
}
_PLAIN_NAMES = {"train", "valid", "validation", "dev", "val", "test"}


def find_data_files(data_dir: Source) -> dict[str, Source]:
    """Find the split files and the label file of a data directory.

    Keys: ``train`` (required), ``valid`` (``valid.*``, ``dev.*``, ``val.*``), ``test``, ``labels``
    (``relation.txt`` / ``relation.csv`` / ``rel2id.json`` / ``*_rel2id.json``); absent keys mean not found. Any
    supported data extension is accepted (``train.csv/.tsv/.jsonl/.json/.parquet/.txt`` ...), as are prefixed names
    (``semeval_train.txt``) and SemEval's ``TRAIN_FILE.TXT`` / ``TEST_FILE_FULL.TXT``. Raises :class:`DataError` when
    the directory does not exist, has no training file, or has two candidates for one split.

    A URI (``s3://bucket/data``) is listed in its store: the files found are URIs (str), local ones :class:`Path`.
    """
    if storage.is_uri(data_dir):
        try:
            return _find_data_files(os.fspath(data_dir), storage.credentials_hint(os.fspath(data_dir)))
        except storage.StorageError as err:
            raise storage_problem(err) from None
    return _find_data_files(Path(data_dir), HINT_PATH)


def _find_data_files(data_dir: Source, hint: str) -> dict[str, Source]:
    if not storage.is_dir(data_dir):
        message = "is a file (expected a data directory)" if storage.exists(data_dir) else "data directory not found"
        raise DataError([Problem(str(data_dir), None, None, message)], hint=hint)
    listed: list[Source] = [Path(p) for p in storage.list_files(data_dir)] if isinstance(data_dir, Path) else \
        list(storage.list_files(data_dir))
    files = sorted(p for p in listed if not _name(p).startswith("."))
    found: dict[str, Source] = {}
    for split, pattern in _SPLIT_NAMES.items():
        candidates = [p for p in files if _suffix(p) in DATA_EXTENSIONS and pattern.match(_stem(p))]
        chosen = _choose(data_dir, split, candidates)
        if chosen is not None:
            found[split] = chosen
    if "train" not in found:
        held = _list([_name(p) for p in files]) if files else "nothing (the directory is empty)"
        raise DataError([Problem(str(data_dir), None, None,
                                 f"no training file (expected train.csv, train.tsv, train.jsonl, train.json, "
                                 f"train.parquet or train.txt; the directory holds {held})")],
                        hint="Name the training file train.<ext>, or pass --train FILE.")
    labels = _label_file(files)
    if labels is not None:
        found["labels"] = labels
    return found


def _name(path: Source) -> str:
    return PurePosixPath(str(path)).name


def _suffix(path: Source) -> str:
    return PurePosixPath(str(path)).suffix.lower()


def _stem(path: Source) -> str:
    return PurePosixPath(str(path)).stem.lower()


def _choose(data_dir: Source, split: str, candidates: list[Source]) -> Source | None:
    if not candidates:
        return None

    def rank(path: Source) -> tuple[int, int]:
        stem = _stem(path)
        return (0 if stem in _PLAIN_NAMES else 1, 0 if stem.endswith("full") else 1)

    best = min(rank(p) for p in candidates)
    chosen = [p for p in candidates if rank(p) == best]
    if len(chosen) > 1:
        raise DataError([Problem(str(data_dir), None, None,
                                 f"more than one {split} file ({', '.join(_name(p) for p in chosen)})")],
                        hint=f"Keep one {split} file in the directory, or name it with --{split} FILE.")
    return chosen[0]


def _label_file(files: Sequence[Source]) -> Source | None:
    by_name = {_name(p).lower(): p for p in files}
    for name in LABEL_FILES:
        if name in by_name:
            return by_name[name]
    prefixed = [p for p in files if _name(p).lower().endswith("_rel2id.json")]
    return prefixed[0] if prefixed else None

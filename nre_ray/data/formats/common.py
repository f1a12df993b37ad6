"""What the format readers share: files, bytes and text (UTF-8 checks, line streaming), files in an object store,
the accumulator of records (:class:`RecordColumns`) and the resolution of a file's columns to the canonical ones."""

from __future__ import annotations

import io
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, NoReturn, TypeVar

import numpy as np
import pandas as pd

from nre_ray import storage
from nre_ray.data.errors import DataError, Problem
from nre_ray.data.schema import CANONICAL, DEEPKE_TINY_MAP, DEEPKE_TINY_OPTION, OPTIONAL, REQUIRED

HINT_PATH = "Check the path (it is read relative to the current directory)."
HINT_UTF8 = ("Re-save the file as UTF-8 (for example: iconv -f GB18030 -t UTF-8 in.csv > out.csv, "
             "or 'CSV UTF-8' in Excel's Save As).")
HINT_COLUMNS = ("Rename the columns in the file, or map your column names to ours with --columns SOURCE=TARGET,... "
                "(column_map={'SOURCE': 'TARGET'}), e.g. --columns text=sentence,label=relation.")
NYT10_END_MARK = "###END###"
"""How a sentence of NYT10's TSV ends (``head id, tail id, head, tail, relation, sentence ###END###``): bag data."""
HINT_NYT10 = ("This looks like NYT10's TSV (head id, tail id, head, tail, relation, sentence ###END###): bag data. "
              "Add --bag-aggregator att, avg or one to read it as bags (train and python -m nre_ray.data inspect).")

Source = Path | str
"""A data file or folder: a local path, or a URI (``s3://...``, kept as a string)."""
T = TypeVar("T")


# --------------------------------------------------------------------------------------------------------------------
# files, bytes and text


def require_file(path: Path) -> None:
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


def read_text(path: Path) -> str:
    """The whole file as text (UTF-8, BOM removed); :class:`DataError` when missing, undecodable or empty."""
    require_file(path)
    text = _decode(str(path), path.read_bytes())
    if not text.strip():
        _empty(path)
    return text


def _empty(path: Path) -> NoReturn:
    raise DataError([Problem(str(path), None, None, "file is empty")],
                    hint="Check that you passed the right file; a data file needs at least one record.")


def stream_lines(path: Path, universal: bool) -> Iterator[str]:
    """The file's lines one at a time, with their line ends, checked as :func:`read_text` checks the whole text.

    ``universal``: a lone CR also ends a line, as ``io.StringIO(text, newline="")`` splits (for the csv module)."""
    require_file(path)
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


def split_lines(lines: Iterable[str]) -> Iterator[str]:
    """What ``text.split("\\n")`` gives, from the lines of ``text`` with their ends."""
    last = "\n"
    for line in lines:
        last = line
        yield line[:-1] if line.endswith("\n") else line
    if last.endswith("\n"):
        yield ""


def batched(items: Iterable[Any], size: int | None) -> Iterator[list[Any]]:
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


# --------------------------------------------------------------------------------------------------------------------
# files in an object store


def storage_problem(err: storage.StorageError) -> DataError | storage.StorageError:
    """A :class:`DataError` (``URI: reason`` and what to check) for a file of the store that cannot be had; ``err``
    itself when the store cannot be reached or cannot serve now, which is no problem of the data."""
    if err.kind in (storage.UNREACHABLE, storage.BUSY):
        return err
    reason = {storage.NOT_FOUND: "file not found", storage.IS_FOLDER: "is a directory (expected a data file)"}
    return DataError([Problem(err.uri, None, None, reason.get(err.kind, err.reason))], hint=err.hint or HINT_PATH)


def _renamed(err: DataError, local: str, uri: str) -> DataError:
    """``err`` about the temporary copy ``local``, naming ``uri`` instead."""
    return DataError([Problem(uri if p.file == local else p.file, p.line, p.field, p.message.replace(local, uri))
                      for p in err.problems], hint=err.hint, total=err.total)


def remote_call(uri: str, read: Callable[[Path], T]) -> T:
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


def remote_frames(uri: str, read: Callable[[Path], Iterator[pd.DataFrame]]) -> Iterator[pd.DataFrame]:
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
# records and columns


class RecordColumns:
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
        data: dict[str, Any] = {c: self.columns.get(c, [""] * len(self.lines)) for c in output_columns(self.columns)}
        data["file"] = [name] * len(self.lines)
        data["line"] = np.asarray(self.lines, dtype=np.int64)
        data["problem"] = self.problems
        return pd.DataFrame(data)


def output_columns(present: Mapping[str, Any]) -> list[str]:
    return [c for c in REQUIRED if c != "relation" or "relation" in present] + list(OPTIONAL)


def resolve_columns(
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
                                 f"{', '.join(absent)}, not in the file (found columns: {list_names(names)})")],
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
        message = f"missing required columns {', '.join(missing)} (found columns: {list_names(names)})"
        return DataError(
            [Problem(name, line, None, message)],
            hint=(f"This looks like DeepKE's sentence,entity1,entity2,offset1,offset2,relation layout: map its columns "
                  f"with {DEEPKE_TINY_OPTION} (column_map={DEEPKE_TINY_MAP}) or pass --format deepke."))
    if not found and fmt in ("csv", "tsv", "deepke"):
        sep = "\t" if fmt == "tsv" else ","
        message = (f"no header row: line {line} names none of the expected columns (found {list_names(names)}); "
                   f"expected a header line such as {sep.join(REQUIRED)!r}")
        if len(names) == 6 and names[5].rstrip().endswith(NYT10_END_MARK):
            return DataError([Problem(name, line, None, message)], hint=HINT_NYT10)
        return DataError([Problem(name, line, None, message)],
                         hint="Add a header line naming the columns, or map your column names with "
                              "--columns SOURCE=TARGET,...")
    word = "column" if len(missing) == 1 else "columns"
    message = f"missing required {word} {', '.join(missing)} (found columns: {list_names(names)}; expected: {expected})"
    if len(names) == 1 and fmt in ("csv", "deepke") and ("\t" in names[0] or ";" in names[0]):
        message += "; the header looks separated by " + ("tabs (use --format tsv)" if "\t" in names[0] else "';'")
    return DataError([Problem(name, line, None, message)], hint=HINT_COLUMNS)


def _looks_tiny(names: Sequence[str]) -> bool:
    return {"entity1", "entity2"} <= set(names) and not {"head", "tail"} & set(names)


def list_names(names: Sequence[str], limit: int = 20) -> str:
    shown = ", ".join(repr(n) if (not n or n != n.strip() or "," in n) else n for n in list(names)[:limit])
    return shown + (f", ... ({len(names)} in all)" if len(names) > limit else "") if names else "none"


def check_duplicates(name: str, names: Sequence[str], line: int | None) -> None:
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

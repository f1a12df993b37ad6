"""Reading bag-level data: NYT10's TSV, and the entity-pair ids of OpenNRE JSON Lines, CSV, TSV and Parquet.

Every reader gives :func:`nre_ray.data.read.read_table`'s frame (canonical columns as str, then ``file``, ``line``,
``problem``) plus :data:`ID_COLUMNS` (``head_id``, ``tail_id``: str, "" where the file has no ids), so that
:mod:`nre_ray.tasks.bag.bags` can key a bag by ids where there are ids and by the entity texts where there are none.

* NYT10 TSV (:func:`read_nyt10`): ``head id, tail id, head, tail, relation, sentence ###END###`` per line, no header,
  entities written with underscores inside the sentence (``John_Glover``). The sentence is kept as written (without
  the end mark); the offsets are found in it (:func:`find_entity`). Detected from content (:func:`is_nyt10_line`).
* OpenNRE JSON Lines: ``h.id`` / ``t.id``; CSV, TSV, JSON Lines, Parquet: ``head_id`` / ``tail_id`` columns. The
  sentence reader (:func:`~nre_ray.data.read.read_table`) reads the records; :func:`pair_ids` reads the ids (a second
  pass over the file, until the shared schema declares the id columns: see the task's design note).
* Labels come from the data. :func:`read_relation2id` reads NYT10's ``relation2id.txt`` (``NAME ID`` per line) and
  :func:`check_label_file` reports a label file that disagrees with the data (GIDS spells ``…/degrees`` there while
  its data says ``…/degree``).
"""

from __future__ import annotations

import csv
import difflib
import json
import os
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from nre_ray import storage
from nre_ray.data.errors import DataError, Problem
from nre_ray.data.formats import FORMATS, HINT_FORMAT, PEEK_BYTES, detect_format
from nre_ray.data.formats.common import (
    NYT10_END_MARK,
    Source,
    read_text,
    remote_call,
    remote_frames,
    require_file,
    split_lines,
    storage_problem,
    stream_lines,
)
from nre_ray.data.formats.delimited import csv_records, header_record
from nre_ray.data.read import read_table
from nre_ray.data.schema import OPTIONAL, REQUIRED, as_text, quote

NYT10 = "nyt10"
"""The format name of NYT10's TSV (``--format nyt10`` once the commands take bags)."""
BAG_FORMATS: tuple[str, ...] = (NYT10, *FORMATS)
END_MARK = NYT10_END_MARK
NYT10_FIELDS = ("head_id", "tail_id", "head", "tail", "relation", "sentence")
ID_COLUMNS = ("head_id", "tail_id")
COLUMNS: tuple[str, ...] = (*REQUIRED, *OPTIONAL, *ID_COLUMNS, "file", "line", "problem")
"""The columns of every frame read here, in this order."""
_FREEBASE_ID = re.compile(r"^/?m[./][0-9a-z_]+$")
HINT_LABEL_FILE = ("Labels come from the data: fix the label file so that it names the data's labels, "
                   "or leave the label file out.")


# --------------------------------------------------------------------------------------------------------------------
# detection


def is_nyt10_line(line: str) -> bool:
    """Whether ``line`` is a record of NYT10's TSV: six tab-separated fields, the last ending in ``###END###`` (or,
    without the mark, the first two fields Freebase ids such as ``/m/0q34g`` or ``m.0q34g``)."""
    fields = line.rstrip("\r\n").split("\t")
    if len(fields) != len(NYT10_FIELDS):
        return False
    return fields[5].rstrip().endswith(END_MARK) or all(_FREEBASE_ID.match(f.strip()) for f in fields[:2])


def detect_bag_format(path: Source) -> str:
    """The format of ``path`` (one of :data:`BAG_FORMATS`): ``nyt10`` when its first non-blank line is an NYT10
    record (:func:`is_nyt10_line`), whatever the extension; otherwise :func:`~nre_ray.data.formats.detect_format`.
    A URI: only its first bytes are read."""
    if storage.is_uri(path):
        try:
            storage.check_file(path)
            with storage.open_input(os.fspath(path)) as stream:
                head = stream.read(PEEK_BYTES)
        except storage.StorageError as err:
            raise storage_problem(err) from None
    else:
        require_file(Path(path))
        with open(path, "rb") as fh:
            head = fh.read(PEEK_BYTES)
    text = head.decode("utf-8", errors="replace").lstrip("\ufeff")
    first = next((line for line in text.split("\n") if line.strip()), "")
    if first and not head.startswith(b"PAR1") and is_nyt10_line(first):
        return NYT10
    return detect_format(path)


# --------------------------------------------------------------------------------------------------------------------
# NYT10 TSV


def find_entity(sentence: str, entity: str, avoid: tuple[int, int] | None = None) -> tuple[int, int]:
    """``(offset, occurrences)`` of ``entity`` in ``sentence``; offset -1 when it does not occur.

    A whole-word occurrence (not inside a longer word; ``_`` counts as a letter, so ``New_York`` is not found inside
    ``New_York_City``) is preferred to one inside a word. Of several, the first that does not overlap ``avoid`` (the
    other entity's ``(start, end)``) is taken, else the first. ``occurrences`` counts the candidates of the kind taken.
    """
    if not entity:
        return -1, 0
    starts, whole = [], []
    at = sentence.find(entity)
    while at >= 0:
        starts.append(at)
        end = at + len(entity)
        if (at == 0 or not _is_word(sentence[at - 1])) and (end == len(sentence) or not _is_word(sentence[end])):
            whole.append(at)
        at = sentence.find(entity, at + 1)
    candidates = whole or starts
    if not candidates:
        return -1, 0
    if avoid is not None:
        for start in candidates:
            if start + len(entity) <= avoid[0] or start >= avoid[1]:
                return start, len(candidates)
    return candidates[0], len(candidates)


def _is_word(char: str) -> bool:
    """Whether ``char`` is a word character (a letter, digit or ``_``: what ``\\w`` matches)."""
    return char.isalnum() or char == "_"


def nyt10_record(fields: Sequence[str]) -> tuple[dict[str, str], str]:
    """The canonical values (plus ids) of one NYT10 record's six fields, and "" or its problem.

    The sentence loses its end mark ``###END###`` and the blanks around it; offsets are found with
    :func:`find_entity` (head first, then the tail, avoiding the head's span)."""
    if len(fields) != len(NYT10_FIELDS):
        return {}, (f"row: wrong number of fields (expected {len(NYT10_FIELDS)} tab-separated fields: head id, "
                    f"tail id, head, tail, relation, sentence; found {len(fields)})")
    head_id, tail_id, head, tail, relation, sentence = fields
    sentence = sentence.rstrip()
    if sentence.endswith(END_MARK):
        sentence = sentence[: -len(END_MARK)].rstrip()
    values = {"head_id": head_id.strip(), "tail_id": tail_id.strip(), "head": head, "tail": tail,
              "relation": relation.strip(), "sentence": sentence}
    problems = []
    head_at, _ = find_entity(sentence, head)
    if head_at < 0:
        problems.append(f"head: {quote(head)} does not occur in the sentence")
    tail_at, _ = find_entity(sentence, tail, (head_at, head_at + len(head)) if head_at >= 0 else None)
    if tail_at < 0:
        problems.append(f"tail: {quote(tail)} does not occur in the sentence")
    values["head_offset"] = str(head_at) if head_at >= 0 else ""
    values["tail_offset"] = str(tail_at) if tail_at >= 0 else ""
    return values, "; ".join(problems)


def read_nyt10(path: Path, lines: Iterable[str], rows_per_chunk: int | None = None) -> Iterator[pd.DataFrame]:
    """The records of an NYT10 TSV file from its ``lines`` (without their ends), in frames of :data:`COLUMNS` of at
    most ``rows_per_chunk`` records (None: one frame). Blank lines are skipped; a record that cannot be read (wrong
    number of fields, an entity that is not in its sentence) keeps its ``problem``, as the sentence readers do."""
    name = str(path)
    rows: list[dict[str, str]] = []
    numbers: list[int] = []
    problems: list[str] = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        values, problem = nyt10_record(line.rstrip("\r").split("\t"))
        rows.append(values)
        numbers.append(number)
        problems.append(problem)
        if rows_per_chunk is not None and len(rows) >= rows_per_chunk:
            yield _frame(name, rows, numbers, problems)
            rows, numbers, problems = [], [], []
    if rows or rows_per_chunk is None:
        yield _frame(name, rows, numbers, problems)


def _frame(name: str, rows: list[dict[str, str]], numbers: list[int], problems: list[str]) -> pd.DataFrame:
    data: dict[str, object] = {c: [r.get(c, "") for r in rows] for c in COLUMNS[:-3]}
    data["file"] = [name] * len(rows)
    data["line"] = np.asarray(numbers, dtype=np.int64)
    data["problem"] = problems
    return pd.DataFrame(data, columns=list(COLUMNS))


def read_nyt10_chunks(path: Source, rows_per_chunk: int = 10_000) -> Iterator[pd.DataFrame]:
    """:func:`read_nyt10` of a file or URI as a stream, ``rows_per_chunk`` records at a time (a URI is copied to a
    temporary local file first; the frames and problems name the URI)."""
    if storage.is_uri(path):
        yield from remote_frames(os.fspath(path), lambda local: read_nyt10_chunks(local, rows_per_chunk))
        return
    path = Path(path)
    yield from read_nyt10(path, split_lines(stream_lines(path, universal=False)), rows_per_chunk)


# --------------------------------------------------------------------------------------------------------------------
# any format, with the pair ids


def read_bag_table(
    path: Source, fmt: str | None = None, column_map: dict[str, str] | None = None, require_relation: bool = True,
) -> pd.DataFrame:
    """One data file (or URI) read for bags: a frame of :data:`COLUMNS`.

    Args:
        path: the file; ``file`` in the result names it as given.
        fmt: one of :data:`BAG_FORMATS`, detected with :func:`detect_bag_format` when None.
        column_map: as for :func:`~nre_ray.data.read.read_table` (not for nyt10); the id columns are read by their
            own names, ``head_id`` and ``tail_id``.
        require_relation: False for prediction input.

    Raises:
        DataError: what :func:`~nre_ray.data.read.read_table` raises, and an unknown format.
    """
    if fmt is None:
        fmt = detect_bag_format(path)
    if fmt not in BAG_FORMATS:
        raise DataError([Problem(str(path), None, None,
                                 f"unknown format {fmt!r} (expected one of {', '.join(BAG_FORMATS)})")],
                        hint=HINT_FORMAT)
    if storage.is_uri(path):
        uri = os.fspath(path)
        frame = remote_call(uri, lambda local: _read_local(local, fmt, column_map, require_relation))
        frame["file"] = uri
        return frame
    return _read_local(Path(path), fmt, column_map, require_relation)


def _read_local(path: Path, fmt: str, column_map: dict[str, str] | None, require_relation: bool) -> pd.DataFrame:
    if fmt == NYT10:
        if column_map:
            raise DataError([Problem(str(path), None, None, "a column map does not apply to the nyt10 format")],
                            hint="Leave out --columns for this file.")
        return next(read_nyt10(path, read_text(path).split("\n")))
    frame = read_table(path, fmt, column_map, require_relation)
    ids = pair_ids(path, fmt)
    for column in ID_COLUMNS:
        frame[column] = frame["line"].map(ids[column]).fillna("").astype(object) if ids is not None else ""
    return frame[[c for c in COLUMNS if c in frame.columns]]


def pair_ids(path: Path, fmt: str) -> pd.DataFrame | None:
    """The entity-pair ids of a local file of one of :data:`~nre_ray.data.formats.FORMATS`, indexed by the record's
    ``line`` (as :func:`~nre_ray.data.read.read_table` numbers it), with columns :data:`ID_COLUMNS` as str; None when
    the file has no ids (no ``head_id``/``tail_id`` column, no ``h.id``/``t.id``; deepke and semeval never have)."""
    if fmt == "parquet":
        return _parquet_ids(path)
    if fmt in ("csv", "tsv"):
        return _delimited_ids(path, "\t" if fmt == "tsv" else ",")
    if fmt in ("jsonl", "opennre"):
        return _json_ids(path, opennre=fmt == "opennre")
    return None


def _ids_frame(lines: list[int], heads: list[str], tails: list[str]) -> pd.DataFrame | None:
    if not any(heads) and not any(tails):
        return None
    return pd.DataFrame({"head_id": heads, "tail_id": tails}, index=pd.Index(lines, name="line"))


def _parquet_ids(path: Path) -> pd.DataFrame | None:
    import pyarrow.parquet as pq

    parquet = pq.ParquetFile(path)
    if not set(ID_COLUMNS) <= set(parquet.schema_arrow.names):
        return None
    table = parquet.read(list(ID_COLUMNS))
    heads = [as_text(v) for v in table.column("head_id").to_pylist()]
    tails = [as_text(v) for v in table.column("tail_id").to_pylist()]
    return _ids_frame(list(range(1, table.num_rows + 1)), heads, tails)


def _delimited_ids(path: Path, delimiter: str) -> pd.DataFrame | None:
    records = csv_records(str(path), csv.reader(stream_lines(path, universal=True), delimiter=delimiter))
    _, header = header_record(str(path), records)
    names = [column.strip().lstrip("\ufeff") for column in header]
    if not set(ID_COLUMNS) <= set(names):
        return None
    h, t = names.index("head_id"), names.index("tail_id")
    lines, heads, tails = [], [], []
    for start, _, fields in records:
        lines.append(start)
        heads.append(fields[h].strip() if h < len(fields) else "")
        tails.append(fields[t].strip() if t < len(fields) else "")
    return _ids_frame(lines, heads, tails)


def _json_ids(path: Path, opennre: bool) -> pd.DataFrame | None:
    lines, heads, tails = [], [], []
    for number, line in enumerate(split_lines(stream_lines(path, universal=False)), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except ValueError:
            continue  # the sentence reader reports the line
        if not isinstance(record, dict):
            continue
        if opennre:
            head, tail = record.get("h"), record.get("t")
            head_id = as_text(head.get("id")) if isinstance(head, dict) else ""
            tail_id = as_text(tail.get("id")) if isinstance(tail, dict) else ""
        else:
            head_id, tail_id = as_text(record.get("head_id")), as_text(record.get("tail_id"))
        lines.append(number)
        heads.append(head_id.strip())
        tails.append(tail_id.strip())
    return _ids_frame(lines, heads, tails)


# --------------------------------------------------------------------------------------------------------------------
# label files


def read_relation2id(path: Source) -> list[str]:
    """The labels of NYT10's ``relation2id.txt`` (``NAME ID`` per line, blank lines ignored), ordered by id.

    Raises :class:`DataError` for a line without an integer id, or a label or id given twice."""
    if storage.is_uri(path):
        return remote_call(os.fspath(path), read_relation2id)
    path = Path(path)
    name = str(path)
    by_id: dict[int, tuple[str, int]] = {}
    seen: dict[str, int] = {}
    for number, line in enumerate(read_text(path).splitlines(), start=1):
        if not line.strip():
            continue
        label, _, ident = line.strip().rpartition(" ")
        label = label.strip()
        if not label or not re.fullmatch(r"-?\d+", ident):
            raise DataError([Problem(name, number, None, f"expected 'LABEL ID' (found {quote(line.strip())})")],
                            hint="Write one label and its integer id per line, e.g. 'NA 0'.")
        if label in seen or int(ident) in by_id:
            first = seen.get(label) or by_id[int(ident)][1]
            raise DataError([Problem(name, number, None, f"label {label!r} or id {ident} given twice "
                                                         f"(first on line {first})")],
                            hint="Give every label its own id, each once.")
        seen[label] = number
        by_id[int(ident)] = (label, number)
    if not by_id:
        raise DataError([Problem(name, None, None, "file is empty")], hint="A label file needs at least one label.")
    return [by_id[i][0] for i in sorted(by_id)]


def check_label_file(name: str, file_labels: Sequence[str], data_labels: Mapping[str, str]) -> list[str]:
    """The labels in the label file's order when every label of the data is in it; a :class:`DataError` otherwise.

    Args:
        name: the label file as the user named it (for the message).
        file_labels: its labels (:func:`read_relation2id` or :func:`~nre_ray.data.read.read_labels`).
        data_labels: ``{label: where it first occurs ("FILE:LINE")}`` for every label of the data.

    Labels of the file that the data lacks are fine (relations without examples). A data label the file lacks is a
    problem naming where it occurs and the file's closest label (``…/degree`` against ``…/degrees``).
    """
    known = set(file_labels)
    problems = []
    for label, where in data_labels.items():
        if label in known:
            continue
        close = difflib.get_close_matches(label, list(file_labels), n=1, cutoff=0.8)
        hint = f"; the label file has {close[0]!r}" if close else ""
        problems.append(Problem(name, None, None,
                                f"the data's label {label!r} (first at {where}) is not in the label file{hint}"))
    if problems:
        raise DataError(problems, hint=HINT_LABEL_FILE)
    return list(file_labels)


def first_occurrences(frame: pd.DataFrame) -> dict[str, str]:
    """``{relation: "FILE:LINE" of its first record}`` of a frame read here, in order of first occurrence."""
    firsts = frame.drop_duplicates("relation")
    return {r: f"{f}:{n}" for r, f, n in zip(firsts["relation"], firsts["file"], firsts["line"], strict=True)}

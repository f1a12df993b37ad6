"""Label files: ``relation.txt`` (one label per line), DeepKE's ``relation.csv``, OpenNRE's ``rel2id.json``."""

from __future__ import annotations

import csv
import io
import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from nre_ray import storage
from nre_ray.data.errors import DataError, Problem
from nre_ray.data.formats.common import Source, list_names, read_text, remote_call
from nre_ray.data.formats.delimited import csv_records, header_record
from nre_ray.data.schema import quote

HINT_LABELS = "Fix the label file: one relation label per line, each label once."


def read_labels(path: Source) -> list[str]:
    """The relation labels of a label file, in their order.

    * ``relation.txt`` (any other name too): one label per line; blank lines ignored; BOM / CRLF fine.
    * DeepKE ``relation.csv`` (header ``head_type,tail_type,relation,index``): ordered by ``index``.
    * OpenNRE ``rel2id.json`` (``{label: id}``): ordered by id (a JSON list of labels is taken as is).

    Raises :class:`DataError` for a missing / empty / undecodable file, a duplicate label, or a malformed file.
    A URI is read on this machine; the problems name it.
    """
    if storage.is_uri(path):
        return remote_call(os.fspath(path), read_labels)
    path = Path(path)
    text = read_text(path)
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
    records = csv_records(name, reader)
    header_line, header = header_record(name, records)
    names = [column.strip() for column in header]
    if "relation" not in names:
        raise DataError([Problem(name, header_line, None,
                                 f"no 'relation' column (found columns: {list_names(names)}; expected "
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
        raise DataError([Problem(name, line, "index", f"not an integer (found {quote(raw)})")],
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

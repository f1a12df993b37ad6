"""CSV, TSV and DeepKE's CSV (which also maps DeepKE's ``entity1,entity2,offset1,offset2`` columns by itself)."""

from __future__ import annotations

import csv
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

import pandas as pd

from nre_ray.data.errors import DataError, Problem
from nre_ray.data.formats.common import RecordColumns, check_duplicates, output_columns, resolve_columns


def csv_records(name: str, reader: Any) -> Iterator[tuple[int, int, list[str]]]:
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


def read(
    path: Path, lines: Iterable[str], column_map: Mapping[str, str] | None, require_relation: bool,
    rows_per_chunk: int | None, fmt: str = "csv",
) -> Iterator[pd.DataFrame]:
    """The records of a ``fmt`` file (csv, tsv or deepke) from its ``lines`` (with their ends, as the csv module
    reads them), in frames of ``rows_per_chunk`` records (None: one frame)."""
    name = str(path)
    delimiter = "\t" if fmt == "tsv" else ","
    reader = csv.reader(lines, delimiter=delimiter)
    records = csv_records(name, reader)
    header_line, header = header_record(name, records)
    names = [column.strip().lstrip("\ufeff") for column in header]
    check_duplicates(name, names, header_line)
    found = resolve_columns(name, names, column_map, require_relation, header_line, fmt)
    index = {target: names.index(source) for target, source in found.items()}
    rows = RecordColumns(output_columns(found))
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
            rows = RecordColumns(output_columns(found))
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


def header_record(name: str, records: Iterator[tuple[int, int, list[str]]]) -> tuple[int, list[str]]:
    """``(line, fields)`` of the first record; :class:`DataError` when there is none."""
    first = next(records, None)
    if first is None:
        raise DataError([Problem(name, None, None, "file is empty")],
                        hint="Check that you passed the right file; a data file needs at least one record.")
    return first[0], first[2]

"""JSON Lines: one JSON object per line, its keys the columns."""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

import pandas as pd

from nre_ray.data.errors import DataError, Problem
from nre_ray.data.formats.common import RecordColumns, batched, output_columns, resolve_columns
from nre_ray.data.schema import as_text


def json_lines(lines: Iterable[str]) -> Iterator[tuple[int, Any, str]]:
    """``(line, value, problem)`` for each non-blank line: the parsed JSON value, or None and the reason."""
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            yield number, json.loads(line), ""
        except ValueError as err:
            where = f" at column {err.colno}" if isinstance(err, json.JSONDecodeError) else ""
            yield number, None, f"json: not valid JSON ({getattr(err, 'msg', str(err))}{where})"


def json_object_problem(value: Any) -> str:
    if isinstance(value, dict):
        return ""
    return f"json: not a JSON object (expected {{\"sentence\": ..., ...}}, found a {type(value).__name__})"


def read(
    path: Path, lines: Iterable[str], column_map: Mapping[str, str] | None, require_relation: bool,
    rows_per_chunk: int | None,
) -> Iterator[pd.DataFrame]:
    """The records of a JSON Lines file from its ``lines`` (without their ends), in frames of ``rows_per_chunk``
    records (None: one frame)."""
    name = str(path)
    keys: dict[str, None] = {}
    for parsed in batched(json_lines(lines), rows_per_chunk):
        for _, value, _ in parsed:
            if isinstance(value, dict):
                keys.update(dict.fromkeys(value))
        if not keys and parsed and all(problem for _, _, problem in parsed):
            first_line, _, problem = parsed[0]
            raise DataError([Problem(name, first_line, "json", problem.partition(": ")[2])],
                            hint="Write one JSON object per line (JSON Lines).")
        found = resolve_columns(name, list(keys), column_map, require_relation, None, "jsonl")
        rows = RecordColumns(output_columns(found))
        for line, value, problem in parsed:
            problem = problem or json_object_problem(value)
            if problem:
                rows.add(line, {}, problem)
                continue
            rows.add(line, {target: as_text(value.get(source)) for target, source in found.items()})
        yield rows.frame(name)

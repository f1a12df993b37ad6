"""OpenNRE's JSON Lines: ``{"token": [...], "h": {"name", "pos"}, "t": {...}, "relation"}`` (token positions) or
with ``"text"`` instead of ``"token"`` (character positions)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from nre_ray.data.errors import DataError, Problem
from nre_ray.data.formats.common import RecordColumns, batched, output_columns
from nre_ray.data.formats.jsonl import json_lines, json_object_problem
from nre_ray.data.schema import as_text, quote


def is_opennre(record: Mapping[str, Any]) -> bool:
    return isinstance(record.get("h"), dict) and isinstance(record.get("t"), dict) and (
        "token" in record or "text" in record)


def read(
    path: Path, lines: Iterable[str], column_map: Mapping[str, str] | None, require_relation: bool,
    rows_per_chunk: int | None,
) -> Iterator[pd.DataFrame]:
    """The records of an OpenNRE file from its ``lines`` (without their ends), in frames of ``rows_per_chunk`` records
    (None: one frame). ``column_map`` is always None: the format has fixed fields."""
    name = str(path)
    has_relation = False
    for parsed in batched(json_lines(lines), rows_per_chunk):
        has_relation = has_relation or any(isinstance(v, dict) and "relation" in v for _, v, _ in parsed)
        if require_relation and not has_relation:
            raise DataError([Problem(name, None, None,
                                     "missing required field relation (no record has a 'relation')")],
                            hint="Add the relation label to every record, or read the file as prediction input.")
        rows = RecordColumns(output_columns({"relation": ""} if has_relation else {}))
        for line, value, problem in parsed:
            problem = problem or json_object_problem(value)
            if problem:
                rows.add(line, {}, problem)
                continue
            values, problem = _opennre_record(value)
            rows.add(line, values, problem)
        yield rows.frame(name)


def _opennre_record(record: Mapping[str, Any]) -> tuple[dict[str, str], str]:
    """Canonical values of one OpenNRE record (token or text form), or ({}, problem)."""
    values = {"relation": as_text(record.get("relation")), "id": as_text(record.get("id"))}
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
        return (0, 0), f"{key}.pos: not a [start, end] pair of integers (found {quote(as_text(pos))})"
    start, end = pos
    if limit is not None and not 0 <= start < end <= limit:
        return (0, 0), (f"{key}.pos: outside the {limit} tokens (expected 0 <= start < end <= {limit}, "
                        f"found [{start}, {end}])")
    return (start, end), ""

"""Row validation: :func:`check_rows`, the pure per-batch check that Ray Data runs with
``map_batches(batch_format="pandas")`` (empty texts, offsets that are not integers, out of range or not where the
entity is), and :func:`problems_of` / :func:`split_problem`, which turn the ``problem`` strings of checked rows back
into :class:`~nre_ray.data.errors.Problem` objects."""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from nre_ray.data.errors import Problem
from nre_ray.data.schema import CANONICAL, ENTITIES, TEXT_FIELDS, as_text, quote

ROW_FIELDS = (*CANONICAL, "row", "json", "token", "text", "h", "t", "h.pos", "t.pos", "h.name", "t.name")
"""Field names that may start a part of a ``problem`` string (used to split joined problems apart again)."""
_PROBLEM_SPLIT = re.compile("; (?=(?:" + "|".join(re.escape(f) for f in ROW_FIELDS) + "): )")
_PROBLEM_PART = re.compile(r"^([A-Za-z_][\w.]*): (.*)$", re.DOTALL)

MAX_OFFSET = 2**53
MAX_HINT_OFFSETS = 5



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
            self._values = [v if type(v) is str else as_text(v) for v in raw]
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
    return [v if type(v) is str else as_text(v) for v in series.to_numpy(dtype=object)]


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
        status[[i for i, v in zip(unparsed, raw, strict=True) if not as_text(v).strip()]] = _EMPTY
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
        raw = as_text(_column(batch, field).iloc[i])
        return f"{field}: not an integer (expected a whole number such as 12, found {quote(raw)})"
    end = offset + len(text)
    if status == _NEGATIVE:
        return (f"{field}: negative (expected 0 <= {field} <= {len(sentence) - len(text)}, found {offset})"
                f"{_where(entity, text, sentence)}")
    if status == _PAST_END:
        return (f"{field}: {entity} runs past the end of the sentence (expected {field} + len({entity}) <= "
                f"{len(sentence)}, found {offset} + {len(text)} = {end}){_where(entity, text, sentence)}")
    if status == _MISMATCH:
        return (f"{field}: the sentence does not have {entity} at offset {offset} (expected {quote(text)}, found "
                f"{quote(sentence[offset:end])}){_where(entity, text, sentence)}")
    return ""


def _where(entity: str, text: str, sentence: str) -> str:
    """A hint naming where ``text`` does occur in ``sentence`` (or that it does not)."""
    found = []
    start = sentence.find(text)
    while start >= 0:
        found.append(start)
        start = sentence.find(text, start + 1)
    if not found:
        return f", and {entity} {quote(text)} does not occur anywhere in the sentence"
    shown = ", ".join(map(str, found[:MAX_HINT_OFFSETS])) + (", ..." if len(found) > MAX_HINT_OFFSETS else "")
    return f", but {entity} {quote(text)} occurs at offset{'s' if len(found) > 1 else ''} {shown}"


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

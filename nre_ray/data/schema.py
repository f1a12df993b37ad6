"""The one record schema every input format is read into, column maps onto it, and values as its text.

Canonical columns: ``sentence``, ``head``, ``head_offset``, ``tail``, ``tail_offset``, ``relation`` (offsets are
0-based character offsets of the entity's first character in ``sentence``; head = subject, tail = object), and
optionally ``id``, ``head_type``, ``tail_type``. Readers give every column as str (see :func:`as_text`);
:func:`nre_ray.data.checks.check_rows` checks them.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any, NoReturn

import numpy as np
import pandas as pd

from nre_ray.data.errors import DataError, Problem

REQUIRED: tuple[str, ...] = ("sentence", "head", "head_offset", "tail", "tail_offset", "relation")
OPTIONAL: tuple[str, ...] = ("id", "head_type", "tail_type")

CANONICAL: tuple[str, ...] = REQUIRED + OPTIONAL
TEXT_FIELDS = ("sentence", "head", "tail", "relation")
ENTITIES = ("head", "tail")
DEEPKE_TINY_MAP: dict[str, str] = {
    "entity1": "head", "offset1": "head_offset", "entity2": "tail", "offset2": "tail_offset",
}
"""How DeepKE's first ``sentence,entity1,entity2,offset1,offset2,relation`` layout maps to the canonical one."""
DEEPKE_TINY_OPTION = "--columns " + ",".join(f"{k}={v}" for k, v in DEEPKE_TINY_MAP.items())

MAX_QUOTE = 60


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
# values as text


def as_text(value: Any) -> str:
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


def quote(text: str) -> str:
    """``repr`` of user text, shortened to :data:`MAX_QUOTE` characters."""
    return repr(text if len(text) <= MAX_QUOTE else text[:MAX_QUOTE] + "…")

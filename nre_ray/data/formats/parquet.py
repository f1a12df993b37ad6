"""Parquet: the columns by name, their values as text; ``line`` is the row number + 1."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any, NoReturn

import numpy as np
import pandas as pd
import pyarrow as pa

from nre_ray.data.errors import DataError, Problem
from nre_ray.data.formats.common import check_duplicates, output_columns, require_file, resolve_columns
from nre_ray.data.schema import as_text


def read(
    path: Path, lines: Iterable[str] | None, column_map: Mapping[str, str] | None, require_relation: bool,
    rows_per_chunk: int | None,
) -> Iterator[pd.DataFrame]:
    """The records of a Parquet file, which it opens itself (``lines`` is None), in frames of ``rows_per_chunk``
    records (None: one frame)."""
    import pyarrow.parquet as pq

    name = str(path)
    require_file(path)
    try:
        parquet = pq.ParquetFile(path)
        names = list(parquet.schema_arrow.names)
        num_rows = parquet.metadata.num_rows
    except (pa.ArrowException, OSError) as err:
        _bad_parquet(name, err)
    check_duplicates(name, names, None)
    if num_rows == 0:
        raise DataError([Problem(name, None, None, "file is empty (no rows)")],
                        hint="Check that you passed the right file; a data file needs at least one record.")
    found = resolve_columns(name, names, column_map, require_relation, None, "parquet")
    columns = list(found.values())
    start = 0
    try:
        tables = [parquet.read(columns)] if rows_per_chunk is None else \
            parquet.iter_batches(batch_size=rows_per_chunk, columns=columns)
        for table in tables:
            n = table.num_rows
            data: dict[str, Any] = {}
            for target in output_columns(found):
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
        return [as_text(v) for v in column.cast(pa.large_string()).to_pylist()]
    return [as_text(v) for v in column.to_pylist()]

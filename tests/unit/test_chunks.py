"""Chunked reading: the chunks together are read_table's rows (values, problems, lines), plus the input's columns."""

from __future__ import annotations

import json

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from nre_ray.data.chunks import canonical_part, input_part, plan_chunks
from nre_ray.data.errors import DataError
from nre_ray.data.read import check_rows, read_table
from tests.helpers import tiny_frame

COMPARED = ["sentence", "head", "head_offset", "tail", "tail_offset", "file", "line", "problem"]


def rows(n_per_label: int = 4) -> pd.DataFrame:
    frame = tiny_frame(n_per_label).drop(columns=["problem"])
    frame.insert(0, "doc", [f"d{i}" for i in range(len(frame))])
    frame["source"] = "web"
    return frame.astype(str)


def read_all(path, **kw):
    plan = plan_chunks(path, **kw)
    parts = pd.concat([plan.read(i) for i in range(len(plan.chunks))], ignore_index=True)
    whole = read_table(path, kw.get("fmt"), kw.get("column_map"), require_relation=False)
    got = canonical_part(parts)
    for column in COMPARED:
        assert got[column].astype(str).tolist() == whole[column].astype(str).tolist(), column
    return plan, parts


def test_csv_with_multiline_fields_blank_lines_and_bad_rows(tmp_path):
    frame = rows()
    frame.loc[2, "sentence"] = frame.loc[2, "sentence"].replace(" ", "\n", 1)  # a quoted field over two lines
    frame.loc[5, "head_offset"] = "five"
    path = tmp_path / "in.csv"
    frame.to_csv(path, index=False)
    header, body = path.read_text().split("\n", 1)
    path.write_text(header + "\n\n" + body + "\n\n")  # blank lines after the header and at the end
    plan, parts = read_all(path, chunk_rows=5)
    assert len(plan.chunks) == -(-len(frame) // 5) and plan.total_rows == len(frame)
    assert plan.columns == list(frame.columns)
    assert input_part(parts).astype(str).values.tolist() == frame.values.tolist()
    checked = check_rows(canonical_part(parts))
    assert checked["problem"][5].startswith("head_offset: not an integer")
    assert checked["line"][5] == 9  # the header, a blank line, two lines for row 2


def test_tsv_with_a_column_map(tmp_path):
    frame = rows().rename(columns={"head": "e1", "tail": "e2"})
    path = tmp_path / "in.tsv"
    frame.to_csv(path, index=False, sep="\t")
    _, parts = read_all(path, column_map={"e1": "head", "e2": "tail"}, chunk_rows=4)
    assert list(input_part(parts).columns) == list(frame.columns)


def test_jsonl_with_bad_lines(tmp_path):
    frame = rows(2)
    path = tmp_path / "in.jsonl"
    with open(path, "w") as fh:
        for i, record in enumerate(frame.to_dict("records")):
            record["head_offset"] = int(record["head_offset"])
            if i == 3:
                fh.write("{not json\n\n")
            fh.write(json.dumps(record) + "\n")
    plan, parts = read_all(path, chunk_rows=3)
    assert plan.columns == list(frame.columns)
    assert parts["head_offset"].tolist()[:3] == [int(v) for v in frame["head_offset"][:3]]
    assert canonical_part(parts)["problem"][3].startswith("json: not valid JSON")


def test_parquet_by_row_groups(tmp_path):
    frame = rows(5).assign(head_offset=lambda f: f["head_offset"].astype(int))
    path = tmp_path / "in.parquet"
    pq.write_table(pa.Table.from_pandas(frame, preserve_index=False), path, row_group_size=4)
    plan, parts = read_all(path, chunk_rows=10)
    assert [c.rows for c in plan.chunks] == [12, 3]
    assert parts["head_offset"].dtype.kind == "i"


def test_semeval_is_read_whole(tmp_path):
    path = tmp_path / "in.txt"
    path.write_text('1\t"The <e1>company</e1> fabricates plastic <e2>chairs</e2>."\nProduct-Producer(e2,e1)\n'
                    'Comment:\n\n2\t"The <e1>child</e1> was carefully wrapped into the <e2>cradle</e2>."\n'
                    "Entity-Destination(e1,e2)\nComment:\n\n")
    plan, _ = read_all(path, chunk_rows=1)
    assert plan.frame is not None and len(plan.chunks) == 2
    assert "sentence" in plan.columns and "head_type" not in plan.columns


def test_file_problems_point_into_the_whole_file(tmp_path):
    frame = rows()
    path = tmp_path / "in.csv"
    frame.drop(columns=["tail"]).to_csv(path, index=False)
    with pytest.raises(DataError, match=r"in\.csv:1: missing required column tail"):
        plan_chunks(path)
    broken = tmp_path / "broken.csv"
    frame.to_csv(broken, index=False)
    data = broken.read_bytes().splitlines(keepends=True)
    data[9] = b"\xff\xfe" + data[9]
    broken.write_bytes(b"".join(data))
    plan = plan_chunks(broken, chunk_rows=4)
    with pytest.raises(DataError, match=r"broken\.csv:10: not valid UTF-8"):
        for i in range(len(plan.chunks)):
            plan.read(i)

"""read_chunks: the same records, lines and problems as read_table, in pieces, without reading the whole file."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nre_ray.data import read
from nre_ray.data.errors import DataError
from nre_ray.data.read import read_chunks, read_table

HEADER = "sentence,head,head_offset,tail,tail_offset,relation"
GOOD = "张三是ABC公司的董事长,张三,0,ABC公司,3,董事长"
SEMEVAL = ('1\t"The <e1>audits</e1> were about <e2>waste</e2>."\r\nMessage-Topic(e1,e2)\r\nComment:\r\n\r\n'
           '2\t"A <e1>b</e1> c <e2>d</e2>."\nComment: no label\n\n'
           'stray line\n'
           '3\t"<e2>X</e2> y <e1>Z</e1>"\nOther\n')
OPENNRE = [{"token": ["A", "likes", "B"], "h": {"name": "A", "pos": [0, 1]}, "t": {"name": "B", "pos": [2, 3]},
            "relation": "likes"},
           {"text": "C hates D", "h": {"name": "C", "pos": [0, 1]}, "t": {"name": "D", "pos": [8, 9]},
            "relation": "hates"}]


def write(folder: Path, name: str, text: str | bytes) -> Path:
    path = folder / name
    path.write_bytes(text if isinstance(text, bytes) else text.encode("utf-8"))
    return path


def inputs(folder: Path) -> list[tuple[Path, dict]]:
    """Files of every format with the awkward bits: BOM, CRLF, blank lines, lone CR, quoted line breaks, bad rows."""
    csv_text = ("\ufeff" + HEADER + "\r\n" + GOOD + "\r\n\r\n"
                + '"line one\nline two",line,0,two,14,r\n'
                + "a,b,c\n"  # wrong number of fields
                + GOOD + "\r" + GOOD + "\n"  # a lone CR ends a line for csv
                + "甲乙丙,甲,0,丙,5,r\n" * 5)
    jsonl_lines = [json.dumps({"sentence": "A likes B", "head": "A", "head_offset": i % 3, "tail": "B",
                               "tail_offset": 8, "relation": "likes"}) for i in range(7)]
    jsonl_text = "\n".join(jsonl_lines[:3]) + "\n\nnot json\n" + "\r\n".join(jsonl_lines[3:]) + "\n[1, 2]\n"
    parquet = folder / "p.parquet"
    pd.DataFrame({"sentence": ["A likes B"] * 5, "head": ["A"] * 5, "head_offset": [0, 1, 0, None, 0],
                  "tail": ["B"] * 5, "tail_offset": [8] * 5, "relation": ["likes"] * 5}).to_parquet(parquet,
                                                                                             row_group_size=2)
    return [
        (write(folder, "a.csv", csv_text), {}),
        (write(folder, "a.tsv", HEADER.replace(",", "\t") + "\n" + "A, B\tA\t0\tB\t3\tr\n" * 4), {}),
        (write(folder, "a.jsonl", jsonl_text), {}),
        (write(folder, "o.txt", "\n".join(json.dumps(r) for r in OPENNRE * 3)), {}),
        (write(folder, "TRAIN_FILE.TXT", SEMEVAL * 2), {}),
        (parquet, {}),
        (write(folder, "tiny.csv", "sentence,entity1,entity2,offset1,offset2,relation\r\n"
               + "甲和乙,甲,乙,0,2,r\r\n" * 4), {"fmt": "deepke"}),
    ]


@pytest.mark.parametrize("rows_per_chunk", [1, 2, 3, 1000])
def test_chunks_are_read_table_in_pieces(tmp_path: Path, rows_per_chunk: int) -> None:
    for path, kwargs in inputs(tmp_path):
        whole = read_table(path, **kwargs)
        pieces = list(read_chunks(path, rows_per_chunk=rows_per_chunk, **kwargs))
        assert all(len(p) <= rows_per_chunk for p in pieces), path.name
        assert len(pieces) == -(-len(whole) // rows_per_chunk), path.name
        together = pd.concat(pieces, ignore_index=True)
        pd.testing.assert_frame_equal(together, whole, obj=path.name)


def test_chunks_never_read_the_whole_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def whole_text(path: Path) -> str:
        raise AssertionError(f"{path} was read whole")

    expected = {path: read_table(path, **kwargs) for path, kwargs in inputs(tmp_path)}
    monkeypatch.setattr(read, "read_text", whole_text)
    for path, kwargs in inputs(tmp_path):
        assert len(pd.concat(read_chunks(path, rows_per_chunk=2, **kwargs))) == len(expected[path])


def test_undecodable_byte_deep_in_the_file_is_reported_after_the_earlier_chunks(tmp_path: Path) -> None:
    data = "\n".join([HEADER] + [GOOD] * 50).encode("utf-8") + b"\n" + GOOD.encode("gbk") + b"\n" + GOOD.encode()
    path = write(tmp_path, "a.csv", data)
    with pytest.raises(DataError) as whole:
        read_table(path)
    chunks = read_chunks(path, rows_per_chunk=10)
    seen = 0
    with pytest.raises(DataError) as streamed:
        for chunk in chunks:
            seen += len(chunk)
    assert seen == 50  # every good chunk before the bad line came through
    assert streamed.value.problems == whole.value.problems
    assert streamed.value.problems[0].line == 52 and "GB18030" in streamed.value.problems[0].message


@pytest.mark.parametrize(("text", "message"), [
    ("", "file is empty"),
    ("\n \r\n", "file is empty"),
    (HEADER + "\n", "the file has a header but no data rows"),
])
def test_file_level_errors_are_the_same(tmp_path: Path, text: str, message: str) -> None:
    path = write(tmp_path, "a.csv", text)
    with pytest.raises(DataError) as whole:
        read_table(path)
    with pytest.raises(DataError) as streamed:
        list(read_chunks(path, rows_per_chunk=3))
    assert streamed.value.problems == whole.value.problems
    assert streamed.value.problems[0].message == message


def test_rows_per_chunk_must_be_positive(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="rows_per_chunk"):
        next(read_chunks(write(tmp_path, "a.csv", f"{HEADER}\n{GOOD}\n"), rows_per_chunk=0))


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.text(alphabet="ab \r\n\t,", min_size=1, max_size=40).filter(lambda t: t.strip()))
def test_streamed_lines_split_like_the_whole_text(tmp_path: Path, text: str) -> None:
    path = tmp_path / "lines.txt"
    path.write_bytes(text.encode())
    assert list(read.stream_lines(path, universal=True)) == list(io.StringIO(text, newline=""))
    assert list(read.split_lines(read.stream_lines(path, universal=False))) == text.split("\n")

"""Tests for nre_ray.data.read and nre_ray.data.errors: every input format, the real DeepKE data, and a corpus of
malformed inputs, each checked for the exact problem it reports (file, line, field, message)."""

from __future__ import annotations

import csv
import io
import json
import pickle
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nre_ray.data.errors import DataError, Problem
from nre_ray.data.read import (
    FORMATS,
    OPTIONAL,
    REQUIRED,
    check_rows,
    detect_format,
    find_data_files,
    parse_column_map,
    problems_of,
    read_labels,
    read_table,
)

ROOT = Path(__file__).resolve().parents[2]
DEEPKE = ROOT.parent / "shared" / "datasets" / "deepke_chinese"
needs_deepke = pytest.mark.skipif(not DEEPKE.is_dir(), reason="shared DeepKE data not available")
TINY_MAP = "entity1=head,offset1=head_offset,entity2=tail,offset2=tail_offset"
HEADER = "sentence,head,head_offset,tail,tail_offset,relation"
GOOD = "张三是ABC公司的董事长,张三,0,ABC公司,3,董事长"


def write(folder: Path, name: str, text: str | bytes) -> Path:
    """Write ``text`` byte-exactly (no newline translation) and return the path."""
    path = folder / name
    path.write_bytes(text if isinstance(text, bytes) else text.encode("utf-8"))
    return path


def checked(path: Path, **kwargs: object) -> pd.DataFrame:
    return check_rows(read_table(path, **kwargs))


def row_problems(path: Path, **kwargs: object) -> list[Problem]:
    return problems_of(checked(path, **kwargs))


def data_error(call: object, *args: object, **kwargs: object) -> DataError:
    with pytest.raises(DataError) as info:
        call(*args, **kwargs)
    return info.value


# ---------------------------------------------------------------------------------------------------------- errors


def test_problem_str_leaves_out_unknown_parts() -> None:
    assert str(Problem("a.csv", 3, "head", "empty")) == "a.csv:3: head: empty"
    assert str(Problem("a.csv", None, None, "file not found")) == "a.csv: file not found"
    assert str(Problem("a.csv", 7, None, "bad")) == "a.csv:7: bad"


def test_data_error_lists_twenty_then_counts_the_rest_then_hints() -> None:
    problems = [Problem("t.csv", i, "head", f"p{i}") for i in range(1, 26)]
    lines = str(DataError(problems)).splitlines()
    assert lines[:20] == [f"t.csv:{i}: head: p{i}" for i in range(1, 21)]
    assert lines[20] == "... and 5 more problems"
    assert "--on-bad-rows skip" in lines[21] and len(lines) == 22
    two = str(DataError(problems[:2], hint="Do X.")).splitlines()
    assert two == ["t.csv:1: head: p1", "t.csv:2: head: p2", "Do X."]


def test_data_error_survives_pickling() -> None:
    err = DataError([Problem("t.csv", 2, "head", "empty")], hint="Fix it.")
    again = pickle.loads(pickle.dumps(err))
    assert again.problems == err.problems and str(again) == str(err)


# --------------------------------------------------------------------------------------------------------- formats


def test_csv_canonical_columns_types_and_lines(tmp_path: Path) -> None:
    path = write(tmp_path, "train.csv", f"id,{HEADER},head_type,tail_type,extra\nr1,{GOOD},人物,企业,x\n")
    frame = read_table(path)
    assert list(frame.columns) == [*REQUIRED, *OPTIONAL, "file", "line", "problem"]
    row = frame.iloc[0].to_dict()
    assert row == {"sentence": "张三是ABC公司的董事长", "head": "张三", "head_offset": "0", "tail": "ABC公司",
                   "tail_offset": "3", "relation": "董事长", "id": "r1", "head_type": "人物", "tail_type": "企业",
                   "file": str(path), "line": 2, "problem": ""}
    out = check_rows(frame)
    assert out["head_offset"].dtype == np.int64 and out["head_offset"].tolist() == [0]
    assert out["tail_offset"].tolist() == [3] and out["problem"].tolist() == [""]


def test_csv_missing_optional_columns_are_empty_strings(tmp_path: Path) -> None:
    frame = read_table(write(tmp_path, "a.csv", f"{HEADER}\n{GOOD}\n"))
    assert frame[["id", "head_type", "tail_type"]].iloc[0].tolist() == ["", "", ""]


def test_csv_with_bom_and_crlf(tmp_path: Path) -> None:
    path = write(tmp_path, "a.csv", f"\ufeff{HEADER}\r\n{GOOD}\r\n\r\n{GOOD}\r\n")
    out = checked(path)
    assert out["line"].tolist() == [2, 4]
    assert out["relation"].tolist() == ["董事长", "董事长"] and out["problem"].tolist() == ["", ""]


def test_csv_multiline_quoted_field_counts_physical_lines(tmp_path: Path) -> None:
    text = (f"{HEADER}\n"
            '"line one\nline two\nline three",line,0,two,14,r\n'
            "甲乙丙,甲,0,丙,5,r\n")
    out = checked(write(tmp_path, "a.csv", text))
    assert out["sentence"].iloc[0] == "line one\nline two\nline three"
    assert out["line"].tolist() == [2, 5]
    assert problems_of(out) == [Problem(
        str(tmp_path / "a.csv"), 5, "tail_offset",
        "tail runs past the end of the sentence (expected tail_offset + len(tail) <= 3, found 5 + 1 = 6), "
        "but tail '丙' occurs at offset 2")]


def test_tsv(tmp_path: Path) -> None:
    path = write(tmp_path, "a.tsv", "sentence\thead\thead_offset\ttail\ttail_offset\trelation\n"
                                    "A, B and C\tA\t0\tC\t9\tr\n")
    assert detect_format(path) == "tsv"
    out = checked(path)
    assert out[["sentence", "head_offset", "tail_offset", "line"]].iloc[0].tolist() == ["A, B and C", 0, 9, 2]


def test_jsonl_keeps_json_values_as_text_and_lines(tmp_path: Path) -> None:
    records = [{"sentence": "A likes B", "head": "A", "head_offset": 0, "tail": "B", "tail_offset": 8.0,
                "relation": "likes", "id": 7},
               {"sentence": "A likes B", "head": "A", "head_offset": "0", "tail": "B", "tail_offset": 2.5,
                "relation": "likes"}]
    text = json.dumps(records[0]) + "\n\n" + json.dumps(records[1]) + "\n"
    path = write(tmp_path, "a.jsonl", text)
    assert detect_format(path) == "jsonl"
    frame = read_table(path)
    assert frame["tail_offset"].tolist() == ["8.0", "2.5"] and frame["id"].tolist() == ["7", ""]
    out = check_rows(frame)
    assert out["line"].tolist() == [1, 3] and out["tail_offset"].tolist() == [8, -1]
    assert problems_of(out) == [Problem(str(path), 3, "tail_offset",
                                        "not an integer (expected a whole number such as 12, found '2.5')")]


def test_jsonl_with_column_map(tmp_path: Path) -> None:
    record = {"text": "A likes B", "subj": "A", "subj_start": 0, "obj": "B", "obj_start": 8, "label": "likes"}
    path = write(tmp_path, "a.jsonl", json.dumps(record) + "\n")
    mapping = parse_column_map("text=sentence,subj=head,subj_start=head_offset,obj=tail,obj_start=tail_offset,"
                               "label=relation")
    out = checked(path, column_map=mapping)
    assert out[["sentence", "head", "tail", "relation", "problem"]].iloc[0].tolist() == [
        "A likes B", "A", "B", "likes", ""]


def test_parquet_lines_are_row_numbers(tmp_path: Path) -> None:
    path = tmp_path / "a.parquet"
    pd.DataFrame({"sentence": ["A likes B", "A likes B"], "head": ["A", "A"], "head_offset": [0, 1],
                  "tail": ["B", "B"], "tail_offset": [8, 8], "relation": ["likes", None]}).to_parquet(path)
    assert detect_format(path) == "parquet"
    out = checked(path)
    assert out["line"].tolist() == [1, 2] and out["head_offset"].tolist() == [0, -1]
    assert [str(p) for p in problems_of(out)] == [
        f"{path}:2: relation: empty (expected a relation label)",
        f"{path}:2: head_offset: the sentence does not have head at offset 1 (expected 'A', found ' '), "
        "but head 'A' occurs at offset 0",
    ]


def test_opennre_token_positions(tmp_path: Path) -> None:
    record = {"token": ["Bill", "Gates", "founded", "Microsoft", "."], "h": {"name": "bill gates", "pos": [0, 2]},
              "t": {"name": "microsoft", "pos": [3, 4]}, "relation": "founder"}
    path = write(tmp_path, "semeval_train.txt", json.dumps(record) + "\n")
    assert detect_format(path) == "opennre"
    row = checked(path).iloc[0]
    assert row["sentence"] == "Bill Gates founded Microsoft ."
    assert (row["head"], row["head_offset"], row["tail"], row["tail_offset"]) == ("Bill Gates", 0, "Microsoft", 19)
    assert row["relation"] == "founder" and row["problem"] == ""


def test_opennre_text_positions(tmp_path: Path) -> None:
    record = {"text": "Bill Gates founded Microsoft.", "h": {"name": "Bill Gates", "pos": [0, 10], "type": "PER"},
              "t": {"name": "Microsoft", "pos": [19, 28]}, "relation": "founder"}
    row = checked(write(tmp_path, "a.jsonl", json.dumps(record) + "\n")).iloc[0]
    assert (row["head"], row["head_offset"], row["tail"], row["tail_offset"]) == ("Bill Gates", 0, "Microsoft", 19)
    assert row["head_type"] == "PER" and row["problem"] == ""


SEMEVAL = (
    '8001\t"The most common <e1>audits</e1> were about <e2>waste</e2> and recycling."\r\n'
    "Message-Topic(e1,e2)\r\n"
    "Comment: Assuming an audit = an audit document.\r\n"
    "\r\n"
    '8002\t"The <e1>company</e1> fabricates plastic <e2>chairs</e2>."\r\n'
    "Product-Producer(e2,e1)\r\n"
    "Comment:\r\n"
    "\r\n"
)


def test_semeval_labelled(tmp_path: Path) -> None:
    path = write(tmp_path, "TEST_FILE_FULL.TXT", SEMEVAL)
    assert detect_format(path) == "semeval"
    out = checked(path)
    assert out["sentence"].tolist() == ["The most common audits were about waste and recycling.",
                                        "The company fabricates plastic chairs."]
    assert out[["head", "head_offset", "tail", "tail_offset"]].values.tolist() == [
        ["audits", 16, "waste", 34], ["company", 4, "chairs", 31]]
    assert out["relation"].tolist() == ["Message-Topic(e1,e2)", "Product-Producer(e2,e1)"]
    assert out["id"].tolist() == ["8001", "8002"] and out["line"].tolist() == [1, 5]
    assert out["problem"].tolist() == ["", ""]


def test_semeval_unlabelled_test_file(tmp_path: Path) -> None:
    path = write(tmp_path, "TEST_FILE.txt", '8001\t"A <e1>b</e1> c <e2>d</e2>."\n8002\t"<e2>X</e2> y <e1>Z</e1>"\n')
    out = checked(path, require_relation=False)
    assert "relation" not in out.columns
    assert out[["sentence", "head", "head_offset", "tail", "tail_offset", "line"]].values.tolist() == [
        ["A b c d.", "b", 2, "d", 6, 1], ["X y Z", "Z", 4, "X", 0, 2]]
    assert out["problem"].tolist() == ["", ""]


def test_prediction_input_without_relation_column(tmp_path: Path) -> None:
    path = write(tmp_path, "a.csv", "sentence,head,head_offset,tail,tail_offset\nA likes B,A,0,B,8\n")
    out = checked(path, require_relation=False)
    assert "relation" not in out.columns and out["problem"].tolist() == [""]


def test_detect_format_by_content(tmp_path: Path) -> None:
    assert detect_format(write(tmp_path, "a.txt", f"{HEADER}\n{GOOD}\n")) == "csv"
    assert detect_format(write(tmp_path, "b.txt", "sentence\thead\n")) == "tsv"
    assert detect_format(write(tmp_path, "c.json", '{"sentence": "x"}\n')) == "jsonl"
    assert detect_format(write(tmp_path, "d.data", '1\t"<e1>a</e1> <e2>b</e2>"\nOther\n')) == "semeval"


def test_forced_format_wins(tmp_path: Path) -> None:
    path = write(tmp_path, "data.txt", f"{HEADER}\n{GOOD}\n")
    assert read_table(path, fmt="csv")["relation"].tolist() == ["董事长"]


# ------------------------------------------------------------------------------------------------------- real data


@needs_deepke
def test_real_deepke_train_csv_reads_clean() -> None:
    path = DEEPKE / "csv" / "train.csv"
    out = checked(path)
    assert len(out) == 4000 and (out["problem"] == "").all()
    assert out["line"].iloc[0] == 2 and out["line"].iloc[-1] == 4001
    assert (out["head_offset"] >= 0).all() and (out["tail_offset"] >= 0).all()
    assert out["relation"].nunique() == 10 and (out["head_type"] != "").all()
    assert out.iloc[0][["head", "head_offset", "tail", "tail_offset"]].tolist() == ["逐风行", 1, "纵横中文网", 12]


@needs_deepke
def test_real_deepke_tiny_layout_needs_the_column_map() -> None:
    path = DEEPKE / "orig_init_83e694ae" / "train.csv"
    err = data_error(read_table, path)
    assert err.problems == [Problem(str(path), 1, None,
                                    "missing required columns head, head_offset, tail, tail_offset "
                                    "(found columns: sentence, entity1, entity2, offset1, offset2, relation)")]
    assert f"--columns {TINY_MAP}" in str(err) and "column_map=" in str(err)
    out = checked(path, column_map=parse_column_map(TINY_MAP))
    assert len(out) == 180 and (out["problem"] == "").all() and out["line"].iloc[-1] == 181
    assert out["relation"].nunique() == 6
    deepke = checked(path, fmt="deepke")
    assert deepke[["head", "head_offset", "tail"]].equals(out[["head", "head_offset", "tail"]])


@needs_deepke
def test_real_label_files() -> None:
    assert read_labels(DEEPKE / "orig_42bf9c18" / "relation.txt")[:3] == ["国籍", "祖籍", "导演"]
    labels = read_labels(DEEPKE / "orig_v0.2.0_cb07fb64" / "relation.csv")
    assert labels[:3] == ["None", "导演", "国籍"] and len(labels) == 11


@needs_deepke
def test_real_data_dirs() -> None:
    found = find_data_files(DEEPKE / "orig_v0.2.0_cb07fb64")
    assert {k: v.name for k, v in found.items()} == {"train": "train.csv", "valid": "valid.csv", "test": "test.csv",
                                                    "labels": "relation.csv"}


# -------------------------------------------------------------------------------------------------- labels and dirs


def test_read_labels_txt_csv_json(tmp_path: Path) -> None:
    assert read_labels(write(tmp_path, "relation.txt", "\ufeffa\r\n\r\nb\r\nc\r\n")) == ["a", "b", "c"]
    csv_text = "head_type,tail_type,relation,index\nX,Y,b,2\nNone,None,None,0\nX,Y,a,1\n"
    assert read_labels(write(tmp_path, "relation.csv", csv_text)) == ["None", "a", "b"]
    assert read_labels(write(tmp_path, "rel2id.json", '{"b": 1, "a": 0, "c": 2}')) == ["a", "b", "c"]


def test_find_data_files_accepts_extensions_and_dev(tmp_path: Path) -> None:
    for name in ("train.jsonl", "dev.tsv", "test.parquet", "relation.txt", "README.md"):
        write(tmp_path, name, "x")
    found = find_data_files(tmp_path)
    assert {k: v.name for k, v in found.items()} == {"train": "train.jsonl", "valid": "dev.tsv",
                                                    "test": "test.parquet", "labels": "relation.txt"}


def test_find_data_files_semeval_and_opennre_names(tmp_path: Path) -> None:
    semeval = tmp_path / "semeval"
    semeval.mkdir()
    for name in ("TRAIN_FILE.TXT", "TEST_FILE.txt", "TEST_FILE_FULL.TXT"):
        write(semeval, name, "x")
    assert {k: v.name for k, v in find_data_files(semeval).items()} == {"train": "TRAIN_FILE.TXT",
                                                                       "test": "TEST_FILE_FULL.TXT"}
    opennre = tmp_path / "opennre"
    opennre.mkdir()
    for name in ("wiki80_train.txt", "wiki80_val.txt", "wiki80_rel2id.json"):
        write(opennre, name, "x")
    assert {k: v.name for k, v in find_data_files(opennre).items()} == {
        "train": "wiki80_train.txt", "valid": "wiki80_val.txt", "labels": "wiki80_rel2id.json"}


def test_parse_column_map() -> None:
    assert parse_column_map(f" {TINY_MAP.replace(',', ' , ')} ") == {
        "entity1": "head", "offset1": "head_offset", "entity2": "tail", "offset2": "tail_offset"}
    assert parse_column_map("") == {}


# ---------------------------------------------------------------------------------------- malformed input: files


def test_bad_missing_file(tmp_path: Path) -> None:
    path = tmp_path / "nope.csv"
    err = data_error(read_table, path)
    assert err.problems == [Problem(str(path), None, None, "file not found")]
    assert str(err) == f"{path}: file not found\nCheck the path (it is read relative to the current directory)."


def test_bad_directory_instead_of_file(tmp_path: Path) -> None:
    assert data_error(read_table, tmp_path).problems == [
        Problem(str(tmp_path), None, None, "is a directory (expected a data file)")]


def test_bad_missing_required_column(tmp_path: Path) -> None:
    path = write(tmp_path, "a.csv", "sentence,head,head_offset,tail,relation\nA likes B,A,0,B,r\n")
    err = data_error(read_table, path)
    assert err.problems == [Problem(str(path), 1, None,
                                    "missing required column tail_offset (found columns: sentence, head, head_offset, "
                                    "tail, relation; expected: sentence, head, head_offset, tail, tail_offset, "
                                    "relation (optional: id, head_type, tail_type))")]
    assert "--columns SOURCE=TARGET" in str(err) and "column_map" in str(err)


def test_bad_missing_relation_column_unless_prediction(tmp_path: Path) -> None:
    path = write(tmp_path, "a.csv", "sentence,head,head_offset,tail,tail_offset\nA likes B,A,0,B,8\n")
    assert data_error(read_table, path).problems[0].message.startswith("missing required column relation ")


def test_bad_column_map_names_absent_column(tmp_path: Path) -> None:
    path = write(tmp_path, "a.csv", f"{HEADER}\n{GOOD}\n")
    assert data_error(read_table, path, column_map={"entity1": "head"}).problems == [
        Problem(str(path), 1, None, "the column map names column entity1, not in the file (found columns: sentence, "
                                    "head, head_offset, tail, tail_offset, relation)")]


def test_bad_duplicated_header_column(tmp_path: Path) -> None:
    path = write(tmp_path, "a.csv", "sentence,head,head_offset,head,tail,tail_offset,relation\n")
    err = data_error(read_table, path)
    assert err.problems == [Problem(str(path), 1, "head", "duplicated header column (columns 2 and 4 are both 'head')")]


def test_bad_no_header(tmp_path: Path) -> None:
    path = write(tmp_path, "a.csv", f"{GOOD}\n{GOOD}\n")
    err = data_error(read_table, path)
    assert err.problems == [Problem(
        str(path), 1, None,
        "no header row: line 1 names none of the expected columns (found 张三是ABC公司的董事长, 张三, 0, ABC公司, 3, "
        "董事长); expected a header line such as 'sentence,head,head_offset,tail,tail_offset,relation'")]


def test_nyt10_read_as_sentences_says_add_bag_aggregator(tmp_path: Path) -> None:
    path = write(tmp_path, "train.tsv", "/m/01\t/m/02\tAnn\tParis\tNA\tAnn saw Paris . ###END###\n")
    err = data_error(read_table, path)
    assert str(err.problems[0]).startswith(f"{path}:1: no header row") and "Add --bag-aggregator att" in err.hint


@pytest.mark.parametrize("content", [b"", b"\n\r\n  \n", b"\xef\xbb\xbf"], ids=["zero-bytes", "blank", "bom-only"])
def test_bad_empty_file(tmp_path: Path, content: bytes) -> None:
    path = write(tmp_path, "a.csv", content)
    assert data_error(read_table, path).problems == [Problem(str(path), None, None, "file is empty")]


def test_bad_header_without_rows(tmp_path: Path) -> None:
    path = write(tmp_path, "a.csv", f"{HEADER}\r\n")
    assert data_error(read_table, path).problems == [
        Problem(str(path), 1, None, "the file has a header but no data rows")]


def test_bad_undecodable_bytes(tmp_path: Path) -> None:
    gbk = "李四是公司的总经理,李四,0,公司,3,总经理\n".encode("gbk")
    path = write(tmp_path, "a.csv", f"{HEADER}\n{GOOD}\n".encode() + gbk)
    err = data_error(read_table, path)
    offset = len(f"{HEADER}\n{GOOD}\n".encode())
    assert err.problems == [Problem(str(path), 3, None,
                                    f"not valid UTF-8: byte 0xc0 at byte offset {offset} (byte 1 of the line) "
                                    "cannot be decoded; the line decodes as GB18030, so the file was probably saved "
                                    "as GBK/GB18030")]
    assert "Re-save the file as UTF-8" in str(err)


@pytest.mark.parametrize(("name", "content", "message"), [
    ("a.xml", "<doc/>\n", "cannot read this file: it is not a format we know (first line: '<doc/>')"),
    ("a.json", '[{"sentence": "x"}]', "cannot read this file: it is a JSON array; write one JSON object per line "
                                      "(JSON Lines) instead"),
    ("a.xlsx", b"PK\x03\x04rest", "cannot read this file: it is a ZIP archive (an Excel workbook?); save it as CSV "
                                  "UTF-8"),
])
def test_bad_unknown_format(tmp_path: Path, name: str, content: str | bytes, message: str) -> None:
    path = write(tmp_path, name, content)
    err = data_error(read_table, path)
    assert err.problems == [Problem(str(path), None, None, message)] and "--format" in str(err)


def test_bad_unknown_forced_format(tmp_path: Path) -> None:
    path = write(tmp_path, "a.csv", f"{HEADER}\n{GOOD}\n")
    assert data_error(read_table, path, fmt="xml").problems == [
        Problem(str(path), None, None, f"unknown format 'xml' (expected one of {', '.join(FORMATS)})")]


def test_bad_parquet_file(tmp_path: Path) -> None:
    path = write(tmp_path, "a.parquet", b"not parquet at all")
    [problem] = data_error(read_table, path).problems
    assert (problem.file, problem.line) == (str(path), None)
    assert problem.message.startswith("not a readable Parquet file")


def test_bad_jsonl_lacking_a_required_key_everywhere(tmp_path: Path) -> None:
    path = write(tmp_path, "a.jsonl", '{"sentence": "A likes B", "head": "A", "head_offset": 0, "relation": "r"}\n')
    assert data_error(read_table, path).problems == [Problem(
        str(path), None, None, "missing required columns tail, tail_offset (found columns: sentence, head, "
        "head_offset, relation; expected: sentence, head, head_offset, tail, tail_offset, relation (optional: id, "
        "head_type, tail_type))")]


def test_bad_semeval_without_any_label(tmp_path: Path) -> None:
    path = write(tmp_path, "TEST_FILE.txt", '8001\t"A <e1>b</e1> c <e2>d</e2>."\n')
    err = data_error(read_table, path)
    assert err.problems == [Problem(str(path), None, None,
                                    "no relation labels: this is an unlabelled SemEval file (sentence lines only)")]
    assert "TEST_FILE_FULL.TXT" in str(err)


# ----------------------------------------------------------------------------------------- malformed input: rows


def one_row(tmp_path: Path, row: str, header: str = HEADER) -> list[str]:
    """The problems (as text) of a CSV with one header and row (and a good row first, so the bad one is line 3)."""
    path = write(tmp_path, "a.csv", f"{header}\n{GOOD}\n{row}\n")
    return [str(p).removeprefix(f"{path}:") for p in row_problems(path)]


@pytest.mark.parametrize(("row", "expected"), [
    ("张三是ABC公司的董事长,张三,abc,ABC公司,3,董事长",
     ["3: head_offset: not an integer (expected a whole number such as 12, found 'abc')"]),
    ("张三是ABC公司的董事长,张三,2.5,ABC公司,3.0,董事长",
     ["3: head_offset: not an integer (expected a whole number such as 12, found '2.5')"]),
    ("张三是ABC公司的董事长,张三,-1,ABC公司,3,董事长",
     ["3: head_offset: negative (expected 0 <= head_offset <= 10, found -1), but head '张三' occurs at offset 0"]),
    ("张三是ABC公司的董事长,张三,0,ABC公司,9,董事长",
     ["3: tail_offset: tail runs past the end of the sentence (expected tail_offset + len(tail) <= 12, "
      "found 9 + 5 = 14), but tail 'ABC公司' occurs at offset 3"]),
    ("张三是ABC公司的董事长,张三,0,ABC公司,2,董事长",
     ["3: tail_offset: the sentence does not have tail at offset 2 (expected 'ABC公司', found '是ABC公'), "
      "but tail 'ABC公司' occurs at offset 3"]),
    ("张三和张三的ABC公司,张三,1,ABC公司,6,董事长",
     ["3: head_offset: the sentence does not have head at offset 1 (expected '张三', found '三和'), "
      "but head '张三' occurs at offsets 0, 3"]),
    ("张三是ABC公司的董事长,李四,0,ABC公司,3,董事长",
     ["3: head_offset: the sentence does not have head at offset 0 (expected '李四', found '张三'), "
      "and head '李四' does not occur anywhere in the sentence"]),
    (",张三,0,ABC公司,3,董事长", ["3: sentence: empty (expected the sentence text)"]),
    ("张三是ABC公司的董事长,,0,ABC公司,3,董事长", ["3: head: empty (expected the head entity text)"]),
    ("张三是ABC公司的董事长,张三,0,  ,3,董事长", ["3: tail: empty (expected the tail entity text)"]),
    ("张三是ABC公司的董事长,张三,0,ABC公司,3,", ["3: relation: empty (expected a relation label)"]),
    ("张三是ABC公司的董事长,张三,,ABC公司,3,董事长",
     ["3: head_offset: empty (expected the 0-based character offset of head in sentence)"]),
    ("张三是ABC公司的董事长,张三,x,ABC公司,-2,",
     ["3: relation: empty (expected a relation label)",
      "3: head_offset: not an integer (expected a whole number such as 12, found 'x')",
      "3: tail_offset: negative (expected 0 <= tail_offset <= 7, found -2), but tail 'ABC公司' occurs at offset 3"]),
    ("张三是ABC公司的董事长,张三,0,ABC公司,3,董事长,extra",
     ["3: row: wrong number of fields (expected 6 like the header, found 7), a field that contains a comma must be "
      "enclosed in double quotes"]),
    ("张三是ABC公司的董事长,张三,0",
     ["3: row: wrong number of fields (expected 6 like the header, found 3)"]),
], ids=["offset-abc", "offset-2.5", "negative", "past-end", "mismatch", "mismatch-two-hints", "mismatch-nowhere",
        "empty-sentence", "empty-head", "blank-tail", "empty-relation", "empty-offset", "several", "extra-field",
        "short-row"])
def test_bad_rows(tmp_path: Path, row: str, expected: list[str]) -> None:
    assert one_row(tmp_path, row) == expected


def test_bad_row_trailing_empty_fields_are_fine(tmp_path: Path) -> None:
    assert one_row(tmp_path, GOOD + ",,") == []


def test_bad_unmatched_quote_names_the_lines(tmp_path: Path) -> None:
    path = write(tmp_path, "a.csv", f'{HEADER}\n"oops,张三,0,ABC公司,3,董事长\n{GOOD}\n{GOOD}\n')
    assert [str(p) for p in row_problems(path)] == [
        f"{path}:2: row: wrong number of fields (expected 6 like the header, found 1), this record runs from line 2 "
        "to line 4: check for an unmatched double quote"]


def test_bad_row_line_after_multiline_field(tmp_path: Path) -> None:
    text = f'{HEADER}\r\n"a\r\nb\r\nc",a,0,c,6,r\r\n{GOOD}\r\n甲乙,甲,0,乙,1,\r\n'
    path = write(tmp_path, "a.csv", text)
    assert row_problems(path) == [Problem(str(path), 6, "relation", "empty (expected a relation label)")]


def test_bad_json_line(tmp_path: Path) -> None:
    good = json.dumps({"sentence": "A likes B", "head": "A", "head_offset": 0, "tail": "B", "tail_offset": 8,
                       "relation": "r"})
    path = write(tmp_path, "a.jsonl", f'{good}\n{{"sentence": "x",\n[1, 2]\n{good}\n')
    out = checked(path)
    assert out["line"].tolist() == [1, 2, 3, 4]
    assert problems_of(out) == [
        Problem(str(path), 2, "json",
                "not valid JSON (Expecting property name enclosed in double quotes at column 18)"),
        Problem(str(path), 3, "json", 'not a JSON object (expected {"sentence": ..., ...}, found a list)'),
    ]


def test_bad_opennre_positions(tmp_path: Path) -> None:
    record = {"token": ["A", "likes", "B"], "h": {"name": "a", "pos": [0, 1]}, "t": {"name": "b", "pos": [2, 5]},
              "relation": "r"}
    path = write(tmp_path, "a.txt", json.dumps(record) + "\n")
    assert row_problems(path) == [
        Problem(str(path), 1, "t.pos", "outside the 3 tokens (expected 0 <= start < end <= 3, found [2, 5])")]


def test_bad_semeval_block_without_label(tmp_path: Path) -> None:
    text = SEMEVAL + '8003\t"A <e1>b</e1> c <e2>d</e2>."\nComment: forgot the label\n\n'
    path = write(tmp_path, "TRAIN_FILE.TXT", text)
    assert row_problems(path) == [Problem(
        str(path), 9, "relation", "SemEval block has no label line (expected a label such as 'Other' or "
        "'Cause-Effect(e1,e2)' on the line after the sentence, found 'Comment: forgot the label')")]


def test_bad_semeval_tags(tmp_path: Path) -> None:
    path = write(tmp_path, "TRAIN_FILE.TXT", '1\t"A <e1>b</e1> c d."\nOther\nComment:\n\n')
    assert row_problems(path) == [Problem(str(path), 1, "sentence", "entity tags incomplete (expected one <e1>...</e1> "
                                                                    "and one <e2>...</e2>, found e1)")]


# ---------------------------------------------------------------------------------- malformed input: labels, dirs


def test_bad_duplicate_label_in_relation_txt(tmp_path: Path) -> None:
    path = write(tmp_path, "relation.txt", "导演\r\n国籍\r\n\r\n导演\r\n")
    err = data_error(read_labels, path)
    assert err.problems == [Problem(str(path), 4, None, "duplicate label '导演' (first on line 1)")]


def test_bad_duplicate_index_in_relation_csv(tmp_path: Path) -> None:
    path = write(tmp_path, "relation.csv", "head_type,tail_type,relation,index\nX,Y,a,1\nX,Y,b,1\n")
    assert data_error(read_labels, path).problems == [Problem(str(path), 3, "index", "duplicate index 1 (first on "
                                                                                     "line 2)")]


def test_bad_rel2id_shared_id(tmp_path: Path) -> None:
    path = write(tmp_path, "rel2id.json", '{"a": 0, "b": 0}')
    assert data_error(read_labels, path).problems == [Problem(str(path), None, None, "labels 'a' and 'b' share id 0")]


def test_bad_data_dir_without_train(tmp_path: Path) -> None:
    write(tmp_path, "valid.csv", "x")
    write(tmp_path, "notes.md", "x")
    err = data_error(find_data_files, tmp_path)
    assert err.problems == [Problem(str(tmp_path), None, None,
                                    "no training file (expected train.csv, train.tsv, train.jsonl, train.json, "
                                    "train.parquet or train.txt; the directory holds notes.md, valid.csv)")]


def test_bad_data_dir_missing_or_ambiguous(tmp_path: Path) -> None:
    assert data_error(find_data_files, tmp_path / "nope").problems == [
        Problem(str(tmp_path / "nope"), None, None, "data directory not found")]
    write(tmp_path, "train.csv", "x")
    write(tmp_path, "train.jsonl", "x")
    assert data_error(find_data_files, tmp_path).problems == [
        Problem(str(tmp_path), None, None, "more than one train file (train.csv, train.jsonl)")]


@pytest.mark.parametrize(("text", "message"), [
    ("entity1", "bad mapping 'entity1' (expected SOURCE=TARGET, e.g. entity1=head)"),
    ("entity1=", "bad mapping 'entity1=' (expected SOURCE=TARGET, e.g. entity1=head)"),
    ("entity1=subject", "unknown target column 'subject' in entity1=subject (expected one of sentence, head, "
                        "head_offset, tail, tail_offset, relation, id, head_type, tail_type)"),
    ("a=head,b=head", "two columns are mapped to 'head': 'a' and 'b'"),
    ("a=head,a=tail", "column 'a' is mapped twice"),
])
def test_bad_column_map_syntax(text: str, message: str) -> None:
    assert data_error(parse_column_map, text).problems == [Problem("--columns", None, None, message)]


# ------------------------------------------------------------------------------------------------- check_rows


def test_check_rows_never_raises_on_garbage_and_keeps_prior_problems() -> None:
    batch = pd.DataFrame({
        "sentence": [None, np.nan, 3, "abc", ["x"], "x y", "x y"],
        "head": [1.5, None, "a", "a", {}, "y", "y"],
        "head_offset": [None, "x", True, 2.5, [0], 2, 2],
        "tail": ["a", None, np.nan, "b", "c", "x", "x"],
        "tail_offset": [float("nan"), 1e30, -3, "1", 0, 0, 0],
        "relation": [None, 1, 2.0, "r", "r", "r", "r"],
        "problem": ["", "", "", "", "", "", "json: not valid JSON (x)"],
    }, dtype=object)
    out = check_rows(batch)
    assert out["head_offset"].dtype == np.int64 and out["tail_offset"].dtype == np.int64
    assert out["problem"].iloc[5] == "" and out["head_offset"].iloc[5] == 2
    assert out["problem"].iloc[6] == "json: not valid JSON (x)"
    assert all(out["problem"].iloc[:5] != "")
    assert out["sentence"].tolist()[:3] == ["", "", "3"]


def test_check_rows_handles_missing_columns_and_empty_batches() -> None:
    out = check_rows(pd.DataFrame({"sentence": ["a b"], "head": ["a"]}))
    assert out["problem"].iloc[0] == (
        "tail: empty (expected the tail entity text); "
        "head_offset: empty (expected the 0-based character offset of head in sentence); "
        "tail_offset: empty (expected the 0-based character offset of tail in sentence)")
    empty = check_rows(pd.DataFrame({c: pd.Series([], dtype=object) for c in REQUIRED}))
    assert len(empty) == 0 and empty["head_offset"].dtype == np.int64 and "problem" in empty.columns


def test_check_rows_accepts_integer_and_float_offset_columns() -> None:
    batch = pd.DataFrame({"sentence": ["A likes B"] * 2, "head": ["A"] * 2, "head_offset": [0, 0],
                          "tail": ["B"] * 2, "tail_offset": [8.0, np.nan], "relation": ["r"] * 2})
    out = check_rows(batch)
    assert out["tail_offset"].tolist() == [8, -1]
    assert out["problem"].tolist() == [
        "", "tail_offset: empty (expected the 0-based character offset of tail in sentence)"]


def test_check_rows_does_not_modify_its_input() -> None:
    batch = pd.DataFrame({"sentence": ["A likes B"], "head": ["A"], "head_offset": ["0"], "tail": ["B"],
                          "tail_offset": ["8"], "relation": [None]})
    before = batch.copy()
    check_rows(batch)
    pd.testing.assert_frame_equal(batch, before)


def test_problems_of_splits_joined_problems() -> None:
    batch = pd.DataFrame({"file": ["f.csv", "f.csv"], "line": [2, 3],
                          "problem": ["", "head: empty (expected x; y); relation: empty (expected a label)"]})
    assert problems_of(batch) == [Problem("f.csv", 3, "head", "empty (expected x; y)"),
                                  Problem("f.csv", 3, "relation", "empty (expected a label)")]


# ------------------------------------------------------------------------------------------------ property tests

garbage = st.one_of(st.none(), st.text(max_size=8), st.integers(-10**20, 10**20), st.floats(allow_nan=True),
                    st.booleans(), st.lists(st.integers(), max_size=2))


@settings(max_examples=150, deadline=None)
@given(st.lists(st.fixed_dictionaries({c: garbage for c in REQUIRED}), min_size=1, max_size=6))
def test_property_check_rows_never_raises(rows: list[dict[str, object]]) -> None:
    out = check_rows(pd.DataFrame(rows, dtype=object))
    assert out["head_offset"].dtype == np.int64 and len(out) == len(rows)
    good = out["problem"] == ""
    for _, row in out[good].iterrows():
        for entity in ("head", "tail"):
            start = row[f"{entity}_offset"]
            assert start >= 0 and row["sentence"][start:start + len(row[entity])] == row[entity]


cell = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\r\x00"), min_size=1, max_size=12)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.tuples(cell, cell, cell, cell), min_size=1, max_size=5))
def test_property_csv_round_trip_and_physical_lines(tmp_path: Path, rows: list[tuple[str, ...]]) -> None:
    """Any text survives csv quoting; each record's LINE is 1 + the newlines before it."""
    records = []
    for before, head, middle, tail in rows:
        if not head.strip() or not tail.strip() or not middle.strip():
            continue
        sentence = before + head + middle + tail
        records.append([sentence, head, len(before), tail, len(before + head + middle), "r"])
    if not records:
        return
    buffer = io.StringIO(newline="")
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(HEADER.split(","))
    starts = []
    for record in records:
        starts.append(buffer.getvalue().count("\n") + 1)
        writer.writerow(record)
    path = write(tmp_path, "p.csv", buffer.getvalue())
    out = checked(path, fmt="csv")
    assert out["line"].tolist() == starts
    assert out["sentence"].tolist() == [r[0] for r in records]
    assert out["problem"].tolist() == [""] * len(records)
    assert out["tail_offset"].tolist() == [r[4] for r in records]



def test_check_rows_on_arrow_backed_batches_like_ray_gives() -> None:
    import pyarrow as pa

    table = pa.table({
        "sentence": pa.array(["A likes B", None, "A likes B"], pa.large_string()), "head": ["A", "A", "A"],
        "head_offset": pa.array([0, None, 0], pa.int64()), "tail": ["B", "B", None],
        "tail_offset": pa.array(["8", "8", "x"], pa.large_string()), "relation": ["r", "r", "r"]})
    out = check_rows(table.to_pandas(types_mapper=pd.ArrowDtype))
    assert out["head_offset"].tolist() == [0, -1, 0] and out["tail_offset"].tolist() == [8, -1, -1]
    assert out["problem"].tolist() == [
        "",
        "sentence: empty (expected the sentence text); "
        "head_offset: empty (expected the 0-based character offset of head in sentence)",
        "tail: empty (expected the tail entity text); "
        "tail_offset: not an integer (expected a whole number such as 12, found 'x')",
    ]

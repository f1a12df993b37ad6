"""Bag readers: NYT10 TSV (the real GIDS files and broken copies), entity offsets, pair ids of the other formats,
URIs, and the relation2id.txt quirk."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from nre_ray import storage
from nre_ray.data.errors import DataError
from nre_ray.tasks.bag import bags, files
from nre_ray.tasks.bag.files import COLUMNS, detect_bag_format, find_entity, read_bag_table

DEGREE = "/people/person/education./education/education/degree"


def nyt10_line(head: str, tail: str, relation: str, sentence: str, ids: tuple[str, str] = ("/m/01", "/m/02")) -> str:
    return f"{ids[0]}\t{ids[1]}\t{head}\t{tail}\t{relation}\t{sentence} ###END### \n"


@pytest.mark.parametrize(("name", "sentences", "id_bags", "text_bags"),
                         [("test.tsv", 5663, 3247, 3246), ("dev.tsv", 1864, 1082, 1082)])
def test_gids_files(shared_datasets: Path, name: str, sentences: int, id_bags: int, text_bags: int) -> None:
    path = shared_datasets / "gids" / name
    assert detect_bag_format(path) == "nyt10"
    frame = read_bag_table(path)
    assert list(frame.columns) == list(COLUMNS)
    assert len(frame) == sentences and not (frame["problem"] != "").any()
    for entity in ("head", "tail"):
        offsets = frame[f"{entity}_offset"].astype(int)
        assert all(s[o:o + len(e)] == e for s, o, e in zip(frame["sentence"], offsets, frame[entity], strict=True))
    assert not frame["sentence"].str.contains("###END###").any()
    assert set(frame["relation"]) == {"NA", DEGREE, "/people/person/education./education/education/institution",
                                      "/people/person/place_of_birth", "/people/deceased_person/place_of_death"}
    built = bags.build_bags(frame)
    assert len(built) == id_bags and built["total"].sum() == sentences
    no_ids = frame.drop(columns=["head_id", "tail_id"])
    assert len(bags.build_bags(no_ids)) == text_bags  # test.tsv: two id pairs share one (head, tail) text pair


def test_gids_relation2id_disagrees_with_the_data(shared_datasets: Path) -> None:
    folder = shared_datasets / "gids"
    file_labels = files.read_relation2id(folder / "relation2id.txt")
    assert file_labels[0] == "NA" and len(file_labels) == 5
    frame = read_bag_table(folder / "dev.tsv")
    with pytest.raises(DataError) as err:
        files.check_label_file(str(folder / "relation2id.txt"), file_labels, files.first_occurrences(frame))
    message = str(err.value)
    assert f"the data's label {DEGREE!r} (first at {folder / 'dev.tsv'}:8) is not in the label file; " \
           f"the label file has {DEGREE + 's'!r}" in message
    assert message.endswith(files.HINT_LABEL_FILE) and message.count("\n") == 1
    fixed = [label.replace("degrees", "degree") for label in file_labels]
    assert files.check_label_file("x", fixed, files.first_occurrences(frame)) == fixed


def test_relation2id_problems(tmp_path: Path) -> None:
    path = tmp_path / "relation2id.txt"
    path.write_text("NA 0\n/a 1\n\n/b 1\n")
    with pytest.raises(DataError, match=r"relation2id.txt:4: label '/b' or id 1 given twice \(first on line 2\)"):
        files.read_relation2id(path)
    path.write_text("NA 0\n/a one\n")
    with pytest.raises(DataError, match=r":2: expected 'LABEL ID' \(found '/a one'\)"):
        files.read_relation2id(path)
    path.write_text("/b 2\nNA 0\n/a 1\n")
    assert files.read_relation2id(path) == ["NA", "/a", "/b"]


def test_find_entity() -> None:
    assert find_entity("New_York_City is in New_York", "New_York") == (20, 1)  # not inside New_York_City
    assert find_entity("Norwich Sol-fa, born in Norwich", "Norwich") == (0, 2)
    assert find_entity("Norwich and Norwich", "Norwich", avoid=(0, 7)) == (12, 2)  # the tail avoids the head's span
    assert find_entity("Bob and Bob", "Bob", avoid=(0, 11)) == (0, 2)  # all overlap: the first
    assert find_entity("the Garouas", "Garoua") == (4, 1)  # inside a word only when there is no whole word
    assert find_entity("nothing here", "Garoua") == (-1, 0)
    assert find_entity("anything", "") == (-1, 0)


def test_broken_nyt10_copy(shared_datasets: Path, tmp_path: Path) -> None:
    lines = (shared_datasets / "gids" / "dev.tsv").read_text(encoding="utf-8").split("\n")[:6]
    fields = lines[1].split("\t")
    lines[1] = "\t".join(fields[:5])  # a field missing
    fields = lines[3].split("\t")
    fields[5] = fields[5].replace(fields[2], "someone")  # the head no longer in the sentence
    lines[3] = "\t".join(fields)
    lines.insert(4, "")  # a blank line: skipped, the line numbers still count it
    path = tmp_path / "broken.txt"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    assert detect_bag_format(path) == "nyt10"
    frame = read_bag_table(path)
    assert frame["line"].tolist() == [1, 2, 3, 4, 6, 7]
    problems = dict(zip(frame["line"], frame["problem"], strict=True))
    assert problems[2] == ("row: wrong number of fields (expected 6 tab-separated fields: head id, tail id, head, "
                           "tail, relation, sentence; found 5)")
    assert problems[4].startswith("head: '") and problems[4].endswith("' does not occur in the sentence")
    assert [p for n, p in problems.items() if n not in (2, 4)] == ["", "", "", ""]
    with pytest.raises(DataError, match="a column map does not apply to the nyt10 format"):
        read_bag_table(path, column_map={"a": "sentence"})
    with pytest.raises(DataError, match="unknown format 'xml'"):
        read_bag_table(path, fmt="xml")
    with pytest.raises(DataError, match="file not found"):
        read_bag_table(tmp_path / "missing.tsv")


def test_nyt10_chunks_and_detection(tmp_path: Path) -> None:
    text = "".join(nyt10_line("A_b", "C", "NA", f"A_b met C {i} times") for i in range(5))
    path = tmp_path / "train.tsv"  # a .tsv extension: the content says nyt10
    path.write_text(text)
    assert detect_bag_format(path) == "nyt10"
    chunks = list(files.read_nyt10_chunks(path, rows_per_chunk=2))
    assert [len(c) for c in chunks] == [2, 2, 1]
    whole = pd.concat(chunks, ignore_index=True)
    pd.testing.assert_frame_equal(whole, read_bag_table(path))
    assert whole["head_offset"].tolist() == ["0"] * 5 and whole["tail_offset"].tolist() == ["8"] * 5
    no_mark = tmp_path / "ids.txt"
    no_mark.write_text("m.01\tm.02\tA\tC\tNA\tA and C\n")
    assert detect_bag_format(no_mark) == "nyt10"
    plain = tmp_path / "plain.tsv"
    plain.write_text("sentence\thead\thead_offset\ttail\ttail_offset\trelation\nA and C\tA\t0\tC\t6\tNA\n")
    assert detect_bag_format(plain) == "tsv"


def test_opennre_ids(tmp_path: Path) -> None:
    records = [
        {"text": "Paris is in France", "h": {"id": "m.1", "name": "Paris", "pos": [0, 5]},
         "t": {"id": "m.2", "name": "France", "pos": [12, 18]}, "relation": "/location/contains"},
        {"text": "Lyon is in France", "h": {"name": "Lyon", "pos": [0, 4]}, "t": {"name": "France", "pos": [11, 17]},
         "relation": "NA"},
    ]
    path = tmp_path / "train.txt"
    path.write_text("\n".join(json.dumps(r) for r in records) + "\n\nnot json\n")
    assert detect_bag_format(path) == "opennre"
    frame = read_bag_table(path)
    assert list(frame.columns) == list(COLUMNS)
    assert frame["head_id"].tolist() == ["m.1", "", ""] and frame["tail_id"].tolist() == ["m.2", "", ""]
    assert frame["head_offset"].tolist()[:2] == ["0", "0"] and frame["line"].tolist() == [1, 2, 4]
    assert frame["problem"].tolist()[2].startswith("json: not valid JSON")
    keys = bags.bag_keys(frame.iloc[:2])
    assert keys.tolist() == ["id\x1fm.1\x1fm.2", "text\x1fLyon\x1fFrance"]


def test_csv_tsv_parquet_ids(tmp_path: Path) -> None:
    rows = pd.DataFrame({"sentence": ["A met B", "A saw B"], "head": ["A", "A"], "head_offset": [0, 0],
                         "tail": ["B", "B"], "tail_offset": [6, 6], "relation": ["r", "NA"],
                         "head_id": ["/m/a", "/m/a"], "tail_id": ["/m/b", ""]})
    rows.to_csv(tmp_path / "ids.csv", index=False)
    rows.to_csv(tmp_path / "ids.tsv", index=False, sep="\t")
    rows.to_parquet(tmp_path / "ids.parquet")
    rows.to_json(tmp_path / "ids.jsonl", orient="records", lines=True)
    rows.drop(columns=["head_id", "tail_id"]).to_csv(tmp_path / "plain.csv", index=False)
    for name in ("ids.csv", "ids.tsv", "ids.parquet", "ids.jsonl"):
        frame = read_bag_table(tmp_path / name)
        assert frame["head_id"].tolist() == ["/m/a", "/m/a"] and frame["tail_id"].tolist() == ["/m/b", ""], name
        assert (frame["problem"] == "").all()
    plain = read_bag_table(tmp_path / "plain.csv")
    assert plain["head_id"].tolist() == ["", ""] and list(plain.columns) == list(COLUMNS)
    (tmp_path / "bad.csv").write_text("sentence,head,head_offset,tail,tail_offset,relation,head_id,tail_id\n"
                                      "A met B,A,0,B,6,r,/m/a,/m/b\n\"A saw B,A,0,B,6,r,/m/a,/m/b\n")
    bad = read_bag_table(tmp_path / "bad.csv")
    assert bad["problem"].tolist()[0] == "" and bad["head_id"].tolist()[0] == "/m/a"


def test_uri_inputs(object_store: str, tmp_path: Path) -> None:
    local = tmp_path / "train.tsv"
    local.write_text(nyt10_line("A", "B", "r", "A knows B") + nyt10_line("A", "Z", "NA", "A knows B"))
    record = {"text": "A B", "h": {"id": "x", "name": "A", "pos": [0, 1]}, "t": {"id": "y", "name": "B", "pos": [2, 3]},
              "relation": "r"}
    (tmp_path / "o.jsonl").write_text(json.dumps(record) + "\n")
    base = storage.join(object_store, "bag_readers")
    storage.upload(tmp_path, base)
    uri = storage.join(base, "train.tsv")
    assert detect_bag_format(uri) == "nyt10"
    frame = read_bag_table(uri)
    assert frame["file"].tolist() == [uri, uri]
    assert frame["problem"].tolist()[1] == "tail: 'Z' does not occur in the sentence"
    expected = read_bag_table(local).drop(columns="file")
    pd.testing.assert_frame_equal(frame.drop(columns="file"), expected)
    assert pd.concat(files.read_nyt10_chunks(uri, 1))["file"].tolist() == [uri, uri]
    ids = read_bag_table(storage.join(base, "o.jsonl"))
    assert ids["head_id"].tolist() == ["x"] and ids["file"].tolist() == [storage.join(base, "o.jsonl")]
    with pytest.raises(DataError, match="file not found"):
        read_bag_table(storage.join(base, "missing.tsv"))

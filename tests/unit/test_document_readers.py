"""Document readers (nre_ray.tasks.document.readers / checks / text): the real CDR and Re-DocRED files, broken copies
(offsets, composite and missing ids, missing entities, unknown relations), detection, skip mode, URIs."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from nre_ray import storage
from nre_ray.data.errors import DataError
from nre_ray.tasks.document.readers import (
    detect_document_format,
    format_of_head,
    read_documents,
    split_of_name,
)
from nre_ray.tasks.document.records import Document, document_from_dict
from nre_ray.tasks.document.sample import write_sample
from nre_ray.tasks.document.text import split_sentences, tokenize
from nre_ray.tasks.document.validation import check_relations

CDR = {"CDR_TrainingSet.PubTator.txt": ("train", 1038), "CDR_DevelopmentSet.PubTator.txt": ("valid", 1012),
       "CDR_TestSet.PubTator.txt": ("test", 1066)}

TITLE = "Lithium-induced nephropathy in rats."
ABSTRACT = "Lithium carbonate caused hemorrhagic cystitis and renal failure. Dr. Smith saw no tremor in 3 rats."
PUBTATOR = f"""\
100|t|{TITLE}
100|a|{ABSTRACT}
100\t0\t7\tLithium\tChemical\tD008094
100\t16\t27\tnephropathy\tDisease\tD007674
100\t37\t54\tLithium carbonate\tChemical\tD016651
100\t62\t82\themorrhagic cystitis\tDisease\tD006470|D003556\themorrhagic|cystitis
100\t87\t100\trenal failure\tDisease\tD051437
100\t119\t125\ttremor\tDisease\t-1
100\tCID\tD008094\tD007674
100\tCID\tD016651\tD003556

200|t|Second document.
200|a|Aspirin caused pain.
200\t17\t24\tAspirin\tChemical\tD001241
200\t32\t36\tpain\tDisease\tD010146
200\tCID\tD001241\tD010146
"""


def write(folder: Path, name: str, text: str) -> Path:
    path = folder / name
    path.write_text(text, encoding="utf-8")
    return path


def mention_is_consistent(doc: Document) -> None:
    """Every mention's character span is its text, and its tokens cover exactly that span."""
    for entity in doc.entities:
        for m in entity.mentions:
            assert doc.text is not None and doc.token_chars is not None and m.chars is not None
            assert doc.text[m.chars[0]:m.chars[1]] == m.text
            spans = doc.token_chars[m.sent_id][m.start:m.end]
            assert (spans[0][0], spans[-1][1]) == m.chars, (doc.id, m)


# --------------------------------------------------------------------------------------------------------------------
# the real files


@pytest.mark.parametrize("name", sorted(CDR))
def test_cdr_files_read_as_published(shared_datasets: Path, name: str) -> None:
    path = shared_datasets / "cdr" / name
    split, facts = CDR[name]
    assert detect_document_format(path) == "pubtator" and split_of_name(str(path)) == split
    got = read_documents(path)
    assert got.format == "pubtator" and got.skipped == 0 and not got.problems
    assert len(got.documents) == 500 and len({d.id for d in got.documents}) == 500
    assert sum(len(d.facts) for d in got.documents) == facts
    assert {f.relation for d in got.documents for f in d.facts} == {"CID"}
    assert all(d.entities[f.head].type == "Chemical" and d.entities[f.tail].type == "Disease"
               for d in got.documents for f in d.facts)
    assert sum(len(d.unlinked) for d in got.documents) > 0  # the -1 mentions, kept apart
    for doc in got.documents:
        mention_is_consistent(doc)
        assert doc.sentences[0] == tuple(doc.text[a:b] for a, b in doc.token_chars[0])


def test_cdr_composite_ids_belong_to_each_entity(shared_datasets: Path) -> None:
    docs = {d.id: d for path in (shared_datasets / "cdr").glob("CDR_*.txt") for d in read_documents(path).documents}
    doc = docs["1545575"]  # "Hemorrhagic cystitis" is D006470|D003556
    entities = {e.id: e for e in doc.entities}
    first = next(m for m in entities["D006470"].mentions if m.chars == (0, 20))
    assert first.text == "Hemorrhagic cystitis" and first in entities["D003556"].mentions


def test_re_docred_file(shared_datasets: Path) -> None:
    path = shared_datasets / "re-docred" / "dev_revised.json"
    assert detect_document_format(path) == "docred" and split_of_name(str(path)) is None
    got = read_documents(path)
    assert len(got.documents) == 500 and sum(len(d.facts) for d in got.documents) == 17284
    assert len({f.relation for d in got.documents for f in d.facts}) == 95
    doc = got.documents[0]
    raw = json.loads(path.read_text(encoding="utf-8"))[0]
    assert doc.id == raw["title"] and [e.id for e in doc.entities] == [str(i) for i in range(len(raw["vertexSet"]))]
    assert document_from_dict(doc.to_dict()) == dataclasses.replace(doc, source="", index=0)


def test_broken_copies_of_the_real_files(shared_datasets: Path, tmp_path: Path) -> None:
    lines = (shared_datasets / "cdr" / "CDR_TestSet.PubTator.txt").read_text(encoding="utf-8").split("\n")
    k = next(i for i, line in enumerate(lines) if line.count("\t") >= 5)  # the first mention line
    fields = lines[k].split("\t")
    lines[k] = "\t".join([fields[0], fields[1], str(int(fields[2]) + 1), *fields[3:]])  # its end one too far
    path = write(tmp_path, "CDR_TestSet.PubTator.txt", "\n".join(lines))
    with pytest.raises(DataError, match=rf"CDR_TestSet\.PubTator\.txt:{k + 1}: document 0 \(id '{fields[0]}'\): "
                                        rf"mention '{fields[3]}' at {fields[1]}-{int(fields[2]) + 1} does not match"):
        read_documents(path)
    got = read_documents(path, on_bad="skip")
    assert len(got.documents) == 499 and got.skipped == 1 and got.documents[0].id != fields[0]

    docs = json.loads((shared_datasets / "re-docred" / "dev_revised.json").read_text(encoding="utf-8"))
    docs[3]["vertexSet"] = docs[3]["vertexSet"][:1]  # its labels now name entities it does not have
    path = write(tmp_path, "dev.json", json.dumps(docs))
    got = read_documents(path, on_bad="skip")
    assert len(got.documents) == 499 and got.skipped == 1 and {p.message.split(":")[0] for p in got.problems} == {
        f"document 3 ({docs[3]['title']!r})"}


# --------------------------------------------------------------------------------------------------------------------
# PubTator, built here


def test_pubtator_entities_sentences_and_ids(tmp_path: Path) -> None:
    got = read_documents(write(tmp_path, "x.txt", PUBTATOR))
    doc = got.documents[0]
    assert [e.id for e in doc.entities] == ["D008094", "D007674", "D016651", "D006470", "D003556", "D051437"]
    assert [" ".join(s) for s in doc.sentences] == [
        "Lithium - induced nephropathy in rats .",
        "Lithium carbonate caused hemorrhagic cystitis and renal failure .",
        "Dr . Smith saw no tremor in 3 rats ."]  # the title alone; no cut after "Dr."
    cystitis = doc.entities[3].mentions[0]
    assert doc.entities[4].mentions == (cystitis,) and (cystitis.sent_id, cystitis.start, cystitis.end) == (1, 3, 5)
    assert [m.text for m in doc.unlinked] == ["tremor"]  # id -1: no entity
    assert [(doc.entities[f.head].id, doc.entities[f.tail].id, f.relation) for f in doc.facts] == [
        ("D008094", "D007674", "CID"), ("D016651", "D003556", "CID")]
    assert doc.line == 1 and got.documents[1].line == 12 and got.documents[1].index == 1
    mention_is_consistent(doc)


def test_bad_pubtator_documents_are_named_and_skipped(tmp_path: Path) -> None:
    broken = (PUBTATOR.replace("100\t16\t27\tnephropathy", "100\t16\t28\tnephropathy")  # offsets do not match
              .replace("100\t87\t100\trenal", "100\t87\t900\trenal")  # outside the text
              .replace("200\tCID\tD001241\tD010146", "200\tCID\tD001241\tD999999"))  # no such entity
    path = write(tmp_path, "broken.txt", broken)
    with pytest.raises(DataError) as err:
        read_documents(path)
    text = str(err.value)
    assert f"{path}:4: document 0 (id '100'): mention 'nephropathy' at 16-28 does not match the text there" in text
    assert f"{path}:7: document 0 (id '100'): mention 'renal failure' at 87-900 is outside the text" in text
    assert f"{path}:16: document 1 (id '200'): relation CID D001241 -> D999999: 'D999999' is no entity" in text
    assert "--on-bad-rows skip" in text
    # the first document (bad offsets) is left out
    path = write(tmp_path, "one_bad.txt", PUBTATOR.replace("100\t16\t27\tnephropathy", "100\t16\t28\tnephropathy"))
    got = read_documents(path, on_bad="skip")
    assert [d.id for d in got.documents] == ["200"] and got.skipped == 1 and len(got.problems) == 1


def test_pubtator_lines_that_are_not_pubtator(tmp_path: Path) -> None:
    path = write(tmp_path, "x.txt", PUBTATOR.replace("100\tCID\tD008094\tD007674", "100\tCID\tD008094")
                 .replace("200|a|", "201|a|"))
    got = read_documents(path, on_bad="skip")
    messages = [p.message for p in got.problems]
    assert got.documents == [] and got.skipped == 2
    assert "not a PubTator line" in messages[0] and "found 3 field(s)" in messages[0]
    assert "line of document '201' inside document '200'" in messages[1]


# --------------------------------------------------------------------------------------------------------------------
# DocRED, built here


def docred(**changes: object) -> list[dict[str, object]]:
    good = {"title": "T", "sents": [["Ann", "works", "at", "Acme", "."], ["She", "lives", "in", "Oslo", "."]],
            "vertexSet": [[{"name": "Ann", "sent_id": 0, "pos": [0, 1], "type": "PER"},
                           {"name": "She", "sent_id": 1, "pos": [0, 1], "type": "PER"}],
                          [{"name": "Acme", "sent_id": 0, "pos": [3, 4], "type": "ORG"}],
                          [{"name": "Oslo", "sent_id": 1, "pos": [3, 4], "type": "LOC"}]],
            "labels": [{"h": 0, "t": 1, "r": "P108", "evidence": [0]},
                       {"h": 0, "t": 2, "r": "P551", "evidence": [0, 1]}]}
    return [good, {**good, "title": "Bad", **changes}]


def test_docred_problems_name_document_and_field(tmp_path: Path) -> None:
    mentions = docred()[0]["vertexSet"]
    outside = [mentions[0], [{"name": "Acme", "sent_id": 0, "pos": [3, 9], "type": "ORG"}], mentions[2]]
    path = write(tmp_path, "d.json", json.dumps(docred(vertexSet=outside)))
    with pytest.raises(DataError, match=r"d\.json: document 1 \('Bad'\): vertexSet\[1\]\[0\]: pos \[3, 9\] is outside "
                                        r"sentence 0 \(5 tokens\)"):
        read_documents(path)
    path = write(tmp_path, "e.json", json.dumps(docred(labels=[{"h": 0, "t": 7, "r": "P1", "evidence": []}])))
    got = read_documents(path, on_bad="skip")
    assert [d.title for d in got.documents] == ["T"] and got.skipped == 1
    assert str(got.problems[0]) == (f"{path}: document 1 ('Bad'): labels[0]: t 7 is not an entity of the document "
                                    "(it has 3: 0 to 2)")


def test_unknown_relation_in_test(tmp_path: Path) -> None:
    path = write(tmp_path, "test.json", json.dumps(docred(labels=[{"h": 0, "t": 1, "r": "P999", "evidence": []}])))
    got = read_documents(path)
    with pytest.raises(DataError, match=r"document 1 \(id 'Bad'\): relation 'P999' is not one of the training data's"):
        check_relations(got, {"P108", "P551"})
    kept = check_relations(got, {"P108", "P551"}, on_bad="skip")
    assert [d.title for d in kept.documents] == ["T"] and kept.skipped == 1
    assert check_relations(got, {"P108", "P551", "P999"}) is got


def test_docred_without_labels_and_one_object(tmp_path: Path) -> None:
    doc = {k: v for k, v in docred()[0].items() if k != "labels"}
    got = read_documents(write(tmp_path, "one.json", json.dumps(doc)))
    assert len(got.documents) == 1 and got.documents[0].facts == ()
    assert len(got.documents[0].entities[0].mentions) == 2


# --------------------------------------------------------------------------------------------------------------------
# detection, names, files that cannot be read


def test_detection_and_split_names(tmp_path: Path) -> None:
    assert format_of_head(b'[{"title": "x", "vertexSet": []}]') == "docred"
    assert format_of_head(b"\xef\xbb\xbf123|t|A title\n") == "pubtator"
    assert format_of_head(b'{"token": ["a"], "h": {}}') is None  # OpenNRE: sentence-level
    assert format_of_head(b"sentence,head,head_offset\n") is None
    assert [split_of_name(n) for n in ("s3://b/CDR_TrainingSet.PubTator.txt", "CDR_DevelopmentSet.BioC.xml",
                                       "/x/CDR_TestSet.PubTator.txt", "train.json")] == ["train", "valid", "test",
                                                                                          None]
    with pytest.raises(DataError, match="file not found"):
        read_documents(tmp_path / "missing.json")
    with pytest.raises(DataError, match="not a document format we know"):
        read_documents(write(tmp_path, "rows.csv", "sentence,head\n"))
    with pytest.raises(DataError, match=r"bad\.json:1: not valid JSON"):
        read_documents(write(tmp_path, "bad.json", '[{"sents": '))


def test_documents_from_a_uri(object_store: str, tmp_path: Path) -> None:
    local = write_sample(tmp_path / "sample", sizes={"train": 3, "valid": 1, "test": 1})
    uri = storage.join(object_store, "documents", "sample")
    remote = write_sample(uri, sizes={"train": 3, "valid": 1, "test": 1})
    assert detect_document_format(remote["train"]) == "docred"
    got = read_documents(remote["train"]).documents
    assert got[0].source == remote["train"]
    assert [dataclasses.replace(d, source="") for d in got] == [
        dataclasses.replace(d, source="") for d in read_documents(local["train"]).documents]
    storage.write_bytes(storage.join(uri, "CDR_TestSet.PubTator.txt"), PUBTATOR.encode())
    pubtator = read_documents(storage.join(uri, "CDR_TestSet.PubTator.txt"))
    assert pubtator.path.endswith("CDR_TestSet.PubTator.txt") and len(pubtator.documents) == 2
    with pytest.raises(DataError, match="file not found"):
        read_documents(storage.join(uri, "nothing.json"))


# --------------------------------------------------------------------------------------------------------------------
# sentences and tokens


def test_sentence_splitter_rules() -> None:
    text = "A title. Really. Fig. 2 shows e.g. this. J. Smith agreed! next is lower. (Done.) 3 rats died."
    spans = split_sentences(text, title_end=16)
    assert [text[a:b] for a, b in spans] == ["A title. Really.", "Fig. 2 shows e.g. this.",
                                             "J. Smith agreed! next is lower.", "(Done.)", "3 rats died."]
    # never inside a mention
    text = "He took Vit. C daily. Then left."
    assert [text[a:b] for a, b in split_sentences(text)] == ["He took Vit.", "C daily.", "Then left."]
    assert [text[a:b] for a, b in split_sentences(text, 0, [(8, 14)])] == ["He took Vit. C daily.", "Then left."]
    assert split_sentences("   ") == []


def test_tokenize_cuts_at_mention_boundaries() -> None:
    text = "NaCl-induced hypertension"
    assert [text[a:b] for a, b in tokenize(text, (0, len(text)))] == ["NaCl", "-", "induced", "hypertension"]
    assert [text[a:b] for a, b in tokenize(text, (0, len(text)), cuts=[2])] == ["Na", "Cl", "-", "induced",
                                                                               "hypertension"]

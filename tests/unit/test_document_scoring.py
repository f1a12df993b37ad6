"""Document-level metrics (nre_ray.tasks.document.scoring) against hand-computed cases: micro P/R/F1 with
multi-label pairs, DocRED's Ign F1, intra/inter-sentence pairs, per relation, exact on any split of the documents."""

from __future__ import annotations

import itertools
from fractions import Fraction
from pathlib import Path

import pytest

from nre_ray.tasks.document.readers import read_documents
from nre_ray.tasks.document.records import Document, Entity, Fact, Mention
from nre_ray.tasks.document.scoring import (
    Counts,
    Scores,
    gold_triples,
    score_document,
    score_documents,
    train_triples,
)


def entity(id_: str, *mentions: tuple[str, int]) -> Entity:
    return Entity(id_, "T", tuple(Mention(s, 0, 1, name, "T") for name, s in mentions))


def document(id_: str = "A") -> Document:
    """Ann (sentence 0, also "She" in 1), Acme (sentence 0), Oslo (sentence 2); works + founded on (Ann, Acme):
    a multi-label pair, intra-sentence; lives on (Ann, Oslo), and Acme-Oslo, inter-sentence."""
    return Document(id_, id_, (("x",), ("x",), ("x",)),
                    (entity("0", ("Ann", 0), ("She", 1)), entity("1", ("Acme", 0)), entity("2", ("Oslo", 2))),
                    (Fact(0, 1, "works"), Fact(0, 1, "founded"), Fact(0, 2, "lives")))


PREDICTED = [("0", "1", "works"), ("0", "2", "works"), ("0", "2", "lives"), ("0", "2", "lives")]  # one twice


def test_micro_scores_with_multi_label_pairs() -> None:
    s = score_document(document(), PREDICTED)
    assert s.all == Counts(tp=2, predicted=3, gold=3)
    assert s.all.precision == pytest.approx(2 / 3) and s.all.recall == pytest.approx(2 / 3)
    assert s.all.f1 == pytest.approx(2 / 3)
    assert dict(s.relations) == {"founded": Counts(0, 0, 1), "lives": Counts(1, 1, 1), "works": Counts(1, 2, 1)}
    assert [row["relation"] for row in s.relation_report()] == ["founded", "lives", "works"]
    assert s.relation_report()[2]["precision"] == 0.5


def test_intra_and_inter_sentence_pairs() -> None:
    s = score_document(document(), PREDICTED)
    assert s.intra == Counts(tp=1, predicted=1, gold=2)  # (Ann, Acme): both in sentence 0
    assert s.inter == Counts(tp=1, predicted=2, gold=1)  # (Ann, Oslo): sentences {0, 1} and {2}
    summary = s.summary()
    assert summary["intra_recall"] == 0.5 and summary["inter_precision"] == 0.5


def test_ign_f1_as_docred_computes_it() -> None:
    # training: "She" works for "Acme" (any name of the head x any name of the tail counts)
    train = Document("train", "train", (("x",),), (entity("0", ("Bob", 0), ("She", 0)), entity("1", ("Acme", 0))),
                     (Fact(0, 1, "works"),))
    triples = train_triples([train])
    assert triples == {("Bob", "Acme", "works"), ("She", "Acme", "works")}
    s = score_document(document(), PREDICTED, triples)
    assert s.in_train == 1  # the correct (Ann/She, Acme, works); the wrong (Ann, Oslo, works) never counts
    # Ign precision (2 - 1) / (3 - 1); recall stays 2/3 (the official script's)
    assert s.ign_precision == 0.5
    assert s.ign_f1 == pytest.approx(float(Fraction(4, 7)))
    assert score_document(document(), PREDICTED).ign_f1 == pytest.approx(2 / 3)  # nothing seen in training
    # a relation must match too
    other = train_triples([Document("t", "t", (("x",),), train.entities, (Fact(0, 1, "founded"),))])
    assert score_document(document(), PREDICTED, other).in_train == 0


def test_scores_add_up_exactly_in_any_split_and_order() -> None:
    docs = [document("A"), document("B"), Document("C", "C", (("x",),), (entity("0", ("X", 0)), entity("1", ("Y", 0))),
                                                  (Fact(1, 0, "works"),))]
    predictions = {"A": PREDICTED, "B": [("0", "1", "founded")], "C": [("0", "1", "works"), ("1", "0", "works")]}
    train = train_triples([docs[0]])
    whole = score_documents(docs, predictions, train)
    assert whole.documents == 3 and whole.all == Counts(tp=2 + 1 + 1, predicted=3 + 1 + 2, gold=3 + 3 + 1)
    for order in itertools.permutations(range(3)):
        for bounds in ([0, 3], [0, 1, 3], [0, 2, 3], [0, 1, 2, 3]):  # 1, 2 or 3 "workers"
            shards = [[docs[order[i]] for i in range(a, b)] for a, b in itertools.pairwise(bounds)]
            total = Scores()
            for shard in reversed(shards):
                total = total + score_documents(shard, {d.id: predictions[d.id] for d in shard}, train)
            assert total == whole and total.summary() == whole.summary()


def test_bad_predictions_and_empty_scores() -> None:
    with pytest.raises(ValueError, match="names entity '9'"):
        score_document(document(), [("0", "9", "works")])
    with pytest.raises(ValueError, match="not in the gold data"):
        score_documents([document()], {"Z": []})
    assert Scores().summary() == dict.fromkeys(Scores().summary(), 0.0)
    assert score_document(document(), []).all == Counts(0, 0, 3)


def test_cdr_gold_against_itself(shared_datasets: Path) -> None:
    docs = read_documents(shared_datasets / "cdr" / "CDR_TestSet.PubTator.txt").documents
    s = score_documents(docs, {d.id: gold_triples(d) for d in docs})
    assert s.all == Counts(1066, 1066, 1066) and s.all.f1 == 1.0
    assert s.intra.gold + s.inter.gold == 1066 and 0 < s.inter.gold < s.intra.gold

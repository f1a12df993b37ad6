"""Document-level scores as the field computes them, exact and order-independent.

A fact is ``(document, head entity, tail entity, relation)``, entities named by their :attr:`~.records.Entity.id`
(the MeSH id on CDR, so CDR is scored at the entity level, as the CDR task does). Predictions and gold facts are
sets (a fact predicted twice counts once). :func:`score_document` counts one document; :class:`Scores` add up
(integer counts only), so the scores of documents scored on 1, 2 or 3 workers and added in any order are identical.

* **micro P/R/F1** over all facts (:attr:`Scores.all`), and per relation (:attr:`Scores.relations`);
* **Ign F1** (DocRED, Yao et al. 2019, as its official ``evaluation.py`` computes it): a *correct* predicted fact
  is "in train" when some mention name of its head, some mention name of its tail and its relation form a triple
  of the training facts (:func:`train_triples`: every mention name of the head x every mention name of the tail of
  every training fact). Ign precision = (correct - correct in train) / (predicted - correct in train); the recall is
  the plain recall (correct / gold); Ign F1 is their harmonic mean. (The official script adds 1e-5 to the
  denominator; we return 0 where a denominator is 0 instead, so scores are exact.)
* **intra / inter-sentence** (CDR): a pair is intra-sentence when some mention of the head and some mention of the
  tail are in one sentence, else inter; each part's P/R/F1 counts the predicted and gold facts of such pairs
  (:attr:`Scores.intra`, :attr:`Scores.inter`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from nre_ray.tasks.document.records import Document

Triple = tuple[str, str, str]
"""``(head entity id, tail entity id, relation)``: a fact within one document."""
TrainTriples = frozenset[tuple[str, str, str]]
"""``(head mention name, tail mention name, relation)`` of the training facts (for Ign F1)."""


@dataclass(frozen=True)
class Counts:
    """Correct, predicted and gold facts; P/R/F1 from them (0.0 where a denominator is 0)."""

    tp: int = 0
    predicted: int = 0
    gold: int = 0

    def __add__(self, other: Counts) -> Counts:
        return Counts(self.tp + other.tp, self.predicted + other.predicted, self.gold + other.gold)

    @property
    def precision(self) -> float:
        return self.tp / self.predicted if self.predicted else 0.0

    @property
    def recall(self) -> float:
        return self.tp / self.gold if self.gold else 0.0

    @property
    def f1(self) -> float:
        return _f1(self.precision, self.recall)


def _f1(p: float, r: float) -> float:
    return 2 * p * r / (p + r) if p + r else 0.0


@dataclass(frozen=True)
class Scores:
    """The counts of a set of documents; ``a + b`` adds two sets (of different documents).

    Attributes:
        all: every fact.
        in_train: correct predicted facts whose (head name, tail name, relation) is in the training facts.
        intra, inter: the facts of intra- and inter-sentence pairs.
        relations: per relation.
        documents: how many documents were scored.
    """

    all: Counts = Counts()
    in_train: int = 0
    intra: Counts = Counts()
    inter: Counts = Counts()
    relations: Mapping[str, Counts] = field(default_factory=dict)
    documents: int = 0

    def __add__(self, other: Scores) -> Scores:
        relations = dict(self.relations)
        for r, c in other.relations.items():
            relations[r] = relations.get(r, Counts()) + c
        return Scores(self.all + other.all, self.in_train + other.in_train, self.intra + other.intra,
                      self.inter + other.inter, dict(sorted(relations.items())), self.documents + other.documents)

    @property
    def ign_precision(self) -> float:
        """Precision with the correct facts seen in training left out (DocRED's Ign)."""
        denominator = self.all.predicted - self.in_train
        return (self.all.tp - self.in_train) / denominator if denominator else 0.0

    @property
    def ign_f1(self) -> float:
        """DocRED's Ign F1: the harmonic mean of :attr:`ign_precision` and the plain recall."""
        return _f1(self.ign_precision, self.all.recall)

    def summary(self) -> dict[str, float]:
        """The headline numbers: precision, recall, f1, ign_f1, intra_f1, inter_f1 (and their P/R)."""
        out = {"precision": self.all.precision, "recall": self.all.recall, "f1": self.all.f1,
               "ign_precision": self.ign_precision, "ign_f1": self.ign_f1}
        for name, counts in (("intra", self.intra), ("inter", self.inter)):
            out.update({f"{name}_precision": counts.precision, f"{name}_recall": counts.recall,
                        f"{name}_f1": counts.f1})
        return out

    def relation_report(self) -> list[dict[str, float | int | str]]:
        """One row per relation (sorted by name): relation, tp, predicted, gold, precision, recall, f1."""
        return [{"relation": r, "tp": c.tp, "predicted": c.predicted, "gold": c.gold, "precision": c.precision,
                 "recall": c.recall, "f1": c.f1} for r, c in sorted(self.relations.items())]


def train_triples(documents: Iterable[Document]) -> TrainTriples:
    """The ``(head mention name, tail mention name, relation)`` triples of the facts of ``documents`` (the training
    data): every name of the head's mentions with every name of the tail's, as DocRED's ``gen_train_facts``."""
    return frozenset((n1, n2, f.relation) for doc in documents for f in doc.facts
                     for n1 in doc.entities[f.head].names for n2 in doc.entities[f.tail].names)


def gold_triples(doc: Document) -> set[Triple]:
    """The document's facts as ``(head id, tail id, relation)``."""
    return {(doc.entities[f.head].id, doc.entities[f.tail].id, f.relation) for f in doc.facts}


def intra_pairs(doc: Document) -> set[tuple[str, str]]:
    """The ``(head id, tail id)`` pairs (both orders) with a mention of each in one sentence."""
    out = set()
    for a in doc.entities:
        for b in doc.entities:
            if a.id != b.id and a.sentences & b.sentences:
                out.add((a.id, b.id))
    return out


def score_document(doc: Document, predicted: Iterable[Triple], train: TrainTriples = frozenset()) -> Scores:
    """The counts of one gold document against its predicted ``(head id, tail id, relation)`` facts. ``train``:
    the training triples for Ign F1 (empty: nothing counts as seen in training). ValueError for a prediction on an
    entity id the document does not have."""
    entities = {e.id: e for e in doc.entities}
    predicted = set(predicted)
    for h, t, _ in predicted:
        if h not in entities or t not in entities:
            raise ValueError(f"{doc.where()}: a prediction names entity {h if h not in entities else t!r}, "
                             "which the document does not have")
    gold = gold_triples(doc)
    correct = predicted & gold
    in_train = sum(1 for h, t, r in correct
                   if any((n1, n2, r) in train for n1 in entities[h].names for n2 in entities[t].names))
    intra = intra_pairs(doc)

    def counts(keep: object) -> Counts:
        return Counts(sum(1 for x in correct if keep(x)), sum(1 for x in predicted if keep(x)),
                      sum(1 for x in gold if keep(x)))

    relations = {r: counts(lambda x, r=r: x[2] == r) for r in sorted({x[2] for x in predicted | gold})}
    return Scores(all=Counts(len(correct), len(predicted), len(gold)), in_train=in_train,
                  intra=counts(lambda x: (x[0], x[1]) in intra), inter=counts(lambda x: (x[0], x[1]) not in intra),
                  relations=relations, documents=1)


def score_documents(docs: Iterable[Document], predictions: Mapping[str, Iterable[Triple]],
                    train: TrainTriples = frozenset()) -> Scores:
    """The counts of ``docs`` against ``predictions`` (``{document id: facts}``; a document without an entry has
    no predicted fact). ValueError for predictions on a document id that is not among ``docs``."""
    docs = list(docs)
    unknown = set(predictions) - {d.id for d in docs}
    if unknown:
        raise ValueError(f"predictions for documents that are not in the gold data: {sorted(unknown)[:5]}")
    total = Scores()
    for doc in docs:
        total = total + score_document(doc, predictions.get(doc.id, ()), train)
    return total

"""Bag-level held-out metrics, as OpenNRE reports them for NYT10 (``BagREDataset.eval``).

Inputs are per bag: a key (``bag`` of :mod:`.bags`), a score per relation (B, C) and the gold label set (B, C) bool.
The *facts* are the gold (bag, relation) pairs with relation != NA; every (bag, relation != NA) pair is a prediction,
scored. Sorted by score, descending, the predictions give the precision-recall curve: after the i-th prediction,
precision = correct / i and recall = correct / facts. AUC is the area under that curve by the trapezoid rule over
recall (``sklearn.metrics.auc(x=recall, y=precision)``, as OpenNRE); P@N is the precision after the first N
predictions (of all predictions when there are fewer than N).

Exact and order-independent: ties in score are broken by bag key, then relation index, so the curve and every number
are the same whatever order the bags arrive in (gathered from 1, 2 or 3 workers). Nothing here sums floats in an
order that depends on the input.

F1 at a threshold (:func:`threshold_scores`): a (bag, relation != NA) is predicted when its score >= threshold; micro
F1 counts over all relations, macro F1 averages the relations that occur in the gold or the predictions (as
:mod:`nre_ray.tasks.sentence.metrics` does). :func:`choose_threshold` picks the threshold of best micro F1 on
validation.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from sklearn.metrics import auc as _sk_auc

P_AT = (100, 200, 300)


@dataclass(frozen=True)
class Ranking:
    """The (bag, relation != NA) predictions in curve order.

    Attributes:
        scores: (P,) float64 descending (ties by bag key, then relation).
        correct: (P,) bool, whether each is a fact.
        relation: (P,) int64 relation index.
        facts: the number of gold (bag, relation != NA) pairs.
    """

    scores: np.ndarray
    correct: np.ndarray
    relation: np.ndarray
    facts: int


def rank(keys: Sequence[str], scores: np.ndarray, gold: np.ndarray, na_index: int | None) -> Ranking:
    """Every (bag, relation != NA) of B bags in curve order. ``keys`` (B,) unique, ``scores`` (B, C), ``gold``
    (B, C) bool; ``na_index`` the NA column (None: no NA)."""
    keys = np.asarray(keys, dtype=object)
    scores = np.asarray(scores, dtype=np.float64)
    gold = np.asarray(gold, dtype=bool)
    if scores.shape != gold.shape or scores.ndim != 2 or len(keys) != scores.shape[0]:
        raise ValueError(f"keys {len(keys)}, scores {scores.shape} and gold {gold.shape} do not match")
    if len(set(keys.tolist())) != len(keys):
        raise ValueError("bag keys must be unique (a bag scored twice?)")
    relations = [c for c in range(scores.shape[1]) if c != na_index]
    key_rank = np.empty(len(keys), dtype=np.int64)
    key_rank[np.argsort(keys.astype(str), kind="stable")] = np.arange(len(keys))  # (B,) position of each key
    bag = np.repeat(np.arange(len(keys)), len(relations))  # (P,)
    relation = np.tile(np.asarray(relations, dtype=np.int64), len(keys))  # (P,)
    flat_scores = scores[bag, relation]
    order = np.lexsort((relation, key_rank[bag], -flat_scores))
    return Ranking(flat_scores[order], gold[bag, relation][order], relation[order], int(gold[:, relations].sum()))


def pr_curve(ranking: Ranking) -> tuple[np.ndarray, np.ndarray]:
    """``(precision, recall)``, both (P,): after each prediction of the ranking (OpenNRE's ``prec`` and ``rec``)."""
    correct = np.cumsum(ranking.correct)  # (P,)
    precision = correct / np.arange(1, len(correct) + 1)
    recall = correct / ranking.facts if ranking.facts else np.zeros(len(correct))
    return precision, recall


def pr_auc(precision: np.ndarray, recall: np.ndarray) -> float:
    """The area under the curve by the trapezoid rule over recall (``sklearn.metrics.auc``); 0.0 under 2 points."""
    if len(recall) < 2:
        return 0.0
    return float(_sk_auc(recall, precision))


def held_out(keys: Sequence[str], scores: np.ndarray, gold: np.ndarray, na_index: int | None) -> dict[str, float]:
    """The held-out numbers: ``auc``, ``p_at_100``, ``p_at_200``, ``p_at_300``, ``max_f1`` (the best F1 on the
    curve, OpenNRE's ``f1``), ``mean_precision`` (OpenNRE's ``mean_prec``), ``facts``, ``predictions``."""
    ranking = rank(keys, scores, gold, na_index)
    precision, recall = pr_curve(ranking)
    out = {"auc": pr_auc(precision, recall)}
    for n in P_AT:
        top = min(n, len(precision))
        out[f"p_at_{n}"] = float(precision[top - 1]) if top else 0.0
    f1 = 2 * precision * recall / np.maximum(precision + recall, 1e-300)
    out["max_f1"] = float(f1.max()) if len(f1) else 0.0
    out["mean_precision"] = float(precision.mean()) if len(precision) else 0.0
    out["facts"] = float(ranking.facts)
    out["predictions"] = float(len(precision))
    return out


def threshold_scores(keys: Sequence[str], scores: np.ndarray, gold: np.ndarray, na_index: int | None,
                     threshold: float) -> dict[str, float]:
    """Micro and macro precision / recall / F1 of the (bag, relation != NA) with score >= ``threshold``:
    ``micro_precision``, ``micro_recall``, ``micro_f1``, ``macro_f1`` (over the relations with a gold or a predicted
    pair; zero division gives 0)."""
    del keys  # order-independent by construction: sums of counts
    scores = np.asarray(scores, dtype=np.float64)
    gold = np.asarray(gold, dtype=bool)
    relations = [c for c in range(scores.shape[1]) if c != na_index]
    pred = scores[:, relations] >= threshold  # (B, R)
    truth = gold[:, relations]  # (B, R)
    tp = (pred & truth).sum(0)  # (R,)
    fp = (pred & ~truth).sum(0)
    fn = (~pred & truth).sum(0)
    micro_p, micro_r, micro_f1 = _prf(int(tp.sum()), int(fp.sum()), int(fn.sum()))
    active = (tp + fp + fn) > 0
    per_class = [_prf(int(t), int(f), int(n))[2] for t, f, n, a in zip(tp, fp, fn, active, strict=True) if a]
    macro = float(np.mean(per_class)) if per_class else 0.0
    return {"micro_precision": micro_p, "micro_recall": micro_r, "micro_f1": micro_f1, "macro_f1": macro}


def _prf(tp: int, fp: int, fn: int) -> tuple[float, float, float]:
    precision = tp / (tp + fp) if tp + fp else 0.0
    recall = tp / (tp + fn) if tp + fn else 0.0
    f1 = 2 * tp / (2 * tp + fp + fn) if tp else 0.0
    return precision, recall, f1


def choose_threshold(keys: Sequence[str], scores: np.ndarray, gold: np.ndarray, na_index: int | None) -> float:
    """The score threshold of the best micro F1 on (validation) bags: one of the predictions' scores (the highest of
    those that tie on F1); 1.0 when there is no prediction or no fact is ever found (predict nothing)."""
    ranking = rank(keys, scores, gold, na_index)
    if not len(ranking.scores) or not ranking.correct.any():
        return 1.0
    values = ranking.scores
    last_of_value = np.r_[values[1:] != values[:-1], True]  # (P,) cut points: every pair with score >= v taken
    tp = np.cumsum(ranking.correct)[last_of_value]
    taken = (np.arange(1, len(values) + 1))[last_of_value]
    f1 = 2 * tp / (taken + ranking.facts)
    return float(values[last_of_value][int(np.argmax(f1))])  # argmax: the first best, the highest threshold

"""The document task's metric counts: one int64 tensor per split, added up over batches and ranks, and its scores.

The counts are (K, C): a row per kind of count (:data:`ROWS`), a column per label (column 0, the threshold class TH,
stays 0). A fact is a (document, candidate pair, relation) and is counted at most once, so the counts of disjoint
shards add up exactly to the counts of their union, and the scores (:func:`scores`) are the same on any number of
workers. They equal :mod:`.scoring`'s on the same documents (entities are unique per document: DocRED's positions,
CDR's MeSH ids), which ``tests/unit/test_document_task.py`` checks:

* micro precision / recall / F1 over all facts; gold facts on no candidate pair count as missed (``uncovered``);
* DocRED's Ign F1 (correct facts seen in training left out of the precision);
* intra- and inter-sentence F1 (CDR);
* macro F1: the mean of the relations' F1.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from nre_ray.tasks.document.atlop import pair_mask, predict_labels

ROWS = ("tp", "predicted", "gold", "tp_in_train", "intra_tp", "intra_predicted", "intra_gold")
"""The rows of the counts, in order."""
TP, PREDICTED, GOLD, TP_IN_TRAIN, INTRA_TP, INTRA_PREDICTED, INTRA_GOLD = range(len(ROWS))
METRICS = ("micro_f1", "micro_precision", "micro_recall", "ign_f1", "ign_precision", "intra_f1", "inter_f1",
           "macro_f1")
"""The scores of :func:`scores`, what ``--select-metric`` chooses among for documents."""


def new_counts(num_classes: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """(K, C) int64 zeros."""
    return torch.zeros((len(ROWS), num_classes), dtype=torch.long, device=device)


def count(counts: torch.Tensor, logits: torch.Tensor, batch: Mapping[str, torch.Tensor]) -> None:
    """Add a batch to ``counts`` (K, C) in place: ``logits`` (B, P, C) predicted as :func:`.atlop.predict_labels`
    does (the labels above TH); ``batch``: ``pairs`` (B, P, 2), ``labels`` (B, P, C), ``in_train`` (B, P, C),
    ``intra`` (B, P), ``uncovered`` (B, 2, C)."""
    keep = pair_mask(batch["pairs"])  # (B, P)
    predicted = predict_labels(logits[keep].float())  # (N, C)
    gold = batch["labels"][keep] > 0.5  # (N, C)
    predicted[:, 0] = False
    gold[:, 0] = False
    intra = batch["intra"][keep].unsqueeze(-1)  # (N, 1)
    tp = predicted & gold  # (N, C)
    uncovered = batch["uncovered"].sum(dim=0)  # (2, C)
    for row, value in ((TP, tp), (PREDICTED, predicted), (GOLD, gold), (TP_IN_TRAIN, tp & batch["in_train"][keep]),
                       (INTRA_TP, tp & intra), (INTRA_PREDICTED, predicted & intra), (INTRA_GOLD, gold & intra)):
        counts[row] += value.sum(dim=0)
    counts[GOLD] += uncovered[0]
    counts[INTRA_GOLD] += uncovered[1]


def _ratio(a: float, b: float) -> float:
    return float(a) / float(b) if b else 0.0


def _f1(p: float, r: float) -> float:
    return 2 * p * r / (p + r) if p + r else 0.0


def as_array(counts: Any) -> np.ndarray:
    """``counts`` (a tensor or an array) as an int64 numpy array (K, C)."""
    if isinstance(counts, torch.Tensor):
        counts = counts.cpu().numpy()
    return np.asarray(counts, dtype=np.int64)


def scores(counts: Any) -> dict[str, float]:
    """The scores (:data:`METRICS`) of the summed ``counts`` (K, C); 0.0 where a denominator is 0."""
    c = as_array(counts)[:, 1:]  # the relations' columns
    tp, predicted, gold, in_train, itp, ipred, igold = (int(x) for x in c.sum(axis=1))
    precision, recall = _ratio(tp, predicted), _ratio(tp, gold)
    ign_precision = _ratio(tp - in_train, predicted - in_train)
    intra_f1 = _f1(_ratio(itp, ipred), _ratio(itp, igold))
    inter_f1 = _f1(_ratio(tp - itp, predicted - ipred), _ratio(tp - itp, gold - igold))
    per_relation = [row["f1"] for row in per_label(counts, ["TH", *map(str, range(c.shape[1]))])]
    return {"micro_f1": _f1(precision, recall), "micro_precision": precision, "micro_recall": recall,
            "ign_f1": _f1(ign_precision, recall), "ign_precision": ign_precision, "intra_f1": intra_f1,
            "inter_f1": inter_f1, "macro_f1": float(np.mean(per_relation)) if per_relation else 0.0}


def per_label(counts: Any, labels: list[str]) -> list[dict[str, Any]]:
    """One row per relation (``labels[1:]``; ``labels[0]`` is TH): relation, precision, recall, f1, tp, predicted,
    gold."""
    c = as_array(counts)
    rows = []
    for k, label in enumerate(labels[1:], start=1):
        tp, predicted, gold = int(c[TP, k]), int(c[PREDICTED, k]), int(c[GOLD, k])
        p, r = _ratio(tp, predicted), _ratio(tp, gold)
        rows.append({"label": label, "precision": p, "recall": r, "f1": _f1(p, r), "tp": tp, "predicted": predicted,
                     "gold": gold})
    return rows

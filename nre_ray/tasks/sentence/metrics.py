"""Classification metrics computed from a confusion matrix.

Distributed evaluation works by having every worker build a ``(C, C)`` int64
confusion matrix over its shard (rows = gold class id, columns = predicted
class id); the ranks all-reduce (sum) those matrices, and every score here is a
pure function of the summed matrix and the label list. Nothing in this module
needs the raw predictions.

Conventions
-----------
* ``zero_division=0`` everywhere: a precision/recall/F1 whose denominator is
  zero is ``0.0``. No function returns NaN.
* Macro averages run over the *active* classes: those with at least one gold
  example or at least one prediction (a nonzero row or column). This is what
  scikit-learn does with ``labels=None``; a class that never occurs in the
  evaluated data and is never predicted has no defined score and does not
  drag the average down. Which classes are active is itself a function of the
  summed matrix, so the result is the same on every rank.
* For single-label classification, micro precision = micro recall = micro F1
  = accuracy when computed over *all* classes (every wrong prediction is one
  false positive and one false negative). Those keys are still reported for
  completeness; the informative micro scores are the ``pos_micro_*`` ones.
* ``pos_*`` keys follow the TACRED / OpenNRE convention: the negative class
  (``no_relation``, ``Other``, ``NA`` ...) is excluded from the averaged
  classes. Predicting the negative class is not a positive prediction, so a
  gold positive predicted as negative is only a false negative, while a gold
  negative predicted as a positive class is a false positive of that class.
"""

from __future__ import annotations

import re
from collections import OrderedDict

import numpy as np
import pandas as pd

__all__ = [
    "confusion_matrix",
    "per_class_table",
    "scores",
    "select_metric_default",
    "split_directed_label",
]

_DIRECTED_RE = re.compile(r"^(?P<type>.+?)\s*\((?P<dir>e1\s*,\s*e2|e2\s*,\s*e1)\)\s*$")


def confusion_matrix(gold: np.ndarray, pred: np.ndarray, num_classes: int) -> np.ndarray:
    """Count (gold, predicted) class-id pairs into a ``(C, C)`` int64 matrix.

    Args:
        gold: 1-D integer array of gold class ids in ``[0, num_classes)``.
        pred: 1-D integer array of predicted class ids, same length as ``gold``.
        num_classes: ``C``, the number of classes.

    Returns:
        ``cm`` with ``cm[g, p]`` = number of examples with gold ``g`` predicted
        as ``p``. Matrices of disjoint shards can be summed to get the matrix
        of their union.

    Raises:
        ValueError: on shape mismatch or ids out of range.
    """
    if num_classes <= 0:
        raise ValueError(f"num_classes must be positive, got {num_classes}")
    gold = np.asarray(gold).reshape(-1)
    pred = np.asarray(pred).reshape(-1)
    if gold.shape != pred.shape:
        raise ValueError(f"gold and pred differ in length: {gold.shape[0]} vs {pred.shape[0]}")
    if gold.size == 0:
        return np.zeros((num_classes, num_classes), dtype=np.int64)
    gold = gold.astype(np.int64, copy=False)
    pred = pred.astype(np.int64, copy=False)
    for name, arr in (("gold", gold), ("pred", pred)):
        lo, hi = int(arr.min()), int(arr.max())
        if lo < 0 or hi >= num_classes:
            raise ValueError(f"{name} ids must lie in [0, {num_classes}), got range [{lo}, {hi}]")
    flat = np.bincount(gold * num_classes + pred, minlength=num_classes * num_classes)
    return flat.reshape(num_classes, num_classes).astype(np.int64, copy=False)


def _check_cm(cm: np.ndarray, labels: list[str]) -> np.ndarray:
    cm = np.asarray(cm)
    if cm.ndim != 2 or cm.shape[0] != cm.shape[1]:
        raise ValueError(f"confusion matrix must be square 2-D, got shape {cm.shape}")
    if cm.shape[0] != len(labels):
        raise ValueError(f"confusion matrix is {cm.shape[0]}x{cm.shape[0]} but there are {len(labels)} labels")
    if cm.size and cm.min() < 0:
        raise ValueError("confusion matrix has negative counts")
    return cm.astype(np.int64, copy=False)


def _prfs(cm: np.ndarray, label_ids: list[int], average: str | None):
    """Run sklearn's precision_recall_fscore_support on a confusion matrix.

    The matrix is fed exactly as weighted samples: one sample per nonzero
    cell, ``y_true`` = row, ``y_pred`` = column, ``sample_weight`` = count.
    The caller guarantees ``cm.sum() > 0`` and ``label_ids`` non-empty.
    """
    from sklearn.metrics import precision_recall_fscore_support  # here: 70 MB that workers which never score skip

    rows, cols = np.nonzero(cm)
    return precision_recall_fscore_support(
        rows,
        cols,
        labels=label_ids,
        average=average,
        sample_weight=cm[rows, cols].astype(np.float64),
        zero_division=0,
    )


def _f(x: float) -> float:
    """Plain Python float with NaN mapped to 0.0 (defensive; should not occur)."""
    x = float(x)
    return 0.0 if np.isnan(x) else x


def _f1(p: float, r: float) -> float:
    return 0.0 if p + r <= 0 else 2.0 * p * r / (p + r)


def _active(cm: np.ndarray, candidates: list[int]) -> list[int]:
    support = cm.sum(axis=1)
    predicted = cm.sum(axis=0)
    return [i for i in candidates if support[i] > 0 or predicted[i] > 0]


def split_directed_label(label: str) -> tuple[str, str | None]:
    """Split a SemEval-style label into ``(relation_type, direction)``.

    ``"Cause-Effect(e1,e2)"`` -> ``("Cause-Effect", "e1,e2")``; a label without
    a direction suffix (e.g. ``"Other"``) -> ``(label, None)``.
    """
    m = _DIRECTED_RE.match(label)
    if m is None:
        return label, None
    return m.group("type"), re.sub(r"\s+", "", m.group("dir"))


def _semeval_macro_f1(cm: np.ndarray, labels: list[str], negative_id: int) -> float:
    """SemEval-2010 Task 8 official score: (9+1)-way, directionality taken into account.

    For each relation type T (direction ignored when grouping; the negative
    class is excluded):

    * correct(T)   = sum of diagonal cells of T's directed labels (right type
      AND right direction);
    * proposed(T)  = every prediction of T in either direction (column sums),
      so a wrong-direction prediction lowers precision;
    * gold(T)      = every gold example of T in either direction (row sums),
      so a wrong-direction prediction also lowers recall.

    P = correct/proposed, R = correct/gold, F1 = 2PR/(P+R); the score is the
    mean F1 over the active types (gold or predicted at least once).
    """
    groups: OrderedDict[str, list[int]] = OrderedDict()
    for i, lab in enumerate(labels):
        if i == negative_id:
            continue
        rel_type, _ = split_directed_label(lab)
        groups.setdefault(rel_type, []).append(i)
    support = cm.sum(axis=1)
    predicted = cm.sum(axis=0)
    f1s: list[float] = []
    for ids in groups.values():
        gold_n = int(support[ids].sum())
        pred_n = int(predicted[ids].sum())
        if gold_n == 0 and pred_n == 0:
            continue
        correct = int(cm[ids, ids].sum())  # diagonal cells only: right direction
        p = correct / pred_n if pred_n else 0.0
        r = correct / gold_n if gold_n else 0.0
        f1s.append(_f1(p, r))
    return float(np.mean(f1s)) if f1s else 0.0


def scores(cm: np.ndarray, labels: list[str], negative_label: str | None = None) -> dict[str, float]:
    """Scalar scores of a (possibly all-reduced) confusion matrix.

    Args:
        cm: ``(C, C)`` counts, rows = gold, columns = predicted.
        labels: the ``C`` label names, index = class id.
        negative_label: name of the "no relation" class (e.g. ``no_relation``,
            ``Other``). Ignored if ``None`` or not in ``labels``.

    Returns:
        A flat ``dict[str, float]`` (no NaN) with keys

        * ``accuracy``;
        * ``macro_precision``, ``macro_recall``, ``macro_f1`` over all active
          classes (see module docstring);
        * ``micro_precision``, ``micro_recall``, ``micro_f1`` over all classes
          (each equals ``accuracy`` for single-label classification);
        * if ``negative_label`` is in ``labels``: ``pos_micro_precision``,
          ``pos_micro_recall``, ``pos_micro_f1``, ``pos_macro_f1`` over the
          positive classes only (TACRED / OpenNRE convention);
        * if additionally some label has the form ``Rel(e1,e2)`` /
          ``Rel(e2,e1)``: ``semeval_macro_f1``, the SemEval-2010 Task 8
          official (9+1)-way score with directionality taken into account.
    """
    cm = _check_cm(cm, labels)
    num_classes = cm.shape[0]
    total = int(cm.sum())
    has_negative = negative_label is not None and negative_label in labels
    has_directed = any(split_directed_label(lab)[1] is not None for lab in labels)

    keys = [
        "accuracy",
        "macro_precision",
        "macro_recall",
        "macro_f1",
        "micro_precision",
        "micro_recall",
        "micro_f1",
    ]
    if has_negative:
        keys += [
            "pos_micro_precision",
            "pos_micro_recall",
            "pos_micro_f1",
            "pos_macro_f1",
        ]
        if has_directed:
            keys.append("semeval_macro_f1")
    out = {k: 0.0 for k in keys}
    if total == 0 or num_classes == 0:
        return out

    out["accuracy"] = float(np.trace(cm)) / total

    all_ids = list(range(num_classes))
    active = _active(cm, all_ids)  # non-empty because total > 0
    p, r, f, _ = _prfs(cm, active, "macro")
    out["macro_precision"], out["macro_recall"], out["macro_f1"] = _f(p), _f(r), _f(f)
    p, r, f, _ = _prfs(cm, all_ids, "micro")
    out["micro_precision"], out["micro_recall"], out["micro_f1"] = _f(p), _f(r), _f(f)

    if has_negative:
        neg_id = labels.index(negative_label)
        pos_ids = [i for i in all_ids if i != neg_id]
        if pos_ids:
            # Micro over the positive labels: tp = positive diagonal, predicted =
            # positive columns (incl. gold negatives -> FP), gold = positive rows
            # (incl. predictions of the negative class -> FN).
            p, r, f, _ = _prfs(cm, pos_ids, "micro")
            out["pos_micro_precision"], out["pos_micro_recall"], out["pos_micro_f1"] = (
                _f(p),
                _f(r),
                _f(f),
            )
            pos_active = _active(cm, pos_ids)
            if pos_active:
                out["pos_macro_f1"] = _f(_prfs(cm, pos_active, "macro")[2])
            if has_directed:
                out["semeval_macro_f1"] = _f(_semeval_macro_f1(cm, labels, neg_id))
    return out


def per_class_table(cm: np.ndarray, labels: list[str]) -> pd.DataFrame:
    """One row per class: ``label, precision, recall, f1, support, predicted``.

    ``support`` is the number of gold examples (row sum), ``predicted`` the
    number of predictions of that class (column sum). Undefined ratios are 0.
    """
    cm = _check_cm(cm, labels)
    n = cm.shape[0]
    support = cm.sum(axis=1).astype(np.int64)
    predicted = cm.sum(axis=0).astype(np.int64)
    if n and cm.sum() > 0:
        p, r, f, _ = _prfs(cm, list(range(n)), None)
        p, r, f = (np.nan_to_num(np.asarray(a, dtype=np.float64)) for a in (p, r, f))
    else:
        p = r = f = np.zeros(n, dtype=np.float64)
    return pd.DataFrame(
        {
            "label": list(labels),
            "precision": p,
            "recall": r,
            "f1": f,
            "support": support,
            "predicted": predicted,
        },
        columns=["label", "precision", "recall", "f1", "support", "predicted"],
    )


def select_metric_default(negative_label: str | None) -> str:
    """Default model-selection metric.

    ``"pos_macro_f1"`` when the dataset has a negative class, else ``"macro_f1"``.
    """
    return "pos_macro_f1" if negative_label else "macro_f1"

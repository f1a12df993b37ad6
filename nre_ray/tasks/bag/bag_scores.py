"""The bag task's metric counts (each bag's scores and gold labels at its index in the split) and their scores.

The counts of a split of N bags are (N, 2, C) float32: row 0 the bag's probabilities (what the aggregator's
``scores`` give), row 1 its gold label set (0/1), zeros for the bags a rank did not score. Every bag is scored by
exactly one rank, so the all-reduced sum holds every bag's values exactly (``x + 0`` is exact): the held-out curve
(:mod:`.heldout`, ties broken by the bag's index, that is its key: the split is in key order) and every number of it
are the same on 1, 2 or 3 workers. (The loop scores a split in fixed batches of bags whatever the number of workers,
:attr:`~nre_ray.tasks.base.Task.eval_blocks`, so that each bag's probabilities are computed in the same batch too.)

Scores (:data:`METRICS`), as OpenNRE reports NYT10, NA left out of the positives: ``auc`` (area under the held-out
PR curve), ``p_at_100``/``200``/``300``, ``max_f1`` and ``mean_precision`` of the curve; ``micro_precision``,
``micro_recall``, ``micro_f1`` and ``macro_f1`` at a ``threshold`` (a (bag, relation) is predicted when its score is
at least the threshold): chosen on the split itself for validation, validation's for the test split
(:func:`split_scores`).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch

from nre_ray.tasks.bag import heldout
from nre_ray.tasks.bag.bags import NA

CURVE = ("auc", "p_at_100", "p_at_200", "p_at_300", "max_f1", "mean_precision")
AT_THRESHOLD = ("micro_f1", "micro_precision", "micro_recall", "macro_f1")
METRICS = (*CURVE, *AT_THRESHOLD, "threshold")
"""The scores of :func:`scores`: what ``--select-metric`` chooses among for bags (``threshold`` is reported, not a
score to select on)."""


def new_counts(num_bags: int, num_classes: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """(N, 2, C) float32 zeros."""
    return torch.zeros((num_bags, 2, num_classes), dtype=torch.float32, device=device)


def count(counts: torch.Tensor, probs: torch.Tensor, batch: Mapping[str, torch.Tensor]) -> None:
    """Write the batch's bags into ``counts`` (N, 2, C) at ``batch["index"]`` (B,): ``probs`` (B, C) and the gold
    ``batch["labels"]`` (B, C)."""
    index = batch["index"]
    counts[index, 0] = probs.float()
    counts[index, 1] = batch["labels"].float()


def parts(counts: Any) -> tuple[list[str], np.ndarray, np.ndarray]:
    """``(keys, scores (N, C) float64, gold (N, C) bool)`` of summed counts: the key of bag i is i, zero-padded (the
    split's order is its keys' order)."""
    c = counts.cpu().numpy() if isinstance(counts, torch.Tensor) else np.asarray(counts)
    return [f"{i:012d}" for i in range(len(c))], c[:, 0].astype(np.float64), c[:, 1] > 0.5


def na_index(labels: list[str], negative_label: str | None) -> int | None:
    """The column of NA (``--negative-label``, default ``NA``), or None when the labels have none."""
    na = negative_label or NA
    return labels.index(na) if na in labels else None


def scores(counts: Any, labels: list[str], negative_label: str | None,
           threshold: float | None = None) -> dict[str, float]:
    """The scores (:data:`METRICS`) of the summed ``counts``; the F1 scores at ``threshold`` (None: the one of best
    micro F1 on these bags, :func:`~.heldout.choose_threshold`)."""
    keys, probs, gold = parts(counts)
    na = na_index(labels, negative_label)
    out = {k: v for k, v in heldout.held_out(keys, probs, gold, na).items() if k in CURVE}
    if threshold is None:
        threshold = heldout.choose_threshold(keys, probs, gold, na)
    out.update(heldout.threshold_scores(keys, probs, gold, na, threshold))
    out["threshold"] = float(threshold)
    return out


def split_scores(counted: Mapping[str, Any], labels: list[str], negative_label: str | None
                 ) -> dict[str, dict[str, float]]:
    """Each split's scores; the test split's F1 at the threshold chosen on validation (when there is one)."""
    out = {name: scores(c, labels, negative_label) for name, c in counted.items() if name != "test"}
    if "test" in counted:
        chosen = out["valid"]["threshold"] if "valid" in out else None
        out["test"] = scores(counted["test"], labels, negative_label, chosen)
    return out


def curve(counts: Any, labels: list[str], negative_label: str | None) -> Any:
    """The held-out PR curve as a frame: ``rank``, ``score``, ``relation``, ``correct``, ``precision``,
    ``recall``."""
    import pandas as pd

    keys, probs, gold = parts(counts)
    ranking = heldout.rank(keys, probs, gold, na_index(labels, negative_label))
    precision, recall = heldout.pr_curve(ranking)
    return pd.DataFrame({"rank": np.arange(1, len(precision) + 1), "score": ranking.scores,
                         "relation": [labels[r] for r in ranking.relation], "correct": ranking.correct,
                         "precision": precision, "recall": recall})


def write_reports(counts: Any, labels: list[str], negative_label: str | None, folder: Path, name: str,
                  title: str, threshold: float | None = None) -> None:
    """``{name}_pr_curve.csv`` (the curve's points), ``{name}_pr_curve.png`` (its plot, with AUC and P@N) and
    ``{name}_per_relation.csv`` (per relation at ``threshold``; None: this split's best)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import pandas as pd

    points = curve(counts, labels, negative_label)
    points.to_csv(folder / f"{name}_pr_curve.csv", index=False)
    numbers = scores(counts, labels, negative_label)
    fig, ax = plt.subplots(figsize=(5, 4))
    ax.plot(points["recall"], points["precision"], lw=1.2)
    ax.set(xlabel="recall", ylabel="precision", xlim=(0, 1), ylim=(0, 1.02),
           title=f"{title}\nAUC {numbers['auc']:.4f}  P@100 {numbers['p_at_100']:.3f}")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(folder / f"{name}_pr_curve.png", dpi=100)
    plt.close(fig)
    pd.DataFrame(per_label(counts, labels, negative_label, threshold)).to_csv(folder / f"{name}_per_relation.csv",
                                                                              index=False)


def per_label(counts: Any, labels: list[str], negative_label: str | None,
              threshold: float | None = None) -> list[dict[str, Any]]:
    """One row per relation (NA left out): ``label``, ``precision``, ``recall``, ``f1``, ``tp``, ``predicted``,
    ``gold`` (bags) at ``threshold`` (None: the split's best, :func:`~.heldout.choose_threshold`)."""
    keys, probs, gold = parts(counts)
    na = na_index(labels, negative_label)
    if threshold is None:
        threshold = heldout.choose_threshold(keys, probs, gold, na)
    rows = []
    for c, label in enumerate(labels):
        if c == na:
            continue
        predicted, truth = probs[:, c] >= threshold, gold[:, c]
        tp, p, g = int((predicted & truth).sum()), int(predicted.sum()), int(truth.sum())
        precision, recall = (tp / p if p else 0.0), (tp / g if g else 0.0)
        f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
        rows.append({"label": label, "precision": precision, "recall": recall, "f1": f1, "tp": tp, "predicted": p,
                     "gold": g, "threshold": float(threshold)})
    return rows

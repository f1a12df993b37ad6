"""Bag metrics against hand-computed PR curves, AUC, P@N and F1, OpenNRE's own loop, and gathering from 1-3 workers."""

from __future__ import annotations

import numpy as np
import pytest
import sklearn.metrics

from nre_ray.tasks.bag import heldout

KEYS = ["a", "b", "c"]
#                  NA   r1   r2
SCORES = np.array([[0.0, 0.9, 0.1],
                   [0.0, 0.8, 0.3],
                   [0.0, 0.4, 0.7]])
GOLD = np.array([[False, True, False],   # a: r1
                 [True, False, False],   # b: NA
                 [False, True, True]])   # c: r1 and r2


def test_hand_computed_curve_auc_and_f1() -> None:
    ranking = heldout.rank(KEYS, SCORES, GOLD, na_index=0)
    assert ranking.scores.tolist() == [0.9, 0.8, 0.7, 0.4, 0.3, 0.1] and ranking.facts == 3
    assert ranking.correct.tolist() == [True, False, True, True, False, False]
    precision, recall = heldout.pr_curve(ranking)
    np.testing.assert_allclose(precision, [1, 1 / 2, 2 / 3, 3 / 4, 3 / 5, 1 / 2], rtol=0, atol=1e-15)
    np.testing.assert_allclose(recall, [1 / 3, 1 / 3, 2 / 3, 1, 1, 1], rtol=0, atol=1e-15)
    out = heldout.held_out(KEYS, SCORES, GOLD, na_index=0)
    # trapezoids over recall: (1/2 + 2/3) / 2 * 1/3 + (2/3 + 3/4) / 2 * 1/3 = 7/36 + 17/72
    assert out["auc"] == pytest.approx(31 / 72, abs=1e-15)
    assert out["p_at_100"] == out["p_at_200"] == out["p_at_300"] == 0.5  # fewer than N predictions: all of them
    assert out["max_f1"] == pytest.approx(6 / 7, abs=1e-15)
    assert out["mean_precision"] == pytest.approx(241 / 360, abs=1e-15)
    assert (out["facts"], out["predictions"]) == (3, 6)
    at = heldout.threshold_scores(KEYS, SCORES, GOLD, 0, threshold=0.5)  # a-r1, b-r1, c-r2 predicted
    assert at == pytest.approx({"micro_precision": 2 / 3, "micro_recall": 2 / 3, "micro_f1": 2 / 3,
                                "macro_f1": (1 / 2 + 1) / 2}, abs=1e-15)
    assert heldout.choose_threshold(KEYS, SCORES, GOLD, 0) == 0.4  # F1 6/7 there
    assert heldout.threshold_scores(KEYS, SCORES, GOLD, 0, 0.4)["micro_f1"] == pytest.approx(6 / 7)


def test_p_at_n() -> None:
    scores = np.zeros((400, 2))
    scores[:, 1] = np.linspace(1.0, 0.0, 400)  # bag i ranks i-th
    gold = np.zeros((400, 2), dtype=bool)
    gold[np.arange(400) % 4 != 0, 1] = True  # 3 in 4 of the top 100 are facts ...
    gold[100:, 1] &= np.arange(100, 400) % 2 == 0  # ... then 1 in 4 (i % 4 == 2)
    gold[~gold.any(1), 0] = True
    out = heldout.held_out([f"k{i:03d}" for i in range(400)], scores, gold, na_index=0)
    top = gold[:, 1]
    assert out["p_at_100"] == top[:100].mean() == 0.75
    assert out["p_at_200"] == top[:200].sum() / 200 and out["p_at_300"] == top[:300].sum() / 300


def opennre_eval(keys, scores, gold, na_index) -> dict[str, float]:
    """OpenNRE's BagREDataset.eval, written from its description: sort by score, count facts, sklearn's auc."""
    facts = {(k, c) for k, row in zip(keys, gold, strict=True) for c in np.flatnonzero(row) if c != na_index}
    pred = [(s, k, c) for k, row in zip(keys, scores, strict=True) for c, s in enumerate(row) if c != na_index]
    pred.sort(key=lambda x: x[0], reverse=True)
    correct, prec, rec = 0, [], []
    for i, (_, k, c) in enumerate(pred):
        correct += (k, c) in facts
        prec.append(correct / (i + 1))
        rec.append(correct / len(facts))
    return {"auc": sklearn.metrics.auc(x=rec, y=prec), "p_at_100": prec[99], "p_at_200": prec[199]}


def random_bags(n: int, classes: int, seed: int) -> tuple[list[str], np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    scores = rng.random((n, classes))  # continuous: no ties
    gold = rng.random((n, classes)) < 0.15
    gold[:, 0] = ~gold[:, 1:].any(1)
    return [f"bag{i:04d}" for i in range(n)], scores, gold


def test_same_as_opennre_loop() -> None:
    keys, scores, gold = random_bags(300, 5, seed=1)
    ours = heldout.held_out(keys, scores, gold, na_index=0)
    theirs = opennre_eval(keys, scores, gold, 0)
    assert ours["auc"] == theirs["auc"] and ours["p_at_100"] == theirs["p_at_100"]
    assert ours["p_at_200"] == theirs["p_at_200"]


@pytest.mark.parametrize("workers", [1, 2, 3])
def test_exact_whatever_the_workers(workers: int) -> None:
    keys, scores, gold = random_bags(120, 4, seed=2)
    scores = np.round(scores, 1)  # many ties: the tie-break must not depend on the order
    reference = heldout.held_out(keys, scores, gold, 0)
    reference.update(heldout.threshold_scores(keys, scores, gold, 0, 0.5))
    reference["threshold"] = heldout.choose_threshold(keys, scores, gold, 0)
    rng = np.random.default_rng(workers)
    shards = np.array_split(rng.permutation(len(keys)), workers)  # each worker scores its shard, in its own order
    for trial in range(3):
        order = np.concatenate([shards[i] for i in rng.permutation(workers)])  # gathered in any order
        k = [keys[i] for i in order]
        got = heldout.held_out(k, scores[order], gold[order], 0)
        got.update(heldout.threshold_scores(k, scores[order], gold[order], 0, 0.5))
        got["threshold"] = heldout.choose_threshold(k, scores[order], gold[order], 0)
        assert got == reference, trial  # exactly equal, not approximately


def test_edges_and_errors() -> None:
    assert heldout.choose_threshold(KEYS, SCORES, np.eye(3, dtype=bool)[[0, 0, 0]], 0) == 1.0  # no facts
    out = heldout.held_out(["x"], np.array([[0.2, 0.8]]), np.array([[False, True]]), 0)
    assert out["auc"] == 0.0 and out["p_at_100"] == 1.0  # one point: no area
    no_na = heldout.held_out(KEYS, SCORES[:, 1:], GOLD[:, 1:], na_index=None)
    assert no_na["auc"] == heldout.held_out(KEYS, SCORES, GOLD, 0)["auc"]
    with pytest.raises(ValueError, match="bag keys must be unique"):
        heldout.rank(["a", "a", "c"], SCORES, GOLD, 0)
    with pytest.raises(ValueError, match="do not match"):
        heldout.rank(KEYS, SCORES[:2], GOLD, 0)

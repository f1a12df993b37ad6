"""Tests for nre_ray.tasks.sentence.metrics, with expected values worked out by hand."""

from __future__ import annotations

import math

import numpy as np
import pytest
from sklearn.metrics import confusion_matrix as sk_confusion_matrix
from sklearn.metrics import f1_score, precision_score, recall_score

from nre_ray.tasks.sentence.metrics import (
    confusion_matrix,
    per_class_table,
    scores,
    select_metric_default,
    split_directed_label,
)

BASE_KEYS = {
    "accuracy",
    "macro_precision",
    "macro_recall",
    "macro_f1",
    "micro_precision",
    "micro_recall",
    "micro_f1",
}
POS_KEYS = {"pos_micro_precision", "pos_micro_recall", "pos_micro_f1", "pos_macro_f1"}

# 3-class example (rows = gold, cols = predicted).
#            A  B  C   | gold
#   gold A [ 5, 1, 0 ] |  6
#   gold B [ 2, 3, 1 ] |  6
#   gold C [ 0, 2, 6 ] |  8
#   pred     7  6  7   | 20,  trace = 14
#
# A: P = 5/7, R = 5/6, F1 = 2*5/(7+6) = 10/13
# B: P = 3/6, R = 3/6, F1 = 1/2
# C: P = 6/7, R = 6/8, F1 = 2*6/(7+8) = 4/5
# macro P  = (5/7 + 1/2 + 6/7)/3  = 29/42
# macro R  = (5/6 + 1/2 + 3/4)/3  = 25/36
# macro F1 = (10/13 + 1/2 + 4/5)/3 = 269/390
# accuracy = micro P = micro R = micro F1 = 14/20 = 0.7
CM3 = np.array([[5, 1, 0], [2, 3, 1], [0, 2, 6]], dtype=np.int64)
LABELS3 = ["A", "B", "C"]


def _no_nan(d: dict[str, float]) -> None:
    for k, v in d.items():
        assert isinstance(v, float), k
        assert not math.isnan(v), k


def test_scores_three_class_hand_computed():
    s = scores(CM3, LABELS3)
    assert set(s) == BASE_KEYS
    assert s["accuracy"] == pytest.approx(0.7)
    assert s["macro_precision"] == pytest.approx(29 / 42)
    assert s["macro_recall"] == pytest.approx(25 / 36)
    assert s["macro_f1"] == pytest.approx(269 / 390)
    assert s["micro_precision"] == pytest.approx(0.7)
    assert s["micro_recall"] == pytest.approx(0.7)
    assert s["micro_f1"] == pytest.approx(0.7)
    _no_nan(s)


def test_micro_f1_equals_accuracy_on_random_matrices():
    rng = np.random.default_rng(0)
    for _ in range(20):
        c = int(rng.integers(2, 12))
        cm = rng.integers(0, 20, size=(c, c))
        s = scores(cm, [f"l{i}" for i in range(c)])
        assert s["micro_f1"] == pytest.approx(s["accuracy"])
        assert s["micro_precision"] == pytest.approx(s["accuracy"])
        assert s["micro_recall"] == pytest.approx(s["accuracy"])


def test_positive_class_scores_hand_computed():
    # labels: 0 = no_relation, 1 = A, 2 = B
    #                 NR  A  B  | gold
    #   gold NR    [ 10,  2, 1 ] | 13   -> 3 false positives (2 for A, 1 for B)
    #   gold A     [  1,  4, 1 ] |  6   -> 1 FN to NR, 1 confused with B
    #   gold B     [  3,  0, 3 ] |  6   -> 3 FN to NR
    #   pred         14   6  5   | 25,  trace = 17
    #
    # positive micro: tp = 4 + 3 = 7; positive predictions = col A + col B = 6 + 5 = 11;
    #   positive gold = row A + row B = 6 + 6 = 12
    #   P = 7/11, R = 7/12, F1 = 2*7/(11+12) = 14/23
    # positive macro: F1_A = 2*4/(6+6) = 2/3, F1_B = 2*3/(5+6) = 6/11
    #   pos_macro_f1 = (2/3 + 6/11)/2 = 20/33
    cm = np.array([[10, 2, 1], [1, 4, 1], [3, 0, 3]])
    labels = ["no_relation", "A", "B"]
    s = scores(cm, labels, negative_label="no_relation")
    assert set(s) == BASE_KEYS | POS_KEYS
    assert s["accuracy"] == pytest.approx(17 / 25)
    assert s["pos_micro_precision"] == pytest.approx(7 / 11)
    assert s["pos_micro_recall"] == pytest.approx(7 / 12)
    assert s["pos_micro_f1"] == pytest.approx(14 / 23)
    assert s["pos_macro_f1"] == pytest.approx(20 / 33)
    _no_nan(s)


def test_positive_scores_match_sklearn_with_positive_labels():
    rng = np.random.default_rng(1)
    gold = rng.integers(0, 5, size=400)
    pred = np.where(rng.random(400) < 0.6, gold, rng.integers(0, 5, size=400))
    cm = confusion_matrix(gold, pred, 5)
    s = scores(cm, ["NA", "a", "b", "c", "d"], negative_label="NA")
    pos = [1, 2, 3, 4]
    assert s["pos_micro_precision"] == pytest.approx(precision_score(gold, pred, labels=pos, average="micro"))
    assert s["pos_micro_recall"] == pytest.approx(recall_score(gold, pred, labels=pos, average="micro"))
    assert s["pos_micro_f1"] == pytest.approx(f1_score(gold, pred, labels=pos, average="micro"))
    assert s["pos_macro_f1"] == pytest.approx(f1_score(gold, pred, labels=pos, average="macro"))


def test_negative_label_absent_or_none_gives_no_pos_keys():
    assert set(scores(CM3, LABELS3)) == BASE_KEYS
    assert set(scores(CM3, LABELS3, negative_label="no_relation")) == BASE_KEYS


SEMEVAL_LABELS = [
    "Other",
    "Cause-Effect(e1,e2)",
    "Cause-Effect(e2,e1)",
    "Component-Whole(e1,e2)",
    "Component-Whole(e2,e1)",
]
#                     Oth CE12 CE21 CW12 CW21 | gold
SEMEVAL_CM = np.array(
    [
        [5, 1, 0, 0, 1],  # Other: 1 FP for CE(e1,e2), 1 FP for CW(e2,e1)
        [0, 3, 1, 0, 0],  # CE(e1,e2): one WRONG DIRECTION prediction CE(e2,e1)
        [1, 0, 2, 0, 0],  # CE(e2,e1): one missed (predicted Other)
        [0, 0, 1, 2, 0],  # CW(e1,e2): one confused with CE(e2,e1)
        [0, 0, 0, 0, 2],  # CW(e2,e1)
    ]
)
# Cause-Effect (ids 1, 2):
#   correct  = cm[1,1] + cm[2,2] = 3 + 2 = 5
#              (the wrong-direction cell cm[1,2] is NOT correct)
#   gold     = row1 + row2 = 4 + 3 = 7
#              (the wrong-direction example is in here -> lowers recall)
#   proposed = col1 + col2 = 4 + 4 = 8
#              (the wrong-direction prediction is a CE prediction -> lowers precision)
#   P = 5/8, R = 5/7, F1 = 2*5/(8+7) = 2/3
# Component-Whole (ids 3, 4):
#   correct = 2 + 2 = 4, gold = 3 + 2 = 5, proposed = col3 + col4 = 2 + 3 = 5
#   P = 4/5, R = 4/5, F1 = 4/5
# semeval_macro_f1 = (2/3 + 4/5)/2 = 11/15   (Other excluded)
# Had direction been ignored, CE correct would be 6 -> F1 = 12/15 = 4/5,
# and the score 4/5.


def test_semeval_official_score_hand_computed():
    s = scores(SEMEVAL_CM, SEMEVAL_LABELS, negative_label="Other")
    assert set(s) == BASE_KEYS | POS_KEYS | {"semeval_macro_f1"}
    assert s["semeval_macro_f1"] == pytest.approx(11 / 15)
    assert s["semeval_macro_f1"] < 4 / 5  # the wrong-direction prediction is penalised
    _no_nan(s)


def test_semeval_wrong_direction_hurts_precision_and_recall():
    # One type, examples of both directions; one predicted with the wrong direction.
    labels = ["Other", "R(e1,e2)", "R(e2,e1)"]
    cm = np.array([[1, 0, 0], [0, 1, 1], [0, 0, 1]])
    # correct = 2, gold = 3, proposed = 1 + 2 = 3 -> P = R = F1 = 2/3
    s = scores(cm, labels, negative_label="Other")
    assert s["semeval_macro_f1"] == pytest.approx(2 / 3)
    # Predicting Other instead would lose recall only: correct 2, gold 3, proposed 2
    cm_other = np.array([[1, 0, 0], [1, 1, 0], [0, 0, 1]])
    # P = 1, R = 2/3, F1 = 2*(2/3)/(5/3) = 4/5
    assert scores(cm_other, labels, negative_label="Other")["semeval_macro_f1"] == pytest.approx(4 / 5)


def test_semeval_key_requires_negative_label_and_directed_labels():
    assert "semeval_macro_f1" not in scores(SEMEVAL_CM, SEMEVAL_LABELS)
    s = scores(np.eye(3, dtype=int), ["no_relation", "a", "b"], negative_label="no_relation")
    assert "semeval_macro_f1" not in s


def test_split_directed_label():
    assert split_directed_label("Cause-Effect(e1,e2)") == ("Cause-Effect", "e1,e2")
    assert split_directed_label("Cause-Effect(e2,e1)") == ("Cause-Effect", "e2,e1")
    assert split_directed_label("Other") == ("Other", None)
    assert split_directed_label("per:title") == ("per:title", None)


def test_macro_f1_matches_sklearn_on_random_predictions():
    rng = np.random.default_rng(42)
    for trial in range(10):
        c = int(rng.integers(2, 15))
        n = int(rng.integers(50, 600))
        # leave the last class out entirely on some trials (never gold, never predicted)
        hi = c - 1 if trial % 2 else c
        gold = rng.integers(0, hi, size=n)
        pred = rng.integers(0, hi, size=n)
        cm = confusion_matrix(gold, pred, c)
        s = scores(cm, [str(i) for i in range(c)])
        assert s["macro_f1"] == pytest.approx(f1_score(gold, pred, average="macro"))
        assert s["macro_precision"] == pytest.approx(precision_score(gold, pred, average="macro", zero_division=0))
        assert s["macro_recall"] == pytest.approx(recall_score(gold, pred, average="macro", zero_division=0))
        assert s["accuracy"] == pytest.approx(float(np.mean(gold == pred)))


def test_confusion_matrix_matches_sklearn_and_sums_over_shards():
    rng = np.random.default_rng(7)
    c = 6
    gold = rng.integers(0, c, size=1000)
    pred = rng.integers(0, c, size=1000)
    whole = confusion_matrix(gold, pred, c)
    assert whole.dtype == np.int64
    assert whole.shape == (c, c)
    np.testing.assert_array_equal(whole, sk_confusion_matrix(gold, pred, labels=list(range(c))))
    shards = np.array_split(np.arange(1000), 4)
    summed = sum(confusion_matrix(gold[idx], pred[idx], c) for idx in shards)
    np.testing.assert_array_equal(summed, whole)
    assert scores(summed, [str(i) for i in range(c)]) == scores(whole, [str(i) for i in range(c)])


def test_confusion_matrix_edge_cases():
    np.testing.assert_array_equal(
        confusion_matrix(np.array([], dtype=int), np.array([], dtype=int), 3),
        np.zeros((3, 3), dtype=np.int64),
    )
    with pytest.raises(ValueError):
        confusion_matrix(np.array([0, 1]), np.array([0]), 2)
    with pytest.raises(ValueError):
        confusion_matrix(np.array([0, 2]), np.array([0, 1]), 2)
    with pytest.raises(ValueError):
        confusion_matrix(np.array([0, -1]), np.array([0, 1]), 2)


def test_empty_matrix_all_zero_no_nan():
    s = scores(
        np.zeros((3, 3), dtype=np.int64),
        ["NA", "R(e1,e2)", "R(e2,e1)"],
        negative_label="NA",
    )
    assert set(s) == BASE_KEYS | POS_KEYS | {"semeval_macro_f1"}
    assert all(v == 0.0 for v in s.values())
    _no_nan(s)
    table = per_class_table(np.zeros((2, 2), dtype=np.int64), ["a", "b"])
    assert table[["precision", "recall", "f1"]].to_numpy().sum() == 0.0


def test_classes_without_support_no_nan():
    # class "c" never gold but predicted once; class "d" never seen at all
    cm = np.array([[3, 0, 1, 0], [0, 2, 0, 0], [0, 0, 0, 0], [0, 0, 0, 0]])
    s = scores(cm, ["a", "b", "c", "d"])
    _no_nan(s)
    # active classes a, b, c (d is never gold nor predicted, so left out):
    # F1_a = 2*3/(3+4) = 6/7, F1_b = 1, F1_c = 0 -> macro = (6/7 + 1)/3 = 13/21
    assert s["macro_f1"] == pytest.approx(13 / 21)
    # negative class only in the data: no positive predictions or gold -> zeros
    s = scores(np.array([[4, 0], [0, 0]]), ["NA", "x"], negative_label="NA")
    _no_nan(s)
    assert s["pos_micro_f1"] == 0.0 and s["pos_macro_f1"] == 0.0


def test_per_class_table_hand_computed():
    t = per_class_table(CM3, LABELS3)
    assert list(t.columns) == [
        "label",
        "precision",
        "recall",
        "f1",
        "support",
        "predicted",
    ]
    assert t["label"].tolist() == LABELS3
    np.testing.assert_allclose(t["precision"], [5 / 7, 1 / 2, 6 / 7])
    np.testing.assert_allclose(t["recall"], [5 / 6, 1 / 2, 3 / 4])
    np.testing.assert_allclose(t["f1"], [10 / 13, 1 / 2, 4 / 5])
    assert t["support"].tolist() == [6, 6, 8]
    assert t["predicted"].tolist() == [7, 6, 7]


def test_shape_validation():
    with pytest.raises(ValueError):
        scores(CM3, ["A", "B"])
    with pytest.raises(ValueError):
        per_class_table(np.zeros((2, 3)), ["A", "B"])


def test_select_metric_default():
    assert select_metric_default(None) == "macro_f1"
    assert select_metric_default("no_relation") == "pos_macro_f1"

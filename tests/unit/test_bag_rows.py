"""The bag task's rows without Ray: evaluate's file -> bags exactly as the preprocessing's batch functions build them,
its bad input named by file and line, predict's bags (the checkpoint's size cap and seed applied at predict time)
scored as evaluate scores them, one answer row per bag (its relation: NA below the checkpoint's validation
threshold)."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
import torch

from nre_ray.config import Config
from nre_ray.data.chunks import canonical_part
from nre_ray.data.errors import DataError
from nre_ray.data.vocab import Vocab
from nre_ray.inference.predictor import Predictor
from nre_ray.models.registry import ModelSpec
from nre_ray.run.checkpoint import CheckpointError
from nre_ray.tasks.bag import bag_rows, bag_scores, grouping
from nre_ray.tasks.bag.bag_split import BagSplit
from nre_ray.tasks.bag.bag_task import BAG
from nre_ray.tasks.bag.bags import NA
from nre_ray.tasks.bag.files import read_bag_table

SEED = 3
ASSETS = {grouping.SEED_ASSET: json.dumps({"seed": SEED}).encode()}
TEST = grouping.sample_dir() / "test.tsv"


@pytest.fixture(scope="module")
def checkpoint():
    """A bag checkpoint's settings (bags capped at 2 sentences), vocabulary and labels from the sample's training
    file, and an untrained tiny CNN under attention."""
    cfg = Config.from_dict({"data": {"max_bag_size": 2}, "model": {
        "bag_aggregator": "att", "model": "cnn", "hidden_size": 16, "word_dim": 8, "pos_dim": 2}})
    train, _ = bag_rows.read_bags(str(grouping.sample_dir() / "train.tsv"), None, None, None, 0, NA)
    stats = grouping.bag_stats(train.assign(split="train"), "regex", True, True, True)
    tokens = stats[stats["kind"] == "token"]
    vocab = Vocab.build(dict(zip(tokens["name"], tokens["count"], strict=True)), 1)
    labels = grouping.labels_of(sorted(stats.loc[stats["kind"] == "label", "name"]), {}, NA)
    torch.manual_seed(0)
    spec = ModelSpec(len(vocab), len(labels), 2 * cfg.data.position_window + 2)
    return cfg, vocab, labels, BAG.build_model(cfg.model, spec).eval(), spec


def test_evaluate_builds_a_file_s_bags_as_the_preprocessing_does(checkpoint, tmp_path):
    cfg, vocab, labels, _, _ = checkpoint
    moved = tmp_path / "elsewhere.txt"  # the same file in another folder, under another name: the same bags
    moved.write_bytes(TEST.read_bytes())
    split, skipped = BAG.encode_file(str(moved), cfg.data, vocab, labels, ASSETS)
    # the Ray Data stages' functions, group by group as map_groups runs them
    item = pd.DataFrame({"split": ["test"], "path": [str(TEST)], "format": ["nyt10"]})
    keyed = grouping.keyed_good_rows(pd.concat(list(grouping.read_split_file(item, None)), ignore_index=True))
    bags = pd.concat([grouping.bags_of_group(g, 2, SEED, NA) for _, g in keyed.groupby("bag", sort=False)])
    writer = BagSplit.Writer(len(labels), cfg.data.position_window)
    for row in grouping.encode_bags(bags, vocab.tokens, labels, grouping.encode_settings(cfg.data)).itertuples():
        writer.add(row)
    expected = writer.finish("test")
    assert skipped == 0 and len(split) == len(expected) == 66 and split.sizes.max() == 2
    assert split.info == expected.info
    for name in ("scope", "labels", "total"):
        np.testing.assert_array_equal(getattr(split, name), getattr(expected, name), err_msg=name)
    for name, values in expected.sentences.flat.items():
        np.testing.assert_array_equal(split.sentences.flat[name], values, err_msg=name)
    with pytest.raises(CheckpointError, match=r"lacks task/bags\.json"):
        BAG.encode_file(str(TEST), cfg.data, vocab, labels, {})


def test_bad_rows_and_bags_are_named_by_file_and_line(checkpoint, tmp_path):
    cfg, vocab, labels, _, _ = checkpoint
    lines = TEST.read_text(encoding="utf-8").splitlines()[:6]
    bad = tmp_path / "bad.tsv"
    bad.write_text("\n".join([lines[0], "/m/1\t/m/2\tonly five\tfields\tNA", *lines[1:]]) + "\n", encoding="utf-8")
    with pytest.raises(DataError, match=rf"(?s){bad}:2: .*--on-bad-rows skip to evaluate"):
        BAG.encode_file(str(bad), cfg.data, vocab, labels, ASSETS)
    split, skipped = BAG.encode_file(str(bad), cfg.data, vocab, labels, ASSETS, on_bad_rows="skip")
    good = tmp_path / "good.tsv"
    good.write_text("\n".join(lines) + "\n", encoding="utf-8")
    assert skipped == 1 and split.info["keys"] == BAG.encode_file(str(good), cfg.data, vocab, labels, ASSETS)[0].info[
        "keys"]
    unknown = tmp_path / "unknown.tsv"
    unknown.write_text(lines[0].replace("\tNA\t", "\t/new/relation\t") + "\n", encoding="utf-8")
    with pytest.raises(DataError, match=rf"{unknown}:1: relation: '/new/relation' is not a relation of the training"):
        BAG.encode_file(str(unknown), cfg.data, vocab, labels, ASSETS)
    with pytest.raises(DataError, match=r"missing\.tsv: file not found"):
        BAG.encode_file(str(tmp_path / "missing.tsv"), cfg.data, vocab, labels, ASSETS)


def test_predict_scores_bags_as_evaluate_and_answers_one_row_per_bag(checkpoint, tmp_path):
    cfg, vocab, labels, model, spec = checkpoint
    split, _ = BAG.encode_file(str(TEST), cfg.data, vocab, labels, ASSETS)
    probs = bag_rows.bag_probabilities(model, split, torch.device("cpu"), 32)  # (66, C), evaluate's bags
    threshold = float(np.quantile(probs[:, 1:].max(axis=1), 0.5))  # about half the bags have a relation
    predictor = Predictor(model, cfg, vocab, labels, spec.num_positions, torch.device("cpu"), 32, ASSETS, BAG,
                          {"valid_threshold": threshold})
    plan = BAG.plan_input(str(TEST), None, None, 32)
    assert plan.total_rows == 66 and [c.rows for c in plan.chunks] == [32, 32, 2]
    rows = pd.concat([predictor.predict_rows(canonical_part(plan.read(i)), top_k=3) for i in range(3)],
                     ignore_index=True)
    assert (rows["problem"] == "").all() and rows["head_id"].tolist() == split.info["head_id"]
    answers = BAG.answer(rows)
    assert list(answers.columns) == BAG.answer_columns(3) == ["head_id", "tail_id", "head", "tail", "relation",
                                                             "score", "top_k_labels", "top_k_scores"]
    assert len(answers) == 66  # one per bag
    best = probs[:, 1:].argmax(axis=1) + 1  # NA is column 0
    related = probs[np.arange(66), best] >= threshold
    assert 0 < related.sum() < 66
    expected = np.where(related, np.asarray(labels, dtype=object)[best], NA)
    assert answers["relation"].tolist() == expected.tolist()
    np.testing.assert_array_equal(answers["score"].to_numpy(),  # predict's bags are evaluate's: the same scores
                                  np.where(related, probs[np.arange(66), best], probs[:, 0]).astype(np.float64))
    order = np.argsort(-probs, axis=1, kind="stable")[:, :3]
    assert answers["top_k_labels"].tolist() == [[labels[c] for c in row] for row in order]
    assert [s == sorted(s, reverse=True) for s in answers["top_k_scores"]] == [True] * 66  # best first
    plain = BAG.answer(predictor.predict_rows(canonical_part(plan.read(0))))
    pd.testing.assert_frame_equal(plain, answers.iloc[:32][list(bag_rows.OUTPUT_COLUMNS)])


def test_predict_without_labels_answers_as_with_them(checkpoint, tmp_path):
    cfg, vocab, labels, model, spec = checkpoint
    predictor = Predictor(model, cfg, vocab, labels, spec.num_positions, torch.device("cpu"), 32, ASSETS, BAG,
                          {"valid_threshold": 0.25})
    unlabelled = tmp_path / "new.jsonl"  # the test file's records, one a line as in the TSV, without relations
    records = read_bag_table(TEST)[["sentence", "head", "head_offset", "tail", "tail_offset", "head_id", "tail_id"]]
    records.to_json(unlabelled, orient="records", lines=True)
    answers = [BAG.answer(predictor.predict_rows(canonical_part(BAG.plan_input(str(path), None, None, 100).read(0))))
               for path in (TEST, unlabelled)]
    assert len(answers[0]) > 0
    pd.testing.assert_frame_equal(answers[1], answers[0], check_exact=True)


def test_a_bad_row_of_predict_input_is_a_row_with_its_problem(checkpoint, tmp_path):
    cfg, vocab, labels, model, spec = checkpoint
    lines = TEST.read_text(encoding="utf-8").splitlines()[:3]
    bad = tmp_path / "bad.tsv"
    bad.write_text("\n".join([*lines, "/m/1\t/m/2\tfive\tfields\tNA"]) + "\n", encoding="utf-8")
    plan = BAG.plan_input(str(bad), None, None, 10)
    frame = canonical_part(plan.read(0))
    assert frame["problem"].tolist()[-1] != "" and frame["file"].tolist()[-1] == str(bad)
    assert frame["line"].tolist() == [1, 2, 4]  # two bags (lines 1 and 2-3), then the bad line
    predictor = Predictor(model, cfg, vocab, labels, spec.num_positions, torch.device("cpu"), 8, ASSETS, BAG,
                          {"valid_threshold": 0.0})
    rows = predictor.predict_rows(frame)
    assert rows["problem"].tolist()[:2] == ["", ""] and rows["problem"].tolist()[2] != ""
    assert rows["relation"].isna().tolist() == [False, False, True] and np.isnan(rows["score"][2])
    # skipped, it is a bad sentence row, not a bag: listed with its own text, without the bags' empty answers
    from nre_ray.inference.prediction import _run_here, _write

    out = tmp_path / "out.csv"
    summary = _write(_run_here(plan, predictor, 0), plan, str(out), "csv", "skip", False, BAG.answer, BAG.unit,
                     BAG.output_columns(top_k=1))
    assert (summary.rows, summary.written, summary.skipped) == (2, 2, 1)
    rejected = pd.read_csv(tmp_path / "out.rejected.csv")
    assert rejected.columns.tolist() == ["file", "line", "problem", "bag", "sentence"]
    assert rejected["line"].tolist() == [4] and rejected["bag"].isna().all() and rejected["sentence"].isna().all()
    assert pd.read_csv(out).columns.tolist() == list(BAG.output_columns())


def test_evaluate_scores_at_the_checkpoint_s_validation_threshold():
    rng = np.random.default_rng(0)
    counts = np.zeros((40, 2, 3), dtype=np.float32)
    counts[:, 0] = rng.random((40, 3))
    counts[np.arange(40), 1, rng.integers(0, 3, 40)] = 1
    labels = [NA, "/a", "/b"]
    trained = {"valid_threshold": 0.8, "valid_auc": 0.5}
    assert BAG.checkpoint_scores(counts, labels, None, trained) == bag_scores.scores(counts, labels, None, 0.8)
    assert BAG.checkpoint_scores(counts, labels, None, trained)["threshold"] == 0.8
    assert {r["threshold"] for r in BAG.checkpoint_per_label(counts, labels, trained)} == {0.8}
    with pytest.raises(CheckpointError, match="records no valid_threshold"):
        BAG.checkpoint_scores(counts, labels, None, {})


def test_a_bag_s_relation_is_its_best_above_the_threshold_else_na():
    probs = np.array([[0.5, 0.2, 0.3], [0.1, 0.45, 0.45], [0.9, 0.05, 0.05]], dtype=np.float32)
    labels = [NA, "/a", "/b"]
    names, scores = bag_rows.bag_answers(probs, labels, 0, 0.25)
    assert names.tolist() == ["/b", "/a", NA]  # a tie: label order
    np.testing.assert_allclose(scores, [0.3, 0.45, 0.9])  # NA's: its own probability
    names, scores = bag_rows.bag_answers(probs[:, 1:], labels[1:], None, 0.25)  # labels without NA
    assert names.tolist() == ["/b", "/a", NA]
    np.testing.assert_allclose(scores, [0.3, 0.45, 0.95], atol=1e-6)  # NA's: one minus the best relation's
    assert bag_rows.bag_answers(probs[:0], labels, 0, 0.5)[0].tolist() == []


def test_a_bag_a_request_row_answers_as_predict_does(checkpoint):
    from nre_ray.inference.pyfunc import RelationModel

    cfg, vocab, labels, model, spec = checkpoint
    predictor = Predictor(model, cfg, vocab, labels, spec.num_positions, torch.device("cpu"), 32, ASSETS, BAG,
                          {"valid_threshold": 0.0})
    plan = BAG.plan_input(str(TEST), None, None, 100)
    predicted = BAG.answer(predictor.predict_rows(canonical_part(plan.read(0))))
    example = BAG.pyfunc_example(vocab)
    assert list(example.columns) == list(BAG.input_columns) == list(bag_rows.REQUEST_COLUMNS)
    requests = []
    for bag in json.loads(plan.frame["_nre_bag"].to_json(orient="values"))[:5]:
        bag = json.loads(bag)
        requests.append({**{c: bag[c] for c in bag_rows.PAIR_COLUMNS},
                         "sentences": [s["sentence"] for s in json.loads(bag["sentences"])]})
    rows = BAG.parse_request({"bags": requests})
    assert rows.equals(BAG.parse_request(requests)) and BAG.parse_request({"sentences": []}) is None
    assert rows.iloc[:1].equals(example)  # the sample's first test bag
    pyfunc = RelationModel()
    pyfunc.predictor = predictor
    answered = pyfunc.predict(None, rows)
    assert list(answered.columns) == list(bag_rows.OUTPUT_COLUMNS)
    first = predicted[predicted["head_id"].isin(rows["head_id"])].reset_index(drop=True)
    pd.testing.assert_frame_equal(answered, first, atol=1e-6)  # the file's bags and the requests': the same bags
    assert len(BAG.pyfunc_signature().inputs.input_names()) == 5


def test_a_bad_request_bag_is_a_problem_of_its_row(checkpoint):
    from mlflow.exceptions import MlflowException

    from nre_ray.inference.pyfunc import RelationModel

    cfg, vocab, labels, model, spec = checkpoint
    pyfunc = RelationModel()
    pyfunc.predictor = Predictor(model, cfg, vocab, labels, spec.num_positions, torch.device("cpu"), 8, ASSETS, BAG,
                                 {"valid_threshold": 0.0})
    good = {"head_id": "", "tail_id": "", "head": "Ann_Lee", "tail": "Oslo", "sentences": ["Ann_Lee lives in Oslo ."]}
    rows = BAG.parse_request([good, {**good, "sentences": ["Ann_Lee lives here .", "Oslo"]}, {**good, "sentences": 3}])
    with pytest.raises(MlflowException, match=r"(?s)row 2: sentences: sentence 1: tail: .*row 3: sentences: a non-"):
        pyfunc.predict(None, rows)
    answered = pyfunc.predict(None, rows.iloc[:1])
    assert answered["head"].tolist() == ["Ann_Lee"] and answered["relation"].tolist()[0] != NA  # threshold 0


@pytest.mark.parametrize("aggregator", ["att", "avg", "one"])
def test_an_elastic_step_over_bags_is_the_same_update_at_every_world_size(checkpoint, aggregator):
    """An elastic run's step (nre_ray.run.elastic: the step's bags shared among the ranks, each bag's loss divided by
    the step's bag count, the gradients summed over the ranks) gives the same gradients at 1, 2 and 3 simulated
    ranks, for every aggregator: a bag's loss is its own, whichever rank holds it."""
    from tests.helpers import elastic_step_gradients

    cfg, vocab, labels, _, spec = checkpoint
    split, _ = bag_rows.encode_file(str(grouping.sample_dir() / "train.tsv"), cfg.data, vocab, labels, ASSETS)
    dataset = BAG.dataset(split)
    model_cfg = Config.from_dict({"model": {**cfg.model.__dict__, "bag_aggregator": aggregator, "dropout": 0.0,
                                              "embedding_dropout": 0.0}})

    def gradients(world: int) -> list[torch.Tensor]:
        return elastic_step_gradients(BAG, lambda: BAG.build_model(model_cfg.model, spec).train(), dataset, world,
                                      step=1, batch=24, micro=8, seed=5)

    fixed = gradients(3)
    assert any(g.abs().sum() > 0 for g in fixed)
    for world in (1, 2):
        for mine, theirs in zip(gradients(world), fixed, strict=True):
            torch.testing.assert_close(mine, theirs, rtol=1e-5, atol=1e-7)

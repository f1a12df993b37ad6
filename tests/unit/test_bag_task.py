"""The bag task through the task interface, on the bundled bag sample without Ray: the choice by --bag-aggregator,
the preprocessing's batch functions run as plain pandas (read, key, group, encode), the cache files' round trip, the
batches and loss, and per-bag counts that give exactly the same scores on 1, 2 and 3 workers' shards."""

from __future__ import annotations

import functools

import numpy as np
import pandas as pd
import pytest
import torch

from nre_ray.config import Config, ConfigError, DataConfig, ModelConfig
from nre_ray.data.errors import DataError
from nre_ray.data.vocab import Vocab
from nre_ray.models.registry import ModelSpec
from nre_ray.run.loop import ShardSampler
from nre_ray.tasks.bag import bag_scores, grouping, heldout
from nre_ray.tasks.bag.bag_split import BagSplit
from nre_ray.tasks.bag.bag_task import BAG
from nre_ray.tasks.bag.bags import NA
from nre_ray.tasks.lookup import task_for, task_of

SETTINGS = {"tokenizer": "regex", "lowercase": True, "markers": True, "typed": True, "max_length": 64, "window": 20}


@functools.lru_cache(maxsize=8)
def _bags(split: str, max_bag_size: int = 3) -> pd.DataFrame:
    """The sample's ``split`` file as the Ray Data stages make it: read, keyed, grouped by (split, bag) and built
    (cached: callers do not change it)."""
    path = grouping.sample_dir() / f"{split}.tsv"
    item = pd.DataFrame({"split": [split], "path": [str(path)], "format": ["nyt10"]})
    rows = pd.concat(list(grouping.read_split_file(item, None)), ignore_index=True)
    assert (rows["problem"] == "").all() and (rows["fatal"] == 0).all()
    keyed = grouping.keyed_good_rows(rows)
    return pd.concat([grouping.bags_of_group(g, max_bag_size, 7, NA)
                      for _, g in keyed.groupby(["split", "bag"], sort=True)], ignore_index=True)


@pytest.fixture(scope="module")
def encoded():
    """The sample's train and valid bags encoded (labels and vocabulary from train), as BagSplits."""
    train, valid = _bags("train"), _bags("valid")
    stats = grouping.bag_stats(train, "regex", True, True, True)
    vocab = Vocab.build(dict(zip(stats.loc[stats["kind"] == "token", "name"],
                                 stats.loc[stats["kind"] == "token", "count"], strict=True)), 1)
    labels = grouping.labels_of(sorted(stats.loc[stats["kind"] == "label", "name"]), {}, NA)
    splits = {}
    for name, frame in (("train", train), ("valid", valid)):
        writer = BagSplit.Writer(len(labels), SETTINGS["window"])
        for row in grouping.encode_bags(frame, vocab.tokens, labels, SETTINGS).itertuples(index=False):
            assert row.problem == ""
            writer.add(row)
        splits[name] = writer.finish(name)
    return splits, labels, vocab


def test_bags_are_chosen_by_the_aggregator_not_by_the_folder(tmp_path):
    sample = str(grouping.sample_dir())
    assert task_for(sample).name == "sentence"  # the same files train sentence by sentence
    assert task_for(sample, bags=True).name == "bag" and task_for(None, bags=True).name == "bag"
    assert BAG.format_of(DataConfig()) == "nyt10"  # the bundled bag sample, detected from its first line
    assert BAG.format_of(DataConfig(format="tsv")) == "tsv"
    assert set(grouping.find_bag_files(DataConfig())) == {"train", "valid", "test"}
    with pytest.raises(ConfigError, match="--format nyt10 is for bags: add --bag-aggregator"):
        Config.from_dict({"data": {"format": "nyt10"}})
    cfg = Config.from_dict({"data": {"format": "nyt10"}, "model": {"bag_aggregator": "att"}})
    assert cfg.model.bag_aggregator == "att" and cfg.data.max_bag_size == 100
    assert BAG.check_settings(Config.from_dict({"model": {"bag_aggregator": "att", "model": "bert",
                                                           "pretrained": "x"}})) is None  # bert works in bags
    BAG.check_settings(Config.from_dict({"model": {"bag_aggregator": "avg"}, "train": {"num_workers": "1-2"}}))
    assert all(task_of({"task": "bag"}, c) is BAG for c in ("train", "evaluate", "predict", "serve", "pyfunc",
                                                               "tune", "inspect"))


def test_bags_keep_a_seeded_sample_and_every_label():
    full, capped = _bags("train", max_bag_size=1000), _bags("train", max_bag_size=3)
    assert list(full["bag"]) == list(capped["bag"]) and (capped["size"] <= 3).all()
    assert (capped["total"] == full["total"]).all() and (capped["labels"] == full["labels"]).all()
    assert (full["size"] == full["total"]).all() and int(full["total"].sum()) == 400  # train.tsv's 400 sentences
    assert (full["size"] > 3).any()  # the cap did cut some bag
    assert capped.equals(_bags.__wrapped__("train", max_bag_size=3))  # seeded: the same sample again
    keys = list(full["bag"])
    drawn = grouping.draw_valid(full, seed=1, fraction=0.3)
    moved = drawn["split"] == "valid"
    assert 0.15 < moved.mean() < 0.45 and moved.tolist() == [grouping.in_valid_share(1, k, 0.3) for k in keys]


def test_the_split_round_trips_through_the_cache_files(encoded, tmp_path):
    splits, labels, _ = encoded
    split = splits["valid"]
    split.save(tmp_path, "valid")
    assert BAG.splits_complete(tmp_path, ["valid"]) and not BAG.splits_complete(tmp_path, ["test"])
    again = BAG.open_split(tmp_path, "valid")
    assert len(again) == len(split) == 66 and again.info == split.info and again.num_classes == len(labels)
    np.testing.assert_array_equal(again.scope, split.scope)
    np.testing.assert_array_equal(again.labels, split.labels)
    a, b = BAG.dataset(again).__getitems__([3, 0, 5]), BAG.dataset(split).__getitems__([3, 0, 5])
    assert set(a) == set(b) and all(torch.equal(a[k], b[k]) for k in a)


def _model(labels: list[str], vocab: Vocab, aggregator: str = "att") -> torch.nn.Module:
    torch.manual_seed(0)
    cfg = ModelConfig(model="cnn", word_dim=8, pos_dim=3, hidden_size=12, bag_aggregator=aggregator)
    return BAG.build_model(cfg, ModelSpec(len(vocab), len(labels), 2 * SETTINGS["window"] + 2)).eval()


@pytest.mark.parametrize("aggregator", ["att", "avg", "one"])
def test_batches_and_the_loss_per_bag(encoded, aggregator):
    splits, labels, vocab = encoded
    batch = BAG.dataset(splits["train"]).__getitems__([0, 1, 2, 3])
    sizes = splits["train"].sizes[:4]
    assert batch["tokens"].shape[0] == int(sizes.sum()) and batch["scope"].tolist() == [0, *np.cumsum(sizes)]
    assert batch["labels"].shape == (4, len(labels)) and BAG.examples(batch) == 4
    model = _model(labels, vocab, aggregator)
    logits, query, probs = model(batch)
    assert probs.shape == (4, len(labels)) and logits.shape == (int(batch["labels"].sum()), len(labels))
    mean, total = BAG.loss((logits, query), batch), BAG.loss((logits, query), batch, reduction="sum")
    torch.testing.assert_close(total, mean * 4)
    model.train()
    assert len(model(batch)) == 2  # training: the instances' logits and labels only


def _counts(split: BagSplit, labels: list[str], model: torch.nn.Module, world_size: int) -> np.ndarray:
    """Every rank's counts over its shard as the loop makes them (whole blocks of eval_batch_size), summed."""
    total = None
    dataset = BAG.dataset(split)
    for rank in range(world_size):
        counts = BAG.new_counts(labels, len(split), torch.device("cpu"))
        indices = list(ShardSampler(len(split), rank, world_size, BAG.eval_batch_size))
        for start in range(0, len(indices), BAG.eval_batch_size):
            batch = dataset.__getitems__(indices[start:start + BAG.eval_batch_size])
            with torch.no_grad():
                BAG.count(counts, model(batch), batch)
        total = counts if total is None else total + counts
    return total.numpy()


def test_metrics_are_exact_on_one_two_and_three_workers(encoded):
    splits, labels, vocab = encoded
    model = _model(labels, vocab)
    one = _counts(splits["valid"], labels, model, 1)
    assert (one[:, 1].sum(axis=1) >= 1).all()  # every bag scored, its gold set there
    for workers in (2, 3):
        many = _counts(splits["valid"], labels, model, workers)
        np.testing.assert_array_equal(many, one)  # bit for bit: each bag's values, zeros elsewhere
        assert BAG.scores(many, labels, None) == BAG.scores(one, labels, None)
    scores = BAG.scores(one, labels, None)
    assert set(scores) == set(BAG.metric_names(labels, None)) and BAG.default_metric(None) == "auc"
    keys, probs, gold = bag_scores.parts(one)
    expected = heldout.held_out(keys, probs, gold, labels.index(NA))
    assert scores["auc"] == expected["auc"] and scores["p_at_100"] == expected["p_at_100"]


def test_test_f1_is_taken_at_the_threshold_chosen_on_validation(encoded):
    splits, labels, vocab = encoded
    model = _model(labels, vocab)
    valid = _counts(splits["valid"], labels, model, 1)
    train = _counts(splits["train"], labels, model, 1)
    both = BAG.split_scores({"valid": valid, "test": train}, labels, None)
    assert both["valid"] == BAG.scores(valid, labels, None)
    threshold = both["valid"]["threshold"]
    assert both["test"]["threshold"] == threshold
    keys, probs, gold = bag_scores.parts(train)
    at = heldout.threshold_scores(keys, probs, gold, labels.index(NA), threshold)
    assert both["test"]["micro_f1"] == at["micro_f1"] and both["test"]["macro_f1"] == at["macro_f1"]


def test_reports_hold_the_pr_curve_as_data_and_plot(encoded, tmp_path):
    splits, labels, vocab = encoded
    counts = _counts(splits["valid"], labels, _model(labels, vocab), 1)
    BAG.write_reports(counts, labels, tmp_path, "valid", "valid")
    curve = pd.read_csv(tmp_path / "valid_pr_curve.csv")
    assert len(curve) == len(splits["valid"]) * (len(labels) - 1)  # every (bag, relation != NA)
    assert curve["precision"].iloc[99] == pytest.approx(BAG.scores(counts, labels, None)["p_at_100"])
    assert (tmp_path / "valid_pr_curve.png").stat().st_size > 1000
    assert [r["label"] for r in BAG.per_label(counts, labels)] == labels[1:]


def test_a_checkpoints_reports_take_its_validation_threshold(encoded, tmp_path):
    """A sweep's test reports (Task.checkpoint_reports) agree with its test scores (Task.checkpoint_scores): the
    per-relation table at the threshold training chose on validation, not at the scored split's own best."""
    splits, labels, vocab = encoded
    counts = _counts(splits["train"], labels, _model(labels, vocab), 1)
    own = BAG.scores(counts, labels, None)["threshold"]
    trained = {"valid_threshold": own / 2 if own > 0 else 0.5}  # another threshold than the split's own
    BAG.checkpoint_reports(counts, labels, trained, tmp_path, "test", "test")
    table = pd.read_csv(tmp_path / "test_per_relation.csv")
    assert (table["threshold"] == trained["valid_threshold"]).all() and trained["valid_threshold"] != own
    expected = pd.DataFrame(BAG.checkpoint_per_label(counts, labels, trained))
    pd.testing.assert_frame_equal(table, expected, check_dtype=False)
    scores = BAG.checkpoint_scores(counts, labels, None, trained)
    tp, predicted, gold = (int(table[c].sum()) for c in ("tp", "predicted", "gold"))
    micro = 2 * tp / (predicted + gold) if predicted + gold else 0.0  # micro F1 over (bag, relation) pairs
    assert scores["micro_f1"] == pytest.approx(micro) and scores["threshold"] == trained["valid_threshold"]
    assert (tmp_path / "test_pr_curve.csv").exists() and (tmp_path / "test_pr_curve.png").exists()


def test_bad_rows_are_counted_and_named(tmp_path):
    path = tmp_path / "train.tsv"
    good = "/m/1\t/m/2\tAda\tBob\t/r/x\tAda met Bob ###END###"
    path.write_text("\n".join([good, "/m/1\t/m/2\tAda\tCyd\t/r/x\tAda met Bob ###END###", "only\tthree\tfields"]),
                    encoding="utf-8")
    item = pd.DataFrame({"split": ["train"], "path": [str(path)], "format": ["nyt10"]})
    rows = pd.concat(list(grouping.read_split_file(item, None)), ignore_index=True)
    summary = grouping.problem_summary(rows)
    assert int(summary["count"].sum()) == 2 and summary["line"].tolist() == [2, 3]
    assert "tail: 'Cyd' does not occur in the sentence" in summary["problem"].iloc[0]
    with pytest.raises(DataError, match=r"train\.tsv:2: .*Cyd") as err:
        grouping.fail_or_skip(summary, 2, "error", False)
    assert "--on-bad-rows skip" in str(err.value)
    grouping.fail_or_skip(summary, 2, "skip", False)  # skipped: no error
    keyed = grouping.keyed_good_rows(rows)
    assert len(keyed) == 1 and keyed["bag"].iloc[0] == "id\x1f/m/1\x1f/m/2"
    missing = pd.DataFrame({"split": ["train"], "path": [str(tmp_path / "nope.tsv")], "format": ["nyt10"]})
    fatal = pd.concat(list(grouping.read_split_file(missing, None)), ignore_index=True)
    assert fatal["fatal"].tolist() == [1] and "nope.tsv" in fatal["file"].iloc[0]

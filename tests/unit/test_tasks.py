"""The task layer (nre_ray/tasks/base.py): the spine picks the task from the data and from a checkpoint's meta.json,
and the sentence task's counts merge exactly over shards (what makes the metrics exact on 1, 2 and 3 workers)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from nre_ray.inference.predictor import Predictor
from nre_ray.run.checkpoint import CheckpointError, load_checkpoint
from nre_ray.tasks.base import Task
from nre_ray.tasks.lookup import TASKS, task_for, task_of
from nre_ray.tasks.sentence import metrics
from nre_ray.tasks.sentence.task import SENTENCE
from tests.unit.test_inference import make_checkpoint, raw_rows

LABELS = ["born_in", "founded_by", "no_relation"]


def test_the_sentence_task_is_chosen_for_sentence_data_and_old_checkpoints():
    assert task_for(None) is SENTENCE  # the bundled sample
    assert task_for("some/folder/of/csv") is SENTENCE
    assert task_of({}) is SENTENCE  # meta.json written before the task layer
    assert task_of({"task": "sentence"}) is SENTENCE
    assert all(isinstance(task, Task) and name == task.name for name, task in TASKS.items())
    with pytest.raises(CheckpointError, match="unknown task 'nope'"):
        task_of({"task": "nope"})


def test_shards_counts_sum_to_the_whole_splits_counts():
    g = torch.Generator().manual_seed(3)
    logits = torch.randn(101, len(LABELS), generator=g)  # (N, C)
    gold = torch.randint(0, len(LABELS), (101,), generator=g)  # (N,)
    whole = SENTENCE.new_counts(LABELS, 101, torch.device("cpu"))
    SENTENCE.count(whole, logits, {"labels": gold})
    for workers in (1, 2, 3):
        summed = SENTENCE.new_counts(LABELS, 101, torch.device("cpu"))
        for rank in range(workers):  # rank r's shard: rows r, r + w, ... (the loop's ShardSampler), in two batches
            rows = torch.arange(rank, 101, workers)
            for part in rows.tensor_split(2):
                shard = SENTENCE.new_counts(LABELS, 101, torch.device("cpu"))
                SENTENCE.count(shard, logits[part], {"labels": gold[part]})
                summed += shard
        assert torch.equal(summed, whole)
    expected = metrics.confusion_matrix(gold.numpy(), logits.argmax(-1).numpy(), len(LABELS))
    assert np.array_equal(whole.numpy(), expected)
    assert SENTENCE.scores(whole, LABELS, "no_relation") == metrics.scores(expected, LABELS, "no_relation")
    assert SENTENCE.per_label(whole, LABELS) == metrics.per_class_table(expected, LABELS).to_dict(orient="records")


def test_sentence_loss_is_cross_entropy_mean_or_sum():
    logits, gold = torch.tensor([[2.0, 0.0, -1.0], [0.5, 0.5, 3.0]]), torch.tensor([0, 1])
    batch = {"labels": gold}
    assert torch.equal(SENTENCE.loss(logits, batch), torch.nn.functional.cross_entropy(logits, gold))
    assert torch.equal(SENTENCE.loss(logits, batch, reduction="sum"),
                       torch.nn.functional.cross_entropy(logits, gold, reduction="sum"))
    assert SENTENCE.examples(batch) == 2


def test_a_checkpoint_without_the_task_field_predicts_as_the_sentence_task(tmp_path):
    old = make_checkpoint(tmp_path / "old")  # meta.json as before the task layer: no "task"
    assert "task" not in load_checkpoint(old, weights=False).meta
    predictor = Predictor.from_checkpoint(old)
    assert predictor.task is SENTENCE
    out = predictor.predict_frame(raw_rows())
    assert list(out.columns[-2:]) == SENTENCE.output_columns() == ["predicted_relation", "score"]


def test_a_checkpoint_of_an_unknown_task_is_refused_by_name(tmp_path):
    folder = make_checkpoint(tmp_path / "new")
    meta = json.loads((folder / "meta.json").read_text())
    (folder / "meta.json").write_text(json.dumps({**meta, "task": "hologram"}))
    with pytest.raises(CheckpointError, match="unknown task 'hologram'"):
        Predictor.from_checkpoint(folder)

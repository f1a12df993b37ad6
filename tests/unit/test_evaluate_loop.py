"""The evaluation-only loop in Ray Train's local mode: it scores the split exactly like the training loop does."""

from __future__ import annotations

import json

import numpy as np
import pytest
import ray.train
import torch
from ray.train.torch import TorchTrainer

from nre_ray.config import Config
from nre_ray.data.batches import EncodedSplit
from nre_ray.data.vocab import Vocab
from nre_ray.inference.evaluation import eval_loop_per_worker
from nre_ray.inference.predictor import Predictor
from nre_ray.models.registry import ModelSpec
from nre_ray.tasks.sentence import metrics as M
from nre_ray.tasks.sentence.classifier import build_model
from nre_ray.tasks.sentence.rows import probabilities
from tests.helpers import tiny_data


def test_local_mode_scores_every_row_once(tmp_path):
    data = tiny_data()
    cfg = Config.from_dict({"model": {"word_dim": 8, "pos_dim": 3, "hidden_size": 12}})
    spec = ModelSpec(len(data["vocab"]), len(data["labels"]), data["num_positions"])
    torch.manual_seed(0)
    model = build_model(cfg.model, spec)
    split = data["splits"]["test"]
    out = tmp_path / "result.json"
    TorchTrainer(
        eval_loop_per_worker,
        train_loop_config={"model": {"task": "sentence", "config": cfg.to_dict(), "state": model.state_dict(),
                                     "spec": (spec.vocab_size, spec.num_classes, spec.num_positions)},
                           "data": split, "labels": data["labels"], "negative_label": "no_relation",
                           "threads": 1, "sink": str(out)},
        scaling_config=ray.train.ScalingConfig(num_workers=0),
        run_config=ray.train.RunConfig(name="eval", storage_path=str(tmp_path)),
    ).fit()
    result = json.loads(out.read_text())

    predictor = Predictor(model, cfg, Vocab(data["vocab"]), data["labels"], spec.num_positions, torch.device("cpu"))
    predicted = probabilities(model, EncodedSplit(split), predictor).argmax(axis=1)
    cm = M.confusion_matrix(split["labels"], predicted, len(data["labels"]))
    assert result["rows"] == len(split["labels"]) and result["workers"] == 1
    assert np.array_equal(np.asarray(result["confusion_matrix"]), cm)
    expected = M.scores(cm, data["labels"], "no_relation")
    assert result["metrics"] == pytest.approx(expected)
    assert "pos_macro_f1" in result["metrics"]

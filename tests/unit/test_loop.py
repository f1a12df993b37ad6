"""The training loop under Ray Train: it learns, reports and writes checkpoints (local mode, no worker processes),
and Ray's best checkpoint is the loop's best epoch (one real worker)."""

import pytest
import ray.train
from ray.train.torch import TorchTrainer

from nre_ray.checkpoint import load_checkpoint
from nre_ray.config import Config
from nre_ray.loop import SELECTION_RANK, train_loop_per_worker
from tests.helpers import tiny_data


def _fit(tmp_path, name: str, epochs: int, lr: float, num_workers: int, **run: object) -> ray.train.Result:
    """Train the tiny data with a tiny CNN; ``run``: more RunConfig arguments."""
    cfg = Config.from_dict({"train": {"epochs": epochs, "batch_size": 8, "lr": lr, "seed": 3},
                            "model": {"word_dim": 16, "pos_dim": 4, "hidden_size": 16}})
    return TorchTrainer(
        train_loop_per_worker,
        train_loop_config={"config": cfg.to_dict(), "data": tiny_data(), "tracking_uri": None, "run_id": None},
        scaling_config=ray.train.ScalingConfig(num_workers=num_workers),
        run_config=ray.train.RunConfig(name=name, storage_path=str(tmp_path), **run),
    ).fit()


def test_local_mode_learns_and_checkpoints(tmp_path):
    result = _fit(tmp_path, "local", epochs=4, lr=0.01, num_workers=0)
    assert result.metrics["epoch"] == 4
    assert result.metrics["valid_macro_f1"] > 0.9
    loaded = load_checkpoint(result.checkpoint.to_directory(str(tmp_path / "ckpt")))
    assert loaded.state["epoch"] == 4
    assert loaded.labels == ["born_in", "founded_by", "no_relation"]
    assert loaded.meta["model"] == "cnn"
    assert set(loaded.state["model"]) >= {"fc.weight", "encoder.embedding.word.weight"}
    assert loaded.state["scaler"] == {}  # no loss scaling on the CPU; fp16 runs keep their scale here


@pytest.mark.integration
def test_a_tie_on_validation_keeps_the_first_best_epoch_as_the_best_checkpoint(ray_cluster, tmp_path):
    """Once the tiny set is learned, later epochs only tie the best validation score. The best checkpoint Ray
    returns must be the loop's best epoch (the first to reach the score), whose weights were scored on test; with the
    score itself as Ray's ranking a later tied epoch was returned instead. One real worker: local mode keeps no
    checkpoint ranking."""
    keep = ray.train.CheckpointConfig(num_to_keep=2, checkpoint_score_attribute=SELECTION_RANK,
                                      checkpoint_score_order="max")
    result = _fit(tmp_path, "ties", epochs=5, lr=0.02, num_workers=1, checkpoint_config=keep)
    last = result.metrics
    best_epoch = int(last["best_epoch"])
    assert best_epoch < last["epoch"] and last["valid_macro_f1"] == 1.0  # the later epochs tie the best (1.0)
    best = result.get_best_checkpoint(metric=SELECTION_RANK, mode="max")
    loaded = load_checkpoint(best.to_directory(str(tmp_path / "best")))
    assert loaded.state["epoch"] == best_epoch
    assert loaded.state["best_model"] is None  # its own weights are the selected ones
    assert loaded.state["metrics"][SELECTION_RANK] == best_epoch

"""The training loop under Ray Train's local mode (no worker processes): it learns, reports and writes checkpoints.
On real workers: tests/integration/test_loop_workers.py."""

import ray.train
from ray.train.torch import TorchTrainer

from nre_ray.checkpoint import load_checkpoint
from nre_ray.config import Config
from nre_ray.loop import train_loop_per_worker
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

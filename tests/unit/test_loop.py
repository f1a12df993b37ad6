"""The training loop in Ray Train's local mode (no worker processes): it learns, reports and writes checkpoints."""

import ray.train
from ray.train.torch import TorchTrainer

from nre_ray.checkpoint import load_checkpoint
from nre_ray.config import Config
from nre_ray.loop import train_loop_per_worker
from tests.helpers import tiny_data


def test_local_mode_learns_and_checkpoints(tmp_path):
    cfg = Config.from_dict({"train": {"epochs": 4, "batch_size": 8, "lr": 0.01, "seed": 3},
                            "model": {"word_dim": 16, "pos_dim": 4, "hidden_size": 16}})
    trainer = TorchTrainer(
        train_loop_per_worker,
        train_loop_config={"config": cfg.to_dict(), "data": tiny_data(), "tracking_uri": None, "run_id": None},
        scaling_config=ray.train.ScalingConfig(num_workers=0),
        run_config=ray.train.RunConfig(name="local", storage_path=str(tmp_path)),
    )
    result = trainer.fit()
    assert result.metrics["epoch"] == 4
    assert result.metrics["valid_macro_f1"] > 0.9
    loaded = load_checkpoint(result.checkpoint.to_directory(str(tmp_path / "ckpt")))
    assert loaded.state["epoch"] == 4
    assert loaded.labels == ["born_in", "founded_by", "no_relation"]
    assert loaded.meta["model"] == "cnn"
    assert set(loaded.state["model"]) >= {"fc.weight", "encoder.embedding.word.weight"}
    assert loaded.state["scaler"] == {}  # no loss scaling on the CPU; fp16 runs keep their scale here

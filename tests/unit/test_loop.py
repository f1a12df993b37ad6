"""The training loop under Ray Train's local mode (no worker processes): it learns, reports and writes checkpoints.
On real workers: tests/integration/test_loop_workers.py."""


from nre_ray.run.checkpoint import load_checkpoint
from tests.helpers import fit_tiny_cnn


def test_local_mode_learns_and_checkpoints(tmp_path):
    result = fit_tiny_cnn(tmp_path, "local", epochs=4, lr=0.01, num_workers=0)
    assert result.metrics["epoch"] == 4
    assert result.metrics["valid_macro_f1"] > 0.9
    loaded = load_checkpoint(result.checkpoint.to_directory(str(tmp_path / "ckpt")))
    assert loaded.state["epoch"] == 4
    assert loaded.labels == ["born_in", "founded_by", "no_relation"]
    assert loaded.meta["model"] == "cnn" and loaded.meta["task"] == "sentence"  # evaluate/predict/serve read it
    assert set(loaded.state["model"]) >= {"fc.weight", "encoder.embedding.word.weight"}
    assert loaded.state["scaler"] == {}  # no loss scaling on the CPU; fp16 runs keep their scale here

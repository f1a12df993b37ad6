"""The training loop on real Ray Train workers (the session's local Ray): Ray's best checkpoint is the loop's best
epoch, and an elastic run resized 3 -> 2 -> 3 learns as one fixed at 3 workers. The loop's other checks run in Ray
Train's local mode, in tests/unit/test_loop.py and tests/unit/test_elastic.py."""

from __future__ import annotations

import pytest
import ray.train
from ray.train.torch import TorchTrainer

from nre_ray.config import Config
from nre_ray.run.checkpoint import load_checkpoint
from nre_ray.run.loop import SELECTION_RANK, train_loop_per_worker
from tests.helpers import fit_tiny_cnn, tiny_data
from tests.unit.test_elastic import CFG

pytestmark = pytest.mark.integration


def test_a_tie_on_validation_keeps_the_first_best_epoch_as_the_best_checkpoint(ray_cluster, tmp_path):
    """Once the tiny set is learned, later epochs only tie the best validation score. The best checkpoint Ray
    returns must be the loop's best epoch (the first to reach the score), whose weights were scored on test; with the
    score itself as Ray's ranking a later tied epoch was returned instead. One real worker: local mode keeps no
    checkpoint ranking."""
    keep = ray.train.CheckpointConfig(num_to_keep=2, checkpoint_score_attribute=SELECTION_RANK,
                                      checkpoint_score_order="max")
    result = fit_tiny_cnn(tmp_path, "ties", epochs=5, lr=0.02, num_workers=1, checkpoint_config=keep)
    last = result.metrics
    best_epoch = int(last["best_epoch"])
    assert best_epoch < last["epoch"] and last["valid_macro_f1"] == 1.0  # the later epochs tie the best (1.0)
    best = result.get_best_checkpoint(metric=SELECTION_RANK, mode="max")
    loaded = load_checkpoint(best.to_directory(str(tmp_path / "best")))
    assert loaded.state["epoch"] == best_epoch
    assert loaded.state["best_model"] is None  # its own weights are the selected ones
    assert loaded.state["metrics"][SELECTION_RANK] == best_epoch


def _fit(tmp_path, name: str, epochs: int, world: int) -> ray.train.Result:
    """An elastic run (1-3) of the tiny data up to ``epochs``, at ``world`` workers; it resumes the run ``name``."""
    cfg = Config.from_dict({**CFG, "train": {**CFG["train"], "epochs": epochs}})
    return TorchTrainer(
        train_loop_per_worker,
        train_loop_config={"config": cfg.to_dict(), "data": tiny_data(), "tracking_uri": None, "run_id": None},
        scaling_config=ray.train.ScalingConfig(num_workers=world, resources_per_worker={"CPU": 0.5}),
        run_config=ray.train.RunConfig(name=name, storage_path=str(tmp_path)),
    ).fit()


def _losses(tmp_path, name: str) -> list[tuple[int, float, float, int]]:
    result = ray.train.Result.from_path(str(tmp_path / name))
    return [(int(m["epoch"]), m["train_loss"], m["valid_loss"], int(m["workers"]))
            for _, m in result.best_checkpoints if "epoch" in m]


def test_a_run_resized_3_2_3_learns_as_one_fixed_at_3(ray_cluster, tmp_path):
    """The resizes are made by resuming the run's epoch checkpoint at another world size (Ray decides when an
    elastic run resizes, from the cluster's resources; one machine cannot make it resize at a chosen epoch). Every
    epoch matches the fixed run to float tolerance, the resized ones too: only the summation order differs (dropout,
    whose masks are drawn per rank, is off)."""
    _fit(tmp_path, "fixed", 3, 3)
    for epochs, world in ((1, 3), (2, 2), (3, 3)):
        _fit(tmp_path, "resized", epochs, world)
    fixed, resized = _losses(tmp_path, "fixed"), _losses(tmp_path, "resized")
    assert [e for e, *_ in resized] == [1, 2, 3] and [w for *_, w in resized] == [3, 2, 3]
    for (_, *mine, _), (_, *theirs, _) in zip(resized, fixed, strict=True):
        assert mine == pytest.approx(theirs, rel=1e-4)

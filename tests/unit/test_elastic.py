"""Elastic runs (``--num-workers MIN-MAX``): the same updates at every world size, and a position in an epoch that
means the same examples at any world size (:mod:`nre_ray.run.elastic`). The ranks of a world are simulated in this
process: each rank's gradients are computed apart and summed, which is what the one all-reduce of a step does."""

from __future__ import annotations

import time

import pytest
import ray
import ray.train
import torch
from packaging.version import Version
from ray.train.torch import TorchTrainer

from nre_ray.cluster.ray_private import elastic_trainer
from nre_ray.config import Config, ConfigError, build_parser, config_from_args
from nre_ray.data.batches import EncodedSplit
from nre_ray.data.encode import EncodedDataset
from nre_ray.models.registry import ModelSpec
from nre_ray.run import elastic, runner
from nre_ray.run.loop import train_loop_per_worker
from nre_ray.tasks.sentence.classifier import build_model
from nre_ray.tasks.sentence.task import SENTENCE
from tests.helpers import elastic_step_gradients, tiny_data

CFG = {"train": {"batch_size": 5, "num_workers": "1-3", "seed": 5, "lr": 0.01},
       "model": {"word_dim": 16, "pos_dim": 4, "hidden_size": 16, "dropout": 0.0, "embedding_dropout": 0.0}}


def test_num_workers_min_max_parses_and_bad_ranges_are_refused():
    parse = build_parser().parse_args
    cfg = config_from_args(parse(["--num-workers", "1-3", "--max-preemptions", "4"]))
    assert (cfg.elastic, cfg.train.min_workers, cfg.train.num_workers, cfg.train.max_preemptions) == (True, 1, 3, 4)
    assert not config_from_args(parse(["--num-workers", "3"])).elastic
    for bad, said in (("3-1", "MIN must be >= 1 and <= MAX"), ("0-2", "MIN must be >= 1"),
                      ("two", "neither N nor MIN-MAX")):
        with pytest.raises(ConfigError, match=said):
            config_from_args(parse(["--num-workers", bad]))
    assert Config.from_dict(Config.from_dict(CFG).to_dict()).train.min_workers == 1  # a checkpoint's config


def test_every_example_once_per_epoch_at_any_world_size_and_across_a_resize():
    order = elastic.epoch_order(50, seed=5, epoch=2)
    batch, steps = 12, 5  # ceil(50 / 12)

    def seen(world: int, first: int, last: int) -> list[int]:
        out = []
        for step in range(first, last):
            for rank in range(world):
                parts, count = elastic.step_share(order, step, batch, rank, world, micro=4)
                assert all(len(p) <= 4 for p in parts)
                out += [int(i) for p in parts for i in p]
            assert count == min(batch, 50 - step * batch)
        return out

    for world in (1, 2, 3, 7):
        assert sorted(seen(world, 0, steps)) == list(range(50))
    resized = seen(3, 0, 2) + seen(2, 2, 4) + seen(3, 4, steps)  # 3 -> 2 -> 3 workers, resumed at steps 2 and 4
    assert sorted(resized) == list(range(50))


def _gradients(world: int, step: int) -> list[torch.Tensor]:
    """The summed gradients of one step of the tiny data at ``world`` simulated ranks."""
    data = tiny_data()
    cfg = Config.from_dict(CFG)
    dataset = EncodedDataset(EncodedSplit(data["splits"]["train"], "train"))
    spec = ModelSpec(len(data["vocab"]), len(data["labels"]), data["num_positions"])
    return elastic_step_gradients(SENTENCE, lambda: build_model(cfg.model, spec), dataset, world, step,
                                  elastic.global_batch(cfg), cfg.train.batch_size, cfg.train.seed)


@pytest.mark.parametrize("step", [0, 2])  # a full global batch of 15, and the last of 36 rows (6)
def test_one_update_is_the_same_at_every_world_size(step):
    fixed = _gradients(3, step)
    for world in (1, 2):
        for mine, theirs in zip(_gradients(world, step), fixed, strict=True):
            torch.testing.assert_close(mine, theirs, rtol=1e-5, atol=1e-7)


class NodeGone(Exception):
    """The preempted node going away: the worker's training function ends where it is."""


def _local_fit(cfg: Config, train_fn) -> ray.train.Result:
    """``train_fn(loop_config)`` in Ray Train's local mode (in this process) on the tiny data."""
    return TorchTrainer(
        train_fn,
        train_loop_config={"config": cfg.to_dict(), "data": tiny_data(), "tracking_uri": None, "run_id": None},
        scaling_config=ray.train.ScalingConfig(num_workers=0),
    ).fit()


def test_a_run_resumed_from_a_mid_epoch_checkpoint_learns_as_one_never_interrupted(monkeypatch, capsys):
    """A preemption notice in the middle of epoch 2 of 3, the node gone a step later, and the run resumed from the
    mid-epoch checkpoint: every epoch's losses and validation scores are those of the run that was never
    interrupted, each epoch is reported once, and each example of the interrupted epoch is trained on exactly once
    across the two parts.

    Ray Train's local mode (``num_workers=0``) runs the loop in this process with no preemption watcher, so the
    notice is handed to the loop where it reads one: ``nre_ray.run.loop.preemption_notice`` answers a real
    ``ray.train.PreemptionInfo`` at one step; from there on the loop's own path runs (the notice in the step's
    reduction, ``_report_position``, a real checkpoint reported through ``ray.train.report``). The node's end is that
    function raising at the next step, before that step's update. The restart is what Ray's controller does after a
    preemption: the training function runs again, and ``ray.train.get_checkpoint()`` (in local mode: the last
    checkpoint reported in this process) gives it the mid-epoch checkpoint. What each step trains on is recorded at
    ``nre_ray.run.elastic.accumulate``, each epoch's metrics at ``nre_ray.run.loop._report``; both then run as they
    are."""
    from nre_ray.run import loop
    from nre_ray.run.checkpoint import load_checkpoint

    cfg = Config.from_dict({**CFG, "train": {**CFG["train"], "epochs": 3}})  # 36 rows: 3 steps of 15, 15, 6
    reports: list[dict] = []
    trained: list[tuple[int, list[int]]] = []  # (epoch, the examples of one step), one world: one call a step
    report, accumulate = loop._report, elastic.accumulate

    def recording_report(run, metrics, *args, **kwargs):
        reports.append(dict(metrics))
        return report(run, metrics, *args, **kwargs)

    def recording_accumulate(task, model, dataset, parts, *args, **kwargs):
        trained.append((reports[-1]["epoch"] + 1 if reports else 1, [int(i) for p in parts for i in p]))
        return accumulate(task, model, dataset, parts, *args, **kwargs)

    monkeypatch.setattr(loop, "_report", recording_report)
    monkeypatch.setattr(elastic, "accumulate", recording_accumulate)
    _local_fit(cfg, train_loop_per_worker)
    fixed, reports[:] = list(reports), []
    assert [m["epoch"] for m in fixed] == [1, 2, 3]
    trained.clear()

    calls = {"n": 0, "kept": 0}
    notice = ray.train.PreemptionInfo(deadline_ms=None, preempted_node_to_ranks={"spot": [0]})

    def notice_at_epoch_2_step_1():  # called once a step, after the step's forward and backward passes
        calls["n"] += 1
        if calls["n"] == 5:  # epoch 2, step 1 (0-based): its update is made and the checkpoint saved after it
            calls["kept"] = len(trained)
            return notice
        if calls["n"] == 6:  # the node is gone: step 2 is lost
            del trained[calls["kept"]:]
            raise NodeGone
        return None

    saved: dict = {}

    def preempted_then_restarted(loop_config: dict) -> None:
        with pytest.raises(NodeGone):
            train_loop_per_worker(loop_config)
        with ray.train.get_checkpoint().as_directory() as folder:
            saved.update(load_checkpoint(folder).state)
        train_loop_per_worker(loop_config)

    monkeypatch.setattr(loop, "preemption_notice", notice_at_epoch_2_step_1)
    _local_fit(cfg, preempted_then_restarted)
    assert (saved["epoch"], saved["position"]["step"], saved["position"]["partial"][1]) == (1, 2, 30)
    assert "resuming after epoch 1, step 2 of epoch 2, from" in capsys.readouterr().out
    for epoch in (2, 3):
        assert sorted(i for e, step in trained if e == epoch for i in step) == list(range(36)), epoch
    assert [m["epoch"] for m in reports] == [1, 2, 3]
    # the speed of the resumed epoch is that of its last 6 examples, trained on after the restart
    assert [m["examples_per_sec"] * m["epoch_seconds"] for m in reports] == pytest.approx([36, 6, 36])
    volatile = ("examples_per_sec", "epoch_seconds", "epoch_cpu_seconds")
    for mine, theirs in zip(reports, fixed, strict=True):
        assert {k: v for k, v in mine.items() if k not in volatile and not k.startswith("startup_")} == \
            pytest.approx({k: v for k, v in theirs.items() if k not in volatile and not k.startswith("startup_")},
                          rel=1e-6)


def _rank_of_two(rank: int, port: int, notices: list[tuple[bool, float | None]], out: str) -> None:
    """One rank of a real two-process gloo group on 127.0.0.1: this rank's gradients and view of a preemption notice
    through :func:`nre_ray.run.elastic.reduce_gradients`; what it returns is written to ``out``.RANK."""
    import json

    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    try:
        model = torch.nn.Linear(2, 1)
        answers, grads = [], []
        for notice in notices[rank::2]:
            for p in model.parameters():
                p.grad = torch.full_like(p, float(rank + 1))
            answers.append(elastic.reduce_gradients(model, *notice))
            grads.append([p.grad.flatten().tolist() for p in model.parameters()])
    finally:
        dist.destroy_process_group()
    with open(f"{out}.{rank}", "w") as fh:
        json.dump({"answers": answers, "grads": grads}, fh)


def test_every_rank_hears_of_a_preemption_and_its_deadline_whichever_rank_polled_first(tmp_path):
    """Each rank polls Ray for a notice on its own, so at a given step one rank may have it and another not yet (seen
    on a loaded machine: rank 0 saved the mid-epoch checkpoint without the node's deadline). The step's all-reduce
    carries the notice and the seconds to its deadline: every rank gets both."""
    import json

    import torch.multiprocessing as mp

    from tests.procs import free_port

    # per call, rank 0's view then rank 1's: (has a notice, seconds to its deadline)
    notices = [(False, None), (True, 12.0),  # only rank 1 heard: both learn of it, 12 s left
               (True, None), (True, 10.0),  # a notice without a deadline on rank 0: the deadline of rank 1's
               (True, 8.0), (True, 6.0),  # both: the mean
               (False, None), (False, None)]  # nobody
    out = str(tmp_path / "answers")
    mp.start_processes(_rank_of_two, args=(free_port(), notices, out), nprocs=2, start_method="spawn")
    answers = [json.loads((tmp_path / f"answers.{rank}").read_text()) for rank in (0, 1)]
    wanted = [[True, 12.0], [True, 10.0], [True, 7.0], [False, None]]
    assert [a["answers"] for a in answers] == [wanted, wanted]
    assert answers[0]["grads"] == answers[1]["grads"] == [[[3.0, 3.0], [3.0]]] * 4  # the gradients summed, as before


def test_the_elastic_policy_counts_the_reservation_in_the_installed_rays_shape():
    """Contract of ray_private.elastic_trainer's policy (its _count_possible_workers over Ray Train's
    ElasticScalingPolicy): Ray 2.60's coordinator reserves by node id, and the nodes that take no new work are left
    out; Ray 2.59's gives a list without ids (every node counted; a dict's .items() failed there). In both, a
    worker's share is not lost to Ray's float floor (1.98 CPUs hold 3 workers of 0.66)."""
    policy = elastic_trainer(TorchTrainer).scaling_policy(
        ray.train.ScalingConfig(num_workers=(1, 4), resources_per_worker={"CPU": 0.66}))
    policy._nodes, policy._nodes_read = {"a"}, time.monotonic()  # the nodes that take work, as just read: "a"
    if Version(ray.__version__) >= Version("2.60"):
        assert policy._count_possible_workers({"a": {"CPU": 0.66 * 3}, "b": {"CPU": 1.0}}) == 3  # b is draining
    else:
        assert policy._count_possible_workers([{"CPU": 0.66 * 3}, {"CPU": 1.0}]) == 4


@pytest.mark.parametrize("flags", [[], ["--num-workers", "1-3", "--max-preemptions", "4"]])
def test_the_failure_config_is_one_the_installed_ray_takes(flags):
    """runner.failure_config on the installed Ray: Ray 2.60's FailureConfig gets the grace past a preemption's
    deadline; Ray 2.59's has no such field (build_trainer failed there with a TypeError before any run started)."""
    cfg = config_from_args(build_parser().parse_args(flags))
    failure = runner.failure_config(cfg)
    assert failure.max_preemption_failures == (4 if flags else -1)
    assert failure.controller_failure_limit == (runner.ELASTIC_PLACEMENT_RETRIES if flags else 0)
    if Version(ray.__version__) >= Version("2.60"):
        assert failure.preemption_grace_s == runner.PREEMPTION_GRACE_S

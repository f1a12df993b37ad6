"""Score a checkpoint on a labelled file with the evaluation code of training (``python -m nre_ray.evaluate``).

The file is read and encoded with the checkpoint's vocabulary, labels and tokenizer settings by the checkpoint's task
(the pure functions of training: :meth:`nre_ray.tasks.base.Task.encode_file`); a row whose label the checkpoint does
not know is an error that names it. A TorchTrainer then runs :func:`eval_loop_per_worker` on ``--num-workers``
workers: each scores its exact shard (``nre_ray.run.loop.eval_loader``, every row once, no padding), the task's counts
(the sentence task's confusion matrix) are all-reduced (``nre_ray.run.loop.evaluate``) and rank 0 computes the task's
scores and hands them to the driver through a small actor. The numbers therefore do not depend on the number of
workers.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import ray
import torch

from nre_ray.cluster.session import (
    UsageError,
    cluster,
    cpu_allocator_env,
    local_cluster,
    placement_failed,
    ray_phase,
    ray_quiet_env,
    root_cause,
    set_placement_timeout,
    size_workers,
    start_ray,
    torch_config,
)
from nre_ray.config import Config
from nre_ray.core import console
from nre_ray.data.batches import EncodedSplit
from nre_ray.data.pipeline import LAYOUT, MARKER
from nre_ray.inference.predictor import ON_BAD_ROWS, resolve_checkpoint
from nre_ray.models.registry import ModelSpec
from nre_ray.run.checkpoint import load_checkpoint
from nre_ray.run.loop import eval_loader, evaluate, open_splits
from nre_ray.tasks.lookup import task_named, task_of


@ray.remote(num_cpus=0)
class ResultSink:
    """Holds what rank 0 reports (Ray Train keeps a report's metrics only together with a checkpoint)."""

    def __init__(self) -> None:
        self.result: dict[str, Any] | None = None

    def put(self, result: dict[str, Any]) -> None:
        """Store rank 0's result."""
        self.result = result

    def get(self) -> dict[str, Any] | None:
        """What was stored (None if nothing)."""
        return self.result


def eval_loop_per_worker(loop_config: dict[str, Any]) -> None:
    """Score this worker's shard; called by TorchTrainer on every rank.

    ``loop_config``: ``model`` (dict or ObjectRef: ``task`` (its name), ``config`` as Config.to_dict(), ``state``
    weights, ``spec`` (vocab_size, num_classes, num_positions, pretrained_config)), ``data`` (``{"cache": ...}``
    naming the folder of one saved split, as :func:`nre_ray.run.loop.open_splits` reads it; or a dict or ObjectRef of
    the encoded arrays, flat or padded: :class:`EncodedSplit`), ``labels``, ``negative_label``, ``trained`` (the
    metrics training recorded with the checkpoint: :meth:`~nre_ray.tasks.base.Task.checkpoint_scores`), ``threads``,
    ``sink`` (a :class:`ResultSink` handle, or an absolute path for a JSON file).
    """
    import ray.train
    import ray.train.torch

    ctx = ray.train.get_context()
    rank, world_size = ctx.get_world_rank(), ctx.get_world_size()
    torch.set_num_threads(max(1, int(loop_config.get("threads", 1))))
    payload = _resolve(loop_config["model"])
    cfg = Config.from_dict(payload["config"])
    task = task_named(payload["task"])
    model = task.build_model(cfg.model, ModelSpec(*payload["spec"]))
    model.load_state_dict(payload["state"])
    model.to(ray.train.torch.get_device())  # no DDP: nothing is trained, and ranks may run different batch counts
    data = _resolve(loop_config["data"])
    # the saved split's files, read by rows (this worker reads its shard's rows only), or arrays (flat or padded), or
    # a split of a task without flat arrays, shipped as it is (_ship)
    if not isinstance(data, dict):
        split = data
    else:
        split = next(iter(open_splits(data, task).values())) if "cache" in data else EncodedSplit(data)
    labels = list(loop_config["labels"])
    loader = eval_loader(task, split, rank, world_size)
    counts, loss = evaluate(task, model, loader, labels)
    if rank != 0:
        return
    trained = loop_config.get("trained") or {}
    # the counts travel as the array they are (the bag task's are per bag: N x 2 x C floats, 18M at NYT10's test
    # size, which as a Python list took ~0.6 GB on rank 0 and again on the driver); only a test's JSON sink lists them
    result = {"metrics": task.checkpoint_scores(counts, labels, loop_config.get("negative_label"), trained),
              "loss": loss, "confusion_matrix": counts, "labels": labels, "rows": len(loader.dataset),
              "workers": world_size}
    sink = loop_config["sink"]
    if isinstance(sink, str):
        Path(sink).write_text(json.dumps({**result, "confusion_matrix": counts.tolist()}), encoding="utf-8")
    else:
        ray.get(sink.put.remote(result))


def _resolve(value: Any) -> Any:
    return ray.get(value) if isinstance(value, ray.ObjectRef) else value


def evaluate_file(model: str, data: str, num_workers: int = 1, negative_label: str | None = None,
                  fmt: str | None = None, columns: str | None = None, on_bad_rows: str = "error",
                  tracking_uri: str | None = None, address: str | None = None,
                  cpus_per_worker: float | None = None) -> dict[str, Any]:
    """Evaluate ``model`` (checkpoint folder or MLflow model URI) on the labelled file ``data`` with ``num_workers``
    workers (``cpus_per_worker`` CPUs each: ``--cpus-per-worker``; default: sized as training sizes them).

    Returns ``model``, ``data``, ``task`` (the checkpoint's task), ``rows``, ``skipped``, ``workers``,
    ``negative_label``, ``metrics`` (the task's scores), ``loss``, ``per_class`` (one dict per label), ``labels`` and
    ``confusion_matrix`` (the task's counts as an array; the sentence task's: rows = gold, columns = predicted).
    """
    _check_options(num_workers, on_bad_rows, cpus_per_worker)
    ahead = local_cluster(address, use_gpu=False)  # an address Ray cannot join is refused before anything is loaded
    if ahead is not None:  # and workers the local Ray can never hold, before it starts
        size_workers(ahead, num_workers, cpus_per_worker=cpus_per_worker)
    loaded = _load_model(model, tracking_uri)
    negative = _negative(loaded, negative_label)
    task = task_of(loaded.meta)
    with console.get().phase("preprocess", f"reading, checking and encoding {data}") as step:
        # the checkpoint's task reads and encodes it as its training did; bad examples: a DataError, or skipped
        split, skipped = task.encode_file(data, loaded.config.data, loaded.vocab, loaded.labels, loaded.assets, fmt,
                                          columns, on_bad_rows)
        step.done(f"{len(split)} {task.unit}" + (f", {skipped} bad" if skipped else ""))
    if len(split) == 0:
        raise UsageError(f"{data}: no usable {task.unit} to evaluate")
    with tempfile.TemporaryDirectory(prefix="nre_ray_evaluate_data_") as folder:
        result = _run_trainer(loaded, lambda info: _ship(split, Path(folder) / "data", info), len(split), negative,
                              num_workers, address, cpus_per_worker)
    return _report(model, str(data), skipped, negative, result)


def evaluate_split(model: str, prepared: Any, split: str = "test", num_workers: int = 1,
                   negative_label: str | None = None, address: str | None = None,
                   cpus_per_worker: float | None = None, name: str | None = None) -> dict[str, Any]:
    """Evaluate the checkpoint folder ``model`` on the split ``split`` of the preprocessing result ``prepared``
    (:class:`nre_ray.data.pipeline.Prepared`) that it was trained on: the rows as training encoded them, read by the
    workers from the cache as training reads them (:func:`nre_ray.run.loop.open_splits`), not from the input file
    again (a sweep's final test). Returns what :func:`evaluate_file` returns, ``data`` naming the split's file.
    ``name``: what the console and the report call the checkpoint (a sweep's ``s3://`` checkpoint, of which
    ``model`` is a local copy); default ``model``."""
    _check_options(num_workers, "error", cpus_per_worker)
    loaded = _load_model(model, None, name)
    model = name or model
    if loaded.labels != prepared.labels or loaded.vocab.tokens != prepared.vocab.tokens:
        raise UsageError(f"{model}: this checkpoint was not trained on the preprocessed data in {prepared.cache_dir} "
                         "(other labels or vocabulary); evaluate it on a file instead")
    negative = _negative(loaded, negative_label)
    cache = {"dir": str(Path(prepared.cache_dir).absolute()), "shared": prepared.shared_cache_dir, "splits": [split]}
    result = _run_trainer(loaded, lambda info: {"cache": cache}, len(prepared.splits[split]), negative, num_workers,
                          address, cpus_per_worker)
    return _report(model, prepared.sources.get(split, split), 0, negative, result)


def _check_options(num_workers: int, on_bad_rows: str, cpus_per_worker: float | None) -> None:
    if num_workers < 1:
        raise UsageError("--num-workers must be >= 1")
    if cpus_per_worker is not None and cpus_per_worker < 0.01:
        raise UsageError("--cpus-per-worker must be >= 0.01")
    if on_bad_rows not in ON_BAD_ROWS:
        raise UsageError(f"--on-bad-rows must be one of {', '.join(ON_BAD_ROWS)}")


def _load_model(model: str, tracking_uri: str | None, name: str | None = None) -> Any:
    """The checkpoint ``model`` (a folder or an MLflow model URI), loaded in a ``model`` phase that names it ``name``
    (default: ``model``)."""
    with console.get().phase("model", f"loading {name or model}") as step:
        resolved = resolve_checkpoint(model, tracking_uri)
        try:
            loaded = load_checkpoint(resolved.checkpoint)
        finally:
            resolved.cleanup()
        task_of(loaded.meta, "evaluate")  # a task whose models evaluate does not take yet: one line
        step.done(f"{loaded.meta.get('model')}, epoch {loaded.meta.get('epoch')}, {len(loaded.labels)} labels")
    return loaded


def _negative(loaded: Any, negative_label: str | None) -> str | None:
    """The 'no relation' label: ``negative_label`` (one of the checkpoint's labels), else the one it trained with."""
    labels = loaded.labels
    if negative_label and negative_label not in labels:
        raise UsageError(f"--negative-label {negative_label!r} is not one of the checkpoint's labels "
                         f"({', '.join(labels[:10])}{', ...' if len(labels) > 10 else ''})")
    return negative_label or loaded.config.data.negative_label


def trained_metrics(loaded: Any) -> dict[str, float]:
    """The metrics training recorded with the checkpoint ``loaded`` (its state's ``metrics``; {} when none)."""
    return {str(k): float(v) for k, v in (loaded.state.get("metrics") or {}).items()}


def _report(model: str, data: str, skipped: int, negative: str | None, result: dict[str, Any]) -> dict[str, Any]:
    labels, task = result["labels"], task_named(result["task"])
    counts = np.asarray(result["confusion_matrix"])
    return {"model": model, "data": data, "task": task.name, "unit": task.unit, "rows": result["rows"],
            "skipped": skipped, "shown": list(task.report_metrics or result["metrics"]),
            "workers": result["workers"], "negative_label": negative if negative in labels else None,
            "metrics": result["metrics"], "loss": result["loss"],
            "per_class": task.checkpoint_per_label(counts, labels, result["trained"]),
            "labels": labels, "confusion_matrix": counts}


def _run_trainer(loaded: Any, ship: Callable[[Any], Any], rows: int, negative: str | None, num_workers: int,
                 address: str | None, cpus_per_worker: float | None) -> dict[str, Any]:
    """Score ``loaded`` with :func:`eval_loop_per_worker` on ``num_workers`` workers; ``ship(info)`` (called once
    Ray runs, with the :class:`nre_ray.cluster.session.Cluster`) gives the workers' ``data``, ``rows`` rows."""
    import ray.train
    from ray.train.torch import TorchTrainer

    out = console.get()
    with out.phase("ray", ray_phase(address)) as step:
        # Ray's messages (the controller's retries under load) stay in its log files; failures come back as errors
        start_ray(address, log_to_driver=False)
        info = cluster()  # sized as train sizes: the alive nodes and the node types the autoscaler may add
        resources = size_workers(info, num_workers, cpus_per_worker=cpus_per_worker)
        step.done(f"{len(info.nodes)} node(s); {num_workers} worker(s), {resources.per_worker} each")
        if resources.waits:
            step.note(f"the alive nodes cannot hold the workers yet; waiting up to {resources.placement_timeout:g} "
                      f"s for the autoscaler to add nodes ({info.describe_types()})")
    meta = loaded.meta
    task = task_of(meta)
    payload = {"task": task.name, "config": loaded.config.to_dict(), "state": loaded.state["model"],
               "spec": (int(meta["vocab_size"]), int(meta["num_classes"]), int(meta["num_positions"]),
                        loaded.pretrained_config)}
    sink = ResultSink.remote()
    set_placement_timeout(resources.placement_timeout)
    with tempfile.TemporaryDirectory(prefix="nre_ray_evaluate_") as storage:
        trainer = TorchTrainer(
            eval_loop_per_worker,
            torch_config=torch_config(),  # on a local Ray, PyTorch's rendezvous listens on 127.0.0.1 alone
            train_loop_config={"model": ray.put(payload), "data": ship(info), "labels": loaded.labels,
                               "negative_label": negative, "trained": trained_metrics(loaded),
                               "threads": resources.threads, "sink": sink},
            scaling_config=ray.train.ScalingConfig(num_workers=num_workers, resources_per_worker=resources.per_worker),
            run_config=ray.train.RunConfig(
                name=f"evaluate-{uuid.uuid4().hex[:8]}", storage_path=storage,
                failure_config=ray.train.FailureConfig(controller_failure_limit=0),
                logging_config=ray.train.LoggingConfig(log_level="WARNING"),
                worker_runtime_env={"env_vars": {**ray_quiet_env(), **cpu_allocator_env()}},
            ),
        )
        with out.phase("evaluate", f"scoring {rows} {task.unit} on {num_workers} worker(s)") as step:
            try:
                with _no_preemption_watcher():
                    trainer.fit()
            except ray.train.TrainingFailedError as err:
                if placement_failed(err):
                    raise UsageError(f"the {num_workers} evaluation worker(s) ({resources.per_worker} each) could "
                                     f"not be placed within {resources.placement_timeout:g} s. Check `ray status`, "
                                     "or ask for fewer workers.") from None
                raise UsageError(f"evaluation failed: {root_cause(err)}") from None
            step.done("done")
    result = ray.get(sink.get.remote())
    ray.kill(sink)
    if result is None:
        raise UsageError("evaluation failed: rank 0 reported no result")
    return {**result, "task": task.name, "trained": trained_metrics(loaded)}


#: Ray Train's switch of its preemption watcher, an actor per worker group that polls the GCS for drained nodes
#: (ray.train.get_preemption_info). The controller reads it from the driver's environment when ``fit`` starts it.
PREEMPTION_WATCHER_ENV = "RAY_TRAIN_ENABLE_PREEMPTION_WATCHER"


@contextlib.contextmanager
def _no_preemption_watcher() -> Iterator[None]:
    """While the block runs, Ray Train starts no preemption watcher: scoring never asks for preemption notices (a
    drained node is a worker failure like any other), and killing the watcher when the worker group stops made its
    process log a ``core_worker.cc`` error (``PreemptionWatcher ... max_restarts``) into a successful evaluation's
    output. Training keeps its watcher (:mod:`nre_ray.run.elastic` reads the notices)."""
    before = os.environ.get(PREEMPTION_WATCHER_ENV)
    os.environ[PREEMPTION_WATCHER_ENV] = "0"
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(PREEMPTION_WATCHER_ENV, None)
        else:
            os.environ[PREEMPTION_WATCHER_ENV] = before


def _ship(split: EncodedSplit, folder: Path, info: Any) -> Any:
    """How the workers get the encoded rows: on one node, the split saved in ``folder`` (each worker memory-maps it
    and reads only its shard's rows); where there are several or the autoscaler may add some (``info``: the
    :class:`nre_ray.cluster.session.Cluster`), through the object store (``folder`` is not on the others)."""
    if info.multi_node:  # the sentence task's flat arrays; another task's split as it is
        return ray.put(split.flat if isinstance(split, EncodedSplit) else split)
    folder.mkdir(parents=True)
    split.save(folder, "eval")
    (folder / MARKER).write_text(json.dumps({"layout": LAYOUT, "splits": ["eval"]}), encoding="utf-8")
    return {"cache": {"dir": str(folder), "shared": None, "splits": ["eval"]}}

"""The per-worker training loop that Ray Train's TorchTrainer runs: build, prepare, epochs, evaluate, report.

Every rank runs the same code. Distribution shows up in three places only: ``prepare_model`` / ``prepare_data_loader``
(DDP and the DistributedSampler), the all-reduce of the task's counts in :func:`evaluate` (so every example is
counted exactly once whatever the number of workers), and rank 0 alone writing checkpoints and MLflow data.
(Per-epoch metrics are logged by the controller when Ray registers the epoch's checkpoint:
:mod:`nre_ray.tracking.callback`.)

What differs between tasks (the batches, the model's head and loss, the metrics' counts, scores and reports) the
loop asks the run's task (:class:`nre_ray.tasks.base.Task`, named by the driver in ``loop_config["task"]`` and
recorded in every checkpoint's meta.json); nothing here branches on the task.

One worker's run is one object, :class:`WorkerRun` (settings, rank, task, data, model, optimizer, schedule, scaler,
tracker) with its checkpointed progress, :class:`TrainState`; :func:`train_loop_per_worker` starts it and hands it to
the epoch (:func:`_epoch`), the epoch's report (:func:`_report`) and the final scoring (:func:`_final`).
"""

from __future__ import annotations

import contextlib
import copy
import logging
import math
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import ray
import ray.train
import ray.train.torch
import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader, DistributedSampler, RandomSampler, Sampler

from nre_ray.cluster.ray_private import in_local_train_mode, preemption_notice
from nre_ray.config import Config
from nre_ray.core import buildonce, tempfiles
from nre_ray.core.console import NOTES_KEY, RESUME_NOTE
from nre_ray.data.batches import EncodedSplit
from nre_ray.data.encode import identity_collate
from nre_ray.data.vocab import Vocab
from nre_ray.models.pretrained import load_word_vectors, word_embedding
from nre_ray.models.registry import ModelSpec
from nre_ray.run import elastic
from nre_ray.run.checkpoint import check_compatible, load_checkpoint, save_checkpoint
from nre_ray.run.optim import Schedule, build_optimizer, steps_per_epoch
from nre_ray.tasks.base import Task
from nre_ray.tasks.lookup import DEFAULT_TASK, task_named
from nre_ray.tracking.store import FIRST_STEP_AT, Tracker, make_tracker

log = logging.getLogger(__name__)
INTS_AT_ONCE = 65536
"""The samplers' indices become Python ints this many at a time (:class:`LeanDistributedSampler`)."""


class ShardSampler(Sampler[int]):
    """Rank ``r`` of ``w`` gets indices ``r, r + w, r + 2w, ...``: every example exactly once, no padding. With
    ``block`` > 1, whole blocks of ``block`` indices in turn (blocks ``r, r + w, ...``): a loader with that batch size
    then makes the same batches on any number of workers."""

    def __init__(self, n: int, rank: int, world_size: int, block: int = 1) -> None:
        if block == 1:
            self.indices: Any = range(rank, n, world_size)
        else:
            starts = range(rank * block, n, world_size * block)
            self.indices = [i for s in starts for i in range(s, min(s + block, n))]

    def __iter__(self) -> Iterator[int]:
        return iter(self.indices)

    def __len__(self) -> int:
        return len(self.indices)


class LeanDistributedSampler(DistributedSampler):
    """torch's ``DistributedSampler``: the same indices in the same order, without a dataset-sized Python list.

    ``DistributedSampler.__iter__`` turns each epoch's permutation into a list of Python ints (``tolist()``) and keeps
    this rank's share of those int objects alive through the epoch, in pymalloc arenas that stay resident: ~150 MB
    per worker at 4.5M training rows, growing with the data. This one keeps the permutation as a tensor (8 bytes a
    row) and hands out Python ints a chunk at a time. Constructed as Ray Train's ``prepare_data_loader`` constructs
    its own (rank, world size and seed 0 from the process group), which then keeps it.
    """

    def __iter__(self) -> Iterator[int]:
        n = len(self.dataset)  # type: ignore[arg-type]
        if self.shuffle:
            g = torch.Generator()
            g.manual_seed(self.seed + self.epoch)
            indices = torch.randperm(n, generator=g)
        else:
            indices = torch.arange(n)
        if not self.drop_last:
            padding = self.total_size - n
            if padding > 0:  # repeat the first rows so that every rank gets as many
                indices = torch.cat([indices, indices.repeat(math.ceil(padding / n))[:padding]])
        else:
            indices = indices[:self.total_size]
        shard = indices[self.rank:self.total_size:self.num_replicas].clone()  # (num_samples,)
        del indices
        yield from _as_ints(shard)


class LeanRandomSampler(RandomSampler):
    """torch's ``RandomSampler`` (the one worker's shuffle): the same indices in the same order, drawn from the same
    generator, without holding each permutation as a list of Python ints (see :class:`LeanDistributedSampler`)."""

    def __iter__(self) -> Iterator[int]:
        if self.replacement or self.generator is None:
            yield from super().__iter__()
            return
        n = len(self.data_source)
        for _ in range(self.num_samples // n):
            yield from _as_ints(torch.randperm(n, generator=self.generator))
        # torch draws one more permutation for the remainder, even an empty one: so does this, for the next epoch
        yield from _as_ints(torch.randperm(n, generator=self.generator)[:self.num_samples % n])


def _as_ints(indices: torch.Tensor) -> Iterator[int]:
    """The 1-D tensor's values as Python ints, :data:`INTS_AT_ONCE` at a time."""
    for part in indices.split(INTS_AT_ONCE):
        yield from part.tolist()


def unwrap(model: nn.Module) -> nn.Module:
    """The model inside a DDP wrapper (or the model itself)."""
    return model.module if isinstance(model, nn.parallel.DistributedDataParallel) else model


def _several_ranks() -> bool:
    """Whether this process is one of several in a torch process group (a collective has others to meet)."""
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def _all_reduce(t: torch.Tensor) -> torch.Tensor:
    if _several_ranks():
        dist.all_reduce(t)
    return t


def eval_loader(task: Task, split: EncodedSplit, rank: int, world_size: int) -> DataLoader:
    """A loader over this rank's exact shard of ``split`` (no DistributedSampler padding; ``task``'s batches), moved
    to the device."""
    block = task.eval_batch_size if task.eval_blocks else 1
    loader = DataLoader(task.dataset(split), batch_size=task.eval_batch_size,
                        sampler=ShardSampler(len(split), rank, world_size, block), collate_fn=identity_collate)
    return ray.train.torch.prepare_data_loader(loader, add_dist_sampler=False)


def shared_scores(task: Task, counts: np.ndarray, labels: list[str], negative_label: str | None,
                  rank: int) -> dict[str, float]:
    """``task``'s scores of the all-reduced ``counts``, computed by rank 0 and sent to every rank.

    Every rank gets the same dict, so they all take the same decisions (the best epoch, the learning-rate schedule,
    an early stop), and only rank 0 imports what scoring needs (scikit-learn for the sentence task: ~60 MB a process).
    """
    scores = [task.scores(counts, labels, negative_label) if rank == 0 else None]
    if _several_ranks():
        dist.broadcast_object_list(scores, src=0)
    return scores[0]


@torch.no_grad()
def evaluate(task: Task, model: nn.Module, loader: DataLoader, labels: list[str]) -> tuple[np.ndarray, float]:
    """``task``'s counts (:meth:`~nre_ray.tasks.base.Task.new_counts`: the sentence task's (C, C) confusion matrix)
    and the mean loss over the whole split, summed over all ranks: every example counted once."""
    model.eval()
    device = ray.train.torch.get_device()
    counts = task.new_counts(labels, len(loader.dataset), device)  # the whole split's examples, all ranks' shards
    loss_sum = torch.zeros(2, dtype=torch.float64, device=device)  # (sum of losses, count)
    for batch in loader:
        output = model(batch)  # the sentence task's: logits (B, C)
        loss_sum[0] += task.loss(output, batch, reduction="sum").double()
        loss_sum[1] += task.examples(batch)
        task.count(counts, output, batch)
    _all_reduce(counts)
    _all_reduce(loss_sum)
    mean_loss = (loss_sum[0] / loss_sum[1].clamp(min=1)).item()
    return counts.cpu().numpy(), mean_loss


def amp_dtype(device: torch.device, enabled: bool) -> torch.dtype | None:
    """The autocast dtype for training on ``device``: bf16 where the GPU supports it, else fp16; None on CPU/off."""
    if not enabled or device.type != "cuda":
        return None
    return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16


def autocast_context(device: torch.device, enabled: bool) -> contextlib.AbstractContextManager:
    """``torch.autocast`` on a CUDA device with ``enabled`` (see :func:`amp_dtype`); a no-op context otherwise."""
    dtype = amp_dtype(device, enabled)
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=dtype)


def grad_scaler(device: torch.device, enabled: bool) -> torch.amp.GradScaler:
    """A loss scaler, active only for fp16 autocast (bf16 and fp32 need none; a disabled one passes through)."""
    return torch.amp.GradScaler(device.type, enabled=amp_dtype(device, enabled) == torch.float16)


def _finite(value: float) -> float:
    """Ray stores NaN/inf score attributes as null, which breaks a later resume."""
    return value if math.isfinite(value) else 0.0


def _arrays(data: Any) -> dict[str, Any]:
    return ray.get(data) if isinstance(data, ray.ObjectRef) else data


def open_splits(data: dict[str, Any], task: Task | None = None) -> dict[str, EncodedSplit]:
    """This worker's view of the encoded splits, from the loop's ``data``, as ``task`` (default: the sentence task)
    opens its cache files (:meth:`~nre_ray.tasks.base.Task.open_split`).

    With ``cache``: ``{"dir": the local cache folder's absolute path, "shared": the shared cache's URI or None,
    "splits": names}`` (what :func:`nre_ray.run.runner.build_trainer` sends), the splits' ``.npy`` files are read by
    rows (:class:`nre_ray.data.rowfile.RowFile`) from the local folder when it is on this node (one machine, or the
    same path on every node), else from a copy of the shared cache made once per node
    (:func:`nre_ray.core.buildonce.local_copy`). Nothing is read until a batch asks for its rows, so a worker reads
    only its shard. With ``splits`` (name -> padded or flat arrays, in memory: tests and local runs), those arrays are
    used as they are.
    """
    if "splits" in data:
        return {name: EncodedSplit(arrays, name) for name, arrays in data["splits"].items()}

    task = task or task_named(DEFAULT_TASK)
    cache = data["cache"]
    folder = Path(cache["dir"]) if cache.get("dir") else None
    if folder is None or not task.splits_complete(folder, cache["splits"]):
        if not cache.get("shared"):
            raise FileNotFoundError(f"the preprocessed data is not on this node: {folder} (and no shared cache to "
                                    "copy it from: pass a shared --storage-path, or the same path on every node)")
        folder = buildonce.local_copy(cache["shared"])
        if not task.splits_complete(folder, cache["splits"]):  # complete, of this layout
            raise FileNotFoundError(f"the shared cache {cache['shared']} (copied to {folder}) lacks the splits "
                                    f"{cache['splits']}")
    return {name: task.open_split(folder, name) for name in cache["splits"]}


DDP_OPTIONS = {"gradient_as_bucket_view": True}
"""How DDP wraps the model: the gradients are views into its all-reduce buckets instead of a second copy, which
saves one model's worth of memory on every worker (35 MB for the CNN on 1M FewRel rows). The loop's
``zero_grad(set_to_none=True)``, ``no_sync`` accumulation, clipping and loss scaling all work on the views."""


def prepare_model(model: nn.Module) -> nn.Module:
    """Ray Train's ``prepare_model`` with :data:`DDP_OPTIONS` (no DDP with one worker)."""
    return ray.train.torch.prepare_model(model, parallel_strategy_kwargs=DDP_OPTIONS)


def place_and_restore(model: nn.Module, optimizer: torch.optim.Optimizer, scheduler: Schedule,
                      scaler: torch.amp.GradScaler, loaded_state: dict[str, Any] | None,
                      prepare: Callable[[nn.Module], nn.Module] | None = None) -> nn.Module:
    """Put ``model`` on this worker's device, then restore a checkpoint's ``loaded_state`` (None: a fresh run).

    ``prepare`` (default: :func:`prepare_model`) moves the parameters to the device, and wraps the model in DDP with
    more than one worker. It must come first: ``Optimizer.load_state_dict`` casts the saved state (Adam's
    moments) to the device each parameter is on *at load time*, and moving the model later moves only the
    parameters, so loading first left the moments on the CPU beside GPU parameters and the first step after a
    restart (``--resume``, or Ray's ``--max-failures``) failed. The weights load into the unwrapped module: every
    rank loads the same checkpoint after DDP's broadcast of rank 0's parameters, so the replicas stay equal. The
    loss scaler's state is loaded only where it was saved non-empty (fp16 runs). Returns the prepared model.
    """
    model = (prepare or prepare_model)(model)
    if loaded_state is not None:
        unwrap(model).load_state_dict(loaded_state["model"])
        optimizer.load_state_dict(loaded_state["optimizer"])
        scheduler.load_state_dict(loaded_state["scheduler"])
        if loaded_state.get("scaler"):  # fp16 runs (and checkpoints written before the scaler was saved: none)
            scaler.load_state_dict(loaded_state["scaler"])
    return model


#: The metric Ray Train keeps and picks checkpoints by: the epoch number when the epoch improved the selection
#: metric, else 0. Ranking by the validation score itself would let Ray pick a later epoch that only ties the best
#: score, whose weights are not the ones the loop selected and scored on the test split.
SELECTION_RANK = "selection_rank"


def _load_own_copy(checkpoint: ray.train.Checkpoint) -> Any:
    """The checkpoint a restarted worker resumes from (:func:`load_checkpoint`), read from a copy of this worker's
    own when it is in an object store. Ray's ``Checkpoint.as_directory`` shares one download folder among the workers
    of a node, and a worker that comes after another's download has ended downloads again into that folder, over the
    files the other is reading (seen as ``EOFError`` in ``torch.load`` after a lost node, on the stand-in)."""
    import pyarrow.fs

    if isinstance(checkpoint.filesystem, pyarrow.fs.LocalFileSystem):
        return load_checkpoint(Path(checkpoint.path))
    with tempfile.TemporaryDirectory(prefix=tempfiles.prefix("restore")) as folder:
        return load_checkpoint(Path(checkpoint.to_directory(folder)))


@dataclass
class TrainState:
    """The run's progress, as a checkpoint keeps it (:func:`_full_state`), all but ``saved_on_notice``.

    ``epoch``: the epochs done. ``best_model``: the best epoch's weights, a copy on the CPU (name -> tensor, each of
    its parameter's shape). ``position``: where in the next epoch a mid-epoch checkpoint left off (``step``: the
    global steps done; ``partial``: [the global sum of the losses, the examples] before it), None at an epoch's
    start. ``preemptions``: the notices the run has had (an elastic run's MLflow tag). ``saved_on_notice``: this
    worker group has saved its mid-epoch checkpoint for the notice it has (the notice stays until Ray restarts it).
    """

    epoch: int = 0
    best_score: float = -math.inf
    best_epoch: int = 0
    best_model: dict[str, torch.Tensor] | None = None
    position: dict[str, Any] | None = None
    preemptions: int = 0
    saved_on_notice: bool = False

    @classmethod
    def from_checkpoint(cls, state: dict[str, Any]) -> TrainState:
        """The progress a checkpoint's ``state`` records; its weights are the best ones when it keeps no others."""
        return cls(epoch=state["epoch"], best_score=state["best_score"], best_epoch=state["best_epoch"],
                   best_model=state.get("best_model") or state["model"], position=state.get("position"),
                   preemptions=state.get("preemptions", 0))


@dataclass(eq=False)
class WorkerRun:
    """One worker's run: its settings, place among the ranks, data, model and what trains it, and its progress.

    Built by :func:`_start`; the epochs (:func:`_epoch`), the reports (:func:`_report`, :func:`_report_position`)
    and the final scoring (:func:`_final`) take it. ``model`` is the prepared one (DDP with several workers, except in
    an elastic run); ``steps``: the optimizer steps an epoch has. The loaders hand out ``task``'s batches
    (:meth:`nre_ray.tasks.base.Task.dataset`; the sentence task's: dicts of (B, T) ``tokens``, ``head_pos``,
    ``tail_pos``, ``segments`` and ``mask``, (B, 2) ``head_span`` and ``tail_span``, and (B,) ``labels`` and
    ``index``).
    """

    cfg: Config
    rank: int
    world_size: int
    task: Task
    vocab: Vocab
    labels: list[str]
    spec: ModelSpec
    assets: dict[str, bytes] | None  # files every checkpoint carries (a pretrained encoder's tokenizer and config)
    splits: dict[str, EncodedSplit]
    tracker: Tracker
    model: nn.Module
    optimizer: torch.optim.Optimizer
    schedule: Schedule
    scaler: torch.amp.GradScaler  # one for the run (active only for fp16): its scale carries over epochs and resumes
    steps: int
    #: the task's own training batches for this rank (:meth:`nre_ray.tasks.base.Task.train_batches`), or None: the
    #: (distributed) random sampler's batches of ``--batch-size`` examples
    train_batches: Sampler[list[int]] | None = None
    state: TrainState = field(default_factory=TrainState)
    train_set: torch.utils.data.Dataset = field(init=False, repr=False)
    train_loader: DataLoader = field(init=False, repr=False)
    valid_loader: DataLoader = field(init=False, repr=False)


def train_loop_per_worker(loop_config: dict[str, Any]) -> None:
    """Train on this worker's shard; called by TorchTrainer on every rank.

    ``loop_config``: ``config`` (Config.to_dict()), ``data`` (dict or ObjectRef of a dict with ``cache`` (where the
    splits' files are) or ``splits`` (name -> arrays, in memory), see :func:`open_splits`; ``vocab``, ``labels``,
    ``num_positions``, optionally ``assets``), ``tracking_uri`` and ``run_id`` (or None), ``threads``, ``task`` (the
    task's name, :func:`nre_ray.tasks.lookup.task_named`; default the sentence task) and optionally ``startup`` (the
    driver's Unix times ``command`` and ``fit``: the first epoch reports the start-up split, which the controller
    logs at step 0, stamped with the first step's time).
    """
    entered = time.time()
    run = _start(loop_config)
    startup = loop_config.get("startup")
    marks: dict[str, float] = {}  # the start-up split, reported with the first epoch (logged by the controller)
    if startup and run.state.epoch == 0:  # the first training step is next (driver's marks: train.py)
        now = time.time()
        marks = {"startup_workers_s": now - startup["fit"], "startup_total_s": now - startup["command"],
                 "startup_loop_setup_s": now - entered, FIRST_STEP_AT: now}
    patience = run.cfg.train.patience
    for epoch in range(run.state.epoch + 1, run.cfg.train.epochs + 1):
        _report(run, {**_epoch(run, epoch), **marks})
        marks = {}
        # The epoch's metrics reach MLflow and the driver's console from the controller once Ray registers this
        # checkpoint (tracking_callback): the epoch line and an early stop are printed there, not here.
        if patience and epoch - run.state.best_epoch >= patience:  # epochs without improvement
            break
    _final(run)


def _start(loop_config: dict[str, Any]) -> WorkerRun:
    """This worker's run, from ``loop_config`` (see :func:`train_loop_per_worker`): built, resumed from Ray's
    checkpoint when there is one (:func:`_resume`), placed on the device and restored (:func:`_place`)."""
    cfg = Config.from_dict(loop_config["config"])
    tempfiles.remove_stale()  # what killed workers left on this machine (a checkpoint save cut short, say)
    # One progress line per epoch, not Ray's per-report INFO logs (some go to the root logger under a file name).
    logging.getLogger().setLevel(logging.WARNING)
    data = _arrays(loop_config["data"])
    ctx = ray.train.get_context()
    rank, world_size = ctx.get_world_rank(), ctx.get_world_size()
    torch.set_num_threads(max(1, int(loop_config.get("threads", 1))))
    torch.manual_seed(cfg.train.seed)
    tracker = make_tracker(rank, loop_config.get("tracking_uri"), loop_config.get("run_id"))

    vocab, labels = Vocab.from_json(data["vocab"]), list(data["labels"])
    task = task_named(loop_config.get("task", DEFAULT_TASK))
    splits = open_splits(data, task)  # read by rows from the cache folder: this rank reads only the rows it is given
    spec = ModelSpec(len(vocab), len(labels), int(data["num_positions"]))
    model = task.build_model(cfg.model, spec)
    # An elastic run's steps are global batches, the same number at every world size (nre_ray.run.elastic).
    batches = None if cfg.elastic else task.train_batches(splits["train"], cfg.train.batch_size, rank, world_size,
                                                          cfg.train.seed)
    if batches is not None:
        steps = max(1, -(-len(batches) // cfg.train.grad_accum))
    elif cfg.elastic:
        steps = steps_per_epoch(len(splits["train"]), 1, elastic.global_batch(cfg), 1)
    else:
        steps = steps_per_epoch(len(splits["train"]), world_size, cfg.train.batch_size, cfg.train.grad_accum)
    optimizer, schedule = build_optimizer(cfg, model, steps)
    run = WorkerRun(cfg=cfg, rank=rank, world_size=world_size, task=task, vocab=vocab, labels=labels, spec=spec,
                    assets=data.get("assets"), splits=splits, tracker=tracker, model=model, optimizer=optimizer,
                    schedule=schedule, scaler=grad_scaler(ray.train.torch.get_device(), cfg.train.amp), steps=steps,
                    train_batches=batches)
    _place(run, _resume(run))
    return run


def _resume(run: WorkerRun) -> dict[str, Any] | None:
    """Take ``run``'s progress from Ray's checkpoint, if there is one, and return the checkpoint's state (loaded into
    the model, optimizer, schedule and scaler once the model is placed: :func:`_place`); else (a fresh run) load
    the word vectors, if any, and return None. Either is told on the driver's console."""
    cfg, rank = run.cfg, run.rank
    restore: dict[str, Any] | None = None
    notes: list[str] = []  # lines for the driver's console (the same number on every rank: tell_console)
    resumed = ray.train.get_checkpoint()
    if resumed:
        loaded = _load_own_copy(resumed)
        check_compatible(loaded, cfg.model.model, run.vocab, run.labels)
        restore = loaded.state
        run.state = TrainState.from_checkpoint(loaded.state)
        position = run.state.position
        at = f", step {position['step']} of epoch {run.state.epoch + 1}," if position else ""
        notes.append(f"{RESUME_NOTE} {run.state.epoch}{at} from {resumed.path} with {run.world_size} worker(s)")
        if rank == 0:
            run.tracker.set_tags({"nre_ray.resumed_from_epoch": str(run.state.epoch)})
    else:
        hits = None
        if cfg.model.embeddings:  # every rank loads the same vectors (DDP would broadcast rank 0's anyway)
            hits = load_word_vectors(cfg.model.embeddings, run.vocab.index, word_embedding(run.model),
                                     lowercase=cfg.data.lowercase)
        # The run's parameters and tags were logged by the driver (nre_ray.run.runner, nre_ray.tune.trial): this process
        # imports MLflow only if it logs (vectors here, a resume above, the final reports), never before its first step.
        if hits is not None:
            notes.append(f"embeddings: {hits} of {len(run.vocab) - 1} vocabulary words found in {cfg.model.embeddings}")
            if rank == 0:
                run.tracker.log_params({"embeddings.hits": hits, "embeddings.path": cfg.model.embeddings})
    if notes:  # every rank has the same number of notes (from the same checkpoint and settings), or none
        tell_console(notes, rank)
    return restore


def _place(run: WorkerRun, restore: dict[str, Any] | None) -> None:
    """Put ``run``'s model on the device, restore the checkpoint's state ``restore`` (None: a fresh run) into it and
    into the optimizer, schedule and scaler (:func:`place_and_restore`), and make the loaders."""
    cfg = run.cfg
    if cfg.elastic:  # no DDP: nre_ray.run.elastic sums the gradients itself, over ranks that may hold no example
        run.model = place_and_restore(run.model, run.optimizer, run.schedule, run.scaler, restore,
                                      prepare=lambda m: ray.train.torch.prepare_model(m, parallel_strategy=None))
        elastic.broadcast_parameters(run.model)
    else:
        run.model = place_and_restore(run.model, run.optimizer, run.schedule, run.scaler, restore)
    generator = torch.Generator().manual_seed(cfg.train.seed + run.state.epoch)
    # On a GPU the batches come from pinned memory, so that the loader wrapper's non_blocking copy really is one.
    # With several workers prepare_data_loader keeps this DistributedSampler (the one it would add, leaner).
    run.train_set = run.task.dataset(run.splits["train"])
    if run.train_batches is not None:  # the task's batches, already this rank's: no sampler for Ray to add
        run.train_loader = ray.train.torch.prepare_data_loader(DataLoader(
            run.train_set, batch_sampler=run.train_batches, collate_fn=identity_collate,
            pin_memory=cfg.train.use_gpu), add_dist_sampler=False)
    else:
        sampler = LeanDistributedSampler(run.train_set, shuffle=True) if run.world_size > 1 else \
            LeanRandomSampler(run.train_set, generator=generator)
        run.train_loader = ray.train.torch.prepare_data_loader(DataLoader(
            run.train_set, batch_size=cfg.train.batch_size, sampler=sampler, collate_fn=identity_collate,
            generator=generator, pin_memory=cfg.train.use_gpu))
    run.valid_loader = eval_loader(run.task, run.splits["valid"], run.rank, run.world_size)


def _epoch(run: WorkerRun, epoch: int) -> dict[str, Any]:
    """Train ``epoch`` and score it on the validation split; ``run.state`` then counts it (and keeps its weights if
    it improved the selection metric). Returns the epoch's metrics, the same on every rank."""
    cfg, state = run.cfg, run.state
    for sampler in (run.train_loader.sampler, run.train_batches):
        if hasattr(sampler, "set_epoch"):
            sampler.set_epoch(epoch)
    start, cpu_start = time.perf_counter(), time.process_time()
    if cfg.elastic:
        train_loss, seen = _train_elastic_epoch(run, epoch)
    else:
        train_loss, seen = _train_epoch(run.task, run.model, run.train_loader, run.optimizer, cfg.train.grad_clip,
                                        cfg.train.amp, run.schedule, cfg.train.grad_accum, run.scaler,
                                        cfg.train.label_smoothing)
    elapsed, cpu_seconds = time.perf_counter() - start, time.process_time() - cpu_start
    counts, valid_loss = evaluate(run.task, run.model, run.valid_loader, run.labels)
    valid = shared_scores(run.task, counts, run.labels, cfg.data.negative_label, run.rank)
    if cfg.select_metric not in valid:
        raise ValueError(f"--select-metric {cfg.select_metric!r} is not a validation metric here; choose one of "
                         f"{', '.join(sorted(valid))}")
    score = _finite(valid[cfg.select_metric])
    run.schedule.after_epoch(score)
    improved = score > state.best_score
    if improved:
        state.best_score, state.best_epoch = score, epoch
        state.best_model = copy.deepcopy({k: v.cpu() for k, v in unwrap(run.model).state_dict().items()})
    state.epoch = epoch
    return {
        "epoch": epoch, "train_loss": train_loss, "valid_loss": valid_loss,
        **{f"valid_{k}": _finite(v) for k, v in valid.items()},
        "lr": run.optimizer.param_groups[0]["lr"], "examples_per_sec": seen / max(elapsed, 1e-9),
        "epoch_seconds": elapsed, "epoch_cpu_seconds": cpu_seconds, "best_epoch": state.best_epoch,
        "workers": run.world_size, SELECTION_RANK: epoch if improved else 0,
    }


def tell_console(notes: list[str], rank: int) -> None:
    """Show rank 0's ``notes`` on the driver's console, as plain lines (not a worker's output with Ray's prefix).

    Every rank calls this at the same point (a Ray Train report is collective): the lines travel in a report without
    a checkpoint under :data:`nre_ray.core.console.NOTES_KEY`, which the controller's callback passes to the console
    (:mod:`nre_ray.tracking.callback`). In Ray's local mode (``num_workers=0``) the loop runs in the driver and prints
    them itself.
    """
    if in_local_train_mode():
        if rank == 0:
            print("\n".join(notes), flush=True)
        return
    ray.train.report({NOTES_KEY: notes if rank == 0 else []}, checkpoint=None)




def _train_epoch(task: Task, model: nn.Module, loader: DataLoader, optimizer: torch.optim.Optimizer,
                 grad_clip: float, amp: bool = False, scheduler: Schedule | None = None,
                 grad_accum: int = 1, scaler: torch.amp.GradScaler | None = None,
                 label_smoothing: float = 0.0) -> tuple[float, float]:
    """One pass over this rank's shard (``task``'s batches, loss and example counts). Returns (mean loss over all
    ranks, examples seen by all ranks).

    With ``amp`` on a CUDA device the forward pass runs under autocast (bf16, or fp16 with loss scaling). With
    ``grad_accum`` > 1 the gradients of that many batches (fewer for the epoch's last group) are averaged into one
    optimizer step, and DDP all-reduces only on the group's last batch. ``scheduler.after_step()`` follows each step.
    ``scaler``: the run's loss scaler (default: a new one for this pass).
    """
    model.train()
    device = ray.train.torch.get_device()
    scaler = scaler or grad_scaler(device, amp)
    totals = torch.zeros(2, dtype=torch.float64, device=device)  # (sum of losses, examples)
    batches = len(loader)
    optimizer.zero_grad(set_to_none=True)
    for i, batch in enumerate(loader):
        group = min(grad_accum, batches - (i - i % grad_accum))  # batches in this accumulation group
        last = i % grad_accum == group - 1
        no_sync = getattr(model, "no_sync", None)
        with contextlib.nullcontext() if last or no_sync is None else no_sync():
            with autocast_context(device, amp):
                output = model(batch)  # the sentence task's: logits (B, C)
            loss = task.loss(output, batch, label_smoothing=label_smoothing)
            scaler.scale(loss / group).backward()
        if last:
            if grad_clip > 0:
                scaler.unscale_(optimizer)
                nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
            scaler.step(optimizer)
            scaler.update()
            optimizer.zero_grad(set_to_none=True)
            if scheduler is not None:
                scheduler.after_step()
        n = task.examples(batch)
        totals[0] += loss.detach().double() * n
        totals[1] += n
    _all_reduce(totals)
    return (totals[0] / totals[1].clamp(min=1)).item(), totals[1].item()


def _train_elastic_epoch(run: WorkerRun, epoch: int) -> tuple[float, float]:
    """One epoch of an elastic run (:mod:`nre_ray.run.elastic`), from step ``run.state.position["step"]`` (no position:
    the start) on. After the step at which any rank heard of a preemption, a mid-epoch checkpoint is saved
    (:func:`_report_position`), once (``run.state.saved_on_notice``: the notice stays until Ray restarts the worker
    group); training goes on until then. Returns (mean loss over the epoch's examples, examples trained on in this
    call: the epoch's less those before the position)."""
    cfg, model, optimizer, scaler = run.cfg, run.model, run.optimizer, run.scaler
    position, run.state.position = run.state.position or {}, None
    model.train()
    device = ray.train.torch.get_device()
    batch = elastic.global_batch(cfg)
    order = elastic.epoch_order(len(run.train_set), cfg.train.seed, epoch)
    loss_sum, seen = (position.get("partial") or [0.0, 0.0]) if run.rank == 0 else [0.0, 0.0]
    before = float((position.get("partial") or [0.0, 0.0])[1])  # the same on every rank
    for step in range(int(position.get("step", 0)), run.steps):
        parts, count = elastic.step_share(order, step, batch, run.rank, run.world_size, cfg.train.batch_size)
        step_loss, step_seen = elastic.accumulate(
            run.task, model, run.train_set, parts, count, device, lambda: autocast_context(device, cfg.train.amp),
            scaler, cfg.train.label_smoothing)
        loss_sum, seen = loss_sum + step_loss, seen + step_seen
        notice = preemption_notice()
        deadline_ms = getattr(notice, "deadline_ms", None)
        anyone, seconds_left = elastic.reduce_gradients(
            model, notice is not None, deadline_ms / 1000 - time.time() if deadline_ms else None)
        if cfg.train.grad_clip > 0:
            scaler.unscale_(optimizer)
            nn.utils.clip_grad_norm_(model.parameters(), cfg.train.grad_clip)
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad(set_to_none=True)
        run.schedule.after_step()
        if anyone and not run.state.saved_on_notice:
            run.state.saved_on_notice = True
            totals = _all_reduce(torch.tensor([loss_sum, seen], dtype=torch.float64, device=device))  # (2,)
            _report_position(run, step + 1, totals.tolist(), seconds_left)
    totals = _all_reduce(torch.tensor([loss_sum, seen], dtype=torch.float64, device=device))  # (2,)
    return (totals[0] / totals[1].clamp(min=1)).item(), totals[1].item() - before


def _report_position(run: WorkerRun, step: int, partial: list[float], seconds_left: float | None) -> None:
    """Every rank reports a just-in-time checkpoint of the middle of the epoch in progress (``step`` of its steps
    done, ``partial``: the global sums of the losses and examples so far; ``seconds_left``: to the notice's deadline,
    None without one), and the console hears of the preemption in one line; rank 0 writes the checkpoint and counts
    the preemption in the MLflow tag ``preemptions``. The metrics have no ``epoch``: the epoch is logged once, when
    it ends."""
    state = run.state
    epoch = state.epoch + 1  # the epoch in progress
    state.preemptions += 1
    left = f", {max(0.0, seconds_left):.0f} s before the node goes" if seconds_left is not None else ""
    line = (f"preemption {state.preemptions}: a node of the worker group is being taken back; saved a mid-epoch "
            f"checkpoint at step {step} of epoch {epoch}{left}")
    metrics = {"mid_epoch": epoch, "mid_epoch_step": step, SELECTION_RANK: 0,
               NOTES_KEY: [line] if run.rank == 0 else []}
    if run.rank != 0:
        ray.train.report(metrics, checkpoint=None)
        return
    run.tracker.set_tags({"preemptions": str(state.preemptions)})
    position = {"step": step, "partial": partial}
    _save_and_report(run, metrics, {**_full_state(run, {}), "best_model": state.best_model, "position": position})


def _full_state(run: WorkerRun, metrics: dict[str, Any]) -> dict[str, Any]:
    """What a complete checkpoint holds after ``run.state.epoch`` epochs (see :mod:`nre_ray.run.checkpoint`), with the
    epoch's ``metrics``; ``best_model`` is left out (None) when the weights are the best epoch's."""
    state = run.state
    return {
        "model": unwrap(run.model).state_dict(), "optimizer": run.optimizer.state_dict(),
        "scheduler": run.schedule.state_dict(), "scaler": run.scaler.state_dict(), "epoch": state.epoch,
        "best_score": state.best_score, "best_epoch": state.best_epoch,
        "metrics": {k: float(v) for k, v in metrics.items()},
        "best_model": None if state.best_epoch == state.epoch else state.best_model,
        "preemptions": state.preemptions,
    }


def _save_and_report(run: WorkerRun, metrics: dict[str, Any], full_state: dict[str, Any]) -> None:
    """Rank 0: write the checkpoint of ``full_state`` and report it with ``metrics``."""
    # Ray copies the folder to storage and then deletes it; in local mode (num_workers=0) the folder is the checkpoint.
    folder = tempfile.mkdtemp(prefix=tempfiles.prefix("ckpt"))
    save_checkpoint(Path(folder), full_state, run.cfg, run.vocab, run.labels,
                    _meta(run, full_state["epoch"]), run.assets)
    ray.train.report(metrics, checkpoint=ray.train.Checkpoint.from_directory(folder),
                     delete_local_checkpoint_after_upload=True)


def _meta(run: WorkerRun, epoch: int) -> dict[str, Any]:
    """A checkpoint's meta.json fields (:mod:`nre_ray.run.checkpoint`): the run's task (what evaluate, predict and
    serve build again: :func:`nre_ray.tasks.lookup.task_of`), model and sizes, and the ``epoch`` it holds."""
    spec = run.spec
    return {"task": run.task.name, "model": run.cfg.model.model, "epoch": epoch, "vocab_size": spec.vocab_size,
            "num_classes": spec.num_classes, "num_positions": spec.num_positions}


def _report(run: WorkerRun, metrics: dict[str, Any]) -> None:
    """Every rank reports the epoch's ``metrics``; rank 0 attaches a complete checkpoint (:func:`_full_state`)."""
    if run.rank != 0:
        ray.train.report(metrics, checkpoint=None)
        return
    _save_and_report(run, metrics, _full_state(run, metrics))


def _final(run: WorkerRun) -> None:
    """Load the best weights, score valid and test once, and log reports and the best checkpoint (rank 0)."""
    state, labels, cfg = run.state, run.labels, run.cfg
    if state.best_model is None:
        return
    unwrap(run.model).load_state_dict(state.best_model)
    task = run.task
    counted = {name: evaluate(task, run.model, eval_loader(task, run.splits[name], run.rank, run.world_size), labels)
               for name in ("valid", "test") if name in run.splits}  # name -> (the task's counts, mean loss)
    if run.rank != 0:
        return
    scored = task.split_scores({name: counts for name, (counts, _) in counted.items()}, labels,
                               cfg.data.negative_label)
    results = {name: (counts, {**scored[name], "loss": loss}) for name, (counts, loss) in counted.items()}
    final = {f"{name}_{k}": _finite(v) for name, (_, s) in results.items() for k, v in s.items()}
    run.tracker.log_metrics({"best_epoch": state.best_epoch, **{k: v for k, v in final.items()
                                                                if k.startswith("test_")}}, step=state.best_epoch)
    with tempfile.TemporaryDirectory(prefix=tempfiles.prefix("report")) as tmp:
        folder = Path(tmp)
        for name, (counts, _) in results.items():  # as evaluate reports the best checkpoint, which records final
            task.checkpoint_reports(counts, labels, final, folder, name, f"{name} (best epoch {state.best_epoch})")
        run.tracker.log_artifacts(folder, "reports")
    with tempfile.TemporaryDirectory(prefix=tempfiles.prefix("best")) as tmp:
        best = {"model": state.best_model, "epoch": state.best_epoch, "best_score": state.best_score,
                "best_epoch": state.best_epoch, "metrics": final}
        save_checkpoint(Path(tmp), best, cfg, run.vocab, run.labels, _meta(run, state.best_epoch), run.assets)
        run.tracker.log_artifacts(Path(tmp), "best_checkpoint")
    # The test scores are printed by the driver's summary (train.print_summary), from MLflow.

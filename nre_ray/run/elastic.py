"""Training steps of an elastic run (``--num-workers MIN-MAX``): the same updates at every world size.

An epoch's order is one permutation of the training split, seeded by the seed and the epoch alone, cut into
optimizer steps of the global batch ``G = --batch-size x MAX x --grad-accum`` examples. At step ``s`` the world's
``w`` ranks share the examples ``order[s*G : (s+1)*G]`` (rank ``r`` takes every ``w``-th from the ``r``-th), each in
micro-batches of at most ``--batch-size``; each example's loss is divided by the step's example count and the
gradients are summed over the micro-batches and then over the ranks (one all-reduce), so the update is the mean
gradient of the step's examples whatever ``w`` is, and the epoch has the same ``ceil(N / G)`` steps: the learning-rate
schedule does not move. The position in an epoch is the step number, which means the same examples at any world
size: a run resumed at step ``s`` with another number of workers neither skips nor repeats an example. Only the
float summation order (and dropout's masks, drawn per rank) depend on ``w``.

The one all-reduce of a step also carries each rank's view of a preemption notice
(:func:`nre_ray.cluster.ray_private.preemption_notice`) and the seconds to its deadline, so
every rank learns of it at the same step, with the same deadline, and the loop saves one mid-epoch checkpoint there
(:func:`nre_ray.run.loop.train_loop_per_worker`).
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable

import torch
import torch.distributed as dist
from torch import nn

from nre_ray.config import Config
from nre_ray.tasks.base import Task


def global_batch(cfg: Config) -> int:
    """Examples per optimizer step of an elastic run, at every world size: ``--batch-size x MAX x --grad-accum``."""
    return cfg.train.batch_size * cfg.train.num_workers * cfg.train.grad_accum


def epoch_order(num_examples: int, seed: int, epoch: int) -> torch.Tensor:
    """The epoch's order of the training examples, (N,) int64: the same on every rank and at every world size."""
    return torch.randperm(num_examples, generator=torch.Generator().manual_seed(seed * 1_000_003 + epoch))


def step_share(order: torch.Tensor, step: int, batch: int, rank: int, world: int,
               micro: int) -> tuple[list[torch.Tensor], int]:
    """Rank ``rank``'s micro-batches of step ``step`` (the examples ``order[step*batch : (step+1)*batch]``): every
    ``world``-th example from the ``rank``-th, in as many micro-batches of at most ``micro`` examples as the largest
    share needs (all ranks run the same number; a rank's may be empty). Returns ``(micro-batches, examples in the
    step on all ranks)``."""
    chunk = order[step * batch:(step + 1) * batch]
    parts = max(1, math.ceil(math.ceil(len(chunk) / world) / micro))
    mine = chunk[rank::world]
    return [part for part in torch.tensor_split(mine, parts) if len(part)], len(chunk)


def accumulate(task: Task, model: nn.Module, dataset: torch.utils.data.Dataset, parts: list[torch.Tensor],
               count: int, device: torch.device, autocast: Callable[[], contextlib.AbstractContextManager],
               scaler: torch.amp.GradScaler, label_smoothing: float = 0.0) -> tuple[float, int]:
    """Forward and backward this rank's ``parts`` (micro-batches of indices into ``task``'s ``dataset``), each
    example's loss (``task``'s) divided by the step's ``count``: the gradients add up (over micro-batches here, over
    ranks in :func:`reduce_gradients`) to the mean over the step. Returns (sum of the examples' losses, examples)."""
    loss_sum, seen = 0.0, 0
    for part in parts:
        batch = {k: v.to(device, non_blocking=True) for k, v in dataset.__getitems__(part.tolist()).items()}
        with autocast():
            output = model(batch)  # the sentence task's: logits (B, C)
        losses = task.loss(output, batch, label_smoothing=label_smoothing, reduction="sum")
        scaler.scale(losses / count).backward()
        loss_sum += losses.item()
        seen += task.examples(batch)
    return loss_sum, seen


def reduce_gradients(model: nn.Module, notice: bool, seconds_left: float | None = None) -> tuple[bool, float | None]:
    """Sum the gradients of ``model`` over the ranks (one all-reduce of one flat buffer; a parameter without a
    gradient on some rank counts as zeros there), and this rank's view of a preemption with them: ``notice`` (it has
    one) and ``seconds_left`` (to its deadline, when the notice has one). Returns whether any rank has a notice, and
    the mean of the ranks' ``seconds_left`` (None when no rank's notice has a deadline): every rank then says the
    same, whichever of them heard first (each polls Ray on its own)."""
    params = [p for p in model.parameters() if p.requires_grad]
    several = dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1
    if not several:
        return notice, seconds_left if notice else None
    timed = notice and seconds_left is not None
    heard = [1.0 if notice else 0.0, 1.0 if timed else 0.0, float(seconds_left) if timed else 0.0]
    flat = torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1).float() for p in params]
                     + [torch.tensor(heard, device=params[0].device)])
    dist.all_reduce(flat)
    offset = 0
    for p in params:
        size = p.numel()
        p.grad = flat[offset:offset + size].view_as(p).to(p.dtype)
        offset += size
    noticed, with_deadline, left = (float(v) for v in flat[-3:].tolist())
    return noticed > 0, left / with_deadline if with_deadline > 0 else None


def broadcast_parameters(model: nn.Module) -> None:
    """Rank 0's parameters and buffers on every rank (the replicas start equal, as DDP would make them)."""
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        for tensor in [*model.parameters(), *model.buffers()]:
            dist.broadcast(tensor.data, src=0)

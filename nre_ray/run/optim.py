"""Optimizer and learning-rate schedule per model type, behind the two calls the training loop makes.

* Encoders trained from scratch (cnn, pcnn, bilstm, transformer): Adam at ``--lr`` and ``ReduceLROnPlateau`` on the
  validation selection metric (the seed's recipe), stepped once per epoch.
* A pretrained encoder (``--model bert``): AdamW with two learning rates, ``--encoder-lr`` for the pretrained weights
  and ``--lr`` for the rest (pooling and classifier head), no weight decay on biases and norm weights, and a linear
  warm-up over ``--warmup-ratio`` of the optimizer steps followed by a linear decay to 0, stepped after every
  optimizer step.

The loop calls :meth:`Schedule.after_step` after each optimizer step and :meth:`Schedule.after_epoch` with the
validation score; each schedule acts on the call it cares about.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

from nre_ray.config import Config
from nre_ray.models.bert import PretrainedEncoder


class Schedule:
    """A learning-rate schedule driven by the loop's two events; checkpointed through ``state_dict``."""

    def __init__(self, scheduler: Any) -> None:
        self.scheduler = scheduler

    def after_step(self) -> None:
        """Called after every optimizer step."""

    def after_epoch(self, score: float) -> None:
        """Called after every epoch with the validation selection score."""

    def state_dict(self) -> dict[str, Any]:
        return self.scheduler.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.scheduler.load_state_dict(state)


class PlateauSchedule(Schedule):
    """``ReduceLROnPlateau(mode="max")`` on the epoch's validation score. Its state dict is the scheduler's own."""

    def after_epoch(self, score: float) -> None:
        self.scheduler.step(score)


class LinearWarmupSchedule(Schedule):
    """Linear warm-up from 0 over ``warmup`` steps, then linear decay to 0 at ``total`` steps (``LambdaLR``)."""

    def __init__(self, optimizer: torch.optim.Optimizer, warmup: int, total: int) -> None:
        self.warmup, self.total = warmup, max(total, 1)
        super().__init__(torch.optim.lr_scheduler.LambdaLR(optimizer, self.factor))

    def factor(self, step: int) -> float:
        """Multiplier of the base learning rates after ``step`` optimizer steps."""
        if step < self.warmup:
            return step / self.warmup
        return max(0.0, (self.total - step) / max(1, self.total - self.warmup))

    def after_step(self) -> None:
        self.scheduler.step()


def steps_per_epoch(num_examples: int, world_size: int, batch_size: int, grad_accum: int) -> int:
    """Optimizer steps per epoch on each rank (the DistributedSampler gives every rank ``ceil(N / world)`` examples;
    the last, shorter accumulation group of an epoch is a step too)."""
    batches = math.ceil(math.ceil(num_examples / max(world_size, 1)) / batch_size)
    return max(1, math.ceil(batches / grad_accum))


def _pretrained_parameters(model: nn.Module) -> set[int]:
    """ids of the parameters of the model's pretrained transformer (a :class:`~nre_ray.models.bert.PretrainedEncoder`:
    the sentence and bag tasks' and the document task's ``--model bert``); empty for models trained from scratch."""
    found: set[int] = set()
    for module in model.modules():
        if isinstance(module, PretrainedEncoder):
            found.update(id(p) for p in module.transformer.parameters())
    return found


def build_optimizer(cfg: Config, model: nn.Module, steps: int) -> tuple[torch.optim.Optimizer, Schedule]:
    """The optimizer and schedule for ``model`` (unwrapped, before DDP) with ``steps`` optimizer steps per epoch."""
    pretrained = _pretrained_parameters(model)
    if not pretrained:
        optimizer = torch.optim.Adam(model.parameters(), lr=cfg.train.lr, weight_decay=cfg.train.weight_decay)
        plateau = torch.optim.lr_scheduler.ReduceLROnPlateau(optimizer, mode="max", factor=cfg.train.lr_factor,
                                                             patience=cfg.train.lr_patience)
        return optimizer, PlateauSchedule(plateau)
    groups: dict[tuple[bool, bool], list[nn.Parameter]] = {}
    for param in model.parameters():
        if param.requires_grad:
            groups.setdefault((id(param) in pretrained, param.ndim > 1), []).append(param)
    param_groups = [
        {"params": params, "lr": cfg.train.encoder_lr if is_encoder else cfg.train.lr,
         "weight_decay": cfg.train.weight_decay if decays else 0.0}
        for (is_encoder, decays), params in sorted(groups.items(), key=lambda kv: (not kv[0][0], not kv[0][1]))
    ]
    optimizer = torch.optim.AdamW(param_groups)
    total = steps * cfg.train.epochs
    return optimizer, LinearWarmupSchedule(optimizer, math.ceil(cfg.train.warmup_ratio * total), total)

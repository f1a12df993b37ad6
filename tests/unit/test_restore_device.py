"""A restart restores the checkpoint after the model is placed on its device, so the optimizer state follows.

``Optimizer.load_state_dict`` casts Adam's moments to the device of each parameter at load time; loading before
``prepare_model`` moved the model to the GPU left them on the CPU, and the first step after a restart failed. There is
no GPU here: PyTorch's ``meta`` device stands in for "the other device".
"""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from torch import nn

from nre_ray.config import Config
from nre_ray.data.vocab import Vocab
from nre_ray.models.registry import ModelSpec
from nre_ray.run.checkpoint import load_checkpoint, save_checkpoint
from nre_ray.run.loop import grad_scaler, place_and_restore, unwrap
from nre_ray.run.optim import build_optimizer
from nre_ray.tasks.sentence.classifier import build_model

LABELS = ["born_in", "founded_by", "no_relation"]
VOCAB = Vocab(["<pad>", "<unk>", "acme", "was", "founded", "by"])
SPEC = ModelSpec(len(VOCAB), len(LABELS), 22)
CFG = Config.from_dict({"train": {"lr": 0.01, "seed": 3}, "model": {"word_dim": 8, "pos_dim": 2, "hidden_size": 8}})


def _fresh() -> tuple[nn.Module, torch.optim.Optimizer, object, torch.amp.GradScaler]:
    """What a (re)starting worker builds before placing the model: model, optimizer, schedule, scaler (CPU)."""
    model = build_model(CFG.model, SPEC)
    optimizer, scheduler = build_optimizer(CFG, model, steps=4)
    return model, optimizer, scheduler, grad_scaler(torch.device("cpu"), False)


def _checkpoint_state(tmp_path: Path) -> dict:
    """A checkpoint written after two Adam steps and a plateau epoch, read back from disk (tensors on the CPU)."""
    torch.manual_seed(0)
    model, optimizer, scheduler, scaler = _fresh()
    for _ in range(2):
        for p in model.parameters():
            p.grad = torch.randn_like(p)
        optimizer.step()
    scheduler.after_epoch(0.5)
    state = {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict(),
             "scaler": scaler.state_dict(), "epoch": 1, "best_score": 0.5, "best_epoch": 1, "metrics": {}}
    meta = {"model": CFG.model.model, "epoch": 1, "vocab_size": len(VOCAB), "num_classes": len(LABELS)}
    return load_checkpoint(save_checkpoint(tmp_path / "ckpt", state, CFG, VOCAB, LABELS, meta)).state


def _to_meta(model: nn.Module) -> nn.Module:
    """``prepare_model`` on "another device": like ``.to("cuda")`` it keeps each Parameter object (the optimizer's
    references stay valid) and swaps its data. A plain ``.to("meta")`` would replace the Parameters instead."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.__future__.set_swap_module_params_on_conversion(True)
        try:
            return model.to("meta")
        finally:
            torch.__future__.set_swap_module_params_on_conversion(False)


def test_optimizer_state_lives_on_the_device_of_its_parameter(tmp_path):
    loaded = _checkpoint_state(tmp_path)
    model, optimizer, scheduler, scaler = _fresh()
    params = list(model.parameters())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # copying CPU weights into meta parameters is a (warned) no-op
        model = place_and_restore(model, optimizer, scheduler, scaler, loaded, prepare=_to_meta)
    assert [p is q for p, q in zip(model.parameters(), params, strict=True)] == [True] * len(params)
    checked = 0
    for group in optimizer.param_groups:
        for p in group["params"]:
            assert p.device.type == "meta"
            state = optimizer.state[p]
            assert set(state) == {"step", "exp_avg", "exp_avg_sq"}
            for key, value in state.items():
                if key == "step":  # torch keeps Adam's step a CPU scalar unless capturable or fused
                    assert value.device in (torch.device("cpu"), p.device) and value.item() == 2
                else:
                    assert value.device == p.device, f"{key} on {value.device}, its parameter on {p.device}"
                    checked += 1
    assert checked == 2 * len(params)


def test_restores_weights_optimizer_and_schedule(tmp_path):
    loaded = _checkpoint_state(tmp_path)
    model, optimizer, scheduler, scaler = _fresh()
    model = place_and_restore(model, optimizer, scheduler, scaler, loaded, prepare=lambda m: m)
    for key, value in model.state_dict().items():
        assert torch.equal(value, loaded["model"][key]), key
    saved = loaded["optimizer"]["state"]
    for i, p in enumerate(model.parameters()):
        assert torch.equal(optimizer.state[p]["exp_avg"], saved[i]["exp_avg"])
    assert scheduler.state_dict() == loaded["scheduler"]
    assert scaler.state_dict() == {}  # disabled on the CPU: nothing saved, nothing loaded


def test_a_fresh_run_is_only_placed():
    model, optimizer, scheduler, scaler = _fresh()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    placed = place_and_restore(model, optimizer, scheduler, scaler, None, prepare=lambda m: m)
    assert placed is model and not optimizer.state
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())


def test_weights_load_into_the_module_inside_ddp(tmp_path):
    """With several workers ``prepare_model`` wraps the model in DDP ("module." keys): the checkpoint's keys are the
    bare model's, so they load into the unwrapped module. A one-process gloo group stands in for the workers."""
    if dist.is_initialized():
        pytest.skip("a process group is already initialized in this process")
    loaded = _checkpoint_state(tmp_path)
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'pg'}", rank=0, world_size=1)
    try:
        model, optimizer, scheduler, scaler = _fresh()
        model = place_and_restore(model, optimizer, scheduler, scaler, loaded,
                                  prepare=nn.parallel.DistributedDataParallel)
        assert isinstance(model, nn.parallel.DistributedDataParallel)
        for key, value in unwrap(model).state_dict().items():
            assert torch.equal(value, loaded["model"][key]), key
    finally:
        dist.destroy_process_group()

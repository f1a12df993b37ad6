"""On a local Ray, a run's workers meet through a PyTorch rendezvous store that listens on 127.0.0.1 alone
(:func:`nre_ray.cluster.ray_private.loopback_torch_config`): PyTorch's own TCPStore binds every interface. Here the
pieces run in this process as one rank would (no Ray); tests/integration/test_ray_pinning.py runs two real workers.
The contract test pins what the backend takes from Ray Train's private torch setup."""

from __future__ import annotations

import inspect
import os

import torch
import torch.distributed as dist

from nre_ray.cluster import ray_private
from tests.procs import listening, loopback


def test_a_process_group_through_the_loopback_store_listens_on_loopback_only(monkeypatch):
    from ray.train.torch.config import _setup_torch_process_group

    for key in ("MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_USE_AGENT_STORE", "RANK", "WORLD_SIZE"):
        monkeypatch.delenv(key, raising=False)
    before = set(listening([os.getpid()]))  # what earlier tests in this process left listening is not ours
    port = ray_private.open_loopback_store(1, 30)
    ray_private.use_loopback_store(port)
    monkeypatch.setenv("MASTER_PORT", str(port))  # (so that monkeypatch restores the environment afterwards)
    monkeypatch.setenv("TORCHELASTIC_USE_AGENT_STORE", "True")
    try:
        _setup_torch_process_group("gloo", world_rank=0, world_size=1, init_method="env://", timeout_s=30)
        value = torch.ones(3)
        dist.all_reduce(value)
        assert value.tolist() == [1.0, 1.0, 1.0]
        sockets = [s for s in listening([os.getpid()]) if s not in before]  # what the store and the group opened
        assert any(p == port for *_, p in sockets), sockets  # the store itself
        assert [s for s in sockets if not loopback(s[2])] == [], sockets
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
        ray_private._LOOPBACK_STORE.clear()


def test_what_the_loopback_backend_takes_from_ray_trains_torch_setup():
    """Contract: Ray Train's torch backend class, its start hook, and the two setup functions it reuses, with the
    parameters it passes. A Ray release that changes them fails here first."""
    from ray.train.torch import TorchConfig
    from ray.train.torch.config import _set_torch_distributed_env_vars, _setup_torch_process_group, _TorchBackend

    assert list(inspect.signature(_TorchBackend.on_start).parameters) == ["self", "worker_group", "backend_config"]
    assert {"backend", "world_rank", "world_size", "init_method", "timeout_s"} <= set(
        inspect.signature(_setup_torch_process_group).parameters)
    assert callable(_set_torch_distributed_env_vars)
    config = ray_private.loopback_torch_config()
    assert isinstance(config, TorchConfig) and issubclass(config.backend_cls, _TorchBackend)
    assert config.backend_cls is not TorchConfig().backend_cls
    # PyTorch: with TORCHELASTIC_USE_AGENT_STORE every rank is a client of the store at MASTER_ADDR:MASTER_PORT.
    import importlib

    rendezvous = importlib.import_module("torch.distributed.rendezvous")
    assert "TORCHELASTIC_USE_AGENT_STORE" in inspect.getsource(rendezvous._torchelastic_use_agent_store)
    assert "master_listen_fd" in (dist.TCPStore.__init__.__doc__ or "") + (dist.TCPStore.__doc__ or "")

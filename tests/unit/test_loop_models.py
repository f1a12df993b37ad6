"""The loop with the BiLSTM and Transformer encoders, with pretrained vectors, and its mixed-precision helpers."""

import contextlib
import math

import numpy as np
import pytest
import ray.train
import torch
from ray.train.torch import TorchTrainer

from nre_ray.config import Config, ConfigError
from nre_ray.run.checkpoint import load_checkpoint
from nre_ray.run.loop import _train_epoch, amp_dtype, autocast_context, grad_scaler, train_loop_per_worker
from nre_ray.tasks.sentence.task import SENTENCE
from tests.helpers import tiny_data


def _fit(tmp_path, model: dict, data: dict | None = None, name: str = "local"):
    cfg = Config.from_dict({"train": {"epochs": 2, "batch_size": 8, "lr": 0.01, "seed": 3},
                            "model": {"word_dim": 16, "pos_dim": 4, "hidden_size": 16, **model}})
    trainer = TorchTrainer(
        train_loop_per_worker,
        train_loop_config={"config": cfg.to_dict(), "data": data or tiny_data(), "tracking_uri": None,
                           "run_id": None},
        scaling_config=ray.train.ScalingConfig(num_workers=0),
        run_config=ray.train.RunConfig(name=name, storage_path=str(tmp_path)),
    )
    return trainer.fit()


@pytest.mark.timeout(120)
@pytest.mark.parametrize("name", ["bilstm", "transformer"])
def test_local_mode_trains_two_epochs(tmp_path, name):
    result = _fit(tmp_path, {"model": name})
    assert result.metrics["epoch"] == 2
    assert math.isfinite(result.metrics["train_loss"]), result.metrics  # neither NaN nor infinite
    # The tiny set (3 templates) is learnable in 2 epochs: both encoders reach 1.0 here (chance: about 0.33).
    assert result.metrics["valid_macro_f1"] >= 0.9, result.metrics
    loaded = load_checkpoint(result.checkpoint.to_directory(str(tmp_path / "ckpt")))
    assert loaded.meta["model"] == name
    assert loaded.state["epoch"] == 2


@pytest.mark.timeout(120)
def test_local_mode_with_pretrained_vectors(tmp_path, capsys):
    data = tiny_data()
    vocab = data["vocab"]
    # Capitalised entries match the lower-cased vocabulary; "zebra" is not in it.
    lines = [f"{w.capitalize()} " + " ".join(["0.5"] * 16) for w in vocab[2:6]] + ["zebra " + " ".join(["1"] * 16)]
    path = tmp_path / "vectors.txt"
    path.write_text("5 16\n" + "\n".join(lines) + "\n", encoding="utf-8")
    result = _fit(tmp_path, {"model": "cnn", "embeddings": str(path)}, data)
    assert result.metrics["epoch"] == 2
    assert f"embeddings: 4 of {len(vocab) - 1} vocabulary words found in {path}" in capsys.readouterr().out


@pytest.mark.timeout(120)
def test_local_mode_vectors_of_the_wrong_dimension_fail_clearly(tmp_path):
    path = tmp_path / "vectors.txt"
    path.write_text("the 0.1 0.2\n", encoding="utf-8")
    with pytest.raises(Exception, match=r"vectors\.txt: line 1: the word vectors have dimension 2, but --word-dim "
                                        r"is 16"):
        _fit(tmp_path, {"model": "cnn", "embeddings": str(path)})


def test_driver_resolves_the_vectors_path_and_checks_its_dimension_before_starting_ray(tmp_path, monkeypatch):
    from nre_ray.run.runner import UsageError, run

    monkeypatch.chdir(tmp_path)
    (tmp_path / "vectors.txt").write_text("the 0.1 0.2\n", encoding="utf-8")
    cfg = Config.from_dict({"model": {"embeddings": "vectors.txt", "word_dim": 16},
                            "run": {"storage_path": str(tmp_path / "runs"), "tracking_uri": "sqlite:///unused.db"}})
    with pytest.raises(UsageError, match=f"{tmp_path / 'vectors.txt'}: line 1: the word vectors have dimension 2, "
                                         "but --word-dim is 16"):
        run(cfg)
    assert cfg.model.embeddings == str(tmp_path / "vectors.txt")


def test_new_model_options_are_validated():
    with pytest.raises(ConfigError, match="--num-heads 3 must divide --hidden-size 16"):
        Config.from_dict({"model": {"model": "transformer", "hidden_size": 16, "num_heads": 3}})
    with pytest.raises(ConfigError, match="--max-positions 64 must be >= --max-length 128"):
        Config.from_dict({"model": {"model": "transformer", "max_positions": 64}})
    with pytest.raises(ConfigError, match="--num-layers must be >= 1"):
        Config.from_dict({"model": {"model": "bilstm", "num_layers": 0}})
    Config.from_dict({"model": {"model": "cnn", "hidden_size": 16, "num_heads": 3}})  # not used by the CNN


def test_amp_is_off_on_cpu():
    cpu = torch.device("cpu")
    for enabled in (True, False):
        assert amp_dtype(cpu, enabled) is None
        assert isinstance(autocast_context(cpu, enabled), contextlib.nullcontext)
        assert not grad_scaler(cpu, enabled).is_enabled()
    with autocast_context(cpu, True):
        assert not torch.is_autocast_enabled("cpu")
        assert (torch.ones(2, 2) @ torch.ones(2, 2)).dtype == torch.float32
    assert amp_dtype(torch.device("cuda"), False) is None


@pytest.mark.filterwarnings("ignore:CUDA is not available:UserWarning")
def test_amp_on_cuda_picks_bf16_where_supported(monkeypatch):
    cuda = torch.device("cuda")
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: True)
    assert amp_dtype(cuda, True) == torch.bfloat16
    ctx = autocast_context(cuda, True)
    assert isinstance(ctx, torch.autocast) and ctx.fast_dtype == torch.bfloat16
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: False)
    assert amp_dtype(cuda, True) == torch.float16
    assert autocast_context(cuda, True).fast_dtype == torch.float16


def test_cpu_train_step_is_unchanged_by_the_amp_flag(monkeypatch):
    """On CPU, training with --amp gives exactly the weights of training without it."""
    monkeypatch.setattr(ray.train.torch, "get_device", lambda: torch.device("cpu"))
    from nre_ray.config import ModelConfig
    from nre_ray.data.batches import EncodedSplit
    from nre_ray.data.encode import EncodedDataset, identity_collate
    from nre_ray.models.registry import ModelSpec
    from nre_ray.tasks.sentence.classifier import build_model

    data = tiny_data()
    split = EncodedSplit({k: np.array(v) for k, v in data["splits"]["train"].items()})
    spec = ModelSpec(len(data["vocab"]), len(data["labels"]), data["num_positions"])
    weights = []
    for amp in (True, False):
        torch.manual_seed(0)
        model = build_model(ModelConfig(model="bilstm", word_dim=8, pos_dim=3, hidden_size=6, dropout=0.0,
                                        embedding_dropout=0.0), spec)
        loader = torch.utils.data.DataLoader(EncodedDataset(split), batch_size=8, collate_fn=identity_collate)
        _train_epoch(SENTENCE, model, loader, torch.optim.Adam(model.parameters(), lr=0.01), 5.0, amp)
        weights.append(model.state_dict())
    for key in weights[0]:
        assert torch.equal(weights[0][key], weights[1][key]), key


def test_ddp_with_gradients_as_bucket_views_trains_to_the_same_weights(monkeypatch, tmp_path):
    """The loop's DDP options (gradients as views into the all-reduce buckets: one model's worth of memory less per
    worker) under the loop's own step (set_to_none, no_sync accumulation, clipping): a real gloo DDP of one process
    reaches exactly the weights of plain DDP, over two epochs."""
    import torch.distributed as dist

    from nre_ray.config import ModelConfig
    from nre_ray.data.batches import EncodedSplit
    from nre_ray.data.encode import EncodedDataset, identity_collate
    from nre_ray.models.registry import ModelSpec
    from nre_ray.run import loop
    from nre_ray.tasks.sentence.classifier import build_model

    monkeypatch.setattr(ray.train.torch, "get_device", lambda: torch.device("cpu"))
    data = tiny_data()
    split = EncodedSplit({k: np.array(v) for k, v in data["splits"]["train"].items()})
    spec = ModelSpec(len(data["vocab"]), len(data["labels"]), data["num_positions"])
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        weights = []
        for options in ({}, loop.DDP_OPTIONS):
            torch.manual_seed(0)
            model = torch.nn.parallel.DistributedDataParallel(
                build_model(ModelConfig(model="pcnn", word_dim=8, pos_dim=3, hidden_size=6), spec), **options)
            optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
            for _ in range(2):
                loader = torch.utils.data.DataLoader(EncodedDataset(split), batch_size=5,
                                                     collate_fn=identity_collate)
                loop._train_epoch(SENTENCE, model, loader, optimizer, grad_clip=1.0, grad_accum=2)
            weights.append(loop.unwrap(model).state_dict())
    finally:
        dist.destroy_process_group()
    assert loop.DDP_OPTIONS == {"gradient_as_bucket_view": True}
    for key in weights[0]:
        assert torch.equal(weights[0][key], weights[1][key]), key

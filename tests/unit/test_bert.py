"""The pretrained-encoder model (tiny random BERT/RoBERTa, offline), its optimizer and schedule, and its loop."""

from __future__ import annotations

import math
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

pytest.importorskip("transformers")

import ray.train
from ray.train.torch import TorchTrainer

from nre_ray.config import Config, ModelConfig
from nre_ray.data.batches import EncodedSplit
from nre_ray.data.encode import EncodedDataset
from nre_ray.data.subword import MarkerTokenizer, build_tokenizer, encode_subword_batch
from nre_ray.data.vocab import Vocab
from nre_ray.inference.predictor import Predictor
from nre_ray.models.bert import BertEncoder
from nre_ray.models.registry import ModelSpec
from nre_ray.run.checkpoint import PRETRAINED_DIR, load_checkpoint, pretrained_assets
from nre_ray.run.loop import train_loop_per_worker
from nre_ray.run.optim import LinearWarmupSchedule, PlateauSchedule, build_optimizer, steps_per_epoch
from nre_ray.tasks.sentence.classifier import build_model
from nre_ray.tasks.sentence.task import SENTENCE
from tests.helpers import TEMPLATES, tiny_frame
from tests.tiny_bert import make_tiny_bert


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    base = make_tiny_bert(tmp_path_factory.mktemp("tiny"))
    tok = build_tokenizer(str(base), tmp_path_factory.mktemp("tok"), ["[E1]", "[/E1]", "[E2]", "[/E2]"], 64)
    return base, tok


def _batch(rows: list[list[int]], spans: list[tuple[int, int]]) -> dict[str, torch.Tensor]:
    width = max(map(len, rows))
    tokens = torch.zeros(len(rows), width, dtype=torch.long)
    for i, r in enumerate(rows):
        tokens[i, :len(r)] = torch.tensor(r)
    lengths = torch.tensor([len(r) for r in rows])
    return {"tokens": tokens, "mask": torch.arange(width).unsqueeze(0) < lengths.unsqueeze(1),
            "head_span": torch.tensor([[h, h + 2] for h, _ in spans]),
            "tail_span": torch.tensor([[t, t + 2] for _, t in spans])}


@pytest.mark.parametrize("kind", ["bert", "roberta"])
def test_entity_start_pooling_ignores_padding(kind):
    from transformers import BertConfig, BertModel, RobertaConfig, RobertaModel

    sizes = {"vocab_size": 50, "hidden_size": 16, "num_hidden_layers": 1, "num_attention_heads": 2,
             "intermediate_size": 20, "max_position_embeddings": 40}
    torch.manual_seed(0)
    transformer = BertModel(BertConfig(**sizes)) if kind == "bert" else \
        RobertaModel(RobertaConfig(**sizes, pad_token_id=1))
    encoder = BertEncoder(transformer, with_cls=True).eval()
    assert encoder.pad_id == (0 if kind == "bert" else 1)
    assert encoder.out_dim == 48 and transformer.pooler is None
    short, long = [2, 5, 7, 9, 3], [2, 5, 7, 9, 11, 12, 13, 14, 3]
    with torch.no_grad():
        alone = encoder(_batch([short], [(1, 3)]))  # (1, 3H)
        together = encoder(_batch([long, short], [(2, 5), (1, 3)]))  # (2, 3H)
    assert torch.allclose(alone[0], together[1], atol=1e-5)


def test_registry_builds_from_pretrained_weights_and_from_a_checkpoint_config(folders):
    base, tok_dir = folders
    tok = MarkerTokenizer.load(tok_dir)
    cfg = ModelConfig(model="bert", pretrained=str(base), dropout=0.1)
    torch.manual_seed(0)
    model = build_model(cfg, ModelSpec(len(tok.tokenizer), 3, 10)).eval()
    embeddings = model.encoder.transformer.get_input_embeddings()
    assert embeddings.num_embeddings == len(tok.tokenizer) and model.encoder.out_dim == 64
    from transformers import AutoModel

    original = AutoModel.from_pretrained(str(base))  # the pretrained rows are kept, the marker rows added
    assert torch.equal(embeddings.weight[:original.config.vocab_size], original.get_input_embeddings().weight)

    rebuilt = build_model(ModelConfig(model="bert", pretrained="/gone", dropout=0.1),
                          ModelSpec(len(tok.tokenizer), 3, 10,
                                    pretrained_config=(tok_dir / "config.json").read_text())).eval()
    rebuilt.load_state_dict(model.state_dict())  # strict: the same architecture
    batch = _batch([[2, 30, 40, 31, 50, 32, 41, 33, 3]], [(1, 5)])
    with torch.no_grad():
        assert torch.equal(model(batch), rebuilt(batch))


def test_optimizers_per_model_type(folders):
    base, tok_dir = folders
    cfg = Config.from_dict({"train": {"lr": 1e-3, "weight_decay": 0.01, "epochs": 2}})
    cnn = build_model(cfg.model, ModelSpec(20, 3, 10))
    optimizer, schedule = build_optimizer(cfg, cnn, 5)
    assert type(optimizer) is torch.optim.Adam and isinstance(schedule, PlateauSchedule)
    assert isinstance(schedule.scheduler, torch.optim.lr_scheduler.ReduceLROnPlateau)
    assert schedule.scheduler.factor == cfg.train.lr_factor and schedule.scheduler.patience == cfg.train.lr_patience

    cfg = Config.from_dict({"model": {"model": "bert", "pretrained": str(base)},
                            "train": {"lr": 1e-3, "encoder_lr": 5e-5, "weight_decay": 0.01, "epochs": 2,
                                      "warmup_ratio": 0.25}})
    model = build_model(cfg.model, ModelSpec(len(MarkerTokenizer.load(tok_dir).tokenizer), 3, 10))
    optimizer, schedule = build_optimizer(cfg, model, 4)  # 8 steps, 2 of warm-up
    assert type(optimizer) is torch.optim.AdamW and isinstance(schedule, LinearWarmupSchedule)
    groups = {(g["initial_lr"], g["weight_decay"]): sum(p.numel() for p in g["params"]) for g in optimizer.param_groups}
    encoder = sum(p.numel() for p in model.encoder.parameters())
    head = sum(p.numel() for p in model.fc.parameters())
    assert groups[(5e-5, 0.01)] + groups[(5e-5, 0.0)] == encoder
    assert groups[(1e-3, 0.01)] + groups[(1e-3, 0.0)] == head
    lrs = []
    for _ in range(8):
        lrs.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        schedule.after_step()
    assert lrs == pytest.approx([0, 2.5e-5, 5e-5, 5e-5 * 5 / 6, 5e-5 * 4 / 6, 5e-5 * 3 / 6, 5e-5 * 2 / 6, 5e-5 / 6])
    schedule.after_epoch(0.5)  # no effect on a per-step schedule
    assert optimizer.param_groups[0]["lr"] == 0
    assert steps_per_epoch(101, 2, 10, 2) == math.ceil(math.ceil(51 / 10) / 2) == 3


def tiny_subword_data(tok_dir) -> dict:
    """The loop's ``data`` dict for the tiny templates, encoded with the subword tokenizer."""
    labels = sorted(TEMPLATES)
    encoded = encode_subword_batch(tiny_frame(), str(tok_dir), 32, False, labels)
    splits = {"train": EncodedSplit.from_frame(encoded, 50), "valid": EncodedSplit.from_frame(encoded.iloc[::3], 50),
              "test": EncodedSplit.from_frame(encoded.iloc[1::3], 50)}
    vocab = Vocab(MarkerTokenizer.load(tok_dir).vocabulary(), subword=True)
    return {"splits": {k: v.arrays for k, v in splits.items()}, "vocab": vocab.as_json(), "labels": labels,
            "num_positions": 102, "assets": pretrained_assets(tok_dir)}


@pytest.mark.timeout(300)
def test_local_loop_fine_tunes_and_checkpoints_the_tokenizer(folders, tmp_path):
    base, tok_dir = folders
    cfg = Config.from_dict({"model": {"model": "bert", "pretrained": str(base), "dropout": 0.1},
                            "train": {"epochs": 8, "batch_size": 4, "lr": 1e-2, "encoder_lr": 3e-3,
                                      "grad_accum": 2, "warmup_ratio": 0.1, "seed": 3}})
    data = tiny_subword_data(tok_dir)
    trainer = TorchTrainer(
        train_loop_per_worker,
        train_loop_config={"config": cfg.to_dict(), "data": data, "tracking_uri": None, "run_id": None},
        scaling_config=ray.train.ScalingConfig(num_workers=0),
        run_config=ray.train.RunConfig(name="bert-local", storage_path=str(tmp_path)),
    )
    result = trainer.fit()
    assert result.metrics["epoch"] == 8
    assert result.metrics["valid_macro_f1"] > 0.6  # 3 classes: chance is about 0.33
    folder = Path(result.checkpoint.to_directory(str(tmp_path / "ckpt")))
    assert (folder / PRETRAINED_DIR / "tokenizer.json").is_file()
    loaded = load_checkpoint(folder)
    shutil.rmtree(folder)
    assert loaded.vocab.subword and len(loaded.vocab) == len(data["vocab"]["tokens"])
    assert f"{PRETRAINED_DIR}/config.json" in loaded.meta["files"] and loaded.pretrained_config
    assert loaded.state["scheduler"]["last_epoch"] == 8 * steps_per_epoch(36, 1, 4, 2)

    # The loaded checkpoint alone (its folder is gone) rebuilds the model and encodes raw rows as in training.
    predictor = Predictor.from_loaded(loaded)
    frame = tiny_frame()
    predicted = predictor.predict_frame(frame)
    dataset = EncodedDataset(EncodedSplit({k: np.array(v) for k, v in data["splits"]["train"].items()}))
    with torch.no_grad():
        logits = predictor.model(dataset.__getitems__(list(range(len(dataset)))))
    expected = [sorted(TEMPLATES)[i] for i in logits.argmax(-1).tolist()]
    assert predicted["predicted_relation"].tolist() == expected
    assert (predicted["predicted_relation"] == frame["relation"]).mean() > 0.6


def test_gradient_accumulation_matches_one_larger_batch(monkeypatch):
    """Two accumulated batches of 4 make the same SGD step as one batch of 8 (and the short last group too)."""
    from torch.utils.data import DataLoader

    from nre_ray.data.encode import identity_collate
    from nre_ray.run import loop
    from tests.helpers import tiny_data

    monkeypatch.setattr(loop.ray.train.torch, "get_device", lambda: torch.device("cpu"))
    data = tiny_data()
    split = EncodedSplit({k: np.array(v) for k, v in data["splits"]["train"].items()})  # 36 rows
    cfg = ModelConfig(model="cnn", word_dim=8, pos_dim=3, hidden_size=6, dropout=0.0, embedding_dropout=0.0)
    spec = ModelSpec(len(data["vocab"]), 3, data["num_positions"])
    params = []
    for batch_size, accum in ((8, 1), (4, 2)):
        torch.manual_seed(0)
        model = build_model(cfg, spec)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
        loader = DataLoader(EncodedDataset(split), batch_size=batch_size, collate_fn=identity_collate)
        loop._train_epoch(SENTENCE, model, loader, optimizer, grad_clip=0.0, grad_accum=accum)
        params.append(torch.cat([p.detach().flatten() for p in model.parameters()]))
    torch.testing.assert_close(params[0], params[1], atol=1e-6, rtol=1e-5)


def test_pretrained_flags_are_checked():
    from nre_ray.config import ConfigError

    with pytest.raises(ConfigError, match="--model bert needs --pretrained"):
        Config.from_dict({"model": {"model": "bert"}})
    with pytest.raises(ConfigError, match="--pretrained is for --model bert"):
        Config.from_dict({"model": {"model": "cnn", "pretrained": "x"}})
    with pytest.raises(ConfigError, match="--grad-accum"):
        Config.from_dict({"train": {"grad_accum": 0}})


def test_gradient_checkpointing_gives_the_same_gradients(folders):
    base, _ = folders
    grads = []
    for checkpointing in (False, True):
        torch.manual_seed(0)
        model = build_model(ModelConfig(model="bert", pretrained=str(base), dropout=0.0,
                                        gradient_checkpointing=checkpointing), ModelSpec(900, 3, 10))
        model.train()
        for module in model.modules():  # the same forward pass twice: no dropout
            if isinstance(module, torch.nn.Dropout):
                module.p = 0.0
        assert any(getattr(m, "gradient_checkpointing", False) for m in model.modules()) == checkpointing
        batch = _batch([[2, 30, 40, 31, 50, 32, 41, 33, 3]] * 2, [(1, 5), (1, 5)])
        model(batch).sum().backward()
        grads.append(model.encoder.transformer.get_input_embeddings().weight.grad.clone())
    torch.testing.assert_close(grads[0], grads[1])

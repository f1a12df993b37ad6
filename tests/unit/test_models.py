"""Models: output shapes, and the same logits for an example alone or padded inside a batch."""

import pytest
import torch

from nre_ray.config import ModelConfig
from nre_ray.models import MODELS, register
from nre_ray.models.registry import ModelSpec
from nre_ray.tasks.sentence.classifier import build_model

SPEC = ModelSpec(vocab_size=50, num_classes=4, num_positions=12)


def _example(length: int, seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {
        "tokens": torch.randint(2, 50, (1, length), generator=g),
        "head_pos": torch.randint(1, 12, (1, length), generator=g),
        "tail_pos": torch.randint(1, 12, (1, length), generator=g),
        "segments": torch.tensor([[1] * (length // 3) + [2] * (length // 3) + [3] * (length - 2 * (length // 3))]),
        "mask": torch.ones(1, length, dtype=torch.bool),
        "head_span": torch.tensor([[0, min(2, length)]]),
        "tail_span": torch.tensor([[length - 1, length]]),
    }


def _pad(examples: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """Pad the (1, T) tensors to the longest example and stack; spans (1, 2) are stacked as they are."""
    width = max(e["tokens"].shape[1] for e in examples)
    return {k: torch.cat([e[k] if k.endswith("_span") else torch.nn.functional.pad(e[k], (0, width - e[k].shape[1]))
                          for e in examples])
            for k in examples[0]}


@pytest.mark.parametrize("name", sorted(set(MODELS) - {"bert"}))  # bert needs a pretrained model: test_bert.py
def test_shapes_and_padding_invariance(name):
    torch.manual_seed(0)
    model = build_model(ModelConfig(model=name, word_dim=8, pos_dim=3, hidden_size=6), SPEC).eval()
    examples = [_example(n, i) for i, n in enumerate((5, 17, 1, 9))]
    batch = _pad(examples)
    logits = model(batch)
    assert logits.shape == (4, SPEC.num_classes)
    for i, e in enumerate(examples):
        alone = model(e)
        torch.testing.assert_close(alone[0], logits[i], atol=1e-5, rtol=0)
    with torch.no_grad():  # evaluation runs without autograd, where PyTorch may take other (fast) paths
        batched = model(batch)
        torch.testing.assert_close(batched, logits, atol=1e-5, rtol=0)
        for i, e in enumerate(examples):
            torch.testing.assert_close(model(e)[0], batched[i], atol=1e-5, rtol=0)


def test_unknown_and_duplicate_names():
    with pytest.raises(ValueError, match="unknown model 'nope'"):
        build_model(ModelConfig(model="nope"), SPEC)
    with pytest.raises(ValueError, match="already registered"):
        register("cnn")(lambda cfg, spec: None)


@pytest.mark.parametrize("name", ["bilstm", "transformer"])
def test_padded_positions_are_never_read(name):
    """Garbage ids under the padding mask change nothing: the BiLSTM runs on packed sequences, the Transformer masks
    padded keys and pools over real tokens only."""
    torch.manual_seed(0)
    model = build_model(ModelConfig(model=name, word_dim=8, pos_dim=3, hidden_size=6), SPEC).eval()
    batch = _pad([_example(n, i) for i, n in enumerate((5, 17, 2, 9))])
    garbage = dict(batch)
    for key, high in (("tokens", 50), ("head_pos", 12), ("tail_pos", 12), ("segments", 4)):
        noise = torch.randint(1, high, batch[key].shape, generator=torch.Generator().manual_seed(1))
        garbage[key] = torch.where(batch["mask"], batch[key], noise)
    with torch.no_grad():
        torch.testing.assert_close(model(garbage), model(batch), atol=1e-5, rtol=0)


def test_encoder_sizes_and_limits():
    cfg = {"word_dim": 8, "pos_dim": 3, "hidden_size": 7}
    bilstm = build_model(ModelConfig(model="bilstm", num_layers=2, **cfg), SPEC)
    assert bilstm.encoder.out_dim == 6 and bilstm.encoder.lstm.num_layers == 2  # 3 units per direction
    transformer = build_model(ModelConfig(model="transformer", max_positions=8, **cfg), SPEC)
    assert transformer.encoder.out_dim == 3 * 7  # max-pool + head + tail states, d_model 7 (one head)
    assert len(transformer.encoder.encoder.layers) == 2
    assert build_model(ModelConfig(model="transformer", hidden_size=16, num_heads=2), SPEC).encoder.encoder.layers[
        0].self_attn.num_heads == 2
    with pytest.raises(ValueError, match="exceeds the transformer's --max-positions 8"):
        transformer(_example(9, 0))
    with pytest.raises(ValueError, match="--num-heads 3 must divide --hidden-size 7"):
        build_model(ModelConfig(model="transformer", num_heads=3, **cfg), SPEC)

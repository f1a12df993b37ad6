"""Models: output shapes, and the same logits for an example alone or padded inside a batch."""

import pytest
import torch

from nre_ray.config import ModelConfig
from nre_ray.models import MODELS, build_model, register
from nre_ray.models.registry import ModelSpec

SPEC = ModelSpec(vocab_size=50, num_classes=4, num_positions=12)


def _example(length: int, seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {
        "tokens": torch.randint(2, 50, (1, length), generator=g),
        "head_pos": torch.randint(1, 12, (1, length), generator=g),
        "tail_pos": torch.randint(1, 12, (1, length), generator=g),
        "segments": torch.tensor([[1] * (length // 3) + [2] * (length // 3) + [3] * (length - 2 * (length // 3))]),
        "mask": torch.ones(1, length, dtype=torch.bool),
    }


def _pad(examples: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    width = max(e["tokens"].shape[1] for e in examples)
    return {k: torch.cat([torch.nn.functional.pad(e[k], (0, width - e[k].shape[1])) for e in examples])
            for k in examples[0]}


@pytest.mark.parametrize("name", sorted(MODELS))
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


def test_unknown_and_duplicate_names():
    with pytest.raises(ValueError, match="unknown model 'nope'"):
        build_model(ModelConfig(model="nope"), SPEC)
    with pytest.raises(ValueError, match="already registered"):
        register("cnn")(lambda cfg, spec: None)

"""Transformer sentence encoder over word + relative-position embeddings, with entity-aware pooling."""

from __future__ import annotations

import torch
from torch import nn

from nre_ray.models.embedding import WordPositionEmbedding

#: Dropout inside the attention and feed-forward blocks (the classifier head has its own, --dropout).
LAYER_DROPOUT = 0.1


def default_num_heads(d_model: int) -> int:
    """The largest of 8, 4, 2, 1 that divides ``d_model``."""
    return next(h for h in (8, 4, 2, 1) if d_model % h == 0)


class TransformerEncoder(nn.Module):
    """Embed -> project to ``d_model`` -> + learned absolute positions -> pre-norm Transformer encoder -> pooling.

    The input keeps the two relative-position embeddings (distance to head and tail), so the model knows where the
    entities are; the output concatenates a max-pool over the real tokens with the mean state of the head span and of
    the tail span: (B, 3 * d_model). Padded tokens are masked as attention keys and left out of every pool, and the
    fast path's nested tensors are disabled, so an example gives the same output alone or padded in a batch.
    """

    def __init__(self, embedding: WordPositionEmbedding, d_model: int, num_layers: int, num_heads: int,
                 max_positions: int) -> None:
        super().__init__()
        if d_model % num_heads:
            raise ValueError(f"the transformer's --num-heads {num_heads} must divide --hidden-size {d_model}")
        self.embedding = embedding
        self.project = nn.Linear(embedding.dim, d_model) if embedding.dim != d_model else nn.Identity()
        self.position = nn.Embedding(max_positions, d_model)
        layer = nn.TransformerEncoderLayer(d_model, num_heads, dim_feedforward=4 * d_model, dropout=LAYER_DROPOUT,
                                           activation="gelu", batch_first=True, norm_first=True)
        self.encoder = nn.TransformerEncoder(layer, num_layers, norm=nn.LayerNorm(d_model),
                                             enable_nested_tensor=False)
        self.max_positions = max_positions
        self.out_dim = 3 * d_model

    def forward(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """Batch of (B, T) tensors plus ``head_span``/``tail_span`` (B, 2) -> (B, 3 * d_model)."""
        mask = batch["mask"]  # (B, T) True on real tokens
        width = mask.shape[1]
        if width > self.max_positions:
            raise ValueError(f"a batch of {width} tokens exceeds the transformer's --max-positions "
                             f"{self.max_positions}")
        x = self.project(self.embedding(batch["tokens"], batch["head_pos"], batch["tail_pos"]))  # (B, T, D)
        x = x + self.position(torch.arange(width, device=x.device)).unsqueeze(0)  # (B, T, D)
        h = self.encoder(x, src_key_padding_mask=~mask)  # (B, T, D)
        pooled = h.masked_fill(~mask.unsqueeze(-1), float("-inf")).max(dim=1).values  # (B, D)
        head = _span_mean(h, batch["head_span"], mask)  # (B, D)
        tail = _span_mean(h, batch["tail_span"], mask)  # (B, D)
        return torch.cat([pooled, head, tail], dim=-1)  # (B, 3D)


def _span_mean(h: torch.Tensor, span: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean of ``h`` (B, T, D) over the real tokens of each ``[start, end)`` span (B, 2); an empty span gives zeros."""
    steps = torch.arange(h.shape[1], device=h.device).unsqueeze(0)  # (1, T)
    inside = (steps >= span[:, :1]) & (steps < span[:, 1:]) & mask  # (B, T)
    total = torch.where(inside.unsqueeze(-1), h, torch.zeros_like(h)).sum(dim=1)  # (B, D); padded states never read
    return total / inside.sum(dim=1, keepdim=True).clamp(min=1).to(h.dtype)  # (B, D)

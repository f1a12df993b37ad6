"""CNN and PCNN sentence encoders (Zeng et al. 2014, 2015) with padding masked before pooling."""

from __future__ import annotations

import torch
from torch import nn

from nre_ray.models.embedding import WordPositionEmbedding


class CNNEncoder(nn.Module):
    """Embed -> Conv1d -> ReLU -> max-pool over the real tokens only. Output (B, hidden_size).

    The convolution pads with zeros and padded positions embed to zeros, so a token's features do not depend on how
    much padding follows; masking before the max then makes the output independent of the batch's padding.
    """

    def __init__(self, embedding: WordPositionEmbedding, hidden_size: int, kernel_size: int) -> None:
        super().__init__()
        self.embedding = embedding
        self.conv = nn.Conv1d(embedding.dim, hidden_size, kernel_size, padding=kernel_size // 2)
        self.out_dim = hidden_size

    def features(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """Per-token convolution features, (B, T, H)."""
        x = self.embedding(batch["tokens"], batch["head_pos"], batch["tail_pos"])  # (B, T, E)
        return torch.relu(self.conv(x.transpose(1, 2))).transpose(1, 2)  # (B, T, H)

    def forward(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """Batch of (B, T) tensors -> (B, H)."""
        h = self.features(batch)  # (B, T, H)
        h = h.masked_fill(~batch["mask"].unsqueeze(-1), float("-inf"))
        return h.max(dim=1).values  # (B, H)


class PCNNEncoder(CNNEncoder):
    """CNN with piecewise max-pooling over the three pieces cut by the two entities. Output (B, 3 * hidden_size).

    An empty piece (an entity at the sentence edge, nested entities) pools to zeros.
    """

    def __init__(self, embedding: WordPositionEmbedding, hidden_size: int, kernel_size: int) -> None:
        super().__init__(embedding, hidden_size, kernel_size)
        self.out_dim = 3 * hidden_size

    def forward(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """Batch of (B, T) tensors -> (B, 3H)."""
        h = self.features(batch)  # (B, T, H)
        pieces = []
        for piece in (1, 2, 3):
            inside = (batch["segments"] == piece).unsqueeze(-1)  # (B, T, 1)
            pooled = h.masked_fill(~inside, float("-inf")).max(dim=1).values  # (B, H)
            pieces.append(torch.where(inside.any(dim=1), pooled, torch.zeros_like(pooled)))
        return torch.cat(pieces, dim=-1)  # (B, 3H)

"""Word + relative-position embeddings, shared by every encoder trained from scratch."""

from __future__ import annotations

import torch
from torch import nn


class WordPositionEmbedding(nn.Module):
    """Concatenates a word embedding with two position embeddings (relative to head and to tail), then dropout.

    Index 0 is padding in all three tables and maps to a zero vector that never trains, so padded positions
    contribute nothing (dropout keeps zeros zero).
    """

    def __init__(self, vocab_size: int, word_dim: int, num_positions: int, pos_dim: int,
                 dropout: float = 0.0) -> None:
        super().__init__()
        self.word = nn.Embedding(vocab_size, word_dim, padding_idx=0)
        self.head_pos = nn.Embedding(num_positions, pos_dim, padding_idx=0)
        self.tail_pos = nn.Embedding(num_positions, pos_dim, padding_idx=0)
        self.dropout = nn.Dropout(dropout)
        self.dim = word_dim + 2 * pos_dim

    def forward(self, tokens: torch.Tensor, head_pos: torch.Tensor, tail_pos: torch.Tensor) -> torch.Tensor:
        """(B, T) ids x3 -> (B, T, word_dim + 2 * pos_dim)."""
        return self.dropout(torch.cat([self.word(tokens), self.head_pos(head_pos), self.tail_pos(tail_pos)], dim=-1))

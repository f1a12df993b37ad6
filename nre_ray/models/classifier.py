"""The classifier head: encoder -> dropout -> linear -> logits. It owns nothing about distribution or devices."""

from __future__ import annotations

import torch
from torch import nn


class RelationClassifier(nn.Module):
    """Any encoder with an ``out_dim`` plus a softmax classifier (logits go straight to the loss)."""

    def __init__(self, encoder: nn.Module, num_classes: int, dropout: float) -> None:
        super().__init__()
        self.encoder = encoder
        self.dropout = nn.Dropout(dropout)
        self.fc = nn.Linear(encoder.out_dim, num_classes)

    def forward(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """Batch of (B, T) tensors -> logits (B, C)."""
        return self.fc(self.dropout(self.encoder(batch)))

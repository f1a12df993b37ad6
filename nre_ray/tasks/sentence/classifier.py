"""The sentence task's head: encoder -> dropout -> linear -> logits. It owns nothing about distribution or devices."""

from __future__ import annotations

import torch
from torch import nn

from nre_ray.models.registry import ModelSpec, build_encoder


class RelationClassifier(nn.Module):
    """Any encoder with an ``out_dim`` plus a softmax classifier (logits go straight to the loss)."""

    def __init__(self, encoder: nn.Module, num_classes: int, dropout: float) -> None:
        super().__init__()
        self.encoder = encoder
        self.dropout = nn.Dropout(dropout)
        self.fc = nn.Linear(encoder.out_dim, num_classes)

    def forward(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """Batch of (B, T) tensors -> logits (B, C)."""
        return self.fc(self.dropout(self.encoder(batch)))  # (B, C)


def build_model(model_config: object, spec: ModelSpec) -> RelationClassifier:
    """``--model``'s encoder (:func:`nre_ray.models.registry.build_encoder`) with the classifier head over
    ``spec.num_classes`` labels; the encoder's parameters are drawn first, then the head's (the order the random
    initialisation follows, so a seed gives the same weights as before the task layer)."""
    return RelationClassifier(build_encoder(model_config, spec), spec.num_classes, model_config.dropout)

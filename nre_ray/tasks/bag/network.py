"""The bag model: any of the project's sentence encoders (``nre_ray/models``: cnn, pcnn, bilstm, transformer, bert)
under a bag aggregator (:mod:`.aggregators`).

A batch of B bags is the encoder's sentence batch for the N sentences of all of them, bag after bag (the usual
(N, T) tensors: ``tokens``, ``head_pos``, ``tail_pos``, ``mask``, ``segments``, or the subword ones), plus

* ``scope`` (B + 1,) int64: bag b is sentences ``scope[b]:scope[b + 1]``;
* ``labels`` (B, C) bool: the bag's label set (multi-hot; NA is a label of its own; see :mod:`.bags`).

The loss is OpenNRE's for NYT10: softmax cross-entropy, one term per (bag, label) instance (:func:`instances`), so
a bag with two relations is trained as OpenNRE trains its two (head, tail, relation) bags, each with its own
attention query. We chose it over a sigmoid/BCE multi-label loss to match the published NYT10 numbers' setup and
because the evaluation ranks (bag, relation) scores that are softmax probabilities in OpenNRE too.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from nre_ray.models.registry import ModelSpec, build_encoder
from nre_ray.tasks.bag.aggregators import AGGREGATORS, BagAggregator


def instances(labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(B, C) multi-hot labels -> ``(bag_of, query)``, both (K,): one instance per (bag, label), bag by bag, labels
    ascending. Raises ValueError when a bag has no label."""
    if bool((~labels.bool().any(dim=1)).any()):
        raise ValueError("every bag needs at least one label (NA counts as one)")
    bag_of, query = torch.nonzero(labels.bool(), as_tuple=True)  # (K,), (K,)
    return bag_of, query


class BagClassifier(nn.Module):
    """A sentence encoder ((N, T) tensors -> (N, H), ``out_dim`` = H) under a bag aggregator."""

    def __init__(self, encoder: nn.Module, aggregator: BagAggregator) -> None:
        super().__init__()
        self.encoder = encoder
        self.aggregator = aggregator

    def sentences(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """The sentence vectors (N, H) of the batch (``scope`` and ``labels`` are not the encoder's)."""
        return self.encoder({k: v for k, v in batch.items() if k not in ("scope", "labels", "index")})  # (N, H)

    def forward(self, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, ...]:
        """``(logits (K, C), query (K,))`` of the batch's (bag, label) instances; in eval mode also the bags'
        probabilities (B, C) (:meth:`scores`'), from the same sentence vectors."""
        bag_of, query = instances(batch["labels"])
        reps = self.sentences(batch)  # (N, H)
        logits = self.aggregator.train_logits(reps, batch["scope"], bag_of, query)  # (K, C)
        if self.training:
            return logits, query
        return logits, query, self.aggregator.scores(reps, batch["scope"])

    def loss(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """Mean softmax cross-entropy over the batch's instances (a scalar)."""
        logits, query = self(batch)[:2]
        return F.cross_entropy(logits, query)

    @torch.no_grad()
    def scores(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """Inference: probabilities (B, C), one row per bag (call in eval mode)."""
        return self.aggregator.scores(self.sentences(batch), batch["scope"])


def build_bag_model(model_config: object, spec: ModelSpec, aggregator: str) -> BagClassifier:
    """The encoder that ``--model`` names (:func:`nre_ray.models.registry.build_encoder`) under the ``aggregator``
    (``att``, ``avg``, ``one``) with ``spec.num_classes`` relations and
    ``model_config.dropout`` on the bag vector."""
    if aggregator not in AGGREGATORS:
        raise ValueError(f"unknown bag aggregator {aggregator!r}; choose one of: {', '.join(AGGREGATORS)}")
    encoder = build_encoder(model_config, spec)
    return BagClassifier(encoder, AGGREGATORS[aggregator](encoder.out_dim, spec.num_classes, model_config.dropout))

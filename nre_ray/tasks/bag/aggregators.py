"""Bag aggregators: a bag's sentence vectors -> relation scores, after OpenNRE's ``model/bag_attention.py``,
``bag_average.py`` and ``bag_one.py``. Each owns the relation classifier ``fc`` (the attention's query matrix too).

Inputs, for a batch of B bags holding N sentences in all (no padding: bags of any size side by side):

* ``reps`` (N, H): the sentence encoder's vectors, bag after bag;
* ``scope`` (B + 1,) int64 offsets: bag b is ``reps[scope[b]:scope[b + 1]]`` (every bag non-empty);
* at training time, K (bag, relation) *instances*: ``bag_of`` (K,) and ``query`` (K,) relation ids. A bag with one
  label is one instance; a multi-label bag is one instance per label, as OpenNRE trains NYT10 on (head, tail,
  relation) bags. Softmax cross-entropy over the instances' logits (K, C) is the loss (:mod:`.network`).

``train_logits(reps, scope, bag_of, query) -> (K, C)`` logits (dropout on the bag vector, as OpenNRE);
``scores(reps, scope) -> (B, C)`` probabilities at inference (no dropout; each relation scored on its own terms).
"""

from __future__ import annotations

import torch
from torch import nn


def segment_ids(scope: torch.Tensor) -> torch.Tensor:
    """(B + 1,) offsets -> (N,) the bag of each sentence."""
    sizes = scope[1:] - scope[:-1]  # (B,)
    if bool((sizes < 1).any()):
        raise ValueError("every bag needs at least one sentence (scope must be strictly increasing)")
    return torch.repeat_interleave(torch.arange(len(sizes), device=scope.device), sizes)  # (N,)


def instance_rows(scope: torch.Tensor, bag_of: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The sentences of K instances: ``(rows, instance)``, both (M,), M = sum of the instances' bag sizes:
    sentence ``rows[m]`` belongs to instance ``instance[m]``."""
    sizes = (scope[1:] - scope[:-1])[bag_of]  # (K,)
    instance = torch.repeat_interleave(torch.arange(len(bag_of), device=scope.device), sizes)  # (M,)
    starts = torch.cumsum(sizes, 0) - sizes  # (K,) first position of each instance in M
    rows = scope[bag_of][instance] + torch.arange(len(instance), device=scope.device) - starts[instance]  # (M,)
    return rows, instance


def segment_softmax(scores: torch.Tensor, segment: torch.Tensor, num_segments: int) -> torch.Tensor:
    """Softmax of ``scores`` (M,) or (M, C) within each segment (``segment`` (M,) in [0, num_segments))."""
    shape = (num_segments, *scores.shape[1:])
    index = segment.view(-1, *([1] * (scores.dim() - 1))).expand_as(scores)
    peak = torch.full(shape, float("-inf"), dtype=scores.dtype, device=scores.device)
    peak = peak.scatter_reduce(0, index, scores, reduce="amax", include_self=True)
    weights = torch.exp(scores - peak[segment])
    totals = torch.zeros(shape, dtype=scores.dtype, device=scores.device).index_add(0, segment, weights)
    return weights / totals[segment]


def segment_sum(values: torch.Tensor, segment: torch.Tensor, num_segments: int) -> torch.Tensor:
    """Sum of ``values`` (M, ...) per segment -> (num_segments, ...)."""
    out = torch.zeros((num_segments, *values.shape[1:]), dtype=values.dtype, device=values.device)
    return out.index_add(0, segment, values)


class BagAggregator(nn.Module):
    """What the three aggregators share: the classifier ``fc`` (H -> C) and dropout on the bag vector."""

    def __init__(self, hidden_size: int, num_classes: int, dropout: float = 0.5) -> None:
        super().__init__()
        self.fc = nn.Linear(hidden_size, num_classes)
        self.dropout = nn.Dropout(dropout)

    def train_logits(self, reps: torch.Tensor, scope: torch.Tensor, bag_of: torch.Tensor,
                     query: torch.Tensor) -> torch.Tensor:
        """(N, H), (B + 1,), (K,), (K,) -> logits (K, C)."""
        raise NotImplementedError

    def scores(self, reps: torch.Tensor, scope: torch.Tensor) -> torch.Tensor:
        """(N, H), (B + 1,) -> probabilities (B, C)."""
        raise NotImplementedError


class BagAttention(BagAggregator):
    """Selective attention (Lin et al. 2016): a sentence's weight in its bag is ``softmax_bag(x_i · diag · r)``, with
    ``r`` the relation's row of ``fc.weight`` (the relation query matrix) and ``diag`` a learnt diagonal (OpenNRE's
    ``use_diag``). Training: the query is the instance's label. Inference: every relation c attends with its own
    query, and the bag's score for c is ``softmax(fc(bag vector for c))[c]``."""

    def __init__(self, hidden_size: int, num_classes: int, dropout: float = 0.5) -> None:
        super().__init__(hidden_size, num_classes, dropout)
        self.diag = nn.Parameter(torch.ones(hidden_size))

    def train_logits(self, reps: torch.Tensor, scope: torch.Tensor, bag_of: torch.Tensor,
                     query: torch.Tensor) -> torch.Tensor:
        rows, instance = instance_rows(scope, bag_of)  # (M,), (M,)
        x = reps[rows]  # (M, H)
        q = self.fc.weight[query[instance]] * self.diag  # (M, H)
        alpha = segment_softmax((x * q).sum(-1), instance, len(bag_of))  # (M,)
        bag = segment_sum(alpha.unsqueeze(-1) * x, instance, len(bag_of))  # (K, H)
        return self.fc(self.dropout(bag))  # (K, C)

    def scores(self, reps: torch.Tensor, scope: torch.Tensor) -> torch.Tensor:
        segment = segment_ids(scope)  # (N,)
        num_bags = len(scope) - 1
        att = (reps * self.diag) @ self.fc.weight.T  # (N, C): sentence i under relation c's query
        alpha = segment_softmax(att, segment, num_bags)  # (N, C)
        bags = segment_sum(alpha.unsqueeze(-1) * reps.unsqueeze(1), segment, num_bags)  # (B, C, H)
        probs = torch.softmax(self.fc(bags), dim=-1)  # (B, C, C): the bag seen for relation c, scored on all
        return torch.diagonal(probs, dim1=1, dim2=2)  # (B, C)


class BagAverage(BagAggregator):
    """The mean of the bag's sentence vectors, classified (OpenNRE's ``bag_average``)."""

    def train_logits(self, reps: torch.Tensor, scope: torch.Tensor, bag_of: torch.Tensor,
                     query: torch.Tensor) -> torch.Tensor:
        return self.fc(self.dropout(self._means(reps, scope)[bag_of]))  # (K, C)

    def scores(self, reps: torch.Tensor, scope: torch.Tensor) -> torch.Tensor:
        return torch.softmax(self.fc(self._means(reps, scope)), dim=-1)  # (B, C)

    @staticmethod
    def _means(reps: torch.Tensor, scope: torch.Tensor) -> torch.Tensor:
        segment = segment_ids(scope)  # (N,)
        sizes = (scope[1:] - scope[:-1]).to(reps.dtype).unsqueeze(-1)  # (B, 1)
        return segment_sum(reps, segment, len(scope) - 1) / sizes  # (B, H)


class BagOne(BagAggregator):
    """The most confident sentence (Zeng et al. 2015; OpenNRE's ``bag_one``). Training: the sentence whose own
    probability of the instance's label is highest (the first on ties) stands for the bag. Inference: the bag's
    score for c is the highest probability of c over its sentences."""

    def train_logits(self, reps: torch.Tensor, scope: torch.Tensor, bag_of: torch.Tensor,
                     query: torch.Tensor) -> torch.Tensor:
        rows, instance = instance_rows(scope, bag_of)  # (M,), (M,)
        with torch.no_grad():
            probs = torch.softmax(self.fc(reps), dim=-1)  # (N, C)
            own = probs[rows, query[instance]]  # (M,)
            best = torch.full((len(bag_of),), float("-inf"), dtype=own.dtype, device=own.device)
            best = best.scatter_reduce(0, instance, own, reduce="amax", include_self=True)  # (K,)
            candidates = torch.where(own == best[instance], rows, torch.full_like(rows, reps.shape[0]))  # (M,)
            chosen = torch.full((len(bag_of),), reps.shape[0], dtype=rows.dtype, device=rows.device)
            chosen = chosen.scatter_reduce(0, instance, candidates, reduce="amin", include_self=True)  # (K,)
        return self.fc(self.dropout(reps[chosen]))  # (K, C)

    def scores(self, reps: torch.Tensor, scope: torch.Tensor) -> torch.Tensor:
        segment = segment_ids(scope)  # (N,)
        probs = torch.softmax(self.fc(reps), dim=-1)  # (N, C)
        index = segment.unsqueeze(-1).expand_as(probs)
        out = torch.zeros((len(scope) - 1, probs.shape[1]), dtype=probs.dtype, device=probs.device)
        return out.scatter_reduce(0, index, probs, reduce="amax", include_self=False)  # (B, C)


AGGREGATORS: dict[str, type[BagAggregator]] = {"att": BagAttention, "avg": BagAverage, "one": BagOne}
"""``--bag-aggregator`` name -> class."""

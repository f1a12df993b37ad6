"""Documents are not rows of equal length: batches by length, shards by tokens, and padding into tensors.

All pure and deterministic (ties broken by position), on lengths in tokens:

* :func:`length_batches` sorts the documents by length and cuts batches whose padded size (batch size x longest
  document) stays within a token budget, so padding is bounded: a batch only holds documents of similar lengths;
* :func:`padding_share` says which part of the padded tensors is padding;
* :func:`shard_by_tokens` gives each worker about the same number of tokens (greedy: the longest document first, to
  the shard with the fewest tokens so far), rather than the same number of documents;
* :func:`deal_batches` deals whole batches to the ranks, the same number each, balancing their tokens, and
  :class:`LengthBatchSampler` is what a rank's training loader runs (length batches, dealt, reordered each epoch);
* :func:`pad_batch` stacks :class:`~.encoding.EncodedDocument` objects into the model's padded arrays.
"""

from __future__ import annotations

import random
from collections.abc import Iterator, Sequence

import numpy as np
from torch.utils.data import Sampler

from nre_ray.tasks.document.encoding import EncodedDocument


def length_batches(lengths: Sequence[int], max_tokens: int, max_size: int | None = None,
                   shuffle_seed: int | None = None) -> list[list[int]]:
    """Batches of document positions, by length: sorted by (length, position), cut where adding the next document
    would make ``len(batch) * longest`` exceed ``max_tokens`` (a longer document alone is a batch of its own) or the
    batch hold ``max_size`` documents. ``shuffle_seed``: the order of the batches is shuffled with it (their
    contents stay), else batches run from short to long."""
    if max_tokens < 1:
        raise ValueError(f"max_tokens must be at least 1 (got {max_tokens})")
    order = sorted(range(len(lengths)), key=lambda i: (lengths[i], i))
    batches: list[list[int]] = []
    batch: list[int] = []
    for i in order:
        longest = max(lengths[i], max((lengths[j] for j in batch), default=0))
        if batch and ((len(batch) + 1) * longest > max_tokens or (max_size is not None and len(batch) >= max_size)):
            batches.append(batch)
            batch = []
        batch.append(i)
    if batch:
        batches.append(batch)
    if shuffle_seed is not None:
        random.Random(shuffle_seed).shuffle(batches)
    return batches


def padding_share(lengths: Sequence[int], batches: Sequence[Sequence[int]]) -> float:
    """The padding's share of the padded tensors: ``1 - real tokens / sum(len(batch) * longest in batch)``
    (0.0 for no batches)."""
    padded = sum(len(b) * max(lengths[i] for i in b) for b in batches if b)
    real = sum(lengths[i] for b in batches for i in b)
    return 1.0 - real / padded if padded else 0.0


def shard_by_tokens(lengths: Sequence[int], num_shards: int) -> list[list[int]]:
    """``num_shards`` lists of document positions (each sorted) with about equal token totals: the documents from
    the longest to the shortest, each to the shard with the fewest tokens so far (the lowest shard number on a tie).
    No shard's total exceeds the lightest's by more than the longest document."""
    if num_shards < 1:
        raise ValueError(f"num_shards must be at least 1 (got {num_shards})")
    shards: list[list[int]] = [[] for _ in range(num_shards)]
    totals = [0] * num_shards
    for i in sorted(range(len(lengths)), key=lambda i: (-lengths[i], i)):
        k = min(range(num_shards), key=lambda s: (totals[s], s))
        shards[k].append(i)
        totals[k] += lengths[i]
    return [sorted(s) for s in shards]


def pad_batch(docs: Sequence[EncodedDocument], pad_id: int = 0) -> dict[str, np.ndarray]:
    """The padded arrays of a batch of B documents (T: the longest, E: most entities, M: most mentions of an
    entity, P: most pairs, C: label columns):

    * ``input_ids`` (B, T) int64, ``pad_id`` where ``mask`` is False; ``mask`` (B, T) bool;
    * ``mention_pos`` (B, E, M) int64, -1 for no mention;
    * ``pairs`` (B, P, 2) int64, -1 for no pair;
    * ``labels`` (B, P, C) float32, 0 for no pair.
    """
    b = len(docs)
    t = max(d.length for d in docs)
    e = max((len(d.mention_pos) for d in docs), default=0)
    m = max((len(ps) for d in docs for ps in d.mention_pos), default=0)
    p = max(d.pairs.shape[0] for d in docs)
    c = docs[0].labels.shape[1]
    out = {
        "input_ids": np.full((b, t), pad_id, dtype=np.int64),
        "mask": np.zeros((b, t), dtype=bool),
        "mention_pos": np.full((b, max(e, 1), max(m, 1)), -1, dtype=np.int64),
        "pairs": np.full((b, max(p, 1), 2), -1, dtype=np.int64),
        "labels": np.zeros((b, max(p, 1), c), dtype=np.float32),
    }
    for k, d in enumerate(docs):
        out["input_ids"][k, :d.length] = d.input_ids
        out["mask"][k, :d.length] = True
        for j, ps in enumerate(d.mention_pos):
            out["mention_pos"][k, j, :len(ps)] = ps
        out["pairs"][k, :len(d.pairs)] = d.pairs
        out["labels"][k, :len(d.pairs)] = d.labels
    return out


def deal_batches(lengths: Sequence[int], batches: Sequence[Sequence[int]], num_ranks: int) -> list[list[int]]:
    """The positions of ``batches`` dealt to ``num_ranks`` ranks, each the same number of batches
    (``ceil(len(batches) / num_ranks)``: every rank takes as many optimizer steps, as DDP needs) with about the same
    padded tokens (``len(batch) x longest``): the heaviest batch first, to the rank with the fewest tokens so far that
    still has room (the lowest rank on a tie). A rank left short takes again the lightest batches of the others, as
    torch's DistributedSampler repeats examples to even out the shards. Each rank's list is in dealing order."""
    if num_ranks < 1:
        raise ValueError(f"num_ranks must be at least 1 (got {num_ranks})")
    size = [len(b) * max((lengths[i] for i in b), default=0) for b in batches]
    per_rank = -(-len(batches) // num_ranks)
    dealt: list[list[int]] = [[] for _ in range(num_ranks)]
    totals = [0] * num_ranks
    for k in sorted(range(len(batches)), key=lambda k: (-size[k], k)):
        rank = min((r for r in range(num_ranks) if len(dealt[r]) < per_rank), key=lambda r: (totals[r], r))
        dealt[rank].append(k)
        totals[rank] += size[k]
    lightest = sorted(range(len(batches)), key=lambda k: (size[k], k))
    for rank in range(num_ranks):
        extra = iter(lightest)
        while len(dealt[rank]) < per_rank:
            dealt[rank].append(next(extra))
    return dealt


class LengthBatchSampler(Sampler[list[int]]):
    """A rank's training batches of documents by length (the ``batch_sampler`` of its DataLoader).

    The split's documents are cut into :func:`length_batches` of at most ``batch_size x`` the mean document length
    in padded tokens (a batch of short documents holds more of them, one of long documents fewer; padding stays
    bounded), the same batches on every rank and in every epoch; :func:`deal_batches` gives each of the
    ``world_size`` ranks the same number of batches with about the same tokens (shards balance tokens, not
    documents); each epoch (:meth:`set_epoch`) a rank runs its batches in an order drawn from ``seed`` and the epoch.
    """

    def __init__(self, lengths: Sequence[int], batch_size: int, rank: int = 0, world_size: int = 1, seed: int = 0
                 ) -> None:
        self.lengths = [int(n) for n in lengths]
        self.max_tokens = max(1, round(batch_size * sum(self.lengths) / max(len(self.lengths), 1)))
        self.batches = length_batches(self.lengths, self.max_tokens)
        self.mine = deal_batches(self.lengths, self.batches, world_size)[rank] if self.batches else []
        self.seed, self.rank, self.epoch = seed, rank, 0

    def set_epoch(self, epoch: int) -> None:
        """The epoch whose order :meth:`__iter__` gives (as DistributedSampler's ``set_epoch``)."""
        self.epoch = epoch

    def __len__(self) -> int:
        return len(self.mine)

    def __iter__(self) -> Iterator[list[int]]:
        order = list(self.mine)
        random.Random(f"{self.seed}/{self.epoch}/{self.rank}").shuffle(order)
        return iter([list(self.batches[k]) for k in order])

    def padding_share(self) -> float:
        """The padding's share of this rank's padded batches (:func:`padding_share`)."""
        return padding_share(self.lengths, [self.batches[k] for k in self.mine])

"""An encoded split of bags, as the cache keeps it, and the torch dataset the loop reads batches of bags from.

:class:`BagSplit` holds B bags in the order of their keys: their sentences, bag after bag, as one
:class:`~nre_ray.data.batches.EncodedSplit` (N' rows; saved as ``<split>_sentences.*.npy`` and read by rows, so a
worker reads only the sentences of its shard's bags), ``scope`` (B + 1,) int64 offsets into it, ``labels`` (B, C)
bool (the bag's label set, NA a label of its own) and ``total`` (B,) (sentences before the size cap); plus per bag its
key, head, tail and ids (``<split>.bags.json``). :class:`BagDataset` gives the bag model's batches.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from nre_ray.data.batches import EncodedSplit
from nre_ray.data.encode import EncodedDataset

INFO_KEYS = ("keys", "head", "tail", "head_id", "tail_id")


class BagSplit:
    """B encoded bags: ``sentences`` (N' rows), ``scope`` (B + 1,), ``labels`` (B, C) bool, ``total`` (B,), and
    ``info`` (:data:`INFO_KEYS`: lists of B str)."""

    def __init__(self, sentences: EncodedSplit, scope: np.ndarray, labels: np.ndarray, total: np.ndarray,
                 info: dict[str, list[str]], name: str = "") -> None:
        self.sentences = sentences
        self.scope = np.asarray(scope, dtype=np.int64)
        self.labels = np.asarray(labels, dtype=bool)
        self.total = np.asarray(total, dtype=np.int64)
        self.info = info
        self.name = name

    def __len__(self) -> int:
        return len(self.scope) - 1

    @property
    def sizes(self) -> np.ndarray:
        """(B,) sentences kept per bag."""
        return np.diff(self.scope)

    @property
    def num_classes(self) -> int:
        """C, the labels' count."""
        return self.labels.shape[1]

    def sentence_rows(self, indices: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
        """The sentence rows of the bags ``indices``, bag after bag (N,), and their scope (B + 1,)."""
        idx = np.asarray(indices, dtype=np.int64)
        starts, ends = self.scope[idx], self.scope[idx + 1]
        sizes = ends - starts
        scope = np.zeros(len(idx) + 1, dtype=np.int64)
        np.cumsum(sizes, out=scope[1:])
        rows = np.repeat(starts - scope[:-1], sizes) + np.arange(int(scope[-1]))
        return rows, scope

    class Writer:
        """Collects encoded bags (rows of :func:`.grouping.encode_bags`, in any order) into a :class:`BagSplit`."""

        def __init__(self, num_classes: int, window: int) -> None:
            self.num_classes = num_classes
            self.window = window
            self.tokens: list[np.ndarray] = []
            self.lengths: list[np.ndarray] = []
            self.spans: list[np.ndarray] = []
            self.labels: list[np.ndarray] = []
            self.total: list[int] = []
            self.info: dict[str, list[str]] = {k: [] for k in INFO_KEYS}

        def add(self, row: Any) -> None:
            """One bag (an ``itertuples`` row with ``tokens``, ``lengths``, ``spans``, ``label_ids``, ``total``,
            ``bag``, ``head``, ``tail``, ``head_id``, ``tail_id``)."""
            self.tokens.append(np.asarray(row.tokens, dtype=np.int32))
            self.lengths.append(np.asarray(row.lengths, dtype=np.int32))
            self.spans.append(np.asarray(row.spans, dtype=np.int32).reshape(-1, 4))
            multi_hot = np.zeros(self.num_classes, dtype=bool)
            multi_hot[np.asarray(row.label_ids, dtype=np.int64)] = True
            self.labels.append(multi_hot)
            self.total.append(int(row.total))
            for key, value in zip(INFO_KEYS, (row.bag, row.head, row.tail, row.head_id, row.tail_id), strict=True):
                self.info[key].append(str(value))

        def finish(self, name: str) -> BagSplit:
            """The bags added, in the order of their keys, as a split called ``name``."""
            order = sorted(range(len(self.lengths)), key=self.info["keys"].__getitem__)
            self.tokens, self.lengths, self.spans, self.labels, self.total = (
                [part[i] for i in order] for part in (self.tokens, self.lengths, self.spans, self.labels, self.total))
            self.info = {k: [v[i] for i in order] for k, v in self.info.items()}
            lengths = np.concatenate(self.lengths) if self.lengths else np.zeros(0, dtype=np.int32)
            spans = np.concatenate(self.spans) if self.spans else np.zeros((0, 4), dtype=np.int32)
            offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
            np.cumsum(lengths, out=offsets[1:])
            sentences = EncodedSplit({
                "tokens": np.concatenate(self.tokens) if self.tokens else np.zeros(0, dtype=np.int32),
                "offsets": offsets, "lengths": lengths, "labels": np.full(len(lengths), -1, dtype=np.int64),
                "head_span": spans[:, 0:2], "tail_span": spans[:, 2:4]}, f"{name}_sentences",
                window=self.window)
            scope = np.zeros(len(self.lengths) + 1, dtype=np.int64)
            np.cumsum([len(x) for x in self.lengths], out=scope[1:])
            labels = np.stack(self.labels) if self.labels else np.zeros((0, self.num_classes), dtype=bool)
            return BagSplit(sentences, scope, labels, np.asarray(self.total, dtype=np.int64), self.info, name)

    @staticmethod
    def files(name: str) -> list[str]:
        """The files of split ``name`` in a cache folder."""
        return [*EncodedSplit.files(f"{name}_sentences"), f"{name}.bags.npz", f"{name}.bags.json"]

    def save(self, folder: Path, name: str) -> None:
        """Write the split's files into ``folder`` (the JSON file last: it marks the split complete)."""
        self.sentences.save(Path(folder), f"{name}_sentences")
        np.savez(Path(folder) / f"{name}.bags.npz", scope=self.scope, labels=self.labels, total=self.total)
        (Path(folder) / f"{name}.bags.json").write_text(json.dumps(self.info, ensure_ascii=False), encoding="utf-8")

    @classmethod
    def open(cls, folder: Path | str, name: str) -> BagSplit:
        """The split ``name`` saved in ``folder``: the bags' arrays read whole, the sentences by rows on demand."""
        with np.load(Path(folder) / f"{name}.bags.npz", allow_pickle=False) as data:
            scope, labels, total = data["scope"], data["labels"], data["total"]
        info = json.loads((Path(folder) / f"{name}.bags.json").read_text(encoding="utf-8"))
        return cls(EncodedSplit.open(folder, f"{name}_sentences"), scope, labels, total, info, name)


class BagDataset(torch.utils.data.Dataset):
    """A :class:`BagSplit` as batches of bags: ``__getitems__(indices)`` gives the B bags' N sentences as the
    sentence task's batch ((N, T) ``tokens``, ``head_pos``, ``tail_pos``, ``segments``, ``mask``; (N, 2)
    ``head_span``, ``tail_span``), ``scope`` (B + 1,), ``labels`` (B, C) bool and ``index`` (B,) (the bags' indices
    in the split)."""

    def __init__(self, split: BagSplit) -> None:
        self.split = split
        self.sentences = EncodedDataset(split.sentences)

    def __len__(self) -> int:
        return len(self.split)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        return self.__getitems__([index])

    def __getitems__(self, indices: Sequence[int]) -> dict[str, torch.Tensor]:
        rows, scope = self.split.sentence_rows(indices)
        batch = self.sentences.__getitems__(rows.tolist())
        batch["scope"] = torch.from_numpy(scope)
        batch["labels"] = torch.from_numpy(self.split.labels[np.asarray(indices, dtype=np.int64)])
        batch["index"] = torch.as_tensor(list(indices), dtype=torch.long)
        return batch


class BagBatchSampler(torch.utils.data.Sampler[list[int]]):
    """A rank's training batches of bags (the ``batch_sampler`` of its DataLoader): its shard balances sentences,
    not bags.

    The bags go to the ``world_size`` ranks by :func:`~.bags.balance_shards` on their sentence counts (fixed for the
    run, so a rank reads only its shard's sentences); each epoch (:meth:`set_epoch`) a rank shuffles its shard with
    ``seed``, the epoch and its rank, and cuts it into as many batches as the largest shard needs at ``batch_size``
    bags a batch (DDP needs the same number of steps on every rank): a rank with fewer, larger bags takes fewer bags
    a batch, so a step's sentences stay about even. A shard with fewer bags than batches repeats its bags, as
    torch's DistributedSampler repeats examples. One rank: a shuffle of every bag in batches of ``batch_size``.
    """

    def __init__(self, sizes: Sequence[int], batch_size: int, rank: int = 0, world_size: int = 1, seed: int = 0
                 ) -> None:
        from nre_ray.tasks.bag.bags import balance_shards  # (pandas: only where a bag run trains)

        shard_of = balance_shards(sizes, world_size)
        self.mine = np.flatnonzero(shard_of == rank)
        if not len(self.mine) and len(sizes):  # fewer bags than ranks: this one repeats a bag (never no batch)
            self.mine = np.asarray([rank % len(sizes)])
        largest = max(int(np.sum(shard_of == r)) for r in range(world_size)) if len(sizes) else 0
        self.num_batches = max(1, -(-largest // max(batch_size, 1)))
        self.sentences = int(np.asarray(sizes, dtype=np.int64)[self.mine].sum()) if len(sizes) else 0
        self.seed, self.rank, self.epoch = seed, rank, 0

    def set_epoch(self, epoch: int) -> None:
        """The epoch whose order :meth:`__iter__` gives (as DistributedSampler's ``set_epoch``)."""
        self.epoch = epoch

    def __len__(self) -> int:
        return self.num_batches

    def __iter__(self) -> Any:
        rng = np.random.default_rng([self.seed, self.epoch, self.rank])
        order = rng.permutation(self.mine)
        if 0 < len(order) < self.num_batches:
            order = np.resize(order, self.num_batches)
        return iter([part.tolist() for part in np.array_split(order, self.num_batches) if len(part)])

"""The torch side of the encoded data: :class:`EncodedDataset` hands the loop whole batches of an
:class:`EncodedSplit`.

The pure batch functions (``tokenize_batch``, ``token_counts``, ``encode_batch``) and :class:`EncodedSplit` live in
:mod:`nre_ray.data.batches`, which does not import torch (the Ray Data workers that run them start faster and stay
smaller); they are re-exported here, so ``from nre_ray.data.encode import encode_batch`` keeps working.
"""

from __future__ import annotations

import numpy as np
import torch

from nre_ray.data.batches import ARRAY_KEYS, EncodedSplit, encode_batch, token_counts, tokenize_batch

__all__ = ["ARRAY_KEYS", "EncodedDataset", "EncodedSplit", "encode_batch", "identity_collate", "token_counts",
           "tokenize_batch"]


class EncodedDataset(torch.utils.data.Dataset):
    """A map-style dataset over an :class:`EncodedSplit` that hands out whole batches.

    ``__getitems__`` gathers a batch with one ``index_select`` per array, trimmed to the longest sentence in the
    batch; no per-example Python runs on the training hot path. Use with ``collate_fn=identity_collate``. The arrays
    stay int32 and shared with the split (no copy); only the gathered (B, T) slices become int64.
    """

    def __init__(self, split: EncodedSplit) -> None:
        self.tensors = {k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in split.arrays.items()}
        self._positions = torch.arange(max(self.tensors["tokens"].shape[1], 1))  # (T,) for the padding mask

    def __len__(self) -> int:
        return len(self.tensors["lengths"])

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        return self.__getitems__([index])

    def __getitems__(self, indices: list[int]) -> dict[str, torch.Tensor]:
        t = self.tensors
        idx = torch.as_tensor(indices, dtype=torch.long)  # (B,)
        lengths = t["lengths"].index_select(0, idx)  # (B,)
        width = max(int(lengths.max()), 1) if len(indices) else 1
        # (N, T) -> view (N, width) -> gather (B, width) -> int64: only the batch's own cells are copied
        batch = {k: t[k][:, :width].index_select(0, idx).long() for k in ("tokens", "head_pos", "tail_pos", "segments")}
        batch["mask"] = self._positions[:width] < lengths.unsqueeze(1)  # (B, T) True on real tokens
        batch["labels"] = t["labels"].index_select(0, idx)
        batch["head_span"] = t["head_span"].index_select(0, idx).long()  # (B, 2)
        batch["tail_span"] = t["tail_span"].index_select(0, idx).long()  # (B, 2)
        batch["index"] = idx
        return batch


def identity_collate(batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The batch is already collated by :meth:`EncodedDataset.__getitems__`."""
    return batch

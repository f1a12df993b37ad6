"""The torch side of the encoded data: :class:`EncodedDataset` hands the loop whole batches of an
:class:`~nre_ray.data.batches.EncodedSplit`.

The pure batch functions (``tokenize_batch``, ``token_counts``, ``encode_batch``) and ``EncodedSplit`` live in
:mod:`nre_ray.data.batches`, which does not import torch (the Ray Data workers that run them start faster and stay
smaller).
"""

from __future__ import annotations

import torch

from nre_ray.data.batches import EncodedSplit


class EncodedDataset(torch.utils.data.Dataset):
    """A map-style dataset over an :class:`EncodedSplit` that hands out whole batches.

    ``__getitems__`` gathers a batch's rows from the split's flat arrays (read from the files when the split was
    opened from its folder: only the bytes of the rows asked for) and pads them to the longest row of that batch;
    no per-example Python runs on the training hot path. Use with ``collate_fn=identity_collate``. Only the batch's
    own cells are copied; they become int64.
    """

    def __init__(self, split: EncodedSplit) -> None:
        self.split = split

    def __len__(self) -> int:
        return len(self.split)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        return self.__getitems__([index])

    def __getitems__(self, indices: list[int]) -> dict[str, torch.Tensor]:
        rows = self.split.rows(indices)  # (B, T) arrays, T = the longest of these rows
        batch = {k: torch.from_numpy(rows[k]).long() for k in ("tokens", "head_pos", "tail_pos", "segments")}
        lengths = torch.from_numpy(rows["lengths"])  # (B,)
        batch["mask"] = torch.arange(batch["tokens"].shape[1]) < lengths.unsqueeze(1)  # (B, T) True on real tokens
        batch["labels"] = torch.from_numpy(rows["labels"]).long()
        batch["head_span"] = torch.from_numpy(rows["head_span"]).long()  # (B, 2)
        batch["tail_span"] = torch.from_numpy(rows["tail_span"]).long()  # (B, 2)
        batch["index"] = torch.as_tensor(indices, dtype=torch.long)
        return batch


def identity_collate(batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The batch is already collated by :meth:`EncodedDataset.__getitems__`."""
    return batch

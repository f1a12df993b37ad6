"""Encoded splits stored without padding: flat arrays and row offsets, read by rows from the cache folder, batches
padded to their own longest row."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from nre_ray.data.batches import ARRAY_KEYS, FLAT_KEYS, STORED_KEYS, EncodedSplit, flatten
from nre_ray.data.encode import EncodedDataset
from nre_ray.data.rowfile import RowFile
from tests.helpers import tiny_data


def _padded() -> dict[str, np.ndarray]:
    return tiny_data()["splits"]["train"]


def test_flat_arrays_hold_every_row_at_its_real_length_and_pad_back_to_the_same_arrays() -> None:
    padded = _padded()
    split = EncodedSplit(padded)
    flat = split.flat
    lengths = padded["lengths"]
    assert set(flat) == set(FLAT_KEYS)
    assert flat["offsets"].dtype == np.int64 and flat["offsets"].tolist() == [0, *np.cumsum(lengths).tolist()]
    assert len(flat["tokens"]) == int(lengths.sum()) < padded["tokens"].size
    for i in (0, 7, len(split) - 1):
        start, end = flat["offsets"][i], flat["offsets"][i + 1]
        assert flat["tokens"][start:end].tolist() == padded["tokens"][i, :lengths[i]].tolist()
    again = split.arrays
    assert set(again) == set(ARRAY_KEYS)
    for key in ARRAY_KEYS:
        assert again[key].dtype == padded[key].dtype and np.array_equal(again[key], padded[key]), key
    assert flatten(flat) is not flat and all(flatten(flat)[k] is flat[k] for k in FLAT_KEYS)  # flat stays as it is


def test_a_batch_is_padded_to_its_own_longest_row_and_equals_the_padded_rows() -> None:
    padded = _padded()
    dataset = EncodedDataset(EncodedSplit(padded))
    indices = [5, 0, 17, 3]
    batch = dataset.__getitems__(indices)
    width = int(padded["lengths"][indices].max())
    assert batch["tokens"].shape == (4, width) and batch["tokens"].dtype == torch.long
    for key in ("tokens", "head_pos", "tail_pos", "segments"):
        assert batch[key].tolist() == padded[key][indices, :width].tolist()
    assert batch["mask"].sum(dim=1).tolist() == padded["lengths"][indices].tolist()
    assert batch["labels"].tolist() == padded["labels"][indices].tolist()
    assert batch["head_span"].tolist() == padded["head_span"][indices].tolist()
    assert batch["index"].tolist() == indices
    shortest = int(np.argmin(padded["lengths"]))
    assert dataset.__getitems__([shortest])["tokens"].shape == (1, int(padded["lengths"][shortest]))
    assert dataset.__getitems__([])["tokens"].shape == (0, 1)


def test_saved_splits_are_npy_files_opened_for_reading_by_rows_with_bytes_close_to_the_tokens(tmp_path: Path) -> None:
    split = EncodedSplit(_padded())
    split.save(tmp_path, "train")
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(EncodedSplit.files("train"))
    opened = EncodedSplit.open(tmp_path, "train")
    assert opened.name == "train" and len(opened) == len(split)
    assert set(opened.flat) == set(STORED_KEYS) and opened.window == split.window == 10  # positions are derived
    assert all(isinstance(opened.flat[k], RowFile) for k in STORED_KEYS)  # nothing read yet
    whole = EncodedSplit.open(tmp_path, "train", lazy=False)
    assert all(isinstance(whole.flat[k], np.ndarray) for k in STORED_KEYS)
    assert all(np.array_equal(whole.arrays[k], split.arrays[k]) for k in ARRAY_KEYS)
    for key in ARRAY_KEYS:
        assert np.array_equal(opened.arrays[key], split.arrays[key]), key
    assert np.array_equal(EncodedDataset(opened).__getitems__([2, 9])["tokens"],
                          EncodedDataset(split).__getitems__([2, 9])["tokens"])
    # per row on disk: one int32 id per real token, plus offsets, length, label and spans (and the .npy headers)
    tokens = int(split.flat["lengths"].sum())
    data_bytes = sum(opened.flat[k].nbytes for k in STORED_KEYS)
    assert data_bytes == 4 * tokens + 8 * (len(split) + 1) + (4 + 8 + 16) * len(split)

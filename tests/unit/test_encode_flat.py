"""The vectorised encoder (:func:`encode_flat`) against the per-row definitions in :mod:`nre_ray.data.tokenize`."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from nre_ray.core.special_tokens import UNK_ID
from nre_ray.data.batches import encode_flat, encode_split
from nre_ray.data.tokenize import clip_span, pcnn_segments, relative_positions, truncation_window

VOCAB = ["<pad>", "<unk>", "a", "b", "c", "d"]


def reference(tokens: list[str], spans: tuple[int, int, int, int], max_length: int, window: int) -> dict:
    """One row, encoded with the per-row functions."""
    head, tail = spans[:2], spans[2:]
    win = truncation_window(len(tokens), head, tail, max_length)
    head, tail = clip_span(head, win), clip_span(tail, win)
    n = win[1] - win[0]
    index = {t: i for i, t in enumerate(VOCAB)}
    return {"tokens": [index.get(t, UNK_ID) for t in tokens[win[0]:win[1]]],
            "head_pos": relative_positions(n, head, window), "tail_pos": relative_positions(n, tail, window),
            "segments": pcnn_segments(n, head, tail), "head_span": list(head), "tail_span": list(tail)}


def random_rows(seed: int, count: int) -> tuple[list[list[str]], np.ndarray]:
    rng = np.random.default_rng(seed)
    rows, spans = [], []
    for _ in range(count):
        n = int(rng.integers(2, 40))
        rows.append([str(t) for t in rng.choice(["a", "b", "c", "d", "x", "yy"], size=n)])
        head = sorted(rng.choice(n + 1, size=2, replace=False).tolist())
        tail = sorted(rng.choice(n + 1, size=2, replace=False).tolist())
        spans.append(head + tail)  # overlapping, nested, touching and equal spans all occur
    return rows, np.asarray(spans)


@pytest.mark.parametrize(("max_length", "window"), [(4, 2), (7, 50), (16, 3), (128, 5)])
def test_encode_flat_matches_the_per_row_definitions(max_length: int, window: int) -> None:
    rows, spans = random_rows(max_length + window, 300)
    flat = encode_flat(rows, spans, VOCAB, max_length, window)
    offsets = flat["offsets"]
    assert offsets[0] == 0 and len(offsets) == len(rows) + 1
    for i, (tokens, span) in enumerate(zip(rows, spans, strict=True)):
        want = reference(tokens, tuple(int(v) for v in span), max_length, window)
        row = slice(offsets[i], offsets[i + 1])
        for key in ("tokens", "head_pos", "tail_pos", "segments"):
            assert flat[key][row].tolist() == want[key], (i, key)
            assert flat[key].dtype == np.int32
        assert flat["lengths"][i] == len(want["tokens"])
        assert flat["head_span"][i].tolist() == want["head_span"] and flat["tail_span"][i].tolist() == want["tail_span"]


def test_encode_flat_of_no_rows_and_encode_split_labels() -> None:
    empty = encode_flat([], np.zeros((0, 4)), VOCAB, 8, 3)
    assert all(len(empty[k]) == 0 for k in ("tokens", "lengths", "head_span")) and empty["offsets"].tolist() == [0]
    frame = pd.DataFrame({"tokens": [["a", "x"], ["b"]], "head_start": [0, 0], "head_end": [1, 1],
                          "tail_start": [1, 0], "tail_end": [2, 1], "relation": ["r2", "nope"]})
    split = encode_split(frame, VOCAB, ["r1", "r2"], 8, 3)
    assert split.flat["labels"].tolist() == [1, -1] and split.flat["tokens"].tolist() == [2, UNK_ID, 3]
    assert encode_split(frame.drop(columns="relation"), VOCAB, ["r1"], 8, 3).flat["labels"].tolist() == [-1, -1]

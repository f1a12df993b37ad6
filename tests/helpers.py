"""Small builders shared by the tests."""

from __future__ import annotations

import pandas as pd

from nre_ray.data.batches import EncodedSplit, encode_batch, token_counts, tokenize_batch
from nre_ray.data.vocab import Vocab

TEMPLATES = {
    "founded_by": "{h} was founded by {t} in the spring .",
    "born_in": "{h} was born in {t} , a quiet town .",
    "no_relation": "{h} met {t} at a conference .",
}
HEADS = ["Acme", "Globex", "Initech", "Umbrella", "Hooli", "Vandelay"]
TAILS = ["Ann", "Bob", "Cara", "Dan", "Eve", "Finn"]


def tiny_frame(n_per_label: int = 12) -> pd.DataFrame:
    """Canonical rows (with ``problem``) from a few templates: learnable in a couple of epochs."""
    rows = []
    for relation, template in TEMPLATES.items():
        for i in range(n_per_label):
            h, t = HEADS[i % len(HEADS)], TAILS[(i * 5) % len(TAILS)]
            sentence = template.format(h=h, t=t)
            rows.append({"sentence": sentence, "head": h, "head_offset": sentence.index(h), "tail": t,
                         "tail_offset": sentence.index(t), "relation": relation, "problem": ""})
    return pd.DataFrame(rows)


def tiny_data(max_length: int = 32, window: int = 10) -> dict:
    """The ``data`` dict the training loop takes: train/valid/test splits, vocabulary, labels."""
    frame = tokenize_batch(tiny_frame(), "regex", True)
    vocab = Vocab.build(dict(zip(*token_counts(frame).to_dict("list").values(), strict=True)), 1)
    labels = sorted(TEMPLATES)
    encoded = encode_batch(frame, vocab.tokens, labels, max_length, window)
    splits = {"train": EncodedSplit.from_frame(encoded),
              "valid": EncodedSplit.from_frame(encoded.iloc[::3]),
              "test": EncodedSplit.from_frame(encoded.iloc[1::3])}
    return {"splits": {k: v.arrays for k, v in splits.items()}, "vocab": vocab.tokens, "labels": labels,
            "num_positions": 2 * window + 2}

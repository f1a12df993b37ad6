"""A tiny random BERT (2 layers, hidden 32) and its WordPiece tokenizer, written with transformers' own classes."""

from __future__ import annotations

import re
import string
from collections.abc import Iterable
from pathlib import Path

import pandas as pd

from nre_ray.data.pipeline import sample_dir

#: Characters the tests' Chinese sentences use.
CHINESE = "北京大学位于清华的在是。，、"


def sample_words() -> list[str]:
    """The lower-case words of the bundled sample's training sentences."""
    words: set[str] = set()
    for sentence in pd.read_csv(sample_dir() / "train.csv")["sentence"]:
        words.update(re.findall(r"[a-z]+", sentence.lower()))
    return sorted(words)


def bag_sample_words() -> list[str]:
    """The lower-case words of the bundled bag sample's files (its entities' parts among them)."""
    from nre_ray.tasks.bag.grouping import sample_dir as bag_sample_dir

    words: set[str] = set()
    for path in sorted(bag_sample_dir().glob("*.tsv")):
        words.update(re.findall(r"[a-z]+", path.read_text(encoding="utf-8").lower()))
    return sorted(words)


def make_tiny_bert(folder: Path, words: Iterable[str] | None = None, seed: int = 0) -> Path:
    """Write ``vocab.txt`` (special tokens, single characters, ``##`` continuations, ``words``, a few Chinese
    characters), a fast WordPiece tokenizer over it and a random 2-layer BERT to ``folder``; return it."""
    import torch
    from transformers import BertConfig, BertModel, BertTokenizerFast

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    chars = string.ascii_lowercase + string.digits
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *chars, *string.punctuation,
             *(f"##{c}" for c in chars), *CHINESE]
    vocab += [w for w in (sample_words() if words is None else words) if w not in vocab]
    (folder / "vocab.txt").write_text("\n".join(vocab) + "\n", encoding="utf-8")
    tokenizer = BertTokenizerFast(vocab=str(folder / "vocab.txt"))
    tokenizer.save_pretrained(str(folder))
    config = BertConfig(vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=37, max_position_embeddings=128)
    torch.manual_seed(seed)
    BertModel(config).save_pretrained(str(folder))
    return folder

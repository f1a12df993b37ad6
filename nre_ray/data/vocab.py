"""The token vocabulary, built from the training split only and stored as JSON."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nre_ray.core.special_tokens import PAD, UNK, UNK_ID
from nre_ray.data.markers import is_marker


@dataclass
class Vocab:
    """Token <-> id. Id 0 is padding, id 1 stands for every token not in the vocabulary.

    ``subword=True``: a pretrained tokenizer's vocabulary in id order (``--model bert``), recorded so that checkpoints
    and resumed runs can be checked against it; that tokenizer encodes, and its padding and unknown ids are its own.
    """

    tokens: list[str]
    subword: bool = False
    index: dict[str, int] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        if self.subword:
            self.index = {t: i for i, t in enumerate(self.tokens)}
            return
        if self.tokens[:2] != [PAD, UNK]:
            raise ValueError(f"a vocabulary starts with {PAD!r}, {UNK!r}")
        self.index = {t: i for i, t in enumerate(self.tokens)}
        if len(self.index) != len(self.tokens):
            raise ValueError("a vocabulary holds each token once")

    @classmethod
    def build(cls, counts: Mapping[str, int], min_freq: int = 1) -> Vocab:
        """Tokens seen at least ``min_freq`` times, and entity markers seen at all, most frequent first (ties
        alphabetically: deterministic)."""
        kept = sorted((t for t, c in counts.items() if (c >= min_freq or is_marker(t)) and t not in (PAD, UNK)),
                      key=lambda t: (-counts[t], t))
        return cls([PAD, UNK, *kept])

    def __len__(self) -> int:
        return len(self.tokens)

    def encode(self, tokens: Iterable[str]) -> list[int]:
        """Ids of ``tokens``; unknown tokens map to UNK_ID."""
        get = self.index.get
        return [get(t, UNK_ID) for t in tokens]

    def as_json(self) -> list[str] | dict[str, Any]:
        """The JSON form: the token list (the id is the position); ``{"subword": true, "tokens": [...]}`` for a
        subword vocabulary."""
        return {"subword": True, "tokens": self.tokens} if self.subword else self.tokens

    @classmethod
    def from_json(cls, value: list[str] | dict[str, Any]) -> Vocab:
        """The inverse of :meth:`as_json`."""
        if isinstance(value, dict):
            return cls(list(value["tokens"]), subword=bool(value.get("subword")))
        return cls(list(value))

    def save(self, path: Path) -> None:
        """Write :meth:`as_json` to ``path``."""
        Path(path).write_text(json.dumps(self.as_json(), ensure_ascii=False), encoding="utf-8")

    @classmethod
    def load(cls, path: Path) -> Vocab:
        """Read a vocabulary written by :meth:`save`."""
        return cls.from_json(json.loads(Path(path).read_text(encoding="utf-8")))

"""A synthetic distant-supervision corpus in NYT10's TSV layout, deterministic by seed (nothing downloaded).

**Bag sizes.** NYT10's bags are heavy-tailed: most pairs have one sentence, a few have hundreds (570k sentences in
280k pairs: 2.04 a pair). We draw each pair's size from a discrete power law, P(k) ∝ k^-alpha for k = 1 ..
``max_bag`` (alpha 2.5 by default: 75 % of the draws are 1, mean about 1.9), then move sentences so that the corpus
holds exactly ``sentences``: extra sentences go to bags drawn with probability proportional to their size (the rich
get richer, which keeps the tail heavy), missing ones come off bags of two or more drawn the same way. With the
defaults (seed 0): 70 % of the 280,000 bags hold one sentence, the median is 1, the 99th percentile 14, the largest
bag 1,849 sentences.

**Labels.** ``relations`` counts NA (NYT10: 53 = NA + 52). A share ``na_share`` of the pairs is NA; the others take a
relation drawn from a Zipf-like law over the relations (NYT10's relations are skewed too), and a share
``multi_share`` of the positive pairs with two or more sentences takes a second relation (the pair's sentences
alternate between the two, as NYT10 writes a pair's facts on separate lines).

**Text.** Sentences of 8 to 30 filler words around the two entities (written with underscores, as NYT10 does). With
probability ``signal`` a positive pair's sentence carries its relation's trigger phrase (distant supervision is
noisy: the others do not), and with probability ``noise`` an NA sentence carries a random relation's trigger.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

NA = "NA"
SYLLABLES = ("ka", "lo", "mi", "ren", "da", "vo", "tu", "sel", "an", "bri", "po", "zel", "qu", "ma", "nor", "fi",
             "gar", "he", "ix", "ju")
FILLER = ("the", "a", "of", "in", "and", "to", "was", "on", "for", "with", "at", "by", "from", "his", "her", "that",
          "this", "is", "as", "after", "before", "during", "year", "city", "later", "also", "new", "old", "first",
          "time", "people", "work", "family", "life", "home", "known", "small", "large", "state", "early")


@dataclass(frozen=True)
class CorpusSpec:
    """What :func:`corpus_lines` writes. The defaults are NYT10's training-set shape."""

    sentences: int = 570_000
    pairs: int = 280_000
    relations: int = 53
    na_share: float = 0.8
    multi_share: float = 0.02
    alpha: float = 2.5
    max_bag: int = 3_000
    signal: float = 0.8
    noise: float = 0.05
    seed: int = 0
    first_entity: int = 0
    """Entity numbering starts here (disjoint splits: give each its own range)."""

    def check(self) -> None:
        """ValueError for a spec that cannot be written."""
        if not 1 <= self.pairs <= self.sentences:
            raise ValueError(f"need 1 <= pairs <= sentences, found pairs={self.pairs}, sentences={self.sentences}")
        if self.relations < 2:
            raise ValueError(f"relations counts NA and needs at least 2, found {self.relations}")
        if self.sentences > self.pairs * self.max_bag:
            raise ValueError(f"{self.sentences} sentences do not fit {self.pairs} bags of at most {self.max_bag}")
        for name in ("na_share", "multi_share", "signal", "noise"):
            if not 0 <= getattr(self, name) <= 1:
                raise ValueError(f"{name} must be in [0, 1]")


def relation_names(count: int) -> list[str]:
    """``NA`` and ``count - 1`` Freebase-like relation names."""
    return [NA] + [f"/synthetic/relation_{k:02d}" for k in range(1, count)]


def bag_sizes(spec: CorpusSpec, rng: np.random.Generator) -> np.ndarray:
    """(pairs,) int64 bag sizes summing to ``spec.sentences`` (the power law of the module docstring)."""
    k = np.arange(1, spec.max_bag + 1, dtype=np.float64)
    law = k ** -spec.alpha
    sizes = rng.choice(spec.max_bag, size=spec.pairs, p=law / law.sum()).astype(np.int64) + 1
    gap = spec.sentences - int(sizes.sum())
    while gap != 0:
        step = np.sign(gap)
        room = sizes < spec.max_bag if step > 0 else sizes > 1
        weights = np.where(room, sizes, 0).astype(np.float64)
        picks = rng.choice(len(sizes), size=min(abs(gap), int(room.sum())), replace=False, p=weights / weights.sum())
        sizes[picks] += step
        gap -= step * len(picks)
    return sizes


def _word(index: int, length: int) -> str:
    parts = []
    for _ in range(length):
        parts.append(SYLLABLES[index % len(SYLLABLES)])
        index //= len(SYLLABLES)
    return "".join(parts)


def entity_name(index: int) -> str:
    """A unique two-word entity name written NYT10's way (``Kalo_Renda_17``)."""
    first, last = _word(index * 7 + 3, 2), _word(index * 13 + 5, 3)
    return f"{first.capitalize()}_{last.capitalize()}_{index}"


def trigger(relation: int) -> str:
    """The trigger phrase of relation index ``relation`` (> 0): two made-up words."""
    return f"{_word(relation * 31 + 400, 3)} {_word(relation * 17 + 900, 2)}"


def corpus_lines(spec: CorpusSpec) -> Iterator[str]:
    """The corpus as NYT10 TSV lines (with their ``\\n``), pair after pair; see the module docstring."""
    spec.check()
    rng = np.random.default_rng(spec.seed)
    sizes = bag_sizes(spec, rng)
    names = relation_names(spec.relations)
    zipf = 1.0 / np.arange(1, spec.relations)
    zipf /= zipf.sum()
    tails = max(1, spec.pairs // 3)
    for pair, size in enumerate(sizes):
        head_index = spec.first_entity + pair
        tail_index = spec.first_entity + spec.pairs + int(rng.integers(tails))
        head, tail = entity_name(head_index), entity_name(tail_index)
        ids = f"/m/0{_base36(head_index)}\t/m/0{_base36(tail_index)}"
        labels = [0]
        if rng.random() >= spec.na_share:
            labels = [int(rng.choice(spec.relations - 1, p=zipf)) + 1]
            if size >= 2 and rng.random() < spec.multi_share:
                second = int(rng.choice(spec.relations - 1, p=zipf)) + 1
                if second != labels[0]:
                    labels.append(second)
        for i in range(int(size)):
            label = labels[i % len(labels)]
            if label:
                cue = trigger(label) if rng.random() < spec.signal else None
            else:
                cue = trigger(int(rng.integers(1, spec.relations))) if rng.random() < spec.noise else None
            yield f"{ids}\t{head}\t{tail}\t{names[label]}\t{_sentence(rng, head, tail, cue)} ###END###\n"


def _sentence(rng: np.random.Generator, head: str, tail: str, cue: str | None) -> str:
    words = [FILLER[i] for i in rng.integers(len(FILLER), size=int(rng.integers(8, 31)))]
    a, b = sorted(rng.choice(len(words) + 1, size=2, replace=False).tolist())
    middle = words[a:b] if cue is None else [*words[a:b], *cue.split()]
    first, second = (head, tail) if rng.random() < 0.7 else (tail, head)
    return " ".join([*words[:a], first, *middle, second, *words[b:]])


def _base36(n: int) -> str:
    digits = "0123456789abcdefghijklmnopqrstuvwxyz"
    out = ""
    while True:
        n, r = divmod(n, 36)
        out = digits[r] + out
        if not n:
            return out


def write_corpus(path: Path, spec: CorpusSpec) -> int:
    """Write the corpus to ``path`` (UTF-8, ``\\n`` line ends); return the number of lines written."""
    count = 0
    with open(path, "w", encoding="utf-8", newline="\n") as fh:
        for line in corpus_lines(spec):
            fh.write(line)
            count += 1
    return count


SAMPLE_SPLITS: dict[str, CorpusSpec] = {
    "train": CorpusSpec(sentences=400, pairs=220, relations=5, na_share=0.5, multi_share=0.1, max_bag=12, seed=1,
                        first_entity=0),
    "valid": CorpusSpec(sentences=120, pairs=66, relations=5, na_share=0.5, multi_share=0.1, max_bag=12, seed=2,
                        first_entity=10_000),
    "test": CorpusSpec(sentences=120, pairs=66, relations=5, na_share=0.5, multi_share=0.1, max_bag=12, seed=3,
                       first_entity=20_000),
}
"""The bundled bag sample (``nre_ray/tasks/bag/sample/``): NA + 4 relations like GIDS, a few hundred sentences,
learnable (trigger phrases on 80 % of a positive pair's sentences)."""


def write_sample(folder: Path) -> dict[str, int]:
    """Write the bundled bag sample's ``train.tsv``, ``valid.tsv``, ``test.tsv`` and ``relation2id.txt`` to
    ``folder``; return the lines of each split."""
    folder.mkdir(parents=True, exist_ok=True)
    counts = {name: write_corpus(folder / f"{name}.tsv", spec) for name, spec in SAMPLE_SPLITS.items()}
    labels = relation_names(SAMPLE_SPLITS["train"].relations)
    (folder / "relation2id.txt").write_text("".join(f"{label} {i}\n" for i, label in enumerate(labels)),
                                            encoding="utf-8")
    return counts

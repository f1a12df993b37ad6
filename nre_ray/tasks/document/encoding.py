"""A document as encoder input: mention markers, token ids, where each entity's mentions start, candidate pairs
and their label matrix. Pure functions on plain Python and numpy (Ray Data will run them on rows).

Markers follow ATLOP (Zhou et al. 2021): a ``*`` before the first and after the last word of every mention of an
entity (one marker per word position, even where several mentions start or end there); an entity's mentions are
read at their start markers (:attr:`EncodedDocument.mention_pos`). The project's ``[E1]``/``[E2]`` markers
(:mod:`nre_ray.data.markers`) mark *the* head and tail of one sentence example and do not apply: a document has
many entities, and every pair is read from one pass. Mentions without an entity (PubTator ``-1``) get no markers.

Labels: column 0 is the threshold class TH of the adaptive-threshold loss (1 for a pair with no fact), column
``relation_index[r]`` (1, 2, ...) is relation ``r``; a pair may have several relations.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from nre_ray.data.vocab import Vocab
from nre_ray.tasks.document.records import Document

MARKER = "*"
"""ATLOP's mention marker."""
THRESHOLD_LABEL = "TH"
"""The name of column 0 of the label matrix (the adaptive threshold; "no relation" for a pair without facts)."""

Pieces = Callable[[str], Sequence[str]]
"""A word -> its tokens (a subword tokenizer's ``tokenize``; ``lambda w: [w]`` for word-level encoders)."""


@dataclass(frozen=True)
class EncodedDocument:
    """One document ready for the model.

    Attributes:
        id: the document's id.
        input_ids: (T,) token ids, markers and special tokens included.
        mention_pos: per entity, the positions in ``input_ids`` of its mentions' start markers (E lists).
        pairs: (P, 2) candidate ``(head, tail)`` entity positions.
        labels: (P, 1 + R) float32 multi-hot labels, column 0 = TH.
    """

    id: str
    input_ids: np.ndarray
    mention_pos: list[list[int]]
    pairs: np.ndarray
    labels: np.ndarray

    @property
    def length(self) -> int:
        """T, the number of tokens."""
        return int(self.input_ids.shape[0])


def relation_index(relations: Iterable[str]) -> dict[str, int]:
    """``{relation: column}``: the relations sorted by name, in columns 1, 2, ... (column 0 is TH)."""
    return {r: k for k, r in enumerate(sorted(set(relations)), start=1)}


def mark_tokens(doc: Document, pieces: Pieces = lambda w: [w], marker: str = MARKER) -> tuple[list[str],
                                                                                                list[list[int]]]:
    """The document's tokens with ``marker`` around each entity mention, and per entity the positions of its
    mentions' start markers in those tokens. Sentences are concatenated in order; ``pieces`` cuts each word."""
    starts, ends = set(), set()
    for e in doc.entities:
        for m in e.mentions:
            starts.add((m.sent_id, m.start))
            ends.add((m.sent_id, m.end - 1))
    tokens: list[str] = []
    position: dict[tuple[int, int], int] = {}
    for s, sentence in enumerate(doc.sentences):
        for i, word in enumerate(sentence):
            if (s, i) in starts:
                position[(s, i)] = len(tokens)
                tokens.append(marker)
            tokens.extend(pieces(word) or [word])
            if (s, i) in ends:
                tokens.append(marker)
    mention_pos = [[position[(m.sent_id, m.start)] for m in e.mentions] for e in doc.entities]
    return tokens, mention_pos


def label_matrix(doc: Document, pairs: Sequence[tuple[int, int]], relations: Mapping[str, int]) -> np.ndarray:
    """(P, 1 + R) float32: 1 where pair ``p`` has relation ``r`` (column ``relations[r]``), column 0 set for
    pairs with none. Facts on pairs outside ``pairs`` or with a relation outside ``relations`` are not in it (see
    :func:`uncovered_facts`)."""
    row = {pair: k for k, pair in enumerate(pairs)}
    labels = np.zeros((len(pairs), 1 + len(relations)), dtype=np.float32)
    for f in doc.facts:
        k, column = row.get((f.head, f.tail)), relations.get(f.relation)
        if k is not None and column is not None:
            labels[k, column] = 1.0
    labels[:, 0] = labels[:, 1:].sum(axis=1) == 0
    return labels


def uncovered_facts(doc: Document, pairs: Sequence[tuple[int, int]]) -> int:
    """How many facts of ``doc`` are on pairs that are not candidates (they cannot be predicted)."""
    candidates = set(pairs)
    return sum(1 for f in doc.facts if (f.head, f.tail) not in candidates)


def encode_document(doc: Document, pairs: Sequence[tuple[int, int]], relations: Mapping[str, int],
                    to_ids: Callable[[list[str]], list[int]], pieces: Pieces = lambda w: [w],
                    start: Sequence[int] = (), end: Sequence[int] = (), marker: str = MARKER) -> EncodedDocument:
    """``doc`` as an :class:`EncodedDocument`: marked tokens (:func:`mark_tokens`) turned into ids by ``to_ids``,
    between the ids ``start`` and ``end`` (a pretrained encoder's ``[CLS]`` and ``[SEP]``), the candidate
    ``pairs`` and their labels (:func:`label_matrix`). Not truncated: long documents are read in windows by the
    model (:func:`.atlop.encode_long`)."""
    tokens, mention_pos = mark_tokens(doc, pieces, marker)
    offset = len(start)
    ids = np.asarray([*start, *to_ids(tokens), *end], dtype=np.int64)  # (T,)
    return EncodedDocument(
        id=doc.id,
        input_ids=ids,
        mention_pos=[[p + offset for p in ps] for ps in mention_pos],
        pairs=np.asarray(pairs, dtype=np.int64).reshape(-1, 2),  # (P, 2)
        labels=label_matrix(doc, pairs, relations),  # (P, 1 + R)
    )


def build_vocab(docs: Iterable[Document], min_freq: int = 1, lower: bool = True) -> Vocab:
    """A word vocabulary of the documents' tokens (lower-cased with ``lower``) and the marker, for the encoders
    trained from scratch (:class:`nre_ray.data.vocab.Vocab`: 0 padding, 1 unknown)."""
    counts: Counter[str] = Counter()
    for doc in docs:
        for sentence in doc.sentences:
            counts.update(w.lower() if lower else w for w in sentence)
    counts[MARKER] = max(counts[MARKER], min_freq)
    return Vocab.build(counts, min_freq)

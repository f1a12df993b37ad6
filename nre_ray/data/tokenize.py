"""Tokenization and the per-token features of one example, as pure functions (written once, run by Ray Data).

The sentence is first cut at the entity boundaries given by the character offsets, then each piece is tokenized on
its own. Entity boundaries therefore always fall between tokens, and an entity's token span is found from its offsets,
never by searching for its text.

Spans are half-open token ranges ``(start, end)``. Relative positions are clipped to ``+-window`` and shifted by
``window + 1`` so that 0 stays free for padding: ids are in ``[1, 2 * window + 1]``; ``window + 1`` means "inside the
entity". PCNN segment ids are 1 (up to the end of the first entity), 2 (up to the end of the second), 3 (after).
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache

from nre_ray.data.markers import Span, marker_order

# One token per CJK ideograph / kana / hangul syllable; runs of other letters and digits; any other visible character.
_CJK = "\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\uac00-\ud7af"
_TOKEN_RE = re.compile(rf"[{_CJK}]|(?:(?![{_CJK}])[^\W_])+|\S")


@dataclass(frozen=True)
class Tokenized:
    """A tokenized example: tokens and the half-open token spans of head and tail."""

    tokens: list[str]
    head: Span
    tail: Span


def regex_tokens(text: str, lowercase: bool) -> list[str]:
    """Words and punctuation for alphabetic scripts, characters for CJK. ``"Acme's 2nd"`` -> ``acme ' s 2nd``."""
    if lowercase and text.isascii():  # lowercasing ASCII keeps every boundary: lower the text once
        return _TOKEN_RE.findall(text.lower())
    tokens = _TOKEN_RE.findall(text)
    return [t.lower() for t in tokens] if lowercase else tokens  # elsewhere "İ".lower() is two characters


@lru_cache(maxsize=1)
def _jieba():
    import logging

    import jieba

    jieba.setLogLevel(logging.WARNING)
    return jieba


def jieba_tokens(text: str, lowercase: bool) -> list[str]:
    """Chinese word segmentation (jieba); whitespace dropped."""
    tokens = [t for t in _jieba().lcut(text) if t.strip()]
    return [t.lower() for t in tokens] if lowercase else tokens


def tokenize_example(sentence: str, head_offset: int, head_len: int, tail_offset: int, tail_len: int,
                     tokenizer: str = "regex", lowercase: bool = True,
                     markers: Sequence[str] | None = None) -> Tokenized:
    """Tokenize ``sentence`` so that both entities are whole token spans.

    ``markers`` (head start, head end, tail start, tail end; :mod:`nre_ray.data.markers`): tokens written around
    the entities, in :func:`~nre_ray.data.markers.marker_order`; each entity's span then runs from its start marker
    to its end marker, both included (``span[0]`` is the start marker).

    Raises ValueError when an entity covers no token (e.g. it is only whitespace).
    """
    head_chars = (head_offset, head_offset + head_len)
    tail_chars = (tail_offset, tail_offset + tail_len)
    cuts = sorted({0, len(sentence), *head_chars, *tail_chars})
    nested = _overlaps(head_chars, tail_chars)
    tokens: list[str] = []
    head = [-1, -1]  # token span, grown over the pieces that lie inside the entity (they are contiguous)
    tail = [-1, -1]
    pending = marker_order(head_chars, tail_chars) if markers else []  # (character position, marker index)
    placed = [0, 0, 0, 0]  # each marker's token index
    for lo, hi in itertools.pairwise(cuts):
        while pending and pending[0][0] <= lo:
            placed[pending[0][1]] = len(tokens)
            tokens.append(markers[pending.pop(0)[1]])
        piece = sentence[lo:hi]
        if tokenizer == "jieba":
            is_entity = (lo, hi) == head_chars or (lo, hi) == tail_chars
            if is_entity and not nested and piece.strip():
                piece_tokens = [piece.strip().lower() if lowercase else piece.strip()]
            else:
                piece_tokens = jieba_tokens(piece, lowercase)
        else:
            piece_tokens = regex_tokens(piece, lowercase)
        if not piece_tokens:
            continue
        first = len(tokens)
        tokens.extend(piece_tokens)
        for chars, span in ((head_chars, head), (tail_chars, tail)):
            if lo >= chars[0] and hi <= chars[1]:
                if span[0] < 0:
                    span[0] = first
                span[1] = len(tokens)
    if head[0] < 0:
        raise ValueError("head: the entity contains no token (only spaces?)")
    if tail[0] < 0:
        raise ValueError("tail: the entity contains no token (only spaces?)")
    if markers:
        for _, index in pending:  # markers at the sentence's end
            placed[index] = len(tokens)
            tokens.append(markers[index])
        return Tokenized(tokens, (placed[0], placed[1] + 1), (placed[2], placed[3] + 1))
    return Tokenized(tokens, (head[0], head[1]), (tail[0], tail[1]))


def _overlaps(a: Span, b: Span) -> bool:
    return a[0] < b[1] and b[0] < a[1]


def truncation_window(length: int, head: Span, tail: Span, max_length: int) -> Span:
    """The ``[start, end)`` token window of at most ``max_length`` tokens, centred on both entities.

    When both entities fit, they are both kept whole; when they are further apart than ``max_length``, the window
    starts at the first entity.
    """
    if length <= max_length:
        return (0, length)
    lo, hi = min(head[0], tail[0]), max(head[1], tail[1])
    if hi - lo >= max_length:
        start = lo
    else:
        start = max(0, lo - (max_length - (hi - lo)) // 2)
    start = min(start, length - max_length)
    return (start, start + max_length)


def relative_positions(length: int, span: Span, window: int) -> list[int]:
    """Position id of each token relative to ``span``: ``window + 1`` inside it, less before, more after."""
    start, end = span
    out = []
    for i in range(length):
        if i < start:
            rel = i - start
        elif i >= end:
            rel = i - end + 1
        else:
            rel = 0
        out.append(max(-window, min(window, rel)) + window + 1)
    return out


def pcnn_segments(length: int, head: Span, tail: Span) -> list[int]:
    """PCNN piece of each token: 1 up to the end of the first entity, 2 up to the end of the second, 3 after."""
    first, second = sorted((head, tail))
    cut1 = min(first[1], length)
    cut2 = max(cut1, min(second[1], length))
    return [1 if i < cut1 else 2 if i < cut2 else 3 for i in range(length)]


def clip_span(span: Span, window: Span) -> Span:
    """A span shifted into ``window`` coordinates and clipped to it."""
    start = min(max(span[0] - window[0], 0), window[1] - window[0])
    end = min(max(span[1] - window[0], 0), window[1] - window[0])
    return (start, end)

"""Entity markers: the tokens that wrap the head and the tail in a sentence, for every encoder.

The recipe of Baldini Soares et al. (2019), "entity markers": ``[E1] Acme [/E1] was founded by [E2] Ann [/E2]``; with
entity types (``head_type``/``tail_type`` columns) the typed markers of Zhou and Chen (2021), ``<e1:org> Acme
</e1:org> ... <e2:person> Ann </e2:person>``. ``--model bert`` adds them to its pretrained tokenizer as special tokens
(:mod:`nre_ray.data.subword`); the encoders trained from scratch get them as words of the sentence
(:func:`nre_ray.data.tokenize.tokenize_example`), where no tokenizer can produce them from text (the regex and jieba
tokenizers cut ``[`` and ``<`` off as tokens of their own).

Where several markers fall at one character, :func:`marker_order` says which comes first, so that nested entities get
properly nested markers.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

Span = tuple[int, int]

#: The untyped markers: head start, head end, tail start, tail end.
MARKERS = ("[E1]", "[/E1]", "[E2]", "[/E2]")
_TYPE_CHARS = re.compile(r"[\s<>]+")
#: Matches every marker token, untyped or typed (a regular expression that pyarrow compute understands too).
MARKER_PATTERN = r"^\[(/?E[12])\]$|^<(/?)e([12]):[^<>\s]+>$"
_MARKER_RE = re.compile(MARKER_PATTERN)


def clean_type(value: object) -> str:
    """An entity type as it appears inside a marker: stripped, inner whitespace and ``<``/``>`` turned into ``_``;
    "" for a missing value (None, NaN, empty)."""
    if value is None or (isinstance(value, float) and value != value):
        return ""
    return _TYPE_CHARS.sub("_", str(value).strip()).strip("_")


def typed_markers(head_type: str, tail_type: str) -> tuple[str, str, str, str]:
    """``("<e1:org>", "</e1:org>", "<e2:person>", "</e2:person>")``; an empty type gives the untyped pair."""
    head = (f"<e1:{head_type}>", f"</e1:{head_type}>") if head_type else MARKERS[:2]
    tail = (f"<e2:{tail_type}>", f"</e2:{tail_type}>") if tail_type else MARKERS[2:]
    return (*head, *tail)


def marker_vocabulary(head_types: Iterable[object] = (), tail_types: Iterable[object] = ()) -> list[str]:
    """Every marker token to add to a tokenizer: the untyped four, then the typed ones of the given types (sorted)."""
    found: list[str] = list(MARKERS)
    for t in sorted({clean_type(t) for t in head_types} - {""}):
        found += typed_markers(t, "")[:2]
    for t in sorted({clean_type(t) for t in tail_types} - {""}):
        found += typed_markers("", t)[2:]
    return found


def is_marker(token: str) -> bool:
    """Whether ``token`` is an entity marker, untyped or typed."""
    return bool(_MARKER_RE.match(token))


def untyped(token: str) -> str:
    """The untyped marker standing for a marker token (``</e2:person>`` -> ``[/E2]``); other tokens as they are."""
    found = _MARKER_RE.match(token)
    if not found:
        return token
    return f"[{found.group(1)}]" if found.group(1) else f"[{found.group(2)}E{found.group(3)}]"


def marker_order(head: Span, tail: Span) -> list[tuple[int, int]]:
    """``(position, marker index)`` of the four markers (0 head start, 1 head end, 2 tail start, 3 tail end) around
    the half-open spans ``head`` and ``tail``, in the order they are written.

    At one position end markers come before start markers (adjacent entities do not nest); of two entities that
    start together the longer opens first, of two that end together the inner one closes first, so nested entities
    give properly nested markers (``[E1] [E2] New York [/E2] University [/E1]``). Partly overlapping entities give
    interleaved markers. Identical spans give ``[E1] [E2] x [/E2] [/E1]``.
    """
    events = []  # (position, sort key, marker index)
    for k, (start, end) in enumerate((head, tail)):
        events.append((start, (1, -end, k), 2 * k))
        events.append((end, (0, -start, -k), 2 * k + 1))
    return [(pos, index) for pos, _, index in sorted(events)]


@dataclass(frozen=True)
class Marked:
    """A sentence with markers inserted; ``positions[k]`` is the character offset of marker ``k`` (head start, head
    end, tail start, tail end) in ``text``."""

    text: str
    positions: tuple[int, int, int, int]


def insert_markers(sentence: str, head: Span, tail: Span, markers: Sequence[str] = MARKERS) -> Marked:
    """Insert ``markers`` (head start, head end, tail start, tail end) around the character spans ``head`` and
    ``tail`` (half-open, non-empty), each marker separated from the text by one space, in :func:`marker_order`."""
    out: list[str] = []
    positions = [0, 0, 0, 0]
    cursor = 0
    for pos, index in marker_order(head, tail):
        _append(out, sentence[cursor:pos])
        cursor = pos
        if out and not out[-1][-1:].isspace():
            out.append(" ")
        positions[index] = sum(map(len, out))
        out.append(markers[index] + " ")
    _append(out, sentence[cursor:])
    return Marked("".join(out), (positions[0], positions[1], positions[2], positions[3]))


def _append(out: list[str], piece: str) -> None:
    """Append ``piece``, dropping its first character when both it and the text so far are whitespace there."""
    if piece[:1].isspace() and out and out[-1][-1:].isspace():
        piece = piece[1:]
    if piece:
        out.append(piece)

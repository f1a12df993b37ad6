"""Sentences and tokens of a raw text whose mentions are given by character offsets (PubTator): pure, deterministic.

:func:`split_sentences` is a simple rule-based splitter (no model, no download), written for PubMed abstracts:

* the title is a sentence of its own (everything before ``title_end``);
* elsewhere a sentence ends after ``.``, ``?`` or ``!`` (and any closing quotes or brackets right after it) when
  whitespace follows and the next character is not a lower-case letter;
* except after a few abbreviations (:data:`ABBREVIATIONS`: ``e.g.``, ``i.e.``, ``vs.``, ``et al.``, ``Fig.``, ...)
  and single capital initials (``J. Smith``);
* and never inside a mention (a boundary that falls inside a mention's span is dropped).

Intra/inter-sentence metrics and windows only need the same boundaries every time, which this gives.

:func:`tokenize` cuts a sentence into words (``\\w+`` runs and single other characters) and also cuts at every
mention boundary, so that each mention is a whole number of tokens.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence

from nre_ray.tasks.document.records import Span

ABBREVIATIONS = frozenset({"e.g.", "i.e.", "vs.", "al.", "fig.", "figs.", "approx.", "ca.", "cf.", "dr.", "mr.",
                           "mrs.", "ms.", "no.", "nos.", "resp.", "ref.", "refs.", "st.", "etc.", "viz.", "eq."})
"""Words (lower-cased, with their final dot) after which no sentence ends."""

_END = re.compile(r"[.?!][\"')\]]*(?=\s)")
_TOKEN = re.compile(r"\w+|[^\w\s]")
_INITIAL = re.compile(r"(?:^|\s)[A-Z]\.$")


def split_sentences(text: str, title_end: int = 0, mentions: Iterable[Span] = ()) -> list[Span]:
    """The ``[start, end)`` character spans of the sentences of ``text`` (leading and trailing whitespace left out,
    empty sentences dropped), by the rules of the module docstring. ``title_end``: where the title ends (0: no
    title). ``mentions``: character spans no boundary may cut."""
    inside = _inside(mentions)
    cuts = {title_end} if 0 < title_end < len(text) else set()
    for match in _END.finditer(text, title_end):
        end = match.end()
        rest = text[end:].lstrip()
        if not rest or rest[0].islower() or end in inside or _abbreviation(text, match.start() + 1):
            continue
        cuts.add(end)
    spans, start = [], 0
    for cut in [*sorted(cuts), len(text)]:
        span = _strip(text, start, cut)
        if span is not None:
            spans.append(span)
        start = cut
    return spans


def _inside(mentions: Iterable[Span]) -> set[int]:
    """Positions strictly inside a mention (a cut there would split it)."""
    return {i for start, end in mentions for i in range(start + 1, end)}


def _abbreviation(text: str, end: int) -> bool:
    """Whether the word ending at ``end`` (just after its dot) is an abbreviation or an initial."""
    word = text[:end].rsplit(None, 1)[-1].lstrip("([\"'").lower() if text[:end].strip() else ""
    return word in ABBREVIATIONS or bool(_INITIAL.search(text[max(0, end - 3):end]))


def _strip(text: str, start: int, end: int) -> Span | None:
    while start < end and text[start].isspace():
        start += 1
    while end > start and text[end - 1].isspace():
        end -= 1
    return (start, end) if start < end else None


def tokenize(text: str, span: Span, cuts: Sequence[int] = ()) -> list[Span]:
    """The character spans of the tokens of ``text[span[0]:span[1]]``: ``\\w+`` runs and single other characters,
    also cut at each position in ``cuts`` (mention starts and ends) that falls inside a token."""
    start, end = span
    inner = sorted({c for c in cuts if start < c < end})
    tokens: list[Span] = []
    for match in _TOKEN.finditer(text, start, end):
        a, b = match.span()
        for c in inner:
            if a < c < b:
                tokens.append((a, c))
                a = c
        tokens.append((a, b))
    return tokens

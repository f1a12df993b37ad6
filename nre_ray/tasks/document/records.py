"""The records of document-level relation extraction: :class:`Document`, its :class:`Entity` objects (each a cluster
of :class:`Mention` objects) and its :class:`Fact` objects (head entity, tail entity, relation, evidence).

Every reader (:mod:`.read`) produces these, whatever the published format: sentences as token lists, mentions as
token spans inside one sentence (and, for formats with character offsets such as PubTator, the character span in
:attr:`Document.text` too). :meth:`Document.to_dict` / :func:`document_from_dict` turn a document into plain JSON
values and back (DocRED's layout plus our extra fields), which is what Ray Data rows and the cache will hold.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

Span = tuple[int, int]
"""``[start, end)``: token positions inside a sentence, or character offsets inside a text."""


@dataclass(frozen=True)
class Mention:
    """One mention of an entity.

    Attributes:
        sent_id: the sentence it is in (0-based index into :attr:`Document.sentences`).
        start, end: its tokens, ``sentences[sent_id][start:end]``.
        text: its text as the data gives it (DocRED's ``name``; PubTator's mention text).
        type: its entity type (``PER``, ``Chemical`` ...).
        chars: its ``[start, end)`` character offsets in :attr:`Document.text`, for formats that give them (PubTator),
            else None.
    """

    sent_id: int
    start: int
    end: int
    text: str
    type: str
    chars: Span | None = None


@dataclass(frozen=True)
class Entity:
    """An entity: the mentions that refer to one thing.

    Attributes:
        id: its id within the document: the MeSH id for CDR (entities are grouped by id), the position in
            ``vertexSet`` (as a string, ``"0"``, ``"1"``, ...) for DocRED. Facts and metrics use it.
        type: its type (that of its first mention).
        mentions: its mentions, in the order the data gives them (at least one).
    """

    id: str
    type: str
    mentions: tuple[Mention, ...]

    @property
    def names(self) -> frozenset[str]:
        """The texts of its mentions (what DocRED's Ign F1 compares with the training facts)."""
        return frozenset(m.text for m in self.mentions)

    @property
    def sentences(self) -> frozenset[int]:
        """The sentences it is mentioned in."""
        return frozenset(m.sent_id for m in self.mentions)


@dataclass(frozen=True)
class Fact:
    """A relation between two entities of a document.

    Attributes:
        head, tail: positions of the entities in :attr:`Document.entities`.
        relation: the relation's name (a Wikidata id such as ``P17`` for DocRED, ``CID`` for CDR).
        evidence: the sentences that support it (DocRED's ``evidence``; empty when the data gives none).
    """

    head: int
    tail: int
    relation: str
    evidence: tuple[int, ...] = ()


@dataclass(frozen=True)
class Document:
    """A document with its entities and facts.

    Attributes:
        id: the document's id (PubMed id for PubTator; the title for DocRED, which has no other id).
        title: its title.
        sentences: its sentences, each a tuple of tokens.
        entities: its entities; ``Fact.head``/``Fact.tail`` index into this.
        facts: its facts (none for unlabelled data), each (head, tail, relation) once.
        text: the original text (PubTator: title, a space, the abstract), or None when the data gives only tokens.
        token_chars: per sentence, the ``[start, end)`` character offsets of its tokens in :attr:`text` (None
            without :attr:`text`).
        unlinked: mentions without an id (PubTator's ``-1``): kept for describing the document, left out of the
            entities and therefore of entity-level candidate pairs and evaluation.
        source: the file it was read from; index: its 0-based position in that file; line: the 1-based line where it
            starts (None for JSON).
    """

    id: str
    title: str
    sentences: tuple[tuple[str, ...], ...]
    entities: tuple[Entity, ...]
    facts: tuple[Fact, ...] = ()
    text: str | None = None
    token_chars: tuple[tuple[Span, ...], ...] | None = None
    unlinked: tuple[Mention, ...] = ()
    source: str = ""
    index: int = 0
    line: int | None = None
    extra: Mapping[str, Any] = field(default_factory=dict, compare=False, repr=False)

    @property
    def num_tokens(self) -> int:
        """Words in the document (before any subword tokenizer)."""
        return sum(len(s) for s in self.sentences)

    def where(self) -> str:
        """``document 3 (id '227508')``: how messages name this document."""
        return f"document {self.index} (id {self.id!r})"

    def to_dict(self) -> dict[str, Any]:
        """The document as JSON values in DocRED's layout (``title``, ``sents``, ``vertexSet``, ``labels``) plus
        ``id``, ``entity_ids``, ``text``, ``token_chars`` and ``unlinked`` (mentions in DocRED's mention layout)."""
        return {
            "id": self.id,
            "title": self.title,
            "sents": [list(s) for s in self.sentences],
            "vertexSet": [[_mention_dict(m) for m in e.mentions] for e in self.entities],
            "entity_ids": [e.id for e in self.entities],
            "labels": [{"h": f.head, "t": f.tail, "r": f.relation, "evidence": list(f.evidence)} for f in self.facts],
            "text": self.text,
            "token_chars": None if self.token_chars is None else [[list(c) for c in s] for s in self.token_chars],
            "unlinked": [_mention_dict(m) for m in self.unlinked],
        }


def _mention_dict(m: Mention) -> dict[str, Any]:
    out: dict[str, Any] = {"name": m.text, "sent_id": m.sent_id, "pos": [m.start, m.end], "type": m.type}
    if m.chars is not None:
        out["chars"] = list(m.chars)
    return out


def _mention(value: Mapping[str, Any]) -> Mention:
    chars = value.get("chars")
    return Mention(int(value["sent_id"]), int(value["pos"][0]), int(value["pos"][1]), str(value["name"]),
                   str(value.get("type", "")), None if chars is None else (int(chars[0]), int(chars[1])))


def document_from_dict(value: Mapping[str, Any]) -> Document:
    """The inverse of :meth:`Document.to_dict` (assumes values that :meth:`~Document.to_dict` wrote, or checked
    DocRED values: it does not check them)."""
    ids = value.get("entity_ids") or [str(i) for i in range(len(value["vertexSet"]))]
    entities = tuple(Entity(str(i), str(ms[0].get("type", "")), tuple(_mention(m) for m in ms))
                     for i, ms in zip(ids, value["vertexSet"], strict=True))
    chars = value.get("token_chars")
    return Document(
        id=str(value.get("id", value.get("title", ""))),
        title=str(value.get("title", "")),
        sentences=tuple(tuple(s) for s in value["sents"]),
        entities=entities,
        facts=tuple(Fact(int(f["h"]), int(f["t"]), str(f["r"]), tuple(int(e) for e in f.get("evidence") or ()))
                    for f in value.get("labels") or ()),
        text=value.get("text"),
        token_chars=None if chars is None else tuple(tuple((int(a), int(b)) for a, b in s) for s in chars),
        unlinked=tuple(_mention(m) for m in value.get("unlinked") or ()),
    )

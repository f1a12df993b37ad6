"""Candidate entity pairs of a document: every ordered pair of distinct entities, or only those whose entity types
the training data relates.

:func:`type_pairs` collects the ``(head type, tail type)`` pairs of the training facts; :func:`candidate_pairs`
keeps the ordered pairs whose types are among them. On CDR every training fact is Chemical -> Disease, so the
candidates are exactly the chemical-disease pairs (the usual CDR setting); on DocRED the type pairs seen in training
cover most pairs (a pair of types never related in training cannot be predicted either way). Pass ``allowed=None``
for every ordered pair.
"""

from __future__ import annotations

from collections.abc import Iterable

from nre_ray.tasks.document.records import Document

TypePairs = frozenset[tuple[str, str]]


def type_pairs(documents: Iterable[Document]) -> TypePairs:
    """The ``(head entity type, tail entity type)`` pairs of the facts of ``documents`` (the training data)."""
    return frozenset((doc.entities[f.head].type, doc.entities[f.tail].type) for doc in documents for f in doc.facts)


def candidate_pairs(doc: Document, allowed: TypePairs | None = None) -> list[tuple[int, int]]:
    """The candidate ``(head, tail)`` entity positions of ``doc``, head-major order: every ordered pair of distinct
    entities (``allowed`` None), or those whose ``(head type, tail type)`` is in ``allowed``."""
    types = [e.type for e in doc.entities]
    return [(h, t) for h in range(len(types)) for t in range(len(types))
            if h != t and (allowed is None or (types[h], types[t]) in allowed)]

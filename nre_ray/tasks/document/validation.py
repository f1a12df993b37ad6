"""Checks of documents against what training knows, with the project's error style (:mod:`nre_ray.data.errors`).

The readers (:mod:`.read`) already check each document on its own (mentions inside the text and matching it, labels
on entities that exist). What needs the training data is here: :func:`check_relations` finds facts whose relation
training never saw (an unknown relation in a validation or test file), and, as :func:`~.readers.read_documents` does,
raises :class:`~nre_ray.data.errors.DataError` or, with ``on_bad="skip"``, keeps the good documents and lists the
others.
"""

from __future__ import annotations

from collections.abc import Collection

from nre_ray.data.errors import DataError, Problem
from nre_ray.tasks.document.readers import DOCUMENT_HINT, DocumentFile, OnBad


def relation_problems(file: DocumentFile, known: Collection[str]) -> dict[int, list[Problem]]:
    """``{position in file.documents: problems}`` for the documents with a fact whose relation is not in
    ``known`` (each problem names the file, the document and the relation, and lists the known ones)."""
    known = frozenset(known)
    shown = ", ".join(sorted(known)[:10]) + (" ..." if len(known) > 10 else "")
    out: dict[int, list[Problem]] = {}
    for k, doc in enumerate(file.documents):
        unknown = sorted({f.relation for f in doc.facts} - known)
        if unknown:
            out[k] = [Problem(file.path, doc.line, None,
                              f"{doc.where()}: relation {r!r} is not one of the training data's relations "
                              f"({shown})") for r in unknown]
    return out


def check_relations(file: DocumentFile, known: Collection[str], on_bad: OnBad = "error") -> DocumentFile:
    """``file`` without the documents that have a relation training never saw: :class:`DataError` naming them
    with ``on_bad="error"``; with ``"skip"`` a new :class:`DocumentFile` whose ``problems`` and ``skipped`` also
    count them."""
    bad = relation_problems(file, known)
    if not bad:
        return file
    problems = [p for k in sorted(bad) for p in bad[k]]
    if on_bad == "error":
        raise DataError(problems, hint=DOCUMENT_HINT)
    good = [doc for k, doc in enumerate(file.documents) if k not in bad]
    return DocumentFile(file.path, file.format, good, [*file.problems, *problems], file.skipped + len(bad))

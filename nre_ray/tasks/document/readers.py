"""Readers of the published document-level formats, from local paths or URIs, with detection and checks.

* **DocRED / Re-DocRED JSON** (:func:`parse_docred`): a JSON list of ``{title, sents, vertexSet, labels}``
  (``labels`` optional: unlabelled test files). A mention's ``pos`` is checked against its sentence; its ``name`` is
  kept as the data gives it (DocRED's names do not always equal the joined tokens, and Ign F1 compares names).
  Entity ids are the positions in ``vertexSet`` (``"0"``, ``"1"``, ...); the document id is the title. A single
  JSON object is read as a one-document file.
* **PubTator** (:func:`parse_pubtator`, BioCreative V CDR): blocks separated by blank lines, each
  ``PMID|t|title``, ``PMID|a|abstract``, mention lines ``PMID<TAB>start<TAB>end<TAB>text<TAB>type<TAB>ids[<TAB>
  texts]`` and relation lines ``PMID<TAB>relation<TAB>id1<TAB>id2``. The text is title + ``" "`` + abstract (the
  offsets count that way). As is common CDR practice (BRAN, EoG, ATLOP's CDR data), **entities are grouped by MeSH
  id** and a mention with a composite id ``D1|D2`` (one mention naming two concepts, such as "hemorrhagic
  cystitis") **belongs to each of the ids' entities**; a mention with id ``-1`` (no concept) belongs to no entity:
  it is kept in :attr:`~.records.Document.unlinked` and left out of candidate pairs and of the entity-level
  evaluation. An entity's type is its first mention's. The text is split into sentences and tokens by
  :mod:`.text`. The relation lines' first id is the head (CID: the chemical), the second the tail (the disease).

:func:`detect_document_format` names the format from a file's first bytes (None: not a document format, so the
sentence-level formats apply); :func:`split_of_name` recognises CDR's file names as train/valid/test.
:func:`read_documents` reads a file; its problems name the file, the document and what is wrong, and with
``on_bad="skip"`` the good documents are kept and the bad ones listed (:class:`DocumentFile`).
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from nre_ray import storage
from nre_ray.data.errors import DataError, Problem
from nre_ray.data.formats.common import Source, storage_problem
from nre_ray.tasks.document.records import Document, Entity, Fact, Mention, Span
from nre_ray.tasks.document.text import split_sentences, tokenize

DOCRED, PUBTATOR = "docred", "pubtator"
DocumentFormat = Literal["docred", "pubtator"]
OnBad = Literal["error", "skip"]
PEEK_BYTES = 1 << 16
NO_ID = "-1"
"""PubTator's id of a mention linked to no concept."""

DOCUMENT_HINT = ("Fix the documents listed above in the input file(s), or pass --on-bad-rows skip to leave bad "
                 "documents out (they are counted and listed).")
_PUBTATOR_TEXT = re.compile(r"^([^|\t]+)\|([ta])\|(.*)$")
_CDR_SPLITS = (("CDR_TrainingSet", "train"), ("CDR_DevelopmentSet", "valid"), ("CDR_TestSet", "test"))


@dataclass
class DocumentFile:
    """What :func:`read_documents` read from one file.

    Attributes:
        path: the file as the user named it.
        format: ``"docred"`` or ``"pubtator"``.
        documents: the good documents, in file order.
        problems: what is wrong with the others (empty unless read with ``on_bad="skip"``).
        skipped: how many documents were left out for those problems.
    """

    path: str
    format: DocumentFormat
    documents: list[Document]
    problems: list[Problem] = field(default_factory=list)
    skipped: int = 0


# --------------------------------------------------------------------------------------------------------------------
# detection


def split_of_name(name: str) -> str | None:
    """``"train"``, ``"valid"`` or ``"test"`` for CDR's own file names (``CDR_TrainingSet.PubTator.txt``,
    ``CDR_DevelopmentSet…``, ``CDR_TestSet…``, anywhere in the name), else None."""
    base = storage.name_of(name) if name else ""
    for prefix, split in _CDR_SPLITS:
        if prefix.lower() in base.lower():
            return split
    return None


def format_of_head(head: bytes) -> DocumentFormat | None:
    """The document format of a file starting with ``head`` (its first bytes), or None when it is none of them:
    a JSON list or object whose first keys include ``vertexSet`` or ``sents`` -> docred; a first line
    ``PMID|t|...`` or ``PMID|a|...`` -> pubtator."""
    text = head.decode("utf-8", errors="replace").lstrip("\ufeff").lstrip()
    if text.startswith(("[", "{")):
        return DOCRED if ('"vertexSet"' in text or '"sents"' in text) else None
    first = text.split("\n", 1)[0].rstrip("\r")
    return PUBTATOR if _PUBTATOR_TEXT.match(first) else None


def detect_document_format(path: Source) -> DocumentFormat | None:
    """The document format of the file ``path`` (local or URI) from its first bytes; None when it is not one (the
    sentence-level detection of :func:`nre_ray.data.formats.detect_format` then applies). Raises
    :class:`DataError` for a file that cannot be had."""
    name = os.fspath(path)
    try:
        storage.check_file(name)
        with storage.open_input(name) as stream:
            return format_of_head(stream.read(PEEK_BYTES))
    except storage.StorageError as err:
        raise storage_problem(err) from None


# --------------------------------------------------------------------------------------------------------------------
# reading


def read_documents(path: Source, fmt: DocumentFormat | None = None, on_bad: OnBad = "error") -> DocumentFile:
    """The documents of the file ``path`` (a local path or a URI, read whole through :mod:`nre_ray.storage`).

    ``fmt``: the format, detected from the content when None. ``on_bad="error"`` raises :class:`DataError` listing
    every problem (file, line or document, what is wrong) when any document is bad; ``"skip"`` keeps the good
    documents and returns the problems of the others. A file that cannot be read, decoded or parsed at all is an
    error either way.
    """
    name = os.fspath(path)
    try:
        storage.check_file(name)
        data = storage.read_bytes(name)
    except storage.StorageError as err:
        raise storage_problem(err) from None
    text = _decode(name, data)
    fmt = fmt or format_of_head(data[:PEEK_BYTES])
    if fmt is None:
        raise DataError([Problem(name, None, None, "not a document format we know (expected DocRED JSON or "
                                                   "PubTator)")], hint="Check that you passed the right file.")
    parsed = list(parse_docred(text, name) if fmt == DOCRED else parse_pubtator(text, name))
    return keep_good(name, fmt, parsed, on_bad)


def keep_good(name: str, fmt: DocumentFormat, parsed: Sequence[tuple[Document | None, list[Problem]]],
              on_bad: OnBad) -> DocumentFile:
    """The :class:`DocumentFile` of parsed ``(document or None, its problems)`` pairs: raise :class:`DataError` on
    any problem with ``on_bad="error"``, else keep the documents without problems."""
    problems = [p for _, ps in parsed for p in ps]
    if problems and on_bad == "error":
        raise DataError(problems, hint=DOCUMENT_HINT)
    good = [doc for doc, ps in parsed if doc is not None and not ps]
    return DocumentFile(name, fmt, good, problems, len(parsed) - len(good))


def _decode(name: str, data: bytes) -> str:
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as err:
        line = data.count(b"\n", 0, err.start) + 1
        raise DataError([Problem(name, line, None, f"not valid UTF-8 (byte offset {err.start})")],
                        hint="Re-save the file as UTF-8.") from None
    text = text.removeprefix("\ufeff")
    if not text.strip():
        raise DataError([Problem(name, None, None, "file is empty")], hint="Check that you passed the right file.")
    return text


# --------------------------------------------------------------------------------------------------------------------
# DocRED JSON


def parse_docred(text: str, name: str) -> Iterator[tuple[Document | None, list[Problem]]]:
    """``(document, problems)`` for each document of a DocRED JSON text (a list of documents, or one document);
    the document is None when it cannot be built. :class:`DataError` when the text is not JSON at all."""
    try:
        value = json.loads(text)
    except ValueError as err:
        raise DataError([Problem(name, getattr(err, "lineno", None), None, f"not valid JSON ({err})")],
                        hint="Check that the file is DocRED JSON: a list of documents.") from None
    items = [value] if isinstance(value, dict) else value
    if not isinstance(items, list):
        raise DataError([Problem(name, None, None, "expected a JSON list of documents")],
                        hint="Check that the file is DocRED JSON: a list of documents.")
    for index, item in enumerate(items):
        yield _docred_document(item, name, index)


def _docred_document(item: Any, name: str, index: int) -> tuple[Document | None, list[Problem]]:
    problems: list[Problem] = []
    title = str(item.get("title", "")) if isinstance(item, dict) else ""
    where = f"document {index} ({title!r})"

    def bad(message: str) -> None:
        problems.append(Problem(name, None, None, f"{where}: {message}"))

    if not isinstance(item, dict):
        bad("is not a JSON object")
        return None, problems
    sents, vertex_set = item.get("sents"), item.get("vertexSet")
    if not _is_list_of(sents, lambda s: _is_list_of(s, lambda t: isinstance(t, str))):
        bad("'sents' must be a list of sentences, each a list of token strings")
        return None, problems
    if not _is_list_of(vertex_set, lambda e: _is_list_of(e, lambda m: isinstance(m, dict)) and len(e) > 0):
        bad("'vertexSet' must be a list of entities, each a non-empty list of mentions")
        return None, problems
    entities = []
    for e, mentions in enumerate(vertex_set):
        parsed = [_docred_mention(m, sents, f"vertexSet[{e}][{k}]", bad) for k, m in enumerate(mentions)]
        good = tuple(m for m in parsed if m is not None)
        if good:
            entities.append(Entity(str(e), good[0].type, good))
    facts = _docred_facts(item.get("labels"), len(vertex_set), len(sents), bad)
    if problems:
        return None, problems
    doc = Document(id=title, title=title, sentences=tuple(tuple(s) for s in sents), entities=tuple(entities),
                   facts=tuple(facts), source=name, index=index)
    return doc, problems


def _is_list_of(value: Any, ok: Any) -> bool:
    return isinstance(value, list) and all(ok(v) for v in value)


def _docred_mention(m: dict[str, Any], sents: list[list[str]], field_name: str, bad: Any) -> Mention | None:
    sent_id, pos = m.get("sent_id"), m.get("pos")
    if not isinstance(sent_id, int) or not 0 <= sent_id < len(sents):
        bad(f"{field_name}: sent_id {sent_id!r} is not a sentence of the document (it has {len(sents)})")
        return None
    if not (isinstance(pos, list) and len(pos) == 2 and all(isinstance(p, int) for p in pos)):
        bad(f"{field_name}: pos must be [start, end] token positions (found {pos!r})")
        return None
    start, end = pos
    length = len(sents[sent_id])
    if not 0 <= start < end <= length:
        bad(f"{field_name}: pos [{start}, {end}] is outside sentence {sent_id} ({length} tokens)")
        return None
    return Mention(sent_id, start, end, str(m.get("name", " ".join(sents[sent_id][start:end]))), str(m.get("type", "")))


def _docred_facts(labels: Any, num_entities: int, num_sents: int, bad: Any) -> list[Fact]:
    if labels is None:
        return []
    if not isinstance(labels, list):
        bad("'labels' must be a list")
        return []
    facts: dict[tuple[int, int, str], Fact] = {}
    for k, label in enumerate(labels):
        if not isinstance(label, dict):
            bad(f"labels[{k}] is not a JSON object")
            continue
        h, t, r = label.get("h"), label.get("t"), label.get("r")
        missing = [f"{key} {v!r}" for key, v in (("h", h), ("t", t))
                   if not isinstance(v, int) or not 0 <= v < num_entities]
        if missing:
            bad(f"labels[{k}]: {' and '.join(missing)} is not an entity of the document "
                f"(it has {num_entities}: 0 to {num_entities - 1})")
            continue
        if not isinstance(r, str) or not r:
            bad(f"labels[{k}]: relation 'r' must be a non-empty string (found {r!r})")
            continue
        evidence = label.get("evidence") or []
        if not _is_list_of(evidence, lambda s: isinstance(s, int) and 0 <= s < num_sents):
            bad(f"labels[{k}]: evidence {evidence!r} must list sentences of the document (0 to {num_sents - 1})")
            continue
        key = (h, t, r)
        old = facts.get(key)
        merged = tuple(sorted(set(evidence) | set(old.evidence if old else ())))
        facts[key] = Fact(h, t, r, merged)
    return list(facts.values())


# --------------------------------------------------------------------------------------------------------------------
# PubTator


@dataclass
class _Block:
    """The lines of one PubTator document: ``(line number, line)``."""

    start: int
    lines: list[tuple[int, str]]


def _blocks(text: str) -> Iterator[_Block]:
    block: _Block | None = None
    for number, line in enumerate(text.split("\n"), start=1):
        line = line.rstrip("\r")
        if not line.strip():
            if block is not None:
                yield block
            block = None
            continue
        if block is None:
            block = _Block(number, [])
        block.lines.append((number, line))
    if block is not None:
        yield block


def parse_pubtator(text: str, name: str) -> Iterator[tuple[Document | None, list[Problem]]]:
    """``(document, problems)`` for each document (block of lines) of a PubTator text; the document is None when
    it cannot be built."""
    for index, block in enumerate(_blocks(text)):
        yield _pubtator_document(block, name, index)


def _pubtator_document(block: _Block, name: str, index: int) -> tuple[Document | None, list[Problem]]:
    problems: list[Problem] = []
    pmid = block.lines[0][1].split("|", 1)[0].split("\t", 1)[0]
    where = f"document {index} (id {pmid!r})"

    def bad(line: int | None, message: str) -> None:
        problems.append(Problem(name, line, None, f"{where}: {message}"))

    title = abstract = None
    raw_mentions: list[tuple[int, int, int, str, str, list[str]]] = []
    raw_relations: list[tuple[int, str, str, str]] = []
    for number, line in block.lines:
        match = _PUBTATOR_TEXT.match(line)
        fields = line.split("\t")
        doc_id = match.group(1) if match else fields[0]
        if doc_id != pmid:
            bad(number, f"line of document {doc_id!r} inside document {pmid!r} (a blank line must separate them)")
        elif match and match.group(2) == "t":
            title = match.group(3)
        elif match:
            abstract = match.group(3)
        elif len(fields) in (6, 7):
            try:
                start, end = int(fields[1]), int(fields[2])
            except ValueError:
                bad(number, f"mention offsets must be integers (found {fields[1]!r}, {fields[2]!r})")
                continue
            raw_mentions.append((number, start, end, fields[3], fields[4], fields[5].split("|")))
        elif len(fields) == 4:
            raw_relations.append((number, fields[1], fields[2], fields[3]))
        else:
            bad(number, f"not a PubTator line (expected PMID|t|title, PMID|a|abstract, a mention line of 6 or 7 "
                        f"tab-separated fields or a relation line of 4; found {len(fields)} field(s))")
    if title is None:
        bad(block.start, "has no title line (PMID|t|...)")
        return None, problems
    full = title + " " + (abstract or "")
    checked: list[tuple[int, str, str, Span, list[str]]] = []
    reported: set[str] = set()  # ids of bad mentions: a relation on them is not reported again
    for number, start, end, mention, kind, ids in raw_mentions:
        if not (mention.strip() and 0 <= start < end <= len(full) and full[start:end] == mention):
            reported.update(ids)
        if not mention.strip():
            bad(number, f"mention at {start}-{end} is blank")
        elif not 0 <= start < end <= len(full):
            bad(number, f"mention {mention!r} at {start}-{end} is outside the text ({len(full)} characters)")
        elif full[start:end] != mention:
            bad(number, f"mention {mention!r} at {start}-{end} does not match the text there "
                        f"({full[start:end]!r})")
        else:
            checked.append((number, mention, kind, (start, end), ids))
    sentences, token_chars, locate = _layout(full, len(title), [c[3] for c in checked])
    by_id: dict[str, list[Mention]] = {}
    unlinked: list[Mention] = []
    for _, mention, kind, chars, ids in checked:
        sent_id, a, b = locate(chars)
        m = Mention(sent_id, a, b, mention, kind, chars)
        if ids == [NO_ID] or not any(i.strip() and i != NO_ID for i in ids):
            unlinked.append(m)
            continue
        for concept in dict.fromkeys(i.strip() for i in ids if i.strip() and i != NO_ID):
            by_id.setdefault(concept, []).append(m)
    entities = tuple(Entity(concept, ms[0].type, tuple(ms)) for concept, ms in by_id.items())
    position = {e.id: k for k, e in enumerate(entities)}
    facts: dict[tuple[int, int, str], Fact] = {}
    for number, relation, head, tail in raw_relations:
        missing = [i for i in (head, tail) if i not in position]
        if missing and not set(missing) & reported:
            bad(number, f"relation {relation} {head} -> {tail}: {' and '.join(repr(i) for i in missing)} "
                        f"{'is no entity' if len(missing) == 1 else 'are no entities'} of the document "
                        "(no mention has that id)")
        if missing:
            continue
        facts.setdefault((position[head], position[tail], relation),
                         Fact(position[head], position[tail], relation))
    if problems:
        return None, problems
    doc = Document(id=pmid, title=title, sentences=sentences, entities=entities, facts=tuple(facts.values()),
                   text=full, token_chars=token_chars, unlinked=tuple(unlinked), source=name, index=index,
                   line=block.start)
    return doc, problems


def _layout(text: str, title_end: int, mentions: list[Span]) -> tuple[
        tuple[tuple[str, ...], ...], tuple[tuple[Span, ...], ...], Any]:
    """Sentences (token tuples), their tokens' character spans, and ``locate(chars) -> (sent_id, start, end)``
    for a mention's character span (its tokens: those inside the span)."""
    cuts = sorted({c for span in mentions for c in span})
    spans = split_sentences(text, title_end, mentions)
    chars = tuple(tuple(tokenize(text, span, cuts)) for span in spans)
    sentences = tuple(tuple(text[a:b] for a, b in sent) for sent in chars)

    def locate(span: Span) -> tuple[int, int, int]:
        for sent_id, sent in enumerate(chars):
            inside = [k for k, (a, b) in enumerate(sent) if a >= span[0] and b <= span[1]]
            if inside:
                return sent_id, inside[0], inside[-1] + 1
        raise AssertionError(f"no token inside the checked mention span {span}")  # a mention holds a non-space

    return sentences, chars, locate

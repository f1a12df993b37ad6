"""The document task's rows: documents in (a DocRED JSON or PubTator file, or DocRED's JSON fields ``title``,
``sents``, ``vertexSet`` as a request's columns), one row per predicted fact out.

A document is encoded with the same pure function that encoded the training data (:func:`.prepare.
encode_document_row`) and the context the checkpoint carries of its training split (:func:`.prepare.
checkpoint_context`: the vocabulary or the pretrained tokenizer, the relations, the candidate pairs' entity types,
the training facts' names), so evaluate scores a file exactly as training scored the same documents, and predict and
serve ask the model about the same candidate pairs.

* :func:`encode_file` (evaluate): a labelled document file -> a :class:`~.split.DocumentSplit`;
* :func:`plan_documents` (predict): a document file as chunks of rows, one row per document (the document as JSON in
  ``_nre_document``; a bad document is a row with its problem);
* :func:`predict_rows`: per document row, its ``document`` id and ``facts`` (a list of dicts), and ``problem``;
* :func:`answer`: those rows as one row per fact (:data:`ANSWER_COLUMNS`), what predict writes, the pyfunc model
  returns and serve answers.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd
import torch
from torch import nn

from nre_ray.core.user_error import ConfigError
from nre_ray.data.chunks import PREFIX, FramePlan, frame_plan
from nre_ray.data.errors import DataError, Problem
from nre_ray.data.formats.common import Source
from nre_ray.data.vocab import Vocab
from nre_ray.run.checkpoint import CheckpointError
from nre_ray.tasks.base import PredictSettings
from nre_ray.tasks.document.prepare import checkpoint_context, encode_document_row
from nre_ray.tasks.document.readers import parse_docred, read_documents
from nre_ray.tasks.document.records import Document, document_from_dict
from nre_ray.tasks.document.split import DocumentDataset, DocumentSplit
from nre_ray.tasks.document.validation import check_relations

INPUT_COLUMNS = ("title", "sents", "vertexSet")
"""The columns of a document as a request's row (DocRED's fields; ``sents`` and ``vertexSet`` as JSON values or
their text; ``labels`` and others are ignored)."""
OUTPUT_COLUMNS = ("document", "facts")
"""Per input document: its id and its predicted facts (a list of dicts with the :data:`FACT_FIELDS`)."""
FACT_FIELDS = ("head", "head_name", "tail", "tail_name", "relation", "score")
"""A predicted fact: head and tail entity (their ids in the document: DocRED's position in ``vertexSet``, CDR's MeSH
id) and names (the first mention's text), the relation and its score (sigmoid of its logit's margin over the
threshold class: above 0.5 for every predicted fact)."""
ANSWER_COLUMNS = ("document", *FACT_FIELDS)
"""One row per predicted fact."""


def _context(settings: Any, vocab: Vocab, labels: list[str], assets: Mapping[str, bytes] | None) -> dict[str, Any]:
    """The encoding context of a checkpoint (``settings``: its data settings); CheckpointError when it lacks it."""
    try:
        return checkpoint_context(vocab, labels, settings.lowercase, assets or {})
    except ValueError as err:
        raise CheckpointError(str(err)) from None


def _no_columns(fmt: str | None, columns: str | None) -> None:
    if fmt or columns:
        raise ConfigError("--format and --columns do not apply to documents: a DocRED JSON or PubTator file is told "
                          "by its content")


# --------------------------------------------------------------------------------------------------------------------
# evaluate


def encode_file(path: Source, data: Any, vocab: Vocab, labels: list[str], assets: Mapping[str, bytes] | None,
                fmt: str | None = None, columns: str | None = None, on_bad_rows: str = "error"
                ) -> tuple[DocumentSplit, int]:
    """The labelled documents of ``path`` encoded as the checkpoint's training encoded them (``data``: its data
    settings), and how many bad ones were skipped. A bad document (a mention outside its text, a label on a missing
    entity, a relation the checkpoint does not know) is a :class:`DataError` naming the file and the document, or
    with ``on_bad_rows="skip"`` left out and counted."""
    _no_columns(fmt, columns)
    context = _context(data, vocab, labels, assets)
    on_bad = "skip" if on_bad_rows == "skip" else "error"
    read = check_relations(read_documents(path, on_bad=on_bad), labels[1:], on_bad)
    rows = [encode_document_row(doc, context) for doc in read.documents]
    return DocumentSplit.from_documents(rows, len(labels), "eval"), read.skipped


# --------------------------------------------------------------------------------------------------------------------
# predict: the input file as chunks of document rows


def document_frame(path: Source) -> pd.DataFrame:
    """Every document of ``path`` as a row: ``id`` (the input's one column), and ``_nre_document``
    (:meth:`~.records.Document.to_dict` as JSON), ``_nre_file``, ``_nre_line``, ``_nre_problem``; the good ones in
    file order, then one row per bad one with its problem."""
    read = read_documents(path, on_bad="skip")
    name = str(path)
    good = [{"id": d.id, PREFIX + "document": json.dumps(d.to_dict(), ensure_ascii=False), PREFIX + "file": name,
             PREFIX + "line": d.line, PREFIX + "problem": ""} for d in read.documents]
    bad = [{"id": None, PREFIX + "document": None, PREFIX + "file": p.file, PREFIX + "line": p.line,
            PREFIX + "problem": p.message} for p in read.problems]
    columns = ["id", *(PREFIX + c for c in ("document", "file", "line", "problem"))]
    return pd.DataFrame(good + bad, columns=columns)


def plan_documents(path: Source, fmt: str | None, columns: str | None, chunk_rows: int) -> FramePlan:
    """``path`` (DocRED JSON or PubTator) as a :class:`~nre_ray.data.chunks.FramePlan` of :func:`document_frame`'s
    rows, ``chunk_rows`` documents a chunk; a file that cannot be read at all is a :class:`DataError` now."""
    _no_columns(fmt, columns)
    return frame_plan(str(path), document_frame(path), chunk_rows)


# --------------------------------------------------------------------------------------------------------------------
# requests


def documents_of_rows(frame: pd.DataFrame) -> pd.DataFrame:
    """Request rows (:data:`INPUT_COLUMNS`; ``sents`` and ``vertexSet`` as JSON values or text) as the canonical
    document rows :func:`predict_rows` takes (``document``, ``problem``, positional); a bad row gets its problem."""
    documents, problems = [], []
    for k, row in enumerate(frame.to_dict(orient="records")):
        item = {c: row.get(c) for c in INPUT_COLUMNS}
        for c in ("sents", "vertexSet"):
            if isinstance(item[c], str):
                try:
                    item[c] = json.loads(item[c])
                except ValueError:
                    pass  # the reader says what is wrong with it
            elif isinstance(item[c], np.ndarray):
                item[c] = item[c].tolist()
        item["title"] = "" if item["title"] is None else str(item["title"])
        try:
            ((doc, found),) = parse_docred(json.dumps(item, ensure_ascii=False, default=_plain), f"row {k + 1}")
        except (DataError, TypeError) as err:
            doc, found = None, [Problem(f"row {k + 1}", None, None, str(err).splitlines()[0])]
        documents.append(None if doc is None else json.dumps(doc.to_dict(), ensure_ascii=False))
        problems.append("; ".join(p.message for p in found) if doc is None else "")
    return pd.DataFrame({"document": documents, "problem": problems})


def _plain(value: Any) -> Any:
    """numpy values (a DataFrame's cells) as JSON values."""
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    raise TypeError(f"{type(value).__name__} is not a JSON value")


# --------------------------------------------------------------------------------------------------------------------
# predicting


@torch.inference_mode()
def predict_facts(model: nn.Module, docs: Sequence[Document], context: Mapping[str, Any], num_classes: int,
                  settings: PredictSettings, top_k: int = 0) -> list[list[dict[str, Any]]]:
    """Each document's predicted facts (:data:`FACT_FIELDS`), the relations scoring above the threshold class
    (at most ``top_k`` a pair when > 0), in candidate-pair order, in batches of ``settings.batch_size``
    documents."""
    from nre_ray.tasks.document.atlop import pair_mask, predict_labels

    split = DocumentSplit.from_documents([encode_document_row(d, context) for d in docs], num_classes)
    dataset = DocumentDataset(split)
    relations = [None, *sorted(context["relations"], key=context["relations"].get)]
    out: list[list[dict[str, Any]]] = []
    for start in range(0, len(docs), settings.batch_size):
        index = list(range(start, min(len(docs), start + settings.batch_size)))
        batch = {k: v.to(settings.device) for k, v in dataset.__getitems__(index).items()}
        logits = model(batch).float()  # (B, P, C)
        keep = pair_mask(batch["pairs"])  # (B, P)
        for b, k in enumerate(index):
            doc = docs[k]
            pairs = batch["pairs"][b][keep[b]].tolist()  # (P_b, 2)
            doc_logits = logits[b][keep[b]]  # (P_b, C)
            chosen = predict_labels(doc_logits, top_k or None)  # (P_b, C)
            margin = torch.sigmoid(doc_logits - doc_logits[:, :1]).cpu().numpy()  # (P_b, C)
            facts = []
            for p, c in zip(*np.nonzero(chosen[:, 1:].cpu().numpy()), strict=True):
                h, t = pairs[p]
                head, tail = doc.entities[h], doc.entities[t]
                facts.append({"head": head.id, "head_name": head.mentions[0].text, "tail": tail.id,
                              "tail_name": tail.mentions[0].text, "relation": relations[c + 1],
                              "score": float(margin[p, c + 1])})
            out.append(facts)
    return out


def predict_rows(model: nn.Module, frame: pd.DataFrame, settings: PredictSettings, top_k: int = 0) -> pd.DataFrame:
    """Per canonical document row (``document``: :meth:`~.records.Document.to_dict` as JSON, ``problem``; or the
    request columns :data:`INPUT_COLUMNS`): ``document`` (its id), ``facts`` (its predicted facts) and ``problem``
    ("" for good rows), positional."""
    if "document" not in frame.columns:
        frame = documents_of_rows(frame)
    frame = frame.reset_index(drop=True)
    problems = frame["problem"].fillna("").astype(str) if "problem" in frame.columns \
        else pd.Series([""] * len(frame), dtype=object)
    good = np.flatnonzero((problems == "").to_numpy())
    docs = [document_from_dict(json.loads(frame["document"][k])) for k in good]
    context = _context(settings.config.data, settings.vocab, settings.labels, settings.assets)
    facts = predict_facts(model, docs, context, len(settings.labels), settings, top_k)
    ids = np.full(len(frame), None, dtype=object)
    found = np.full(len(frame), None, dtype=object)
    for k, doc, doc_facts in zip(good.tolist(), docs, facts, strict=True):
        ids[k], found[k] = doc.id, doc_facts
    return pd.DataFrame({"document": ids, "facts": found, "problem": problems.to_numpy()})


def answer(frame: pd.DataFrame) -> pd.DataFrame:
    """Rows with ``document`` and ``facts`` (:func:`predict_rows`'s, good ones) as one row per fact
    (:data:`ANSWER_COLUMNS`); the other columns are left out."""
    rows = [{"document": d, **fact} for d, facts in zip(frame["document"], frame["facts"], strict=True)
            for fact in (facts or ())]
    return pd.DataFrame(rows, columns=list(ANSWER_COLUMNS)).astype({"score": "float64"})

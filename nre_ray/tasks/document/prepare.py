"""The document task's preprocessing: a folder of DocRED JSON or PubTator files -> encoded splits in the cache.

1. Driver: the split files are found (:func:`find_files`: ``train``/``dev``/``valid``/``test`` in the name, or
   CDR's own names) and read whole (:func:`~.readers.read_documents`; bad documents: an error, or with
   ``--on-bad-rows skip`` left out and listed); relations that training never saw are checked in the other splits
   (:func:`~.validation.check_relations`). Without a validation file, a seeded share of the training documents
   (``--valid-fraction``) validates. The relations (label columns, TH at 0) are the training file's; what else
   needs the whole training split comes from it: the vocabulary (``--min-freq``, ``--lowercase``; with
   ``--model bert``, the pretrained tokenizer's instead, saved with its ``config.json`` in the build folder's
   ``pretrained/``: :func:`.subwords.build_document_tokenizer`), the candidate pairs' entity types (PubTator: the
   type pairs of the training facts, so CDR's Chemical -> Disease; DocRED: every ordered pair) and the training
   facts' names (Ign F1).
2. Ray Data: every document is encoded by :func:`encode_batch` (``map_batches``): ATLOP's markers and token ids
   (words, or the pretrained tokenizer's subwords between its special tokens), its candidate pairs and gold facts
   (:mod:`.encoding`), each pair's intra-sentence flag and each fact's "seen in training" flag (:mod:`.counts`).
3. Driver: the encoded documents become one :class:`~.split.DocumentSplit` per split, saved with the vocabulary,
   labels, audit and the context every checkpoint carries (:data:`CONTEXT_ASSET`; and ``pretrained/``) in a private
   folder and published as the cache folder (:mod:`nre_ray.core.buildonce`), under a key of the input files'
   content and the settings, the pretrained model's fingerprint included (:func:`nre_ray.data.pipeline.cache_key`);
   the next run with the same inputs and settings reuses it.

Documents are few and small next to sentence corpora (CDR: 1,500 abstracts), so the driver holds them and builds the
cache on its node. With a storage path in an object store the result is also published to (and the next job's fetched
from) the shared cache ``<storage-path>/.nre_ray_cache/<key>/``, as the sentence pipeline's is; training workers on
other nodes copy it from there (:mod:`nre_ray.data.shared_cache`).
"""

from __future__ import annotations

import json
import logging
import random
import re
import shutil
from collections import Counter
from collections.abc import Mapping
from pathlib import Path, PurePosixPath
from typing import Any

import numpy as np
import pandas as pd

from nre_ray import storage
from nre_ray.config import DataConfig, ModelConfig
from nre_ray.data import shared_cache as shared_cache_rules
from nre_ray.data.errors import DataError, Problem
from nre_ray.data.formats.common import HINT_PATH, Source, storage_problem
from nre_ray.data.pipeline import CACHE_FOLDER, Prepared, cache_key, load_task_cache, quiet_ray_data, sources_of
from nre_ray.data.subword import fingerprint
from nre_ray.data.vocab import UNK_ID, Vocab
from nre_ray.run.checkpoint import PRETRAINED_DIR, pretrained_assets
from nre_ray.tasks.document.encoding import THRESHOLD_LABEL, build_vocab, encode_document, relation_index
from nre_ray.tasks.document.pairs import candidate_pairs, type_pairs
from nre_ray.tasks.document.readers import (
    PUBTATOR,
    DocumentFile,
    detect_document_format,
    read_documents,
    split_of_name,
)
from nre_ray.tasks.document.records import Document, document_from_dict
from nre_ray.tasks.document.scoring import intra_pairs, train_triples
from nre_ray.tasks.document.split import DocumentSplit
from nre_ray.tasks.document.subwords import (
    DocumentTokenizer,
    build_document_tokenizer,
    document_tokenizer,
    encoder_window,
)
from nre_ray.tasks.document.validation import check_relations

log = logging.getLogger(__name__)
CACHE_VERSION = 3
CONTEXT_ASSET = "task/context.json"
"""What every checkpoint of a document run carries of its training split (:func:`context_asset`): the candidate
pairs' entity types and the training facts' names, so that evaluate, predict and serve encode documents as the run's
preprocessing did (:func:`checkpoint_context`)."""
MARKER = "meta.json"
"""The file a document cache folder gets last (with ``"task": "document"``)."""
_SPLIT_WORDS = {"train": "train", "valid": "valid", "validation": "valid", "dev": "valid", "val": "valid",
                "test": "test"}


# --------------------------------------------------------------------------------------------------------------------
# the files


def split_of_file(name: str) -> str | None:
    """``train``, ``valid`` or ``test`` for a file's name: CDR's own names (:func:`~.readers.split_of_name`), else the
    first word of its stem that names a split (``train_annotated.json``, ``dev_revised.json``, ``test.json``)."""
    cdr = split_of_name(name)
    if cdr:
        return cdr
    stem = PurePosixPath(name).name.split(".", 1)[0].lower()
    return next((_SPLIT_WORDS[w] for w in re.split(r"[_\-]", stem) if w in _SPLIT_WORDS), None)


def find_files(data_dir: Source) -> dict[str, Source]:
    """Split -> the document file (DocRED JSON or PubTator, told by its first bytes) of the folder ``data_dir``
    (local or a URI). :class:`DataError` when there is none for training, or two for one split."""
    try:
        names = storage.list_files(data_dir) if storage.is_dir(data_dir) else []
    except storage.StorageError as err:
        raise storage_problem(err) from None
    found: dict[str, list[Source]] = {}
    for name in sorted(names):
        path: Source = name if storage.is_uri(name) else Path(name)
        split = split_of_file(str(name))
        if split and not PurePosixPath(str(name)).name.startswith(".") and detect_document_format(path):
            found.setdefault(split, []).append(path)
    problems = [Problem(str(data_dir), None, None, f"more than one {s} file ({', '.join(map(str, fs))})")
                for s, fs in found.items() if len(fs) > 1]
    if "train" not in found:
        problems.append(Problem(str(data_dir), None, None, "no training file of documents (DocRED JSON or PubTator "
                                                           "with train, or CDR_TrainingSet, in its name)"))
    if problems:
        raise DataError(problems, hint=HINT_PATH)
    return {s: fs[0] for s, fs in found.items()}


def has_documents(data_dir: str) -> bool:
    """Whether the folder holds a file in a document format whose name names a split (first bytes only)."""
    try:
        if not storage.is_dir(data_dir):
            return False
        for name in storage.list_files(data_dir):
            path: Source = name if storage.is_uri(name) else Path(name)
            if split_of_file(str(name)) and detect_document_format(path):
                return True
    except (DataError, storage.StorageError, OSError):
        return False
    return False


# --------------------------------------------------------------------------------------------------------------------
# encoding (run by Ray Data)


def encode_document_row(doc: Document, context: Mapping[str, Any]) -> dict[str, Any]:
    """One document encoded for :class:`~.split.DocumentSplit` with the training split's ``context``: ``tokens``
    (the vocabulary in id order) and ``lowercase``, or ``pretrained`` (``--model bert``: the tokenizer's files,
    ``{"pretrained/<name>": bytes}``; the words are cut into its subwords between its special tokens:
    :mod:`.subwords`), ``relations`` (name -> column), ``type_pairs`` (allowed (head type, tail type) pairs, or
    None: every ordered pair), ``train`` (the training facts' name triples)."""
    relations = context["relations"]
    allowed = None if context["type_pairs"] is None else frozenset(map(tuple, context["type_pairs"]))
    pairs = candidate_pairs(doc, allowed)
    if context.get("pretrained"):
        tokenizer = document_tokenizer(context["pretrained"])
        encoded = encode_document(doc, pairs, relations, tokenizer.to_ids, tokenizer.pieces(doc), tokenizer.prefix,
                                  tokenizer.suffix)
    else:
        index = {t: i for i, t in enumerate(context["tokens"])}
        lower = context["lowercase"]
        encoded = encode_document(doc, pairs, relations,
                                  lambda tokens: [index.get(t.lower() if lower else t, UNK_ID) for t in tokens])
    intra = intra_pairs(doc)
    ids = [e.id for e in doc.entities]
    row = {(h, t): k for k, (h, t) in enumerate(pairs)}
    train = context["train"]
    facts, uncovered = [], np.zeros((2, 1 + len(relations)), dtype=np.int64)
    for f in doc.facts:
        column = relations[f.relation]
        inside = (ids[f.head], ids[f.tail]) in intra
        k = row.get((f.head, f.tail))
        if k is None:
            uncovered[0, column] += 1
            uncovered[1, column] += inside
            continue
        names = [(n1, n2) for n1 in doc.entities[f.head].names for n2 in doc.entities[f.tail].names]
        facts.append((k, column, any((n1, n2, f.relation) in train for n1, n2 in names)))
    return {"id": doc.id, "input_ids": encoded.input_ids.tolist(), "mention_pos": encoded.mention_pos,
            "pairs": encoded.pairs.tolist(), "intra": [(ids[h], ids[t]) in intra for h, t in pairs],
            "facts": facts, "uncovered": uncovered.tolist()}


def encode_batch(batch: dict[str, np.ndarray], context: Mapping[str, Any]) -> dict[str, np.ndarray]:
    """Ray Data ``map_batches``: rows ``split``, ``position``, ``document`` (:meth:`~.records.Document.to_dict` as
    JSON) -> rows ``split``, ``position``, ``encoded`` (:func:`encode_document_row` as JSON, "" where it failed) and
    ``error`` (why it failed, "" where it did not): a document the checks passed but the encoding could not take is
    reported by the driver (:func:`encoding_problems`), not as a Ray Data traceback."""
    encoded, errors = [], []
    for d in batch["document"]:
        try:
            encoded.append(json.dumps(encode_document_row(document_from_dict(json.loads(d)), context)))
            errors.append("")
        except Exception as err:  # reported with the document it failed on, by the driver
            encoded.append("")
            errors.append(f"{type(err).__name__}: {err}")
    return {"split": batch["split"], "position": batch["position"], "encoded": np.asarray(encoded, dtype=object),
            "error": np.asarray(errors, dtype=object)}


def encoding_problems(documents: Mapping[str, list[Document]], failed: list[tuple[str, int, str]]) -> DataError:
    """The documents whose encoding failed (``failed``: split, position, the error), each named by its file, line
    and id, as one DataError. The checks passed them, so it is a gap in those checks, not a row to fix blindly."""
    problems = []
    for split, position, error in failed:
        doc = documents[split][position]
        problems.append(Problem(str(doc.source or split), doc.line, None,
                                f"document {doc.id!r} passed the checks but could not be encoded ({error})"))
    return DataError(problems, hint="nre_ray's checks missed what is wrong with these documents: please report it "
                                    "with one of them; until then, remove them from the file.")


def _context(train: list[Document], vocab: Vocab, relations: dict[str, int], fmt: str, lowercase: bool,
             pretrained: Mapping[str, bytes] | None) -> dict[str, Any]:
    allowed = sorted(type_pairs(train)) if fmt == PUBTATOR else None
    return {"tokens": [] if pretrained else list(vocab.tokens), "lowercase": lowercase,
            "pretrained": dict(pretrained) if pretrained else None, "relations": relations, "type_pairs": allowed,
            "train": train_triples(train)}


def context_asset(context: Mapping[str, Any]) -> bytes:
    """The part of an encoding ``context`` that the vocabulary, labels and settings of a checkpoint do not hold
    (``type_pairs``, ``train``), as the JSON of :data:`CONTEXT_ASSET`."""
    pairs = None if context["type_pairs"] is None else sorted(map(list, context["type_pairs"]))
    return json.dumps({"type_pairs": pairs, "train": sorted(map(list, context["train"]))},
                      ensure_ascii=False).encode("utf-8")


def checkpoint_context(vocab: Vocab, labels: list[str], lowercase: bool, assets: Mapping[str, bytes]
                       ) -> dict[str, Any]:
    """The encoding context of :func:`encode_document_row` as the run's preprocessing had it, from a checkpoint's
    ``vocab``, ``labels`` (TH first), ``--lowercase`` and ``assets`` (:data:`CONTEXT_ASSET`; with a subword
    vocabulary, ``--model bert``, the tokenizer's files under ``pretrained/``); a CheckpointError-worthy ValueError
    when the checkpoint lacks them."""
    if CONTEXT_ASSET not in assets:
        raise ValueError(f"the checkpoint lacks {CONTEXT_ASSET} (written by an nre_ray older than document "
                         "evaluate/predict): train it again")
    pretrained = {name: data for name, data in assets.items() if name.startswith(f"{PRETRAINED_DIR}/")}
    if vocab.subword and not pretrained:
        raise ValueError(f"this --model bert checkpoint carries no {PRETRAINED_DIR}/ tokenizer files")
    stored = json.loads(assets[CONTEXT_ASSET].decode("utf-8"))
    pairs = stored["type_pairs"]
    return {"tokens": [] if vocab.subword else list(vocab.tokens), "lowercase": lowercase,
            "pretrained": pretrained if vocab.subword else None, "relations": relation_index(labels[1:]),
            "type_pairs": None if pairs is None else [tuple(p) for p in pairs],
            "train": frozenset(tuple(t) for t in stored["train"])}


def _encode_with_ray_data(documents: dict[str, list[Document]], context: dict[str, Any]) -> dict[str, list[dict]]:
    """Every split's documents encoded by Ray Data (:func:`encode_batch`), back in their order."""
    import ray.data

    quiet_ray_data()
    items = [{"split": s, "position": k, "document": json.dumps(d.to_dict(), ensure_ascii=False)}
             for s, docs in documents.items() for k, d in enumerate(docs)]
    blocks = max(1, min(len(items) // 16, 8))
    rows = ray.data.from_items(items, override_num_blocks=blocks).map_batches(
        encode_batch, fn_kwargs={"context": context}, batch_format="numpy", batch_size=32).take_all()
    failed = [(str(r["split"]), int(r["position"]), str(r["error"])) for r in rows if r["error"]]
    if failed:
        raise encoding_problems(documents, sorted(failed))
    out: dict[str, list[Any]] = {s: [None] * len(docs) for s, docs in documents.items()}
    for r in rows:
        out[str(r["split"])][int(r["position"])] = json.loads(r["encoded"])
    return out


# --------------------------------------------------------------------------------------------------------------------
# the run's data


def cache_folder(cfg: DataConfig, files: dict[str, Source], seed: int, pretrained: str | None = None) -> Path:
    """The local cache folder of these split files and settings (built or not)."""
    return Path(cfg.cache_dir or CACHE_FOLDER).absolute() / cache_key(files, settings_of(cfg, seed, pretrained))


def is_cached(cfg: DataConfig, seed: int, pretrained: str | None = None, shared_cache: str | None = None) -> bool:
    """Whether :func:`prepare_documents` would reuse a cache, local or in ``shared_cache`` (and so needs no Ray)."""
    return not cfg.no_cache and shared_cache_rules.is_cached(
        cache_folder(cfg, find_files(cfg.data_dir), seed, pretrained), shared_cache, _accepts)


def settings_of(cfg: DataConfig, seed: int, pretrained: str | None = None) -> dict[str, Any]:
    """The settings that change the encoded documents (the cache key uses them); ``pretrained`` (``--model bert``):
    its tokenizer's fingerprint (:func:`nre_ray.data.subword.fingerprint`: a local folder's small files, or the hub
    name)."""
    settings = {"task": "document", "version": CACHE_VERSION, "seed": seed, "lowercase": cfg.lowercase,
                "min_freq": cfg.min_freq, "valid_fraction": cfg.valid_fraction, "on_bad_rows": cfg.on_bad_rows}
    if pretrained:
        settings["pretrained"] = fingerprint(pretrained)
    return settings


def prepare_documents(cfg: DataConfig, seed: int, pretrained: str | None = None,
                      shared_cache: str | None = None) -> Prepared:
    """The encoded splits of ``cfg.data_dir`` (see the module docstring), from the cache when it has them;
    ``pretrained`` (``--model bert``): in that model's subwords (:mod:`.subwords`); ``shared_cache``: a folder every
    machine sees (``<storage-path>/.nre_ray_cache``), where the result is fetched from or published to
    (:func:`nre_ray.data.shared_cache.build_or_reuse`)."""
    files = find_files(cfg.data_dir)

    def build(private: Path) -> pd.DataFrame:
        built = _build(cfg, files, seed, pretrained, private)
        save_documents(built, private)
        return built.rejected

    prepared = shared_cache_rules.build_or_reuse(cache_folder(cfg, files, seed, pretrained), shared_cache, _accepts,
                                                 cfg.no_cache, build, load_documents)
    prepared.sources = sources_of(files)
    return prepared


def read_files(files: dict[str, Source], cfg: DataConfig) -> tuple[dict[str, DocumentFile], list[Problem]]:
    """Every split's documents, checked (``--on-bad-rows``: DataError listing the bad documents, or ``skip``: left
    out), relations unknown to training refused in the other splits; and the problems of the documents left out."""
    on_bad = "skip" if cfg.on_bad_rows == "skip" else "error"
    read = {s: read_documents(path, on_bad=on_bad) for s, path in files.items()}
    known = {f.relation for d in read["train"].documents for f in d.facts}
    for s in read:
        if s != "train":
            read[s] = check_relations(read[s], known, on_bad)
    return read, [p for f in read.values() for p in f.problems]


def split_documents(read: Mapping[str, DocumentFile], valid_fraction: float, seed: int
                    ) -> tuple[dict[str, list[Document]], dict[str, int], bool]:
    """The documents of each split, the relations (name -> label column) and whether validation was drawn from
    train: without a validation file, a seeded ``valid_fraction`` of the training documents (at least one). The
    relations are the training file's, those of the documents drawn for validation included (a relation only they
    have is a label column that training never sees positive, not a fact that cannot be counted)."""
    documents = {s: list(f.documents) for s, f in read.items()}
    valid_from_train = "valid" not in documents
    if valid_from_train:
        order = list(range(len(documents["train"])))
        random.Random(seed).shuffle(order)
        cut = set(order[:max(1, round(valid_fraction * len(order)))])
        documents["valid"] = [d for k, d in enumerate(documents["train"]) if k in cut]
        documents["train"] = [d for k, d in enumerate(documents["train"]) if k not in cut]
    relations = relation_index(f.relation for d in read["train"].documents for f in d.facts)
    return documents, relations, valid_from_train


def _build(cfg: DataConfig, files: dict[str, Source], seed: int, pretrained: str | None, folder: Path) -> Prepared:
    read, problems = read_files(files, cfg)
    documents, relations, valid_from_train = split_documents(read, cfg.valid_fraction, seed)
    if not documents["train"] or not documents["valid"]:
        raise DataError([Problem(str(files["train"]), None, None, "too few good documents to train and validate "
                                                                  "on")], hint="Check the data folder.")
    train = documents["train"]
    labels = [THRESHOLD_LABEL, *relations]
    tokenizer_dir, window = None, ModelConfig().max_positions
    if pretrained:  # the tokenizer, saved with the cache: every checkpoint carries it
        tokenizer_dir = build_document_tokenizer(pretrained, folder / PRETRAINED_DIR)
        vocab = Vocab(DocumentTokenizer.load(tokenizer_dir).vocabulary(), subword=True)
        window = encoder_window(tokenizer_dir) or window
    else:
        vocab = build_vocab(train, cfg.min_freq, cfg.lowercase)
    context = _context(train, vocab, relations, read["train"].format, cfg.lowercase,
                       pretrained_assets(tokenizer_dir))
    encoded = _encode_with_ray_data({s: documents[s] for s in ("train", "valid", "test") if s in documents}, context)
    splits = {s: DocumentSplit.from_documents(rows, len(labels), s) for s, rows in encoded.items()}
    rejected = pd.DataFrame([{"file": p.file, "line": p.line, "problem": p.message} for p in problems],
                            columns=["file", "line", "problem"])
    return Prepared(splits=splits, vocab=vocab, labels=labels, sources={}, rejected=rejected,
                    valid_from_train=valid_from_train,
                    audit=audit_of(documents, labels, splits, len(problems), window, subwords=bool(pretrained)),
                    rejected_count=len(problems), assets={CONTEXT_ASSET: context_asset(context)},
                    pretrained_dir=None if tokenizer_dir is None else str(tokenizer_dir))


def audit_of(documents: dict[str, list[Document]], labels: list[str], splits: dict[str, DocumentSplit],
             rejected: int, window: int | None = None, subwords: bool = False) -> dict[str, Any]:
    """The data audit (``python -m nre_ray.data inspect``, MLflow's ``data/audit.md``: :mod:`.describe`): per split
    its documents (``rows``), skipped ones, entities, mentions, candidate pairs, facts per relation (``labels``),
    lengths in words and in encoded tokens (markers included; ``subwords``: a pretrained tokenizer's, its special
    tokens too), and how many documents are longer than the encoder's ``window`` (default: ``--max-positions``'s
    default; the pretrained model's positions with ``subwords``; read in overlapping windows)."""
    window = window or ModelConfig().max_positions
    out: dict[str, Any] = {"task": "document", "warnings": [], "labels": labels[1:], "max_length": 0,
                           "window": window, "subwords": subwords, "splits": {}}
    for s, docs in documents.items():
        facts = Counter(f.relation for d in docs for f in d.facts)
        tokens = splits[s].lengths if s in splits else np.zeros(0, dtype=np.int64)
        out["splits"][s] = {
            "rows": len(docs), "rejected": rejected if s == "train" else 0,
            "entities": sum(len(d.entities) for d in docs),
            "mentions": sum(len(e.mentions) for d in docs for e in d.entities),
            "candidate_pairs": len(splits[s].arrays["pairs"]) if s in splits else 0,
            "facts": sum(facts.values()),
            "length": _spread([d.num_tokens for d in docs]), "tokens": _spread(tokens.tolist()),
            "longer_than_window": int((tokens > window).sum()),
            "distance": {}, "labels": dict(facts)}
    return out


def _spread(values: list[int]) -> dict[str, float]:
    """Mean, p50, p90 and max of ``values`` (0 for none)."""
    a = np.asarray(values or [0])
    return {"mean": float(a.mean()), "p50": float(np.percentile(a, 50)), "p90": float(np.percentile(a, 90)),
            "max": int(a.max())}


def _accepts(meta: dict[str, Any]) -> bool:
    """A cache folder's ``meta.json`` is a document cache's."""
    return meta.get("task") == "document"


def complete(folder: Path) -> bool:
    """Whether ``folder`` is a complete document cache."""
    return shared_cache_rules.complete(folder, _accepts)


def splits_complete(folder: Path, names: list[str]) -> bool:
    """Whether ``folder`` holds the files of the splits ``names``."""
    return all((Path(folder) / f).is_file() for n in names for f in DocumentSplit.files(n))


def save_documents(prepared: Prepared, folder: Path) -> None:
    """Write the splits, vocabulary, labels, audit and rejected documents into ``folder``, meta.json last."""
    for name, split in prepared.splits.items():
        split.save(folder, name)
    prepared.vocab.save(folder / "vocab.json")
    (folder / "labels.json").write_text(json.dumps(prepared.labels, ensure_ascii=False), encoding="utf-8")
    (folder / "audit.json").write_text(json.dumps(prepared.audit, ensure_ascii=False), encoding="utf-8")
    prepared.rejected.to_csv(folder / "rejected.csv", index=False)
    (folder / "context.json").write_bytes(prepared.assets[CONTEXT_ASSET])
    if prepared.pretrained_dir and Path(prepared.pretrained_dir).resolve() != (folder / PRETRAINED_DIR).resolve():
        shutil.rmtree(folder / PRETRAINED_DIR, ignore_errors=True)
        shutil.copytree(prepared.pretrained_dir, folder / PRETRAINED_DIR)
    meta = {"task": "document", "splits": list(prepared.splits), "valid_from_train": prepared.valid_from_train,
            "rejected_count": prepared.rejected_count, "pretrained": bool(prepared.pretrained_dir)}
    (folder / MARKER).write_text(json.dumps(meta), encoding="utf-8")


def load_documents(folder: Path) -> Prepared:
    """What :func:`save_documents` wrote (``--model bert``: ``pretrained_dir`` is the cache's tokenizer folder)."""
    pretrained = json.loads((folder / MARKER).read_text(encoding="utf-8")).get("pretrained")
    return load_task_cache(folder, MARKER, DocumentSplit.open,
                           assets={CONTEXT_ASSET: (folder / "context.json").read_bytes()},
                           pretrained_dir=str(folder / PRETRAINED_DIR) if pretrained else None)

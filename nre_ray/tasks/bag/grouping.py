"""The bag task's preprocessing: split files -> sentences -> entity-pair bags -> encoded bags in the cache, on Ray Data.

1. Driver: the split files (:func:`find_bag_files`: ``--data-dir``'s ``train``/``valid``/``dev``/``test`` files or
   the explicit ``--train/--valid/--test``; without any, the bundled bag sample) and their formats, from their first
   bytes (:func:`~.files.detect_bag_format`: NYT10's TSV, else the sentence formats with ``head_id``/``tail_id`` or
   OpenNRE's ``h.id``/``t.id``; ``--format`` forces one). Nothing else is read on the driver.
2. Ray Data, one read task per file (:func:`read_split_file`; NYT10 TSV streamed in chunks): the records, with
   their problems as the readers report them. The driver counts the bad rows and shows the first ones
   (``--on-bad-rows error``: a :class:`~nre_ray.data.errors.DataError`; ``skip``: left out and listed).
3. Ray Data: the good rows get their bag key (:func:`~.bags.with_bag_keys`) and are grouped by (split, bag)
   (``groupby(...).map_groups``, :func:`bags_of_group`): one row per bag, its label set (NA dropped beside a
   relation) and at most ``--max-bag-size`` sentences, a seeded uniform sample (:func:`~.bags.build_bags`'s
   bottom-k: the same bag whatever the files' order or Ray's blocks). Without a validation file a seeded share
   (``--valid-fraction``) of the training *bags* validates (:func:`draw_valid`: by a hash of the bag's key, so no
   list of bags is needed).
4. Ray Data: the training bags' token counts (summed by a groupby) -> the vocabulary; every bag's sentences
   tokenized and encoded as the sentence task encodes a row (:func:`encode_bags`). With ``--model bert`` the
   vocabulary is the pretrained tokenizer's plus the entity markers (built once on the driver into the cache's
   ``pretrained/`` folder, :func:`nre_ray.data.subword.tokenizer_vocab`, as the sentence task builds it), and each
   sentence is encoded by the sentence task's subword encoder (:func:`nre_ray.data.subword.encode_subword_batch`:
   markers around the head and the tail, the model's special tokens, a window of ``--max-length`` subwords).
5. Driver: the encoded bags stream in (``iter_batches``), are put in the order of their keys and written split by
   split as :class:`~.bag_split.BagSplit` files (4 bytes a token; the raw corpus never reaches the driver), with the
   vocabulary, labels and audit (:mod:`.bag_audit`), in a private folder published as the cache folder
   (:mod:`nre_ray.core.buildonce`) under a key of the inputs' content and the settings: the next run with the same
   inputs reuses it. With a storage path in an object store it is published to the shared cache too
   (``<storage-path>/.nre_ray_cache/<key>/``), where jobs on other machines and workers on other nodes find it
   (:mod:`nre_ray.data.shared_cache`).

Labels come from the training bags: NA (``--negative-label``, default ``NA``) first, then the relations sorted. A bag
of the validation or test split with a relation training never saw is a bad row of its file (its first sentence).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
from collections.abc import Iterator
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from nre_ray import storage
from nre_ray.config import DataConfig
from nre_ray.data import shared_cache as shared_cache_rules
from nre_ray.data.batches import EncodedSplit, encode_flat, token_counts, tokenize_batch
from nre_ray.data.checks import check_rows
from nre_ray.data.datadir import find_data_files
from nre_ray.data.errors import MAX_SHOWN, DataError, Problem
from nre_ray.data.formats.common import Source
from nre_ray.data.labels import read_labels
from nre_ray.data.pipeline import CACHE_FOLDER, Prepared, cache_key, load_task_cache, quiet_ray_data, sources_of
from nre_ray.data.schema import parse_column_map
from nre_ray.data.subword import assets_folder, encode_subword_batch, fingerprint, tokenizer_vocab
from nre_ray.data.vocab import Vocab
from nre_ray.run.checkpoint import pretrained_assets
from nre_ray.tasks.bag.bag_audit import SentenceLengths, audit_of
from nre_ray.tasks.bag.bag_split import BagSplit
from nre_ray.tasks.bag.bags import BAG, NA, build_bags, with_bag_keys
from nre_ray.tasks.bag.files import (
    COLUMNS,
    NYT10,
    check_label_file,
    detect_bag_format,
    read_bag_table,
    read_nyt10_chunks,
    read_relation2id,
)

log = logging.getLogger(__name__)
CACHE_VERSION = 3  # 2: a sentence's sampling priority leaves out its file's name and its label; 3: the bag audit
MARKER = "meta.json"
"""The file a bag cache folder gets last (with ``"task": "bag"``)."""
SPLITS = ("train", "valid", "test")
ROWS_HINT = "Fix these rows, or pass --on-bad-rows skip to train on the good rows only."
TEXT_COLUMNS = [c for c in COLUMNS if c != "line"]
SEED_ASSET = "task/bags.json"
"""What a bag checkpoint carries of its preprocessing (under ``task/``): ``{"seed": N}``, the seed that sampled and
ordered each bag's sentences (:func:`~.bags.priority`), so evaluate and predict build a file's bags as training
built them."""


def sample_dir() -> Path:
    """The bag sample shipped inside the package (NYT10 TSV: NA + 4 relations, 640 sentences)."""
    return Path(str(resources.files("nre_ray.tasks.bag") / "sample"))


def find_bag_files(cfg: DataConfig) -> dict[str, Source]:
    """Split name -> file: ``--data-dir``'s split files (default: :func:`sample_dir`), then the explicit
    ``--train``, ``--valid``, ``--test``; ``labels`` only with ``--labels`` (labels come from the data)."""
    files: dict[str, Source] = {}
    if cfg.data_dir or not cfg.train:
        found = find_data_files(cfg.data_dir if cfg.data_dir else sample_dir())
        files.update({k: v for k, v in found.items() if k in SPLITS})
    for key in (*SPLITS, "labels"):
        value = getattr(cfg, key)
        if value:
            files[key] = value if storage.is_uri(value) else Path(value)
    return files


def formats_of(files: dict[str, Source], forced: str | None) -> dict[str, str]:
    """Each split file's format: ``forced`` (``--format``), else detected from its first bytes."""
    return {s: forced or detect_bag_format(p) for s, p in files.items() if s in SPLITS}


# --------------------------------------------------------------------------------------------------------------------
# Ray Data batch functions (pure: a frame in, a frame out)


def read_split_file(batch: pd.DataFrame, columns: str | None, require_relation: bool = True
                    ) -> Iterator[pd.DataFrame]:
    """Ray Data ``map_batches`` over rows ``split``, ``path``, ``format``: each file's records as frames of
    :data:`~.files.COLUMNS` plus ``split`` and ``fatal`` (a file that cannot be read at all is one row with its
    problem and ``fatal`` 1). ``require_relation``: False for prediction input (NYT10's lines always have one)."""
    column_map = parse_column_map(columns) if columns else None
    for split, path, fmt in zip(batch["split"], batch["path"], batch["format"], strict=True):
        source: Source = path if storage.is_uri(path) else Path(path)
        try:
            frames = read_nyt10_chunks(source) if fmt == NYT10 \
                else iter([read_bag_table(source, fmt, column_map, require_relation)])
            for frame in frames:
                yield _typed(check_rows(frame).assign(split=split, fatal=0))
        except DataError as err:
            yield _typed(pd.DataFrame([{"file": p.file or str(path), "line": p.line or 0,
                                        "problem": f"{p.field + ': ' if p.field else ''}{p.message}", "split": split,
                                        "fatal": 1} for p in err.problems]))


def _typed(frame: pd.DataFrame) -> pd.DataFrame:
    """``frame`` with every column of a read frame, text as str (Arrow needs one type a column)."""
    out = frame.reindex(columns=[*COLUMNS, "split", "fatal"])
    for c in (*TEXT_COLUMNS, "split"):
        out[c] = out[c].astype(object).fillna("").astype(str)
    out["line"] = pd.to_numeric(out["line"], errors="coerce").fillna(0).astype(np.int64)
    out["fatal"] = out["fatal"].fillna(0).astype(np.int64)
    return out


def keyed_good_rows(batch: pd.DataFrame) -> pd.DataFrame:
    """The rows without a problem, with their bag key (:func:`~.bags.with_bag_keys`)."""
    good = batch[batch["problem"] == ""]
    return with_bag_keys(good.drop(columns=["problem", "fatal"]))


def bags_of_group(group: pd.DataFrame, max_bag_size: int, seed: int, na: str) -> pd.DataFrame:
    """Ray Data ``map_groups`` on the rows of one (split, bag): the bag (:func:`~.bags.build_bags`), its split, its
    sentences as JSON (Arrow keeps no tuples of dicts) and its labels joined by a newline."""
    split = str(group["split"].iloc[0])
    return stored_bags(build_bags(group.drop(columns=["split"]), max_bag_size, seed, na), split)


def stored_bags(bags: pd.DataFrame, split: str) -> pd.DataFrame:
    """A bag frame (:data:`~.bags.BAG_COLUMNS`) as Ray Data and :func:`encode_bags` keep it: with its ``split``,
    its sentences as JSON and its labels joined by a newline."""
    return pd.DataFrame({
        "split": [split] * len(bags), BAG: bags[BAG], "head_id": bags["head_id"], "tail_id": bags["tail_id"],
        "head": bags["head"], "tail": bags["tail"], "labels": ["\n".join(x) for x in bags["labels"]],
        "total": bags["total"].astype(np.int64), "size": bags["size"].astype(np.int64),
        "sentences": [json.dumps(list(s), ensure_ascii=False) for s in bags["sentences"]]})


def in_valid_share(seed: int, key: str, fraction: float) -> bool:
    """Whether the training bag ``key`` is drawn for validation: a 64-bit hash of (seed, key) below ``fraction`` of
    its range (a seeded share of the bags, independent of their order and of how many there are)."""
    digest = hashlib.blake2b(f"valid\x1f{seed}\x1f{key}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") < fraction * 2.0 ** 64


def draw_valid(batch: pd.DataFrame, seed: int, fraction: float) -> pd.DataFrame:
    """Ray Data ``map_batches``: training bags drawn by :func:`in_valid_share` move to ``valid``."""
    out = batch.copy()
    drawn = [s == "train" and in_valid_share(seed, k, fraction) for s, k in zip(out["split"], out[BAG], strict=True)]
    out.loc[np.asarray(drawn, dtype=bool), "split"] = "valid"
    return out


def _sentences_frame(batch: pd.DataFrame) -> tuple[pd.DataFrame, np.ndarray]:
    """The sentences of a batch of bags, one row each (``problem`` ""), and the bag (row of ``batch``) of each."""
    rows, owner = [], []
    for b, text in enumerate(batch["sentences"]):
        for s in json.loads(text):
            rows.append(s)
            owner.append(b)
    frame = pd.DataFrame(rows, columns=["sentence", "head", "head_offset", "tail", "tail_offset", "relation", "file",
                                        "line"])
    return frame.assign(problem=""), np.asarray(owner, dtype=np.int64)


def bag_token_counts(batch: pd.DataFrame, tokenizer: str, lowercase: bool, markers: bool, typed: bool
                     ) -> pd.DataFrame:
    """Ray Data ``map_batches``: the token counts of the training bags' (kept) sentences, as ``token, count``."""
    train = batch[batch["split"] == "train"]
    if not len(train):
        return pd.DataFrame({"token": pd.Series([], dtype=str), "count": pd.Series([], dtype=np.int64)})
    sentences, _ = _sentences_frame(train)
    tokenized = tokenize_batch(sentences, tokenizer, lowercase, markers, typed)
    return token_counts(tokenized[tokenized["problem"] == ""])


def encode_sentences(sentences: pd.DataFrame, vocab: list[str], settings: dict[str, Any]
                     ) -> tuple[np.ndarray, dict[str, np.ndarray], np.ndarray]:
    """Checked sentence rows (``sentence``, ``head``, ``head_offset``, ``tail``, ``tail_offset``, ``problem``)
    encoded as the sentence task encodes rows: with ``settings["subword"]`` (a pretrained tokenizer's files, under
    ``pretrained/``: ``--model bert``) by the subword encoder (:func:`~nre_ray.data.subword.encode_subword_batch`,
    entity markers inserted by offset), else tokenized (``tokenizer``, ``lowercase``, ``markers``, ``typed``) and
    looked up in ``vocab`` (:func:`~nre_ray.data.batches.encode_flat`). Returns which rows were encoded (N,) bool,
    their flat arrays (``tokens``, ``offsets``, ``lengths``, ``head_span``, ``tail_span``: the spans after
    truncation; a subword span starts at its start marker) and their token counts before truncation (the audit's)."""
    if settings.get("subword"):
        encoded = encode_subword_batch(sentences, assets_folder(settings["subword"]), settings["max_length"],
                                       settings["typed"], None)
        ok = (encoded["problem"] == "").to_numpy()
        full = encoded.loc[ok, "full_length"].to_numpy(dtype=np.int64)
        return ok, EncodedSplit.from_frame(encoded[ok], settings["window"]).flat, full
    tokenized = tokenize_batch(sentences, settings["tokenizer"], settings["lowercase"], settings["markers"],
                               settings["typed"])
    ok = (tokenized["problem"] == "").to_numpy()
    kept = tokenized[ok]
    spans = kept[["head_start", "head_end", "tail_start", "tail_end"]].to_numpy(dtype=np.int64).reshape(-1, 4)
    token_lists = [list(t) for t in kept["tokens"]]
    full = np.fromiter(map(len, token_lists), dtype=np.int64, count=len(token_lists))
    return ok, encode_flat(token_lists, spans, vocab, settings["max_length"], settings["window"]), full


def encode_bags(batch: pd.DataFrame, vocab: list[str], labels: list[str], settings: dict[str, Any]
                ) -> pd.DataFrame:
    """Ray Data ``map_batches``: every bag's sentences encoded as the sentence task encodes rows
    (:func:`encode_sentences`; ``settings``: :func:`encode_settings`'), and its label set as label ids. Adds
    ``tokens`` (flat ids), ``lengths``, ``spans`` (flat head start/end, tail start/end after truncation),
    ``full_lengths`` (the kept sentences' token counts before truncation: the audit's), ``label_ids`` and
    ``problem`` (a sentence whose entity covers no token is left out of its bag; a bag left empty, or with a label
    not in ``labels``, gets a problem)."""
    sentences, owner = _sentences_frame(batch)
    ok, flat, full = encode_sentences(sentences, vocab, settings)
    owner_kept = owner[ok]
    index = {name: i for i, name in enumerate(labels)}
    out = batch.drop(columns=["sentences"]).copy()
    tokens, lengths, full_lengths, span_rows, label_ids, problems = [], [], [], [], [], []
    starts = flat["offsets"]
    for b in range(len(batch)):
        mine = np.flatnonzero(owner_kept == b)
        lengths.append(flat["lengths"][mine].astype(np.int64).tolist())
        full_lengths.append(full[mine].tolist())
        tokens.append(np.concatenate([flat["tokens"][starts[i]:starts[i + 1]] for i in mine]).astype(np.int64).tolist()
                      if len(mine) else [])
        span_rows.append(np.concatenate([flat["head_span"][mine], flat["tail_span"][mine]], axis=1).reshape(-1)
                         .astype(np.int64).tolist())
        names = [x for x in str(batch["labels"].iloc[b]).split("\n") if x]
        label_ids.append([index.get(x, -1) for x in names])
        unknown = [x for x in names if x not in index]
        problems.append(f"relation: {unknown[0]!r} is not a relation of the training bags" if unknown
                        else "" if len(mine) else "no sentence of the bag has its entities as tokens")
    out["tokens"], out["lengths"], out["full_lengths"], out["spans"] = tokens, lengths, full_lengths, span_rows
    out["label_ids"], out["problem"] = label_ids, problems
    first = [json.loads(s)[0] if s else {} for s in batch["sentences"]]
    out["first_file"] = [str(f.get("file", "")) for f in first]
    out["first_line"] = np.asarray([int(f.get("line", 0) or 0) for f in first], dtype=np.int64)
    return out


# --------------------------------------------------------------------------------------------------------------------
# the run's data


def encode_settings(cfg: DataConfig, subword: dict[str, bytes] | None = None) -> dict[str, Any]:
    """What :func:`encode_bags` encodes with (``settings``), from the data settings ``cfg`` (a run's, or the ones a
    checkpoint carries); ``subword``: ``--model bert``'s tokenizer files (``{"pretrained/<file>": bytes}``, what a
    checkpoint carries: :func:`nre_ray.run.checkpoint.pretrained_assets`), None for words. The files themselves,
    not a path: Ray Data's tasks and the predictor write them into a local folder once per process
    (:func:`nre_ray.data.subword.assets_folder`)."""
    return {"tokenizer": cfg.tokenizer, "lowercase": cfg.lowercase, "markers": cfg.entity_markers,
            "typed": cfg.typed_markers, "max_length": cfg.max_length, "window": cfg.position_window,
            "subword": subword or None}


def settings_of(cfg: DataConfig, seed: int, pretrained: str | None = None) -> dict[str, Any]:
    """The settings that change the encoded bags (the cache key uses them); ``pretrained`` (``--model bert``) by its
    tokenizer's fingerprint, as the sentence task's cache keys it (:func:`nre_ray.data.subword.fingerprint`)."""
    keep = ("format", "columns", "tokenizer", "lowercase", "min_freq", "max_length", "position_window",
            "valid_fraction", "on_bad_rows", "negative_label", "entity_markers", "typed_markers", "max_bag_size")
    settings = {"task": "bag", "version": CACHE_VERSION, "seed": seed, **{k: getattr(cfg, k) for k in keep}}
    if pretrained:
        settings["pretrained"] = fingerprint(pretrained)
    return settings


def cache_folder(cfg: DataConfig, files: dict[str, Source], seed: int, pretrained: str | None = None) -> Path:
    """The cache folder of these split files and settings (built or not)."""
    return Path(cfg.cache_dir or CACHE_FOLDER).absolute() / cache_key(files, settings_of(cfg, seed, pretrained))


def is_cached(cfg: DataConfig, seed: int, pretrained: str | None = None, shared_cache: str | None = None) -> bool:
    """Whether :func:`prepare_bags` would reuse a cache, local or in ``shared_cache``, and so needs no Ray
    (``python -m nre_ray.data inspect``)."""
    return not cfg.no_cache and shared_cache_rules.is_cached(cache_folder(cfg, find_bag_files(cfg), seed, pretrained),
                                                             shared_cache, _accepts)


def prepare_bags(cfg: DataConfig, seed: int, pretrained: str | None = None,
                 shared_cache: str | None = None) -> Prepared:
    """The encoded bag splits of the run's files (see the module docstring), from the cache when it has them;
    ``pretrained``: ``--model bert``'s model, whose tokenizer encodes the sentences; ``shared_cache``: a folder
    every machine sees (``<storage-path>/.nre_ray_cache``), where the result is fetched from or published to
    (:func:`nre_ray.data.shared_cache.build_or_reuse`)."""
    files = find_bag_files(cfg)
    formats = formats_of(files, cfg.format)
    prepared = shared_cache_rules.build_or_reuse(
        cache_folder(cfg, files, seed, pretrained), shared_cache, _accepts, cfg.no_cache,
        lambda private: build(cfg, files, formats, seed, private, pretrained), load_bags)
    prepared.sources = sources_of(files)
    prepared.assets = {SEED_ASSET: json.dumps({"seed": seed}).encode("utf-8")}
    return prepared


def problem_summary(batch: pd.DataFrame) -> pd.DataFrame:
    """Ray Data ``map_batches``: the batch's first :data:`~nre_ray.data.errors.MAX_SHOWN` bad rows (``file``,
    ``line``, ``problem``, ``fatal``, the row's text, ``split``) and, in ``count``, how many bad rows it has (on its
    first row; a batch is a part of one split's file)."""
    bad = batch[batch["problem"] != ""]
    shown = bad.head(MAX_SHOWN)[["file", "line", "problem", "fatal", "sentence", "head", "tail", "relation",
                                 "split"]].copy()
    shown["count"] = np.zeros(len(shown), dtype=np.int64)
    if len(shown):
        shown.iloc[0, shown.columns.get_loc("count")] = len(bad)
    return shown


def bag_stats(batch: pd.DataFrame, tokenizer: str | None, lowercase: bool, markers: bool, typed: bool
              ) -> pd.DataFrame:
    """Ray Data ``map_batches``: what the vocabulary and the labels need of the training bags, as ``kind``
    (``token`` or ``label``), ``name``, ``count``: their sentences' token counts (:func:`bag_token_counts`; none
    with ``tokenizer`` None: a pretrained tokenizer's vocabulary is its own) and their labels."""
    tokens = bag_token_counts(batch, tokenizer, lowercase, markers, typed) if tokenizer else \
        pd.DataFrame({"token": pd.Series([], dtype=str), "count": pd.Series([], dtype=np.int64)})
    found = sorted({x for text in batch.loc[batch["split"] == "train", "labels"] for x in text.split("\n") if x})
    return pd.DataFrame({"kind": ["token"] * len(tokens) + ["label"] * len(found),
                         "name": [*map(str, tokens["token"]), *found],
                         "count": np.concatenate([tokens["count"].to_numpy(dtype=np.int64),
                                                  np.ones(len(found), dtype=np.int64)])})


def fail_or_skip(problems: pd.DataFrame, count: int, on_bad_rows: str, fatal: bool, hint: str = ROWS_HINT
                 ) -> None:
    """DataError with the first problems (a file that cannot be read always; bad rows unless skipped; ``hint``:
    what to do about bad rows)."""
    if count and (fatal or on_bad_rows != "skip"):
        listed = [Problem(str(r.file), int(r.line) or None, None, str(r.problem)) for r in problems.itertuples()]
        raise DataError(listed, hint="Check the file and its format (--format forces one)." if fatal
                        else hint, total=count)


def _partitions(rows: int) -> int:
    """Partitions of the groupby: about 50,000 sentences each, 1 to 64 (each costs Ray a task)."""
    return max(1, min(64, rows // 50_000 + 1))


SHUFFLE = "sort_shuffle_pull_based"
"""Ray Data's shuffle for the groupby into bags. Ray 2.60's default (``shuffle_v2``) starts aggregator actors: the
bundled bag sample's preprocessing took 72 s with it and 27.5 s with this one, on this 2-core machine under a load
of about 28 (2026-12-04)."""


@contextlib.contextmanager
def shuffle_strategy(name: str) -> Iterator[None]:
    """Ray Data's ``DataContext.shuffle_strategy`` set to ``name`` for the block (the driver's current context)."""
    import ray.data

    context = ray.data.DataContext.get_current()
    before = context.shuffle_strategy
    context.shuffle_strategy = name
    try:
        yield
    finally:
        context.shuffle_strategy = before


def build(cfg: DataConfig, files: dict[str, Source], formats: dict[str, str], seed: int, folder: Path,
          pretrained: str | None = None) -> pd.DataFrame:
    """Build the cache into ``folder`` (steps 2-5 of the module docstring; ``pretrained``: ``--model bert``'s model);
    returns the first rejected rows."""
    quiet_ray_data()
    with shuffle_strategy(SHUFFLE):
        return _build(cfg, files, formats, seed, folder, pretrained)


def _build(cfg: DataConfig, files: dict[str, Source], formats: dict[str, str], seed: int, folder: Path,
           pretrained: str | None) -> pd.DataFrame:
    import ray.data

    na = cfg.negative_label or NA
    items = [{"split": s, "path": str(p), "format": formats[s]} for s, p in files.items() if s in SPLITS]
    read = ray.data.from_items(items, override_num_blocks=len(items)).map_batches(
        read_split_file, fn_kwargs={"columns": cfg.columns}, batch_format="pandas", batch_size=1).materialize()
    summary = pd.DataFrame(read.map_batches(problem_summary, batch_format="pandas").take_all())
    fatal = summary[summary["fatal"] == 1] if len(summary) else summary
    fail_or_skip(fatal, len(fatal), cfg.on_bad_rows, True)
    bad_count = int(summary["count"].sum()) if len(summary) else 0
    bad_rows = {str(k): int(v) for k, v in summary.groupby("split")["count"].sum().items()} if len(summary) else {}
    shown = summary.head(MAX_SHOWN).drop(columns=["fatal", "count", "split"]) if len(summary) \
        else pd.DataFrame(columns=["file", "line", "problem"])
    fail_or_skip(shown, bad_count, cfg.on_bad_rows, False)

    bags = read.map_batches(keyed_good_rows, batch_format="pandas").groupby(
        ["split", BAG], num_partitions=_partitions(read.count())).map_groups(
        bags_of_group, fn_kwargs={"max_bag_size": cfg.max_bag_size, "seed": seed, "na": na}, batch_format="pandas")
    valid_from_train = "valid" not in files
    if valid_from_train:
        bags = bags.map_batches(draw_valid, fn_kwargs={"seed": seed, "fraction": cfg.valid_fraction},
                                batch_format="pandas")
    bags = bags.materialize()
    stats = pd.DataFrame(bags.map_batches(bag_stats, fn_kwargs={
        "tokenizer": None if pretrained else cfg.tokenizer, "lowercase": cfg.lowercase,
        "markers": cfg.entity_markers, "typed": cfg.typed_markers},
        batch_format="pandas").take_all(), columns=["kind", "name", "count"])
    if pretrained:  # the tokenizer's vocabulary, entity markers added (bag sentences carry no entity types)
        vocab, tokenizer_dir, _ = tokenizer_vocab(pretrained, folder / "pretrained", cfg.max_length)
        settings = encode_settings(cfg, pretrained_assets(tokenizer_dir))
    else:
        counts = stats[stats["kind"] == "token"].groupby("name")["count"].sum()
        vocab = Vocab.build({str(t): int(c) for t, c in counts.items()}, cfg.min_freq)
        settings = encode_settings(cfg)
    labels = labels_of(sorted(set(stats.loc[stats["kind"] == "label", "name"])), files, na)
    encoded = bags.map_batches(encode_bags, fn_kwargs={"vocab": vocab.tokens, "labels": labels, "settings": settings},
                               batch_format="pandas")
    writers = {s: BagSplit.Writer(len(labels), cfg.position_window) for s in SPLITS}
    lengths = SentenceLengths()
    rejected, rejected_bags = [], {s: 0 for s in SPLITS}
    for part in encoded.iter_batches(batch_format="pandas", batch_size=4096):
        lengths.add(part)
        for row in part.itertuples(index=False):
            if row.problem:
                rejected.append({"file": row.first_file, "line": int(row.first_line), "problem": row.problem,
                                 "sentence": "", "head": row.head, "tail": row.tail, "relation": row.labels})
                rejected_bags[row.split] += 1
                continue
            writers[row.split].add(row)
    rejected_frame = pd.DataFrame(rejected, columns=["file", "line", "problem", "sentence", "head", "tail",
                                                     "relation"])
    if len(rejected_frame):
        fail_or_skip(rejected_frame.head(MAX_SHOWN), len(rejected_frame), cfg.on_bad_rows, False)
    splits = {s: w.finish(s) for s, w in writers.items() if s in files or (s == "valid" and valid_from_train)}
    if not len(splits["train"]) or not len(splits.get("valid", [])):
        raise DataError([Problem(str(files["train"]), None, None, "too few good bags to train and validate on")],
                        hint="Check the data files, or lower --valid-fraction's share of a small training file.")
    for name, split in splits.items():
        split.save(folder, name)
    vocab.save(folder / "vocab.json")
    (folder / "labels.json").write_text(json.dumps(labels, ensure_ascii=False), encoding="utf-8")
    audit = audit_of(splits, labels, na, lengths, cfg.max_length, cfg.max_bag_size, bad_rows, rejected_bags,
                     valid_from_train)
    (folder / "audit.json").write_text(json.dumps(audit, ensure_ascii=False), encoding="utf-8")
    all_rejected = pd.concat([shown, rejected_frame], ignore_index=True) if bad_count else rejected_frame
    all_rejected.to_csv(folder / "rejected.csv", index=False)
    meta = {"task": "bag", "splits": list(splits), "valid_from_train": valid_from_train,
            "rejected_count": int(bad_count + len(rejected_frame)), "window": cfg.position_window,
            "pretrained_dir": "pretrained" if pretrained else None}
    (folder / MARKER).write_text(json.dumps(meta), encoding="utf-8")
    return all_rejected


def labels_of(found: list[str], files: dict[str, Source], na: str) -> list[str]:
    """The training bags' labels ``found``: ``na`` first, the relations sorted; in ``--labels``' order when given
    (every label of the data must be in it: :func:`~.files.check_label_file`)."""
    data_labels = ([na] if na in found else []) + [x for x in found if x != na]
    if "labels" not in files:
        return data_labels
    path = files["labels"]
    try:
        from_file = read_relation2id(path)
    except DataError:
        from_file = read_labels(path)
    return check_label_file(str(path), from_file, {x: "the training bags" for x in data_labels})


def _accepts(meta: dict[str, Any]) -> bool:
    """A cache folder's ``meta.json`` is a bag cache's."""
    return meta.get("task") == "bag"


def complete(folder: Path) -> bool:
    """Whether ``folder`` is a complete bag cache."""
    return shared_cache_rules.complete(folder, _accepts)


def load_bags(folder: Path) -> Prepared:
    """What :func:`build` wrote into ``folder`` (with ``--model bert`` its tokenizer folder, ``pretrained/``, which
    every checkpoint carries)."""
    meta = json.loads((folder / MARKER).read_text(encoding="utf-8"))
    pretrained_dir = meta.get("pretrained_dir")
    return load_task_cache(folder, MARKER, BagSplit.open, position_window=int(meta["window"]),
                           pretrained_dir=str(folder / pretrained_dir) if pretrained_dir else None)

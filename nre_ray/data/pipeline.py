"""The preprocessing pipeline: files -> validated, tokenized, encoded arrays. Ray Data runs the pure batch functions.

Steps: read each split (``read.read_table``) -> Ray Data ``map_batches``: row checks then tokenization -> bad rows
reported (or set aside with ``--on-bad-rows skip``) -> labels checked against the label list -> a seeded stratified
validation split when there is no validation file -> vocabulary from the training split only (Ray Data groupby) ->
Ray Data ``map_batches``: encoding -> padded arrays. The result is cached under a key made of the input files' content
hashes and the preprocessing settings.
"""

from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import asdict, dataclass, field
from importlib import resources
from pathlib import Path

import numpy as np
import pandas as pd

from nre_ray.config import DataConfig
from nre_ray.data.encode import EncodedSplit, encode_batch, token_counts, tokenize_batch
from nre_ray.data.errors import DataError, Problem
from nre_ray.data.read import check_rows, find_data_files, parse_column_map, read_labels, read_table
from nre_ray.data.vocab import Vocab

log = logging.getLogger(__name__)
SPLITS = ("train", "valid", "test")
CACHE_VERSION = 1


def sample_dir() -> Path:
    """The sample dataset shipped inside the package."""
    return Path(str(resources.files("nre_ray.data") / "sample"))


@dataclass
class Prepared:
    """Encoded splits with everything needed to interpret them."""

    splits: dict[str, EncodedSplit]
    vocab: Vocab
    labels: list[str]
    sources: dict[str, str]
    rejected: pd.DataFrame = field(default_factory=pd.DataFrame)
    cache_hit: bool = False
    valid_from_train: bool = False

    @property
    def num_positions(self) -> int:
        """Size of the position-embedding tables (ids 0..2*window+1)."""
        return int(max(int(s.arrays["head_pos"].max(initial=0)) for s in self.splits.values()) + 1)


def resolve_files(cfg: DataConfig) -> dict[str, Path]:
    """Split name -> file, from ``--data-dir`` (default: the bundled sample) and the explicit ``--train/...``."""
    files: dict[str, Path] = {}
    if cfg.data_dir or not cfg.train:
        files.update(find_data_files(Path(cfg.data_dir) if cfg.data_dir else sample_dir()))
    for key in ("train", "valid", "test", "labels"):
        if getattr(cfg, key):
            files[key] = Path(getattr(cfg, key))
    return files


def settings_of(cfg: DataConfig, seed: int) -> dict:
    """The settings that change the encoded result (the cache key uses them)."""
    keep = ("format", "columns", "tokenizer", "lowercase", "min_freq", "max_length", "position_window",
            "valid_fraction", "on_bad_rows")
    return {"version": CACHE_VERSION, "seed": seed, **{k: asdict(cfg)[k] for k in keep}}


def cache_key(files: dict[str, Path], settings: dict) -> str:
    """sha256 over the files' bytes and the settings."""
    h = hashlib.sha256(json.dumps(settings, sort_keys=True).encode())
    for name in sorted(files):
        h.update(name.encode())
        with open(files[name], "rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 20), b""):
                h.update(chunk)
    return h.hexdigest()[:20]


def prepare(cfg: DataConfig, seed: int) -> Prepared:
    """Read, validate, tokenize, build the vocabulary and encode every split (cached)."""
    files = resolve_files(cfg)
    settings = settings_of(cfg, seed)
    cache = Path(cfg.cache_dir or ".nre_ray_cache").absolute() / cache_key(files, settings)
    if not cfg.no_cache and (cache / "meta.json").exists():
        prepared = load_prepared(cache)
        log.info("preprocessing: reused the cache in %s", cache)
        return prepared
    prepared = _prepare(cfg, files, seed)
    save_prepared(prepared, cache)
    return prepared


def _prepare(cfg: DataConfig, files: dict[str, Path], seed: int) -> Prepared:
    import ray.data

    column_map = parse_column_map(cfg.columns) if cfg.columns else None
    frames = []
    for split in SPLITS:
        if split in files:
            frame = read_table(files[split], cfg.format, column_map)
            frames.append(frame.assign(split=split))
    table = pd.concat(frames, ignore_index=True)
    for optional in ("id", "head_type", "tail_type", "problem"):
        if optional not in table.columns:
            table[optional] = ""
    table = table[["split", "file", "line", "sentence", "head", "head_offset", "tail", "tail_offset", "relation",
                   "id", "head_type", "tail_type", "problem"]].astype({"head_offset": object, "tail_offset": object})

    tokenized = (
        ray.data.from_pandas(table)
        .map_batches(check_rows, batch_format="pandas")
        .map_batches(tokenize_batch, batch_format="pandas",
                     fn_kwargs={"tokenizer": cfg.tokenizer, "lowercase": cfg.lowercase})
        .to_pandas()
    )
    labels = read_labels(files["labels"]) if "labels" in files else None
    tokenized = _check_labels(tokenized, labels)
    bad = tokenized[tokenized["problem"] != ""]
    if len(bad) and cfg.on_bad_rows == "error":
        raise DataError([_problem(r) for r in bad.itertuples()],
                        hint="Fix these rows, or pass --on-bad-rows skip to train on the good rows only.")
    good = tokenized[tokenized["problem"] == ""].copy()
    if labels is None:
        labels = sorted(good.loc[good["split"] == "train", "relation"].unique().tolist())
    valid_from_train = "valid" not in files
    if valid_from_train:
        good = _split_valid(good, cfg.valid_fraction, seed)
    if not (good["split"] == "train").any():
        raise DataError([Problem(str(files["train"]), None, None, "no usable training rows")])

    counts = (
        ray.data.from_pandas(good.loc[good["split"] == "train", ["tokens"]])
        .map_batches(token_counts, batch_format="pandas")
        .groupby("token").sum("count")
        .to_pandas()
    )
    vocab = Vocab.build(dict(zip(counts["token"], counts["sum(count)"], strict=True)), cfg.min_freq)
    encoded = (
        ray.data.from_pandas(good)
        .map_batches(encode_batch, batch_format="pandas",
                     fn_kwargs={"vocab": vocab.tokens, "labels": labels, "max_length": cfg.max_length,
                                "window": cfg.position_window})
        .to_pandas()
    )
    splits = {s: EncodedSplit.from_frame(encoded[encoded["split"] == s]) for s in SPLITS
              if (encoded["split"] == s).any()}
    sources = {k: str(v) for k, v in files.items()}
    rejected = bad[["file", "line", "problem", "sentence", "head", "tail", "relation"]].reset_index(drop=True)
    return Prepared(splits, vocab, labels, sources, rejected=rejected, valid_from_train=valid_from_train)


def _problem(row: object) -> Problem:
    field_name, _, message = row.problem.partition(": ")
    return Problem(str(row.file), int(row.line), field_name if message else None, message or row.problem)


def _check_labels(frame: pd.DataFrame, labels: list[str] | None) -> pd.DataFrame:
    """Mark rows whose relation is not in the label file (or, without one, valid/test labels unseen in train)."""
    ok = frame["problem"] == ""
    known = set(labels) if labels is not None else set(frame.loc[ok & (frame["split"] == "train"), "relation"])
    where = "the label file" if labels is not None else "the training split"
    unknown = ok & ~frame["relation"].isin(known)
    frame = frame.copy()
    frame.loc[unknown, "problem"] = [
        f"relation: label {r!r} is not in {where} (expected one of {len(known)} labels, e.g. "
        f"{', '.join(sorted(known)[:5])})" for r in frame.loc[unknown, "relation"]
    ]
    return frame


def _split_valid(good: pd.DataFrame, fraction: float, seed: int) -> pd.DataFrame:
    """Move a seeded, stratified share of train to valid (classes with fewer than 2 rows stay in train)."""
    rng = np.random.default_rng(seed)
    train_idx = good.index[good["split"] == "train"]
    chosen = []
    for _, rows in good.loc[train_idx].groupby("relation", sort=True):
        if len(rows) < 2:
            continue
        take = max(1, round(len(rows) * fraction))
        chosen.extend(rng.choice(rows.index.to_numpy(), size=min(take, len(rows) - 1), replace=False).tolist())
    good.loc[chosen, "split"] = "valid"
    return good


def save_prepared(prepared: Prepared, folder: Path) -> None:
    """Write the encoded splits, vocabulary, labels and rejected rows to ``folder`` (written last: meta.json)."""
    folder.mkdir(parents=True, exist_ok=True)
    for name, split in prepared.splits.items():
        split.save(folder / f"{name}.npz")
    prepared.vocab.save(folder / "vocab.json")
    (folder / "labels.json").write_text(json.dumps(prepared.labels, ensure_ascii=False), encoding="utf-8")
    prepared.rejected.to_csv(folder / "rejected.csv", index=False)
    meta = {"splits": list(prepared.splits), "sources": prepared.sources,
            "valid_from_train": prepared.valid_from_train}
    (folder / "meta.json").write_text(json.dumps(meta, ensure_ascii=False), encoding="utf-8")


def load_prepared(folder: Path) -> Prepared:
    """Read what :func:`save_prepared` wrote."""
    meta = json.loads((folder / "meta.json").read_text(encoding="utf-8"))
    rejected = pd.read_csv(folder / "rejected.csv", keep_default_na=False) if (folder / "rejected.csv").stat().st_size \
        else pd.DataFrame()
    return Prepared(
        splits={name: EncodedSplit.load(folder / f"{name}.npz") for name in meta["splits"]},
        vocab=Vocab.load(folder / "vocab.json"),
        labels=json.loads((folder / "labels.json").read_text(encoding="utf-8")),
        sources=meta["sources"],
        rejected=rejected,
        cache_hit=True,
        valid_from_train=meta["valid_from_train"],
    )

"""The preprocessing pipeline: files -> validated, tokenized, encoded arrays, streamed through Ray Data.

Nothing holds the whole corpus: the files are read in chunks, and every step runs per block.

1. Ray Data: one reader task per split file streams :func:`~nre_ray.data.read.read_chunks` -> ``map_batches``: row
   checks, tokenization and the audit's per-row numbers. The driver takes the blocks as they come and writes them,
   in file order, as Parquet into a staging folder in this run's private build folder, keeping per row only what
   the later decisions need (line, relation, problem count, a few audit numbers: no text, no tokens).
2. Driver: bad rows (the first :data:`~nre_ray.data.errors.MAX_SHOWN` problems and a count for ``--on-bad-rows
   error``; all of them into ``rejected.csv`` for ``skip``), labels checked against the label list, the seeded
   stratified validation split when there is no validation file (from labels and line numbers only).
3. Ray Data: token counts of the training rows per block -> ``groupby`` -> the vocabulary.
4. Ray Data: encoding per block; the driver copies each encoded block into the padded int32 arrays of its split.

The result (and the audit, see :mod:`nre_ray.data.audit`) is cached under a key made of the input files' content
hashes and the preprocessing settings: built in a private folder and published with one atomic rename, so runs that
start at once on the same inputs never see or touch each other's half-built files (see :func:`prepare`). With
``shared_cache`` (a URI under the run storage) it is also published there and fetched from there by the next job with
the same key, on any machine.

Every input may be a URI (``s3://bucket/data/train.csv``, a ``--data-dir`` ``s3://bucket/data``; see
:mod:`nre_ray.storage`): each read task copies its file to a temporary local file on its node and reads it there
(when every split file is a URI, the read tasks may run on any node); the label file is read on the driver.
Everything reported names the URI.
"""

from __future__ import annotations

import errno
import functools
import hashlib
import json
import logging
import os
import re
import secrets
import shutil
import socket
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from nre_ray import storage
from nre_ray.config import DataConfig
from nre_ray.data import audit as data_audit
from nre_ray.data import subword
from nre_ray.data.batches import EncodedSplit, encode_batch, token_counts_arrow, tokenize_batch
from nre_ray.data.errors import MAX_SHOWN, DataError, Problem
from nre_ray.data.read import (
    CANONICAL,
    Source,
    check_rows,
    find_data_files,
    parse_column_map,
    read_chunks,
    read_labels,
    split_problem,
    storage_problem,
)
from nre_ray.data.vocab import UNK_ID, Vocab

log = logging.getLogger(__name__)
SPLITS = ("train", "valid", "test")
CACHE_VERSION = 3
ROWS_PER_CHUNK = 2_000
"""Records per chunk read from a file (one Ray Data block, more or less)."""
BLOCK_BYTES = 4 << 20
"""Ray Data's target block size for the preprocessing datasets (its default, 128 MiB, would gather chunks)."""
ROWS_PER_FILE = 20_000
"""Rows per staged Parquet file."""
KEPT_REJECTED = 1_000
"""Rejected rows kept in :attr:`Prepared.rejected`; all of them are in ``rejected.csv`` in the cache folder."""
REJECTED_COLUMNS = ["file", "line", "problem", "sentence", "head", "tail", "relation"]
ROWS_HINT = "Fix these rows, or pass --on-bad-rows skip to train on the good rows only."
ENCODED_LISTS = (("tokens", "token_ids"), ("head_pos", "head_pos"), ("tail_pos", "tail_pos"),
                 ("segments", "segments"))
"""(array of :class:`EncodedSplit`, list column of :func:`encode_batch`)."""

STAGED = pa.schema([
    ("split", pa.string()), ("seq", pa.int64()), ("chunk_rows", pa.int64()), ("fatal", pa.string()),
    ("file", pa.string()), ("line", pa.int64()), ("problem", pa.string()),
    ("sentence", pa.string()), ("head", pa.string()), ("tail", pa.string()), ("relation", pa.string()),
    ("tokens", pa.list_(pa.string())),
    ("head_start", pa.int32()), ("head_end", pa.int32()), ("tail_start", pa.int32()), ("tail_end", pa.int32()),
    ("ntok", pa.int32()), ("gap", pa.int32()), ("reach", pa.int32()), ("key", pa.uint64()), ("overlap", pa.bool_()),
    ("head_offset", pa.int64()), ("tail_offset", pa.int64()), ("head_type", pa.string()), ("tail_type", pa.string()),
])
"""A tokenized row as staged: the reader's bookkeeping (split, chunk number and size, a file-level error), the
record, its problem ("" for good rows), tokens and token spans, the audit's numbers, and what subword encoding
(``--model bert``) reads: the checked character offsets and the entity types."""
SCAN_COLUMNS = ("line", "ntok", "gap", "reach", "key", "overlap")


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
    """The first :data:`KEPT_REJECTED` rejected rows (``file, line, problem, sentence, head, tail, relation``)."""
    cache_hit: bool = False
    valid_from_train: bool = False
    audit: dict = field(default_factory=dict)
    """The data audit (:func:`nre_ray.data.audit.build_audit`)."""
    rejected_count: int | None = None
    """How many rows were rejected in all (default: ``len(rejected)``)."""
    rejected_csv: str | None = None
    """A CSV file with every rejected row (``rejected``'s columns), when there were any."""
    cache_dir: str | None = None
    """The cache folder this result was saved to or loaded from."""
    position_window: int = 50
    """``--position-window``: position ids run from 1 to ``2 * position_window + 1``."""
    pretrained_dir: str | None = None
    """``--model bert``: the folder (in the cache folder) with the tokenizer plus entity markers and the model's
    config.json, which every checkpoint carries (:func:`nre_ray.data.subword.build_tokenizer`)."""
    shared_cache_dir: str | None = None
    """``prepare(shared_cache=...)``: the shared folder (URI) this result was fetched from or published to; None when
    there is none, or it could not be used (a warning was logged)."""

    def __post_init__(self) -> None:
        if self.rejected_count is None:
            self.rejected_count = len(self.rejected)

    @property
    def num_positions(self) -> int:
        """Size of the position-embedding tables (ids 0..2*window+1): fixed by the settings, not by the longest
        sentence seen, so that longer sentences at prediction time still fit the tables."""
        return 2 * self.position_window + 2


def resolve_files(cfg: DataConfig) -> dict[str, Source]:
    """Split name -> file, from ``--data-dir`` (default: the bundled sample) and the explicit ``--train/...``: local
    files as :class:`Path`, URIs (``s3://...``) as str."""
    files: dict[str, Source] = {}
    if cfg.data_dir or not cfg.train:
        files.update(find_data_files(cfg.data_dir if cfg.data_dir else sample_dir()))
    for key in ("train", "valid", "test", "labels"):
        value = getattr(cfg, key)
        if value:
            files[key] = value if storage.is_uri(value) else Path(value)
    return files


def settings_of(cfg: DataConfig, seed: int, pretrained: str | None = None) -> dict:
    """The settings that change the encoded result (the cache key uses them). ``pretrained``: the ``--pretrained``
    model whose tokenizer encodes the rows (``--model bert``)."""
    keep = ("format", "columns", "tokenizer", "lowercase", "min_freq", "max_length", "position_window",
            "valid_fraction", "on_bad_rows")
    settings = {"version": CACHE_VERSION, "seed": seed, **{k: asdict(cfg)[k] for k in keep}}
    if pretrained:
        settings.update(pretrained=subword.fingerprint(pretrained), typed_markers=cfg.typed_markers)
    return settings


_REMOTE_KEYS: dict[str, str] = {}
"""cache_key results of inputs with URIs, by settings, names and each file's size and modification time: a remote
file is read once per process (``inspect`` asks :func:`is_cached`, then :func:`prepare`)."""


def cache_key(files: dict[str, Source], settings: dict) -> str:
    """sha256 over the files' bytes and the settings.

    A URI's content is streamed from its store and hashed like a local file's, so the key is the same for the same
    bytes wherever they are (an object store's ETag would spare the read, but pyarrow does not expose it and a
    multipart upload's ETag is not a content hash; the read is one sequential pass, memoised per process)."""
    memo = None
    if any(storage.is_uri(path) for path in files.values()):
        memo = json.dumps([settings, {name: [str(path), storage.stamp(path)] for name, path in files.items()}],
                          sort_keys=True, default=str)
        if memo in _REMOTE_KEYS:
            return _REMOTE_KEYS[memo]
    h = hashlib.sha256(json.dumps(settings, sort_keys=True).encode())
    for name in sorted(files):
        h.update(name.encode())
        path = files[name]
        with (storage.open_input(path) if storage.is_uri(path) else open(path, "rb")) as fh:
            for chunk in iter(lambda fh=fh: fh.read(1 << 20), b""):
                h.update(chunk)
    key = h.hexdigest()[:20]
    if memo is not None:
        _REMOTE_KEYS[memo] = key
    return key


def cache_folder(cfg: DataConfig, seed: int, files: dict[str, Source] | None = None,
                 pretrained: str | None = None) -> Path:
    """The cache folder of these inputs and settings (it holds ``meta.json`` once complete)."""
    files = resolve_files(cfg) if files is None else files
    for path in files.values():
        if storage.is_uri(path):
            try:
                storage.check_file(path)
            except storage.StorageError as err:
                raise storage_problem(err) from None
            continue
        if not path.is_file():
            raise DataError([Problem(str(path), None, None, "is a directory (expected a data file)" if path.is_dir()
                                     else "file not found")],
                            hint="Check the path (it is read relative to the current directory).")
    return Path(cfg.cache_dir or ".nre_ray_cache").absolute() / cache_key(files, settings_of(cfg, seed, pretrained))


MARKER = "meta.json"
"""The file a cache folder gets last: the folder is complete when it is there with this :data:`LAYOUT` (locally and
in a shared cache)."""
LAYOUT = 3
"""``meta.json``'s ``layout``: what a cache folder holds and how its paths are recorded (2: built in a private folder
and published by a rename; the rejected rows and the tokenizer folder recorded relative to the folder; 3: each split
stored without padding as memory-mappable ``<split>.<array>.npy`` files, :meth:`EncodedSplit.save`). A folder with
another layout, or none (written before layouts were recorded), is not a cache: it is rebuilt and replaced."""
PRIVATE_MAX_AGE = 24 * 3600
"""Seconds after which a private build folder whose builder cannot be checked (another machine's) counts as stale."""
_HOST = hashlib.sha256(socket.gethostname().encode()).hexdigest()[:8]
"""This machine, in the names of private build folders (a process id means something on its own machine only)."""
_PRIVATE = re.compile(r"(?P<key>[0-9a-f]+)\.tmp-(?P<pid>[0-9]+)-(?P<token>[0-9a-f]+)-(?P<host>[0-9a-f]{8})")
"""The name of a private build folder: ``<key>.tmp-<pid>-<random>-<host>`` next to the cache folder ``<key>``."""
_PUBLISH_TRIES = 20


def is_cached(cfg: DataConfig, seed: int, pretrained: str | None = None, shared_cache: str | None = None) -> bool:
    """True when :func:`prepare` would reuse a cache, the local one or the shared one (so needs no Ray)."""
    if cfg.no_cache:
        return False
    cache = cache_folder(cfg, seed, pretrained=pretrained)
    if _complete(cache):
        return True
    try:
        return bool(shared_cache) and _shared_complete(storage.join(shared_cache, cache.name))
    except storage.StorageError:
        return False


def prepare(cfg: DataConfig, seed: int, pretrained: str | None = None, shared_cache: str | None = None) -> Prepared:
    """Read, validate, tokenize, build the vocabulary, encode every split and audit the data (cached).

    ``pretrained`` (``--model bert``): encode with that model's fast tokenizer and entity markers instead (see
    :mod:`nre_ray.data.subword`); the vocabulary is then the tokenizer's.

    A second call on the same files and settings reuses the cache and logs so; ``cfg.no_cache`` rebuilds it.

    Safe under concurrency (two terminals, the trials of a sweep, on the same inputs): a run builds in a private
    folder next to the cache folder (``<key>.tmp-<pid>-<random>-<host>/``, its staging files included) and publishes
    it with one atomic rename onto ``<key>/``, so no one ever sees a half-written cache and no builder touches
    another's files. When another run published the same key first, this one drops its copy and loads the published
    one (``--no-cache`` replaces it instead). Private folders of builders that are gone are removed on the way.

    ``shared_cache``: a folder (a URI such as ``s3://bucket/runs/.nre_ray_cache``, or a local path) that jobs on
    other machines see. When ``<shared_cache>/<key>/`` holds a complete cache (its ``meta.json``, published last),
    it is downloaded (into a private folder, then renamed like a build) and used (``cache_hit``); otherwise the
    result is built here and published there, ``meta.json`` last. A shared cache that cannot be read or written is
    logged as a warning and preprocessing goes on without it.

    Raises :class:`DataError` for bad input (with ``--on-bad-rows error``, bad rows too: the first problems and a
    count).
    """
    files = resolve_files(cfg)
    cache = cache_folder(cfg, seed, files, pretrained)
    shared = storage.join(shared_cache, cache.name) if shared_cache else None
    prepared = None if cfg.no_cache else _load_complete(cache)
    if prepared is not None:
        log.info("preprocessing: reused the cache in %s (--no-cache rebuilds it)", cache)
        # built here before: still publish it, so that jobs on other machines find it too
        if shared and _ensure_published(cache, shared):
            prepared.shared_cache_dir = shared
        return prepared
    if shared and not cfg.no_cache and _fetch_shared(shared, cache):
        prepared = _load_complete(cache)
        if prepared is not None:
            prepared.shared_cache_dir = shared
            log.info("preprocessing: reused the shared cache %s (copied to %s; --no-cache rebuilds it)", shared,
                     cache)
            return prepared
    log.info("preprocessing: %s; the result is cached in %s%s",
             "rebuilding (--no-cache)" if cfg.no_cache else "nothing cached yet for these inputs and settings",
             cache, f" and published to {shared}" if shared else "")
    private = _private_folder(cache)
    try:
        built = _prepare(cfg, files, seed, private, pretrained)
        save_prepared(built, private)
        prepared = _install_built(built, private, cache, replace=cfg.no_cache)
    finally:
        shutil.rmtree(private, ignore_errors=True)
    if shared and (_publish_shared if cfg.no_cache else _ensure_published)(cache, shared):
        prepared.shared_cache_dir = shared
    return prepared


def _complete(folder: Path) -> bool:
    """``folder`` holds a complete cache of this :data:`LAYOUT`."""
    try:
        meta = json.loads((folder / MARKER).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(meta, dict) and meta.get("layout") == LAYOUT


def split_files_complete(folder: Path, splits: list[str]) -> bool:
    """``folder`` holds a complete cache of this :data:`LAYOUT` with the files of ``splits`` (what a training worker
    memory-maps: :func:`nre_ray.loop.open_splits`)."""
    return _complete(folder) and all((folder / f).is_file() for s in splits for f in EncodedSplit.files(s))


def _shared_complete(shared: str) -> bool:
    """The shared folder ``shared`` holds a complete cache of this :data:`LAYOUT` (raises StorageError)."""
    marker = storage.join(shared, MARKER)
    if not storage.is_file(marker):
        return False
    try:
        meta = json.loads(storage.read_bytes(marker))
    except ValueError:
        return False
    return isinstance(meta, dict) and meta.get("layout") == LAYOUT


def _load_complete(cache: Path) -> Prepared | None:
    """The complete cache in ``cache``, or None. A folder replaced while it is read (``--no-cache`` in another run
    moves the old one away) is read again."""
    for _ in range(3):
        if not _complete(cache):
            return None
        try:
            return load_prepared(cache)
        except FileNotFoundError:
            continue
    return None


def _private_folder(cache: Path) -> Path:
    """A new private build folder next to ``cache`` (same file system, so it can be renamed onto it), after removing
    the stale ones of builders that are gone."""
    cache.parent.mkdir(parents=True, exist_ok=True)
    _remove_stale(cache.parent)
    while True:
        folder = cache.parent / f"{cache.name}.tmp-{os.getpid()}-{secrets.token_hex(4)}-{_HOST}"
        try:
            folder.mkdir()
        except FileExistsError:
            continue
        return folder


def _remove_stale(root: Path) -> None:
    """Remove the private build folders in ``root`` whose builder is gone: its process no longer runs on this
    machine, or (another machine's) nothing in it changed for :data:`PRIVATE_MAX_AGE` seconds. Never a live
    builder's folder on this machine."""
    try:
        entries = list(root.iterdir())
    except OSError:
        return
    for entry in entries:
        match = _PRIVATE.fullmatch(entry.name)
        if match is None:
            continue
        if match["host"] == _HOST:
            stale = not _process_alive(int(match["pid"]))
        else:
            stale = time.time() - _last_change(entry) > PRIVATE_MAX_AGE
        if stale:
            log.info("preprocessing: removing %s, left by a build that did not finish", entry)
            shutil.rmtree(entry, ignore_errors=True)


def _process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's
        return True
    return True


def _last_change(folder: Path) -> float:
    """The newest modification time of ``folder`` and what it holds, one level down (a build adds files to its
    folder and to ``staging/``)."""
    try:
        times = [folder.stat().st_mtime]
        for child in folder.iterdir():
            times.append(child.lstat().st_mtime)
    except OSError:
        return time.time()  # vanishing or unreadable: not stale
    return max(times)


def _install_built(prepared: Prepared, private: Path, cache: Path, replace: bool) -> Prepared:
    """Publish the complete folder ``private`` (:func:`save_prepared` wrote it) as ``cache`` and return ``prepared``,
    its paths now in ``cache``; or, when another run published a complete cache there first (and not ``replace``),
    the result loaded from it (``private`` is left to the caller)."""
    for _ in range(3):
        if _install(private, cache, replace):
            _relocate(prepared, cache)
            return prepared
        published = _load_complete(cache)
        if published is not None:
            log.info("preprocessing: another run published the same result in %s first; using it", cache)
            published.cache_hit = False
            return published
    raise RuntimeError(f"preprocessing could not publish its result to {cache}: other runs kept replacing it")


def _install(private: Path, cache: Path, replace: bool) -> bool:
    """Rename the complete folder ``private`` onto ``cache`` (atomic: one file system). A folder already there that
    is not a complete cache of this layout (an older layout, or any with ``replace``) is moved aside and removed
    first; a complete one is kept: False."""
    for _ in range(_PUBLISH_TRIES):
        try:
            os.rename(private, cache)
            return True
        except OSError as err:
            if err.errno not in (errno.ENOTEMPTY, errno.EEXIST):
                raise
        if not replace and _complete(cache):
            return False
        _discard(cache)
        replace = False  # replaced once: a complete cache that another run publishes after that is as fresh
    raise RuntimeError(f"preprocessing could not publish its result to {cache}: other runs kept replacing it")


def _discard(folder: Path) -> None:
    """Move ``folder`` out of the way under a private name (one rename: readers see it whole or not at all), then
    remove it."""
    aside = folder.parent / f"{folder.name}.tmp-{os.getpid()}-{secrets.token_hex(4)}-{_HOST}"
    try:
        os.rename(folder, aside)
    except FileNotFoundError:
        return  # another run moved it already
    shutil.rmtree(aside, ignore_errors=True)


def _relocate(prepared: Prepared, folder: Path) -> None:
    """Point the paths of ``prepared`` (saved in a private folder) into ``folder``, where it now is."""
    prepared.cache_dir = str(folder)
    prepared.rejected_csv = str(folder / "rejected.csv") if prepared.rejected_count else None
    if prepared.pretrained_dir:
        prepared.pretrained_dir = str(folder / "pretrained")


def _fetch_shared(shared: str, cache: Path) -> bool:
    """Download the complete shared cache folder ``shared`` into a private folder (``meta.json`` last), then rename
    it onto ``cache`` (unless a complete one got there first); False when there is none, or it cannot be read (a
    warning)."""
    private = None
    try:
        if not _shared_complete(shared):
            return False
        private = _private_folder(cache)
        storage.download(shared, private, last=MARKER)
        if not _complete(private):  # replaced while it was copied: build here
            return False
        _install(private, cache, replace=False)
    except storage.StorageError as err:
        log.warning("preprocessing: cannot read the shared cache (%s); preprocessing here", err)
        return False
    finally:
        if private is not None:
            shutil.rmtree(private, ignore_errors=True)
    return True


def _ensure_published(cache: Path, shared: str) -> bool:
    """``shared`` holds a complete copy of ``cache``: already there, or uploaded now."""
    try:
        if _shared_complete(shared):
            return True
    except storage.StorageError:
        pass  # _publish_shared says what is wrong
    return _publish_shared(cache, shared)


def _publish_shared(cache: Path, shared: str) -> bool:
    """Upload the finished local cache folder to ``shared``, ``meta.json`` last (a rebuild first takes the old
    marker away, so that no one reads a half-replaced copy); False and a warning when it cannot be written."""
    try:
        storage.remove(storage.join(shared, MARKER))
        storage.upload(cache, shared, last=MARKER)
    except storage.StorageError as err:
        log.warning("preprocessing: cannot publish the result to the shared cache (%s); later jobs will "
                    "preprocess again", err)
        return False
    log.info("preprocessing: published to the shared cache %s", shared)
    return True


# --------------------------------------------------------------------------------------------------------------------
# Ray Data batch functions (run in the workers)


def _read_files(specs: pd.DataFrame, fmt: str | None, column_map: dict[str, str] | None,
                rows_per_chunk: int) -> Iterator[pd.DataFrame]:
    """Ray Data UDF: each input row names one split file; yields its records in chunks, numbered by ``seq``.

    A problem with the file itself becomes one row whose ``fatal`` holds the error (errors travel as data, so a bad
    file ends in a clean message rather than a failed Ray task with its traceback)."""
    for split, path in zip(specs["split"], specs["path"], strict=True):
        seq = 0
        try:
            for chunk in read_chunks(path if storage.is_uri(path) else Path(path), fmt, column_map, rows_per_chunk):
                yield chunk.assign(split=split, seq=seq, chunk_rows=len(chunk), fatal="")
                seq += 1
        except DataError as err:
            payload = {"problems": [[p.file, p.line, p.field, p.message] for p in err.problems],
                       "hint": err.hint, "total": err.total}
            row: dict[str, Any] = dict.fromkeys(CANONICAL, "")
            row.update(file=path, line=0, problem="row: the file cannot be read", split=split, seq=seq, chunk_rows=1,
                       fatal=json.dumps(payload, ensure_ascii=False))
            yield pd.DataFrame([row])


def _check_and_tokenize(batch: pd.DataFrame, tokenizer: str, lowercase: bool) -> pa.Table:
    """Ray Data UDF: row checks, tokenization and the audit's per-row numbers, as a :data:`STAGED` table."""
    tokenized = tokenize_batch(check_rows(batch), tokenizer, lowercase)
    stats = data_audit.row_stats(tokenized)
    columns: dict[str, Any] = {}
    for name in STAGED.names:
        if name in stats:
            columns[name] = stats[name]
        elif name == "tokens":
            columns[name] = list(tokenized["tokens"])
        else:
            values = tokenized[name].fillna("") if name in ("head_type", "tail_type") else tokenized[name]
            columns[name] = values.to_numpy() if STAGED.field(name).type != pa.string() else values.astype(str)
    return pa.Table.from_pydict(columns, schema=STAGED)


def _kept(batch: pd.DataFrame, labels: list[str]) -> np.ndarray:
    """Rows that are trained on: no problem and a known label."""
    return ((batch["problem"] == "") & batch["relation"].isin(labels)).to_numpy()


def _staged_files(paths: pd.DataFrame, columns: list[str]) -> Iterator[pd.DataFrame]:
    """The rows of the staged files named in ``paths["path"]`` (only ``columns``)."""
    for path in paths["path"]:
        yield pq.read_table(path, columns=columns).to_pandas()


def _train_token_counts(paths: pd.DataFrame, labels: list[str], moved: np.ndarray) -> Iterator[pa.Table]:
    """Ray Data UDF: token counts of the kept training rows of staged files (rows moved to valid left out), counted
    in Arrow (:func:`~nre_ray.data.batches.token_counts_arrow`: the tokens never become Python objects)."""
    for path in paths["path"]:
        table = pq.read_table(path, columns=["line", "problem", "relation", "tokens"])
        keep = pc.and_(pc.and_(pc.equal(table.column("problem"), ""),
                               pc.is_in(table.column("relation"), value_set=pa.array(labels, pa.string()))),
                       pc.invert(pc.is_in(table.column("line"), value_set=pa.array(moved, pa.int64()))))
        yield token_counts_arrow(table.filter(keep).column("tokens"))


def _encode_files(paths: pd.DataFrame, vocab: list[str], labels: list[str], max_length: int, window: int,
                  moved: np.ndarray) -> Iterator[pa.Table]:
    """Ray Data UDF: encode the kept rows of staged files."""
    columns = ["split", "line", "problem", "relation", "tokens", "head_start", "head_end", "tail_start", "tail_end"]
    for batch in _staged_files(paths, columns):
        yield _encode_block(batch, vocab, labels, max_length, window, moved)


def _encode_block(batch: pd.DataFrame, vocab: list[str], labels: list[str], max_length: int, window: int,
                  moved: np.ndarray) -> pa.Table:
    """Encode the kept rows of a staged block. Lists become Arrow ``list<int32>`` columns; ``split`` is the final
    split (training rows moved to valid say so)."""
    batch = batch[_kept(batch, labels)]
    lines = batch["line"].to_numpy(dtype=np.int64)
    split = np.where((batch["split"] == "train").to_numpy() & np.isin(lines, moved), "valid",
                     batch["split"].to_numpy(dtype=object))
    return _encoded_table(split, lines, encode_batch(batch, vocab, labels, max_length, window))


def _encode_subword_files(paths: pd.DataFrame, tokenizer_dir: str, labels: list[str], max_length: int, typed: bool,
                          window: int, moved: np.ndarray) -> Iterator[pa.Table]:
    """Ray Data UDF, ``--model bert``: :func:`_encode_files` with the pretrained tokenizer and entity markers (the
    tokenizer is loaded once per worker process)."""
    columns = ["split", "line", "problem", "relation", "sentence", "head", "head_offset", "tail", "tail_offset",
               "head_type", "tail_type"]
    for batch in _staged_files(paths, columns):
        yield _encode_subword_block(batch, tokenizer_dir, labels, max_length, typed, window, moved)


def _encode_subword_block(batch: pd.DataFrame, tokenizer_dir: str, labels: list[str], max_length: int, typed: bool,
                          window: int, moved: np.ndarray) -> pa.Table:
    """:func:`_encode_block` with the pretrained tokenizer and entity markers."""
    batch = batch[_kept(batch, labels)]
    lines = batch["line"].to_numpy(dtype=np.int64)
    split = np.where((batch["split"] == "train").to_numpy() & np.isin(lines, moved), "valid",
                     batch["split"].to_numpy(dtype=object))
    encoded = subword.encode_subword_batch(batch, tokenizer_dir, max_length, typed, labels, window)
    lost = (encoded["problem"] != "").to_numpy()
    if lost.any():  # not expected: the row checks passed
        raise ValueError(f"line {lines[lost][0]}: {encoded['problem'].to_numpy()[lost][0]}")
    return _encoded_table(split, lines, encoded)


def _encoded_table(split: np.ndarray, lines: np.ndarray, encoded: pd.DataFrame) -> pa.Table:
    """The encoded rows as Arrow: ``list<int32>`` id/feature columns, span starts and ends, length, label."""
    ints = pa.list_(pa.int32())
    columns = {"split": pa.array(split, pa.string()), "line": pa.array(lines, pa.int64()),
               "label": pa.array(encoded["label"].to_numpy(dtype=np.int64)),
               "length": pa.array(encoded["length"].to_numpy(dtype=np.int32))}
    for _, column in ENCODED_LISTS:
        columns[column] = pa.array(list(encoded[column]), ints)
    for key in ("head_span", "tail_span"):
        spans = np.asarray([list(s) for s in encoded[key]], dtype=np.int32).reshape(-1, 2)
        columns[f"{key}_start"], columns[f"{key}_end"] = pa.array(spans[:, 0]), pa.array(spans[:, 1])
    return pa.table(columns)


# --------------------------------------------------------------------------------------------------------------------
# the driver


class _Stage:
    """Takes pass 1's blocks as they come and writes them to ``folder`` in file order (one file per
    :data:`ROWS_PER_FILE` rows or so, per split); keeps the per-row numbers the later decisions need."""

    def __init__(self, folder: Path, splits: list[str]) -> None:
        self.folder = folder
        self.splits = splits
        self.pending: dict[str, dict[int, list[pa.Table]]] = {s: {} for s in splits}
        self.next_seq = dict.fromkeys(splits, 0)
        self.buffer: dict[str, list[pa.Table]] = {s: [] for s in splits}
        self.files: dict[str, list[Path]] = {s: [] for s in splits}
        self.scan: dict[str, dict[str, list[np.ndarray]]] = {s: {} for s in splits}
        self.relations: dict[str, int] = {}
        self.fatal: dict[str, str] = {}

    def add(self, table: pa.Table) -> None:
        split_column = table.column("split")
        for split in pc.unique(split_column).to_pylist():
            part = table.filter(pc.equal(split_column, split))
            seqs = part.column("seq").to_numpy()
            for seq in np.unique(seqs).tolist():
                self.pending[split].setdefault(seq, []).append(part.filter(pa.array(seqs == seq)))
            self._advance(split)

    def _advance(self, split: str) -> None:
        pending = self.pending[split]
        while self.next_seq[split] in pending:
            pieces = pending[self.next_seq[split]]
            rows = sum(p.num_rows for p in pieces)
            if rows < pieces[0].column("chunk_rows")[0].as_py():
                return
            chunk = pa.concat_tables(pieces)
            chunk = chunk.take(pc.sort_indices(chunk.column("line")))
            del pending[self.next_seq[split]]
            self.next_seq[split] += 1
            self._keep(split, chunk)
            self.buffer[split].append(chunk)
            if sum(t.num_rows for t in self.buffer[split]) >= ROWS_PER_FILE:
                self._flush(split)

    def _keep(self, split: str, chunk: pa.Table) -> None:
        fatal = pc.not_equal(chunk.column("fatal"), "")
        if pc.any(fatal).as_py() and split not in self.fatal:
            self.fatal[split] = chunk.filter(fatal).column("fatal")[0].as_py()
        scan = self.scan[split]
        for name in SCAN_COLUMNS:
            scan.setdefault(name, []).append(chunk.column(name).to_numpy())
        problems = chunk.column("problem").to_pylist()
        scan.setdefault("problems", []).append(np.fromiter((len(split_problem(p)) if p else 0 for p in problems),
                                                           dtype=np.int32, count=len(problems)))
        relation = pc.dictionary_encode(chunk.column("relation").combine_chunks())
        codes = np.asarray([self.relations.setdefault(r, len(self.relations))
                            for r in relation.dictionary.to_pylist()], dtype=np.int32)
        scan.setdefault("relation", []).append(codes[relation.indices.to_numpy(zero_copy_only=False)]
                                               if len(codes) else np.zeros(0, dtype=np.int32))

    def _flush(self, split: str) -> None:
        if not self.buffer[split]:
            return
        path = self.folder / f"{self.splits.index(split)}-{split}-{len(self.files[split]):06d}.parquet"
        pq.write_table(pa.concat_tables(self.buffer[split]), path)
        self.files[split].append(path)
        self.buffer[split] = []

    def finish(self) -> dict[str, dict[str, np.ndarray]]:
        """Write what is left; per split, the kept numbers of every row in file order."""
        for split in self.splits:
            if self.pending[split]:
                raise RuntimeError(f"preprocessing lost rows of the {split} file (chunks {sorted(self.pending[split])} "
                                   "incomplete)")
            self._flush(split)
        return {split: {name: np.concatenate(parts) for name, parts in scan.items()}
                for split, scan in self.scan.items()}


def _driver_node_args() -> dict[str, Any]:
    """Ray remote args that keep tasks on the driver's node when the cluster has more than one (the staging files,
    and local input files, are there); none on a single machine."""
    import ray

    if sum(1 for n in ray.nodes() if n.get("Alive")) <= 1:
        return {}
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    return {"scheduling_strategy": NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=False)}


def _reader_args(files: dict[str, Source], inputs: list[str], on_driver: dict[str, Any]) -> dict[str, Any]:
    """The read tasks' Ray remote args: any node when every split file is in an object store, else the driver's
    (``on_driver``: :func:`_driver_node_args`)."""
    return {} if all(storage.is_uri(files[split]) for split in inputs) else on_driver


class _NoProgressNotice(logging.Filter):
    """Drops Ray Data's notice that its progress bars are off (nre_ray turns them off and prints its own lines)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith("Progress bars disabled")


def quiet_ray_data() -> None:
    """Ray Data's console output: warnings only (no plans or "execution finished" lines), without the progress-bar
    notice. Its log file in the Ray session (``logs/ray-data/``) still gets everything."""
    import ray.data  # noqa: F401 (configures the "ray.data" logger on import)

    for handler in logging.getLogger("ray.data").handlers:
        if isinstance(handler, logging.StreamHandler) and not any(isinstance(f, _NoProgressNotice)
                                                                  for f in handler.filters):
            handler.setLevel(logging.WARNING)
            handler.addFilter(_NoProgressNotice())


def _file_dataset(paths: list[Path]) -> Any:
    """A Ray Dataset of one row per staged file (``path``), one block each."""
    import ray.data

    dataset = ray.data.from_items([{"path": str(p)} for p in paths], override_num_blocks=max(1, len(paths)))
    dataset.context.target_max_block_size = BLOCK_BYTES
    return dataset


def _num_cpus() -> int:
    import ray

    return max(1, int(ray.cluster_resources().get("CPU", 1)))


def _fatal_error(payload: str) -> DataError:
    data = json.loads(payload)
    return DataError([Problem(f, line, fld, msg) for f, line, fld, msg in data["problems"]], hint=data["hint"],
                     total=data.get("total"))


def check_inputs(cfg: DataConfig, files: dict[str, Source] | None = None) -> tuple[dict[str, str] | None,
                                                                                list[str] | None]:
    """The checks that need no Ray, on the driver, at once: the files exist, ``--columns`` parses, the label file
    reads, and the first chunk of every local split file reads (format, header, columns; a split file in an object
    store is not downloaded here: its read task reports the same problems). Returns ``(column map, labels of the
    label file or None)``; raises :class:`DataError`."""
    files = resolve_files(cfg) if files is None else files
    column_map = parse_column_map(cfg.columns) if cfg.columns else None
    label_list = read_labels(files["labels"]) if "labels" in files else None
    for split in SPLITS:
        if split in files and storage.is_uri(files[split]):
            try:
                storage.check_file(files[split])
            except storage.StorageError as err:
                raise storage_problem(err) from None
        elif split in files:
            chunks = read_chunks(files[split], cfg.format, column_map, ROWS_PER_CHUNK)
            try:
                next(chunks, None)
            finally:
                chunks.close()
    return column_map, label_list


def _prepare(cfg: DataConfig, files: dict[str, Source], seed: int, folder: Path,
             pretrained: str | None = None) -> Prepared:
    column_map, label_list = check_inputs(cfg, files)
    inputs = [split for split in SPLITS if split in files]
    staging = folder / "staging"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    try:
        return _prepare_staged(cfg, files, seed, folder, staging, inputs, column_map, label_list, pretrained)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _prepare_staged(cfg: DataConfig, files: dict[str, Source], seed: int, folder: Path, staging: Path,
                    inputs: list[str], column_map: dict[str, str] | None, label_list: list[str] | None,
                    pretrained: str | None = None) -> Prepared:
    import ray.data

    quiet_ray_data()

    on_driver = _driver_node_args()
    read_where = _reader_args(files, inputs, on_driver)

    # 1. read, check, tokenize (Ray Data) -> staged Parquet in file order + per-row numbers (driver)
    specs = [{"split": split, "path": str(files[split])} for split in inputs]
    tokenized = ray.data.from_items(specs, override_num_blocks=len(specs))
    tokenized.context.target_max_block_size = BLOCK_BYTES
    tokenized = (
        tokenized
        .map_batches(_read_files, batch_size=1, batch_format="pandas", num_cpus=0, **read_where,
                     fn_kwargs={"fmt": cfg.format, "column_map": column_map, "rows_per_chunk": ROWS_PER_CHUNK})
        .map_batches(_check_and_tokenize, batch_size=None, batch_format="pandas",
                     fn_kwargs={"tokenizer": cfg.tokenizer, "lowercase": cfg.lowercase})
    )
    stage = _Stage(staging, inputs)
    for table in tokenized.iter_batches(batch_format="pyarrow", batch_size=None):
        stage.add(table)
    rows = stage.finish()
    for split in inputs:
        if split in stage.fatal:
            raise _fatal_error(stage.fatal[split])

    # 2. bad rows, labels, validation split (driver, from the per-row numbers)
    relations = list(stage.relations)
    good = {s: rows[s]["problems"] == 0 for s in inputs}
    if label_list is None:
        train_codes = np.unique(rows["train"]["relation"][good["train"]])
        labels = sorted(relations[c] for c in train_codes.tolist())
        where = "the training split"
    else:
        labels = label_list
        where = "the label file"
    class_of = np.asarray([{name: i for i, name in enumerate(labels)}.get(r, -1) for r in relations] or [-1],
                          dtype=np.int64)
    for split in inputs:
        rows[split]["label"] = class_of[rows[split]["relation"]] if len(rows[split]["relation"]) else \
            np.zeros(0, dtype=np.int64)
    unknown = {s: good[s] & (rows[s]["label"] < 0) for s in inputs}
    kept = {s: good[s] & ~unknown[s] for s in inputs}
    rejected_per_split = {s: int((~kept[s]).sum()) for s in inputs}
    problem_count = sum(int(rows[s]["problems"].sum() + unknown[s].sum()) for s in inputs)
    label_problem = functools.partial(_label_problem, labels=sorted(labels), where=where)
    if problem_count and cfg.on_bad_rows == "error":
        first = _first_problems(stage, rows, unknown, relations, label_problem)
        raise DataError(first, hint=ROWS_HINT, total=problem_count)

    valid_from_train = "valid" not in files
    moved = _split_valid(rows["train"], kept["train"], relations, cfg.valid_fraction, seed) if valid_from_train \
        else np.zeros(0, dtype=np.int64)
    final = _final_rows(rows, kept, moved, inputs)
    if not len(final.get("train", {}).get("line", [])):
        raise DataError([Problem(str(files["train"]), None, None, "no usable training rows")])

    rejected, rejected_csv = pd.DataFrame(columns=REJECTED_COLUMNS), None
    if sum(rejected_per_split.values()):
        rejected, rejected_csv = _write_rejected(stage, labels, label_problem, folder / "rejected.csv")

    if pretrained:  # 3-4 with the pretrained model's tokenizer (--model bert)
        splits, vocab, tokenizer_dir, oov = _encode_subword(cfg, pretrained, folder, stage, inputs, labels, moved,
                                                            final, on_driver)
    else:
        splits, vocab, oov = _encode_words(cfg, stage, inputs, labels, moved, final, on_driver)
        tokenizer_dir = None

    audit = data_audit.build_audit(final, labels, cfg.max_length, rejected=rejected_per_split, oov=oov,
                                   valid_from_train=valid_from_train)
    sources = {k: str(v) for k, v in files.items()}
    return Prepared(splits, vocab, labels, sources, rejected=rejected, valid_from_train=valid_from_train, audit=audit,
                    rejected_count=sum(rejected_per_split.values()), rejected_csv=rejected_csv,
                    cache_dir=str(folder), pretrained_dir=tokenizer_dir, position_window=cfg.position_window)


def _encode_words(cfg: DataConfig, stage: _Stage, inputs: list[str], labels: list[str], moved: np.ndarray,
                  final: dict[str, dict[str, np.ndarray]], on_driver: dict[str, Any]) -> tuple:
    """Steps 3-4 for the encoders trained from scratch: vocabulary, then word ids. Returns (splits, vocab, oov)."""
    # 3. vocabulary (Ray Data groupby over the training rows' token counts)
    counts = (
        _file_dataset(stage.files["train"])
        .map_batches(_train_token_counts, batch_size=1, batch_format="pandas", **on_driver,
                     fn_kwargs={"labels": labels, "moved": moved})
        .groupby("token", num_partitions=min(_num_cpus(), 8)).sum("count")
        .to_pandas()
    )
    vocab = Vocab.build(dict(zip(counts["token"], counts["sum(count)"], strict=True)), cfg.min_freq)

    # 4. encoding (Ray Data) into the padded arrays of each split (driver)
    encoded = (
        _file_dataset([p for s in inputs for p in stage.files[s]])
        .map_batches(_encode_files, batch_size=1, batch_format="pandas", **on_driver,
                     fn_kwargs={"vocab": vocab.tokens, "labels": labels, "max_length": cfg.max_length,
                                "window": cfg.position_window, "moved": moved})
    )
    splits, oov = _assemble(encoded, final)
    return splits, vocab, oov


def _encode_subword(cfg: DataConfig, pretrained: str, folder: Path, stage: _Stage, inputs: list[str],
                    labels: list[str], moved: np.ndarray, final: dict[str, dict[str, np.ndarray]],
                    on_driver: dict[str, Any]) -> tuple:
    """Steps 3-4 for ``--model bert``: the tokenizer with the entity markers (the training rows' entity types with
    ``--typed-markers``) saved once into ``folder/pretrained``, then subword ids (Ray Data; the tokenizer is loaded once
    per worker). Returns (splits, vocab, tokenizer folder, oov)."""
    head_types: list[str] = []
    tail_types: list[str] = []
    if cfg.typed_markers:
        staged = pq.read_table([str(p) for p in stage.files["train"]], columns=["problem", "head_type", "tail_type"])
        types = subword.entity_types(staged.filter(pc.equal(staged.column("problem"), "")).to_pandas())
        head_types, tail_types = types
    tokenizer_dir = folder / "pretrained"
    shutil.rmtree(tokenizer_dir, ignore_errors=True)
    subword.build_tokenizer(pretrained, tokenizer_dir, subword.marker_vocabulary(head_types, tail_types),
                            cfg.max_length)
    tok = subword.MarkerTokenizer.load(tokenizer_dir)
    vocab = Vocab(tok.vocabulary(), subword=True)
    encoded = (
        _file_dataset([p for s in inputs for p in stage.files[s]])
        .map_batches(_encode_subword_files, batch_size=1, batch_format="pandas", **on_driver,
                     fn_kwargs={"tokenizer_dir": str(tokenizer_dir), "labels": labels, "max_length": cfg.max_length,
                                "typed": cfg.typed_markers, "window": cfg.position_window, "moved": moved})
    )
    unk = tok.tokenizer.unk_token_id
    splits, oov = _assemble(encoded, final, unk_id=-1 if unk is None else unk)
    return splits, vocab, str(tokenizer_dir), oov


def _label_problem(relation: str, labels: list[str], where: str) -> str:
    """The problem of a row whose relation is not among the (sorted) labels."""
    return (f"relation: label {relation!r} is not in {where} (expected one of {len(labels)} labels, e.g. "
            f"{', '.join(labels[:5])})")


def _first_problems(stage: _Stage, rows: dict[str, dict[str, np.ndarray]], unknown: dict[str, np.ndarray],
                    relations: list[str], label_problem: Callable[[str], str]) -> list[Problem]:
    """The first :data:`MAX_SHOWN` problems in file order (split by split)."""
    wanted: dict[str, np.ndarray] = {}
    left = MAX_SHOWN
    for split in stage.splits:
        if left <= 0:
            break
        counts = rows[split]["problems"] + unknown[split]
        bad = np.flatnonzero(counts > 0)
        take = bad[: int(np.searchsorted(np.cumsum(counts[bad]), left)) + 1]
        wanted[split] = rows[split]["line"][take]
        left -= int(counts[take].sum())
    problems: list[Problem] = []
    for split, lines in wanted.items():
        found = []
        for path in stage.files[split]:
            table = pq.read_table(path, columns=["file", "line", "problem", "relation"],
                                  filters=[("line", "in", lines.tolist())]) if len(lines) else None
            if table is not None and table.num_rows:
                found.append(table.to_pandas())
        for row in (pd.concat(found).sort_values("line").itertuples() if found else []):
            text = row.problem or label_problem(row.relation)
            problems.extend(Problem(str(row.file), int(row.line), f, m) for f, m in split_problem(text))
    return problems[:MAX_SHOWN]


def _split_valid(train: dict[str, np.ndarray], kept: np.ndarray, relations: list[str], fraction: float,
                 seed: int) -> np.ndarray:
    """Lines of the training rows that move to valid: a seeded, stratified share per class (classes with fewer than
    2 rows stay in train). Classes in sorted order, rows in file order: the same draw for the same data."""
    rng = np.random.default_rng(seed)
    lines, codes = train["line"][kept], train["relation"][kept]
    chosen = []
    for _, code in sorted((relations[c], c) for c in np.unique(codes).tolist()):
        group = lines[codes == code]
        if len(group) < 2:
            continue
        take = max(1, round(len(group) * fraction))
        chosen.append(rng.choice(group, size=min(take, len(group) - 1), replace=False))
    return np.sort(np.concatenate(chosen)) if chosen else np.zeros(0, dtype=np.int64)


def _final_rows(rows: dict[str, dict[str, np.ndarray]], kept: dict[str, np.ndarray], moved: np.ndarray,
                inputs: list[str]) -> dict[str, dict[str, np.ndarray]]:
    """Per final split, the numbers of the rows trained on, in file order (moved training rows form valid)."""
    columns = ("line", "label", "ntok", "gap", "reach", "key", "overlap")
    final: dict[str, dict[str, np.ndarray]] = {}
    for split in inputs:
        take = kept[split]
        if split == "train" and len(moved):
            to_valid = take & np.isin(rows[split]["line"], moved)
            final["valid"] = {c: rows[split][c][to_valid] for c in columns}
            take = take & ~to_valid
        final[split] = {c: rows[split][c][take] for c in columns}
    return {s: final[s] for s in SPLITS if s in final and len(final[s]["line"])}


def _assemble(encoded: Any, final: dict[str, dict[str, np.ndarray]], unk_id: int = UNK_ID
              ) -> tuple[dict[str, EncodedSplit], dict[str, tuple[int, int]]]:
    """Copy the encoded blocks into each split's flat arrays (no padding), row ``i`` = the ``i``-th kept line of the
    split. ``unk_id``: the id that counts as out of vocabulary.

    Blocks come in any order: the per-row arrays are filled first (which gives the offsets), then each block's
    values are scattered to their rows' places in the flat arrays."""
    rows: dict[str, dict[str, np.ndarray]] = {}
    for split, info in final.items():
        n = len(info["line"])
        rows[split] = {"lengths": np.zeros(n, dtype=np.int32), "labels": np.zeros(n, dtype=np.int64),
                       "head_span": np.zeros((n, 2), dtype=np.int32), "tail_span": np.zeros((n, 2), dtype=np.int32)}
    parts: dict[str, list[tuple[np.ndarray, dict[str, tuple[np.ndarray, np.ndarray]]]]] = {s: [] for s in final}
    filled = dict.fromkeys(final, 0)
    oov = {split: [0, 0] for split in final}
    for table in encoded.iter_batches(batch_format="pyarrow", batch_size=None):
        table = table.combine_chunks()
        split_column = table.column("split")
        for split in pc.unique(split_column).to_pylist():
            part = table.filter(pc.equal(split_column, split))
            dest = np.searchsorted(final[split]["line"], part.column("line").to_numpy())
            out = rows[split]
            out["lengths"][dest] = part.column("length").to_numpy()
            out["labels"][dest] = part.column("label").to_numpy()
            for key in ("head_span", "tail_span"):
                out[key][dest, 0] = part.column(f"{key}_start").to_numpy()
                out[key][dest, 1] = part.column(f"{key}_end").to_numpy()
            lists = {}
            for key, column in ENCODED_LISTS:
                values = part.column(column).combine_chunks()
                lengths = pc.list_value_length(values).to_numpy(zero_copy_only=False).astype(np.int64)
                flat = pc.list_flatten(values).to_numpy(zero_copy_only=False).astype(np.int32, copy=False)
                lists[key] = (lengths, flat)
                if key == "tokens":
                    oov[split][0] += int((flat == unk_id).sum())
                    oov[split][1] += len(flat)
            parts[split].append((dest, lists))
            filled[split] += part.num_rows
    for split, info in final.items():
        if filled[split] != len(info["line"]):
            raise RuntimeError(f"preprocessing encoded {filled[split]} of the {len(info['line'])} {split} rows")
    splits = {}
    for split, out in rows.items():
        offsets = np.zeros(len(out["lengths"]) + 1, dtype=np.int64)
        np.cumsum(out["lengths"], out=offsets[1:])
        flat = {key: np.zeros(int(offsets[-1]), dtype=np.int32) for key, _ in ENCODED_LISTS}
        for dest, lists in parts[split]:
            for key, (lengths, values) in lists.items():
                if not np.array_equal(lengths, out["lengths"][dest]):
                    raise RuntimeError(f"preprocessing: {key} does not have one value per token in {split}")
                starts = np.repeat(np.cumsum(lengths) - lengths, lengths)  # each value's row start in the block
                flat[key][np.repeat(offsets[dest], lengths) + np.arange(len(values)) - starts] = values
        splits[split] = EncodedSplit({**flat, "offsets": offsets, **out}, split)
    return splits, {s: (u, t) for s, (u, t) in oov.items()}


def _write_rejected(stage: _Stage, labels: list[str], label_problem: Callable[[str], str],
                    path: Path) -> tuple[pd.DataFrame, str]:
    """Write every rejected row (with its problem) to ``path`` in file order; returns the first
    :data:`KEPT_REJECTED` rows and the path."""
    known = pa.array(labels, pa.string())
    kept: list[pd.DataFrame] = []
    header = True
    for split in stage.splits:
        for staged in stage.files[split]:
            table = pq.read_table(staged, columns=REJECTED_COLUMNS)
            good = pc.equal(table.column("problem"), "")
            rejected = pc.invert(pc.and_(good, pc.is_in(table.column("relation"), value_set=known)))
            frame = table.filter(rejected).to_pandas()
            if frame.empty:
                continue
            unknown = frame["problem"] == ""
            frame.loc[unknown, "problem"] = [label_problem(r) for r in frame.loc[unknown, "relation"]]
            frame.to_csv(path, mode="w" if header else "a", header=header, index=False)
            header = False
            if sum(map(len, kept)) < KEPT_REJECTED:
                kept.append(frame)
    first = pd.concat(kept, ignore_index=True).head(KEPT_REJECTED) if kept else pd.DataFrame(columns=REJECTED_COLUMNS)
    return first, str(path)


# --------------------------------------------------------------------------------------------------------------------
# the cache


def save_prepared(prepared: Prepared, folder: Path) -> None:
    """Write the encoded splits, vocabulary, labels, audit and rejected rows to ``folder`` (written last:
    meta.json, with :data:`LAYOUT`). ``folder`` must be one no one else reads or writes yet: :func:`prepare` writes
    into a private folder and renames it. Paths inside the folder are recorded relative to it, so the folder may be
    renamed or copied as a whole (:func:`load_prepared` resolves them where it finds it)."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / MARKER).unlink(missing_ok=True)
    for name, split in prepared.splits.items():
        split.save(folder, name)
    prepared.vocab.save(folder / "vocab.json")
    (folder / "labels.json").write_text(json.dumps(prepared.labels, ensure_ascii=False), encoding="utf-8")
    (folder / "audit.json").write_text(json.dumps(prepared.audit, ensure_ascii=False), encoding="utf-8")
    rejected = folder / "rejected.csv"
    if prepared.rejected_csv is None:
        prepared.rejected.to_csv(rejected, index=False)
    elif Path(prepared.rejected_csv).resolve() != rejected.resolve():
        shutil.copyfile(prepared.rejected_csv, rejected)  # every rejected row, not only the first ones kept
    if prepared.pretrained_dir and Path(prepared.pretrained_dir).resolve() != (folder / "pretrained").resolve():
        shutil.rmtree(folder / "pretrained", ignore_errors=True)
        shutil.copytree(prepared.pretrained_dir, folder / "pretrained")
    meta = {"layout": LAYOUT, "splits": list(prepared.splits), "sources": prepared.sources,
            "valid_from_train": prepared.valid_from_train, "rejected_count": prepared.rejected_count,
            "rejected_csv": "rejected.csv" if prepared.rejected_count else None,
            "pretrained_dir": "pretrained" if prepared.pretrained_dir else None,
            "pretrained": bool(prepared.pretrained_dir), "position_window": prepared.position_window}
    (folder / MARKER).write_text(json.dumps(meta, ensure_ascii=False), encoding="utf-8")
    _relocate(prepared, folder)


def load_prepared(folder: Path) -> Prepared:
    """Read what :func:`save_prepared` wrote (paths in the result point into ``folder``)."""
    meta = json.loads((folder / MARKER).read_text(encoding="utf-8"))
    rejected_path = folder / "rejected.csv"
    rejected = pd.read_csv(rejected_path, keep_default_na=False, nrows=KEPT_REJECTED) \
        if rejected_path.stat().st_size else pd.DataFrame(columns=REJECTED_COLUMNS)
    count = meta.get("rejected_count", len(rejected))
    rejected_csv = meta.get("rejected_csv", "rejected.csv" if count else None)
    pretrained_dir = meta.get("pretrained_dir", "pretrained" if meta.get("pretrained") else None)
    return Prepared(
        splits={name: EncodedSplit.open(folder, name) for name in meta["splits"]},  # memory-mapped
        vocab=Vocab.load(folder / "vocab.json"),
        labels=json.loads((folder / "labels.json").read_text(encoding="utf-8")),
        sources=meta["sources"],
        rejected=rejected,
        cache_hit=True,
        valid_from_train=meta["valid_from_train"],
        audit=json.loads((folder / "audit.json").read_text(encoding="utf-8")),
        rejected_count=count,
        rejected_csv=str(folder / rejected_csv) if rejected_csv else None,
        cache_dir=str(folder),
        pretrained_dir=str(folder / pretrained_dir) if pretrained_dir else None,
        position_window=meta["position_window"],
    )

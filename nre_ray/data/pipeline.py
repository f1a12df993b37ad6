"""The preprocessing pipeline: files -> validated, tokenized, encoded arrays, built by Ray tasks that write files.

Nothing holds the whole corpus, and the data never passes through the driver: it takes small summaries and makes the
decisions that need the whole picture. The Ray work is in :mod:`nre_ray.data.stages`; the files go to ``work/`` in
this run's private build folder (on a cluster whose storage path is in an object store, a folder there, so that the
tasks may run on any node: see :func:`prepare`).

1. Ray Data: one reader task per split file streams :func:`~nre_ray.data.read.read_chunks` -> ``map_batches``: row
   checks, tokenization and the audit's per-row numbers, each block written as Parquet by the task that made it.
   The driver gets a summary per block: problem counts and the first problems, and the good rows per relation.
2. Driver: bad rows (the first :data:`~nre_ray.data.errors.MAX_SHOWN` problems and a count for ``--on-bad-rows
   error``), labels checked against the label list, the seeded stratified validation split when there is no
   validation file (from the counts per class: the tasks find the drawn rows by their rank in their class).
3. Ray Data: token counts of the training rows per task, added up by the driver -> the vocabulary (or the pretrained
   tokenizer with entity markers, ``--model bert``); then encoding per block, each task writing its rows' flat
   arrays (no padding) and its rejected rows.
4. Ray tasks, one per split: the blocks concatenated in file order into the split's ``.npy`` files
   (:class:`~nre_ray.data.batches.EncodedSplit`), audited on the way.

The result (and the audit, see :mod:`nre_ray.data.audit`) is cached under a key made of the preprocessing settings and
what identifies each input's content (a local file's bytes, an object's version in its store: :func:`cache_key`):
built in a private folder and published with one atomic rename (:mod:`nre_ray.core.buildonce`), so runs that start at
once on the same inputs never see or touch each other's half-built files (see :func:`prepare`). With
``shared_cache`` (a URI under the run storage) it is also published there and fetched from there by the next job with
the same key, on any machine.

Every input may be a URI (``s3://bucket/data/train.csv``, a ``--data-dir`` ``s3://bucket/data``; see
:mod:`nre_ray.storage`): each read task copies its file to a temporary local file on its node and reads it there
(when every split file is a URI, the read tasks may run on any node); the label file is read on the driver.
Everything reported names the URI.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import os
import shutil
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from nre_ray import storage
from nre_ray.cluster.session import alive_nodes
from nre_ray.config import ConfigError, DataConfig
from nre_ray.core import buildonce, console
from nre_ray.data import audit as data_audit
from nre_ray.data import shared_cache as shared_cache_rules
from nre_ray.data import stages, subword
from nre_ray.data.batches import EncodedSplit
from nre_ray.data.errors import MAX_SHOWN, DataError, Problem
from nre_ray.data.read import (
    Source,
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
"""Records per chunk read from a file (a few chunks make a Ray Data block)."""
BLOCK_BYTES = 16 << 20
"""Ray Data's target block size for the preprocessing datasets: the raw records a tokenizing task gets (~50,000
FewRel rows). Each task costs Ray ~0.15 s beyond its work, so 4 MiB blocks spent ~15% of pass 1 on that (measured at
1M rows: 73 tasks, 23.9 s; 21 tasks, 21.0 s); Ray Data's default, 128 MiB, would leave a core idle on small inputs."""
KEPT_REJECTED = 1_000
"""Rejected rows kept in :attr:`Prepared.rejected`; all of them are in ``rejected.csv`` in the cache folder."""
REJECTED_COLUMNS = stages.REJECTED_COLUMNS
ROWS_HINT = "Fix these rows, or pass --on-bad-rows skip to train on the good rows only."


CACHE_FOLDER = ".nre_ray_cache"
"""The cache's folder name: in the working directory, under a storage path."""
DEFAULT_STORAGE = "ray_results"
"""``--storage-path`` when none is given (train, tune; data inspect reads the cache of that path)."""


def cache_places(cache_dir: str | None, storage_path: str | None,
                 allow_local_storage: bool = False) -> tuple[str, str | None]:
    """Where every command that preprocesses (train, tune, ``data inspect``) caches, from its ``--cache-dir``,
    ``--storage-path`` and ``--allow-local-storage``: ``(local folder, shared folder or None)``.

    * The shared cache is ``<storage-path>/.nre_ray_cache`` when the storage path is a URI (``s3://...``): jobs on
      any machine find what another built. The local folder is then a private copy in the temporary folder, out of a
      job's working directory.
    * With ``--allow-local-storage`` (a storage path mounted on every node), the local folder is
      ``<storage-path>/.nre_ray_cache`` itself.
    * Otherwise ``./.nre_ray_cache``. ``--cache-dir`` replaces the local folder in every case.
    """
    import tempfile

    where = storage.absolute(storage_path or DEFAULT_STORAGE)
    shared = storage.join(where, CACHE_FOLDER) if storage.is_uri(where) else None
    if cache_dir:
        local = cache_dir
    elif shared:
        local = str(Path(tempfile.gettempdir()) / f"nre_ray-{os.getuid()}" / "cache")
    elif allow_local_storage:
        local = str(Path(where) / CACHE_FOLDER)
    else:
        local = CACHE_FOLDER
    return str(Path(local).absolute()), shared


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
    """Split name (and ``labels``) -> the input file: :func:`prepare` gives this run's own files, never those of the
    run that built the cache it reused; :func:`load_prepared` those that built the folder."""
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
    assets: dict[str, bytes] = field(default_factory=dict)
    """More files every checkpoint carries (``{relative path: bytes}``): what the task needs of the training data to
    encode examples as training did (the document task's ``task/context.json``; :mod:`nre_ray.run.checkpoint`)."""
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



def load_task_cache(folder: Path, marker: str, open_split: Any, **extra: Any) -> Prepared:
    """A task's cache folder (its ``marker`` JSON with ``splits``, ``valid_from_train`` and ``rejected_count``;
    ``vocab.json``, ``labels.json``, ``audit.json``, ``rejected.csv``) as :class:`Prepared`, each split opened with
    ``open_split(folder, name)``; ``extra``: the task's own fields (``position_window``, ``assets``)."""
    import pandas as pd

    meta = json.loads((folder / marker).read_text(encoding="utf-8"))
    rejected = folder / "rejected.csv"
    return Prepared(
        splits={name: open_split(folder, name) for name in meta["splits"]},
        vocab=Vocab.load(folder / "vocab.json"),
        labels=json.loads((folder / "labels.json").read_text(encoding="utf-8")),
        sources={}, rejected=pd.read_csv(rejected, keep_default_na=False) if rejected.stat().st_size > 1
        else pd.DataFrame(), cache_hit=True, valid_from_train=meta["valid_from_train"],
        audit=json.loads((folder / "audit.json").read_text(encoding="utf-8")), rejected_count=meta["rejected_count"],
        rejected_csv=str(rejected) if meta["rejected_count"] else None, cache_dir=str(folder), **extra)

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
    elif cfg.entity_markers:
        settings.update(entity_markers=True, typed_markers=cfg.typed_markers)
    return settings


def cache_key(files: dict[str, Source], settings: dict) -> str:
    """The cache key of these inputs and settings: sha256 over the settings and, per input file, what identifies its
    content.

    * A local file: its bytes (the driver reads local inputs anyway; the same bytes in another folder give the same
      key, and a changed byte another one).
    * A file in an object store: its URI and its version from the store's metadata
      (:func:`nre_ray.storage.object_version`: the ETag and size; no byte of it passes through the driver). The
      same bytes under another URI, or uploaded again, may get another key: they are preprocessed once more.

    What a run records as its inputs never comes from the cache (see :func:`prepare`)."""
    h = hashlib.sha256(json.dumps(settings, sort_keys=True).encode())
    for name in sorted(files):
        h.update(name.encode())
        path = files[name]
        if storage.is_uri(path):
            h.update(json.dumps([str(path), storage.object_version(str(path))]).encode())
            continue
        with open(path, "rb") as fh:
            for chunk in iter(lambda fh=fh: fh.read(1 << 20), b""):
                h.update(chunk)
    return h.hexdigest()[:20]


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
    return Path(cfg.cache_dir or CACHE_FOLDER).absolute() / cache_key(files, settings_of(cfg, seed, pretrained))


MARKER = shared_cache_rules.MARKER
"""The file a cache folder gets last: the folder is complete when it is there with this :data:`LAYOUT` (locally and
in a shared cache)."""
LAYOUT = 4
"""``meta.json``'s ``layout``: what a cache folder holds and how its paths are recorded (2: built in a private folder
and published by a rename; the rejected rows and the tokenizer folder recorded relative to the folder; 3: each split
stored without padding as memory-mappable ``<split>.<array>.npy`` files, :meth:`EncodedSplit.save`; 4: token ids and
per-row arrays only, positions and segments computed per batch from the spans, ``<split>.json`` with the position
window). A folder with another layout, or none (written before layouts were recorded), is not a cache: it is rebuilt
and replaced."""


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


def prepare(cfg: DataConfig, seed: int, pretrained: str | None = None, shared_cache: str | None = None,
            on_every_node: bool = False, multi_node: bool | None = None) -> Prepared:
    """Read, validate, tokenize, build the vocabulary, encode every split and audit the data (cached).

    ``pretrained`` (``--model bert``): encode with that model's fast tokenizer and entity markers instead (see
    :mod:`nre_ray.data.subword`); the vocabulary is then the tokenizer's.

    A second call on the same files and settings reuses the cache and logs so; ``cfg.no_cache`` rebuilds it. The
    result's :attr:`Prepared.sources` are this call's input files (``cfg``'s), whatever run built the cache: the
    cache holds content, and the same content may have been built from files elsewhere.

    Safe under concurrency (two terminals on the same inputs), by the protocol of :mod:`nre_ray.core.buildonce`: a run
    builds in a private folder next to the cache folder (``<key>.tmp-<pid>-<random>-<host>/``, its work files
    included) and publishes it with one atomic rename onto ``<key>/``, so no one ever sees a half-written cache and
    no builder touches another's files. Runs on one machine take turns: the second one waits for the first one's
    result and uses it. Runs on several machines that share a cache folder may build at once: when another run
    published the same key first, this one drops its copy and loads the published one (``--no-cache`` replaces it
    instead). Private folders of builders that are gone are removed on the way.

    ``shared_cache``: a folder (a URI such as ``s3://bucket/runs/.nre_ray_cache``, or a local path) that jobs on
    other machines see. When ``<shared_cache>/<key>/`` holds a complete cache (its ``meta.json``, published last),
    it is downloaded (into a private folder, then renamed like a build) and used (``cache_hit``); otherwise the
    result is built here and published there, ``meta.json`` last. A shared cache that cannot be read or written is
    logged as a warning and preprocessing goes on without it.

    Where the Ray tasks run, on a cluster of several nodes (``multi_node``: several nodes now, or an autoscaler
    that can add some; default: several alive nodes):

    * ``shared_cache`` in an object store (``s3://...``): the tasks that tokenize, count, encode and assemble run on
      any node. Their work files go to a private build folder in the store, ``<shared_cache>/<key>.tmp-.../``
      (removed at the end), and the splits' files straight to ``<shared_cache>/<key>/``; the driver's node only
      downloads the finished splits into the local cache. Neither the driver's CPUs nor its disk do the work.
    * ``on_every_node``: the cache folder is mounted at the same path on every node (``--allow-local-storage`` with
      the cache under the storage path): the tasks run on any node, writing into the build folder there.
    * Otherwise they run on the driver's node, where the build folder is.

    Tasks that read local input files always run on the driver's node.

    Raises :class:`DataError` for bad input (with ``--on-bad-rows error``, bad rows too: the first problems and a
    count).
    """
    files = resolve_files(cfg)
    cache = cache_folder(cfg, seed, files, pretrained)
    shared = storage.join(shared_cache, cache.name) if shared_cache else None
    prepared = _cached_or_built(cfg, files, seed, cache, pretrained, _Where(on_every_node, multi_node, shared_cache,
                                                                            shared))
    prepared.sources = sources_of(files)
    return prepared


def sources_of(files: dict[str, Source]) -> dict[str, str]:
    """Split name -> the input file as a run names it: a URI as it is, a local path made absolute."""
    return {name: storage.absolute(path) for name, path in files.items()}


def _cached_or_built(cfg: DataConfig, files: dict[str, Source], seed: int, cache: Path, pretrained: str | None,
                     place: _Where) -> Prepared:
    """The result from the local cache folder ``cache``, else from the shared cache (``place.shared``), else built
    (and published to both); see :func:`prepare`."""
    shared = place.shared
    if not cfg.no_cache:
        reused = _reuse(cache, shared, "reused the cache in %s (--no-cache rebuilds it)")
        if reused is not None:
            return reused

    def waiting() -> None:
        log.info("preprocess: another run on this machine is building the same result in %s; waiting for it", cache)

    with buildonce.turn(cache, waiting):
        if not cfg.no_cache:
            reused = _reuse(cache, shared, "another run published the same result in %s; using it")
            if reused is not None:
                return reused
            if shared and _fetch_shared(shared, cache):
                prepared = _load_complete(cache)
                if prepared is not None:
                    prepared.shared_cache_dir = shared
                    log.info("preprocess: reused the shared cache %s (copied to %s; --no-cache rebuilds it)", shared,
                             cache)
                    return prepared
        log.info("preprocess: %s; the result is cached in %s%s",
                 "rebuilding (--no-cache)" if cfg.no_cache else "nothing cached yet for these inputs and settings",
                 cache, f" and published to {shared}" if shared else "")
        with buildonce.private_folder(cache) as private:
            place.name = private.name
            built = _prepare(cfg, files, seed, private, pretrained, place)
            save_prepared(built, private)
            prepared = _install_built(built, private, cache, replace=cfg.no_cache)
        if not shared:
            return prepared
        if place.store:  # the splits' files are there already; the small files and the marker are not
            present = frozenset(f for s in prepared.splits for f in EncodedSplit.files(s))
            published = shared_cache_rules.publish(cache, shared, present)
        else:
            published = (shared_cache_rules.publish if cfg.no_cache else _ensure_published)(cache, shared)
        if published:
            prepared.shared_cache_dir = shared
        return prepared


def _reuse(cache: Path, shared: str | None, message: str) -> Prepared | None:
    """The complete cache in ``cache`` (logged with ``message``), published to ``shared`` too when it is not there
    yet (built here before: jobs on other machines find it then); None when there is none."""
    prepared = _load_complete(cache)
    if prepared is None:
        return None
    log.info("preprocess: " + message, cache)
    if shared and _ensure_published(cache, shared):
        prepared.shared_cache_dir = shared
    return prepared


@dataclass
class _Where:
    """Where the preprocessing tasks run and write (see :func:`prepare`): what the caller says, and what
    :meth:`resolve` makes of it once the build starts (it asks Ray)."""

    on_every_node: bool = False
    multi_node: bool | None = None
    shared_root: str | None = None
    """The shared cache (``shared_cache`` of :func:`prepare`)."""
    shared: str | None = None
    """This key's folder in it."""
    name: str = ""
    """The private build folder's name."""
    pin: dict[str, Any] = field(default_factory=dict)
    """Ray remote args that keep a task on the driver's node ({} on one machine)."""
    store: str | None = None
    """The private build folder in the object store (a URI), when the tasks build there."""

    def resolve(self) -> None:
        """Decide, asking Ray; ConfigError when the tasks would have to run on the driver's node and it offers no
        CPU (they could never start)."""
        multi_node = len(alive_nodes()) > 1 if self.multi_node is None else self.multi_node
        self.pin = _driver_node_args() if multi_node else {}
        if self.shared_root and self.shared and storage.is_uri(self.shared) and multi_node and not self.on_every_node:
            self.store = storage.join(self.shared_root, self.name)
        if self.builders and not _own_cpus():
            raise ConfigError(
                "preprocessing cannot run: on a cluster of several nodes its tasks must run on this machine's Ray "
                "node, where the local cache folder is, and that node offers no CPU. Give a --storage-path in an "
                "object store (s3://...), where they build on any node; or, with --allow-local-storage, a "
                "--storage-path mounted on every node and no --cache-dir outside it; or start this node with CPUs.")

    @property
    def builders(self) -> dict[str, Any]:
        """Remote args of the tasks that write into the build folder: anywhere when every node sees it."""
        return {} if self.on_every_node or self.store else self.pin

    @property
    def splits_to(self) -> str | None:
        """Where the assembling tasks write the splits' files: the shared cache with a build in the store, else the
        work folder."""
        return self.shared if self.store else None


def _complete(folder: Path) -> bool:
    """``folder`` holds a complete cache of this :data:`LAYOUT`."""
    return shared_cache_rules.complete(folder, _accepts)


def split_files_complete(folder: Path, splits: list[str]) -> bool:
    """``folder`` holds a complete cache of this :data:`LAYOUT` with the files of ``splits`` (what a training worker
    memory-maps: :func:`nre_ray.run.loop.open_splits`)."""
    return _complete(folder) and all((folder / f).is_file() for s in splits for f in EncodedSplit.files(s))


def _accepts(meta: dict[str, Any]) -> bool:
    """A cache folder's ``meta.json`` is of this :data:`LAYOUT`."""
    return meta.get("layout") == LAYOUT


def _shared_complete(shared: str) -> bool:
    """The shared folder ``shared`` holds a complete cache of this :data:`LAYOUT` (raises StorageError)."""
    return shared_cache_rules.shared_complete(shared, _accepts)


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


def _install_built(prepared: Prepared, private: Path, cache: Path, replace: bool) -> Prepared:
    """Publish the complete folder ``private`` (:func:`save_prepared` wrote it) as ``cache`` and return ``prepared``,
    its paths now in ``cache``; or, when another run published a complete cache there first (and not ``replace``),
    the result loaded from it (``private`` is left to the caller)."""
    for _ in range(3):
        if buildonce.publish(private, cache, _complete, replace):
            _relocate(prepared, cache)
            return prepared
        published = _load_complete(cache)
        if published is not None:
            log.info("preprocess: another run published the same result in %s first; using it", cache)
            published.cache_hit = False
            return published
    raise RuntimeError(f"preprocessing could not publish its result to {cache}: other runs kept replacing it")


def _relocate(prepared: Prepared, folder: Path) -> None:
    """Point the paths of ``prepared`` (saved in a private folder) into ``folder``, where it now is."""
    prepared.cache_dir = str(folder)
    prepared.rejected_csv = str(folder / "rejected.csv") if prepared.rejected_count else None
    if prepared.pretrained_dir:
        prepared.pretrained_dir = str(folder / "pretrained")


def _fetch_shared(shared: str, cache: Path) -> bool:
    """:func:`nre_ray.data.shared_cache.fetch` of a cache of this :data:`LAYOUT`."""
    return shared_cache_rules.fetch(shared, cache, _accepts)


def _ensure_published(cache: Path, shared: str) -> bool:
    """``shared`` holds a complete copy of ``cache``: already there, or uploaded now."""
    return shared_cache_rules.ensure_published(cache, shared, _accepts)



# --------------------------------------------------------------------------------------------------------------------
# the driver: the small decisions between the Ray passes of nre_ray.data.stages


class _Scan:
    """What the driver keeps of pass 1 (the :data:`~nre_ray.data.stages.SUMMARY` rows of
    :func:`~nre_ray.data.stages.stage_block`): per split, the staged blocks with their good rows per relation,
    problem counts, the first problems, and the good rows per relation in all with their first lines; the training
    split's entity types. Nothing per row: its size follows the number of blocks and relations, not of rows."""

    def __init__(self, splits: list[str]) -> None:
        self.splits = splits
        self.blocks: dict[str, list[tuple[int, str, dict[str, int]]]] = {s: [] for s in splits}
        self.fatal: dict[str, str] = {}
        self.problem_rows = dict.fromkeys(splits, 0)
        self.problem_count = dict.fromkeys(splits, 0)
        self.problems: dict[str, list[tuple[int, str, str]]] = {s: [] for s in splits}
        self.relations: dict[str, dict[str, list]] = {s: {} for s in splits}
        self.types: tuple[set[str], set[str]] = (set(), set())

    def add(self, table: pa.Table) -> None:
        for row in table.to_pylist():
            split = row["split"]
            if row["fatal"]:
                self.fatal.setdefault(split, row["fatal"])
                continue
            relations = json.loads(row["relations"])
            self.blocks[split].append((row["first_line"], row["path"], {r: n for r, (n, _) in relations.items()}))
            self.problem_rows[split] += row["problem_rows"]
            self.problem_count[split] += row["problem_count"]
            self.problems[split].extend((line, file, text) for file, line, text in json.loads(row["problems"]))
            for relation, (count, first) in relations.items():
                entry = self.relations[split].setdefault(relation, [0, []])
                entry[0] += count
                entry[1] = sorted(entry[1] + first)[:MAX_SHOWN]
            if split == "train":
                for kept, found in zip(self.types, json.loads(row["types"]), strict=True):
                    kept.update(found)

    def block_items(self, split: str) -> list[dict[str, str]]:
        """The staged blocks of ``split`` in file order, each with ``starts`` (JSON): how many good rows of each
        relation come before it (:func:`~nre_ray.data.stages.moved_rows`)."""
        items = []
        before: dict[str, int] = {}
        for _, path, counts in sorted(self.blocks[split], key=lambda block: block[0]):
            items.append({"split": split, "path": path, "starts": json.dumps(before)})
            before = {r: before.get(r, 0) + counts.get(r, 0) for r in {*before, *counts}}
        return items

    def good_rows(self, split: str, labels: set[str]) -> tuple[int, int]:
        """(good rows with a known label, good rows with an unknown one) of ``split``."""
        known = sum(n for r, (n, _) in self.relations[split].items() if r in labels)
        unknown = sum(n for r, (n, _) in self.relations[split].items() if r not in labels)
        return known, unknown

    def first_problems(self, files: dict[str, Source], labels: set[str],
                       label_problem: Callable[[str], str]) -> list[Problem]:
        """The first :data:`MAX_SHOWN` problems in file order, split by split (an unknown label is a problem)."""
        problems: list[Problem] = []
        for split in self.splits:
            found = list(self.problems[split])
            found += [(line, str(files[split]), label_problem(r)) for r, (_, lines) in self.relations[split].items()
                      if r not in labels for line in lines]
            for line, file, text in sorted(found, key=lambda p: p[0]):
                problems.extend(Problem(str(file), int(line), f, m) for f, m in split_problem(text))
                if len(problems) >= MAX_SHOWN:
                    return problems[:MAX_SHOWN]
        return problems


def _own_cpus() -> float:
    """The CPUs of the driver's Ray node."""
    import ray

    own = ray.get_runtime_context().get_node_id()
    return float(next((n["Resources"].get("CPU", 0) for n in ray.nodes() if n.get("NodeID") == own), 0))


def _driver_node_args() -> dict[str, Any]:
    """Ray remote args that keep a task on the driver's node (where a local build folder and local input files
    are): a label selector on the node id label every Ray node carries (a named argument of Ray Data's
    ``map_batches``, where ``scheduling_strategy`` goes through the deprecated ``ray_remote_args``)."""
    import ray

    return {"label_selector": {"ray.io/node-id": ray.get_runtime_context().get_node_id()}}


def _reader_args(files: dict[str, Source], inputs: list[str], on_driver: dict[str, Any]) -> dict[str, Any]:
    """The read tasks' Ray remote args: any node when every split file is in an object store, else the driver's
    (``on_driver``: :func:`_driver_node_args`)."""
    return {} if all(storage.is_uri(files[split]) for split in inputs) else on_driver


class _NoProgressNotice(logging.Filter):
    """Drops Ray Data's notice that its progress bars are off (nre_ray turns them off and prints its own lines)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith("Progress bars disabled")


def quiet_ray_data(*filters: logging.Filter) -> None:
    """Ray Data's console output: warnings only (no plans or "execution finished" lines), without the progress-bar
    notice, and without what ``filters`` drop (each added once per kind). Its log file in the Ray session
    (``logs/ray-data/``) still gets everything."""
    import ray.data  # noqa: F401 (configures the "ray.data" logger on import)

    for handler in logging.getLogger("ray.data").handlers:
        if not isinstance(handler, logging.StreamHandler):
            continue
        handler.setLevel(logging.WARNING)
        for new in (_NoProgressNotice(), *filters):
            if not any(type(f) is type(new) for f in handler.filters):
                handler.addFilter(new)


def _block_dataset(items: list[dict[str, str]]) -> Any:
    """A Ray Dataset of one row per staged block (``split``, ``path``, ``starts``: :meth:`_Scan.block_items`), a few
    blocks per CPU (each task handles the staged files of its block one after another)."""
    import ray.data

    dataset = ray.data.from_items(items, override_num_blocks=max(1, min(len(items), 4 * _num_cpus())))
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
             pretrained: str | None = None, place: _Where | None = None) -> Prepared:
    """Build the result in ``folder`` (a private build folder): the Ray passes write their files under
    ``folder/work/`` (or ``<place.store>/work/``), removed at the end; the encoded splits end up in ``folder``
    itself. ``place``: see :func:`prepare` (default: this machine)."""
    place = place or _Where()
    column_map, label_list = check_inputs(cfg, files)
    place.resolve()
    work = storage.join(place.store, "work") if place.store else str(folder / "work")
    storage.remove_tree(place.store or work)
    if place.store:
        buildonce.remove_stale(place.shared_root or "")  # the build folders in the store of drivers that are gone
        log.info("preprocess: building in the object store: %s, on any node", place.store)
    else:
        Path(work).mkdir(parents=True)
    try:
        return _prepare_in(cfg, files, seed, folder, work, column_map, label_list, pretrained, place)
    finally:
        storage.remove_tree(place.store or work)


def _prepare_in(cfg: DataConfig, files: dict[str, Source], seed: int, folder: Path, work: str,
                column_map: dict[str, str] | None, label_list: list[str] | None,
                pretrained: str | None, place: _Where) -> Prepared:
    import ray
    import ray.data

    quiet_ray_data()
    inputs = [split for split in SPLITS if split in files]
    driver_node = place.pin  # where local input files are read
    on_driver = place.builders  # where the tasks that write into the build folder run
    valid_from_train = "valid" not in files

    # 1. read, check, tokenize, stage (Ray Data): the driver takes the blocks' summaries only
    specs = [{"split": split, "path": str(files[split])} for split in inputs]
    dataset = ray.data.from_items(specs, override_num_blocks=len(specs))
    dataset.context.target_max_block_size = BLOCK_BYTES
    summaries = (
        dataset
        .map_batches(stages.read_files, batch_size=1, batch_format="pandas", num_cpus=0,
                     **_reader_args(files, inputs, driver_node),
                     fn_kwargs={"fmt": cfg.format, "column_map": column_map, "rows_per_chunk": ROWS_PER_CHUNK})
        .map_batches(stages.stage_block, batch_size=None, batch_format="pandas", **on_driver,
                     fn_kwargs={"tokenizer": cfg.tokenizer, "lowercase": cfg.lowercase, "folder": work,
                                "markers": cfg.entity_markers and not pretrained, "typed": cfg.typed_markers})
    )
    step = console.current_phase()  # train's "preprocess" phase (a silent one elsewhere)
    bar = step.progress(unit="rows read")
    scan = _Scan(inputs)
    for table in summaries.iter_batches(batch_format="pyarrow", batch_size=None):
        scan.add(table)
        bar.update(pc.sum(table.column("rows")).as_py() or 0)
    for split in inputs:
        if split in scan.fatal:
            raise _fatal_error(scan.fatal[split])

    # 2. labels, bad rows, the validation split (driver, from the summaries)
    if label_list is None:
        labels = sorted(r for r, (n, _) in scan.relations["train"].items() if n)
        where = "the training split"
    else:
        labels = label_list
        where = "the label file"
    known = set(labels)
    good = {s: scan.good_rows(s, known) for s in inputs}
    rejected_per_split = {s: scan.problem_rows[s] + good[s][1] for s in inputs}
    problem_count = sum(scan.problem_count[s] + good[s][1] for s in inputs)
    rejected_problem = {"labels": sorted(labels), "where": where}
    if problem_count and cfg.on_bad_rows == "error":
        first = scan.first_problems(files, known, functools.partial(stages.label_problem, **rejected_problem))
        raise DataError(first, hint=ROWS_HINT, total=problem_count)
    drawn = None
    if valid_from_train:  # from the counts per class: each task finds its drawn rows by their rank in their class
        sizes = {r: n for r, (n, _) in scan.relations["train"].items() if r in known}
        drawn = stages.draw_valid(sizes, cfg.valid_fraction, seed)
    moved = sum(len(ranks) for ranks in (drawn or {}).values())
    expected = {s: good[s][0] for s in inputs}
    expected["train"] -= moved
    expected["valid"] = expected.get("valid", 0) + moved
    if expected["train"] <= 0:
        raise DataError([Problem(str(files["train"]), None, None, "no usable training rows")])

    # 3. vocabulary (words) or tokenizer (subwords), then encoding (Ray Data): each task writes its parts
    blocks = [item for s in inputs for item in scan.block_items(s)]
    if pretrained:
        vocab, tokenizer_dir, unk = _subword_vocab(cfg, pretrained, folder, scan)
        shipped = tokenizer_dir
        if place.store:  # the encoding tasks' nodes copy it from the store
            shipped = storage.join(place.store, "pretrained")
            storage.upload(tokenizer_dir, shipped)
        encoder = {"tokenizer_dir": shipped, "typed": cfg.typed_markers}
    else:
        # Each task's table of counts comes back to the driver, which adds them up as they come (in Arrow): the
        # vocabulary's size, whatever the rows. (A Ray Data groupby spent ~3 s starting its shuffle, and the driver
        # took its whole result anyway.)
        counts = None
        for part in (_block_dataset([b for b in blocks if b["split"] == "train"])
                     .map_batches(stages.train_token_counts, batch_size=None, batch_format="pandas", **on_driver,
                                  fn_kwargs={"labels": labels, "drawn": drawn})
                     .iter_batches(batch_format="pyarrow", batch_size=None)):
            counts = stages.add_counts(counts, part)
        tokens, totals = ([], []) if counts is None else (counts.column("token").to_pylist(),
                                                          counts.column("count").to_pylist())
        vocab = Vocab.build(dict(zip(tokens, totals, strict=True)), cfg.min_freq)
        del counts, tokens, totals
        tokenizer_dir, unk = None, UNK_ID
        encoder = {"vocab": vocab.tokens}
    encoded = dict.fromkeys(SPLITS, 0)
    written = (
        _block_dataset(blocks)
        .map_batches(stages.encode_files, batch_size=None, batch_format="pandas", **on_driver,
                     fn_kwargs={"folder": work, "labels": labels, "drawn": drawn, "max_length": cfg.max_length,
                                "window": cfg.position_window, "rejected_problem": rejected_problem, **encoder})
    )
    bar = step.progress(total=sum(expected.values()), unit="rows encoded")
    for table in written.iter_batches(batch_format="pandas", batch_size=None):
        for split, rows in zip(table["split"], table["rows"], strict=True):
            encoded[split] += int(rows)
            bar.update(int(rows))
    for split in SPLITS:
        if encoded[split] != expected.get(split, 0):
            raise RuntimeError(f"preprocessing encoded {encoded[split]} of the {expected.get(split, 0)} {split} rows")

    # 4. each split's parts concatenated into its .npy files, and audited (Ray tasks, not the driver)
    final = [s for s in SPLITS if encoded[s]]
    assemble = ray.remote(num_cpus=1)(stages.assemble_split).options(**on_driver)
    args = (labels, cfg.max_length, cfg.position_window, unk)
    if place.splits_to:  # the splits' files go straight to the shared cache: no one may take it for complete meanwhile
        storage.remove(storage.join(place.splits_to, MARKER))
    results = {"train": ray.get(assemble.remote(work, "train", *args, dest=place.splits_to))}
    pending = {s: assemble.remote(work, s, *args, train_keys=storage.join(work, "train_keys.npy"), dest=place.splits_to)
               for s in final if s != "train"}
    results.update({s: ray.get(ref) for s, ref in pending.items()})
    for split in final:
        for file in EncodedSplit.files(split):
            if place.splits_to:
                storage.download(storage.join(place.splits_to, file), folder / file)
            else:
                os.replace(Path(work) / file, folder / file)
    splits = {s: EncodedSplit.open(folder, s) for s in final}

    rejected, rejected_csv = pd.DataFrame(columns=REJECTED_COLUMNS), None
    if sum(rejected_per_split.values()):
        rejected, rejected_csv = _gather_rejected(storage.join(work, "rejected"), folder / "rejected.csv")
    audit = data_audit.assemble_audit({s: results[s]["info"] for s in final}, labels, cfg.max_length,
                                      rejected=rejected_per_split, oov={s: results[s]["oov"] for s in final},
                                      valid_from_train=valid_from_train)
    return Prepared(splits, vocab, labels, sources_of(files), rejected=rejected, valid_from_train=valid_from_train,
                    audit=audit, rejected_count=sum(rejected_per_split.values()), rejected_csv=rejected_csv,
                    cache_dir=str(folder), pretrained_dir=tokenizer_dir, position_window=cfg.position_window)


def _subword_vocab(cfg: DataConfig, pretrained: str, folder: Path, scan: _Scan) -> tuple[Vocab, str, int]:
    """``--model bert``: the tokenizer with the entity markers (the training rows' entity types with
    ``--typed-markers``) saved once into ``folder/pretrained`` (:func:`nre_ray.data.subword.tokenizer_vocab`).
    Returns (vocabulary, tokenizer folder, unknown id)."""
    head_types: list[str] = []
    tail_types: list[str] = []
    if cfg.typed_markers:
        head_types, tail_types = (sorted({t for t in map(subword.clean_type, found) if t}) for found in scan.types)
    return subword.tokenizer_vocab(pretrained, folder / "pretrained", cfg.max_length, head_types, tail_types)


def _gather_rejected(parts: str, path: Path) -> tuple[pd.DataFrame, str]:
    """Every rejected row, in file order, from the blocks' parts (a folder or a URI) into ``path`` (CSV with a
    header); returns the first :data:`KEPT_REJECTED` rows and the path."""
    found = storage.list_files(parts) if storage.is_dir(parts) else []
    with open(path, "wb") as out:
        out.write((",".join(REJECTED_COLUMNS) + "\n").encode("utf-8"))
        for part in sorted(p for p in found if p.endswith(".csv")):
            with storage.open_input(part) as fh:
                shutil.copyfileobj(fh, out)
    first = pd.read_csv(path, keep_default_na=False, nrows=KEPT_REJECTED)
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
        if split.folder is None or Path(split.folder).resolve() != folder.resolve():  # else the build wrote it there
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
            "position_window": prepared.position_window}
    (folder / MARKER).write_text(json.dumps(meta, ensure_ascii=False), encoding="utf-8")
    _relocate(prepared, folder)


def load_prepared(folder: Path) -> Prepared:
    """Read what :func:`save_prepared` wrote (paths in the result point into ``folder``)."""
    meta = json.loads((folder / MARKER).read_text(encoding="utf-8"))
    rejected_path = folder / "rejected.csv"
    rejected = pd.read_csv(rejected_path, keep_default_na=False, nrows=KEPT_REJECTED) \
        if rejected_path.stat().st_size else pd.DataFrame(columns=REJECTED_COLUMNS)
    count, rejected_csv, pretrained_dir = meta["rejected_count"], meta["rejected_csv"], meta["pretrained_dir"]
    return Prepared(
        splits={name: EncodedSplit.open(folder, name) for name in meta["splits"]},  # read by rows, on demand
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

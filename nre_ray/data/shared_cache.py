"""The shared preprocessing cache: a cache folder published under a storage path that every machine sees
(``<storage-path>/.nre_ray_cache/<key>/`` with an ``s3://...`` storage path:
:func:`nre_ray.data.pipeline.cache_places`), so that a job on another machine, and a training worker on another node,
finds what one run built.

One protocol for every task's cache (the sentence pipeline's :func:`nre_ray.data.pipeline.prepare`, the document and
bag tasks' :func:`build_or_reuse`):

* a folder is complete when its marker file (``meta.json``, written last) is there and ``accepts`` its content (the
  task and the layout it was written with);
* publishing uploads the finished local folder with the marker last, after taking an old marker away, so no one reads
  a half-replaced copy;
* fetching downloads a complete shared folder into a private folder next to the local cache and renames it into
  place (:mod:`nre_ray.core.buildonce`), so two processes of one machine never see half a copy;
* a shared cache that cannot be read or written is a warning: the run preprocesses here, or does without publishing.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from nre_ray import storage
from nre_ray.core import buildonce

if TYPE_CHECKING:
    import pandas as pd

log = logging.getLogger(__name__)

MARKER = "meta.json"
"""The file a cache folder gets last, locally and in the shared cache."""

Accepts = Callable[[dict[str, Any]], bool]
"""``meta.json``'s content -> whether the folder is a complete cache of the kind the caller reads."""


def _accepted(text: str | bytes, accepts: Accepts) -> bool:
    try:
        meta = json.loads(text)
    except ValueError:
        return False
    return isinstance(meta, dict) and accepts(meta)


def complete(folder: Path, accepts: Accepts) -> bool:
    """The local folder ``folder`` holds a complete cache that ``accepts`` takes."""
    try:
        return _accepted((Path(folder) / MARKER).read_text(encoding="utf-8"), accepts)
    except OSError:
        return False


def shared_complete(shared: str, accepts: Accepts) -> bool:
    """The shared folder ``shared`` holds a complete cache that ``accepts`` takes (raises StorageError)."""
    marker = storage.join(shared, MARKER)
    return storage.is_file(marker) and _accepted(storage.read_bytes(marker), accepts)


def fetch(shared: str, cache: Path, accepts: Accepts) -> bool:
    """Download the complete shared folder ``shared`` into a private folder (the marker last), then rename it onto
    ``cache`` (unless a complete one got there first); False when there is none, or it cannot be read (a warning)."""
    try:
        if not shared_complete(shared, accepts):
            return False
        with buildonce.private_folder(cache) as private:
            storage.download(shared, private, last=MARKER)
            if not complete(private, accepts):  # replaced while it was copied: build here
                return False
            buildonce.publish(private, cache, lambda folder: complete(folder, accepts))
    except storage.StorageError as err:
        log.warning("preprocess: cannot read the shared cache (%s); preprocessing here", err)
        return False
    return True


def publish(cache: Path, shared: str, present: frozenset[str] = frozenset()) -> bool:
    """Upload the finished local cache folder to ``shared``, the marker last (a rebuild first takes the old marker
    away, so that no one reads a half-replaced copy), except the files in ``present`` (that the build wrote there
    itself); False and a warning when it cannot be written."""
    try:
        storage.remove(storage.join(shared, MARKER))
        storage.upload(cache, shared, last=MARKER, skip=present)
    except storage.StorageError as err:
        log.warning("preprocess: cannot publish the result to the shared cache (%s); later jobs will "
                    "preprocess again", err)
        return False
    log.info("preprocess: published to the shared cache %s", shared)
    return True


def ensure_published(cache: Path, shared: str, accepts: Accepts) -> bool:
    """``shared`` holds a complete copy of ``cache``: already there, or uploaded now."""
    try:
        if shared_complete(shared, accepts):
            return True
    except storage.StorageError:
        pass  # publish says what is wrong
    return publish(cache, shared)


def is_cached(cache: Path, shared_root: str | None, accepts: Accepts) -> bool:
    """Whether :func:`build_or_reuse` would reuse a cache for ``cache``: the local folder, or its key's folder in the
    shared cache ``shared_root``."""
    if complete(cache, accepts):
        return True
    try:
        return bool(shared_root) and shared_complete(storage.join(shared_root, cache.name), accepts)
    except storage.StorageError:
        return False


def build_or_reuse(cache: Path, shared_root: str | None, accepts: Accepts, no_cache: bool,
                   build: Callable[[Path], pd.DataFrame], load: Callable[[Path], Any]) -> Any:
    """A task's cache folder ``cache``: reused when complete (``no_cache`` False), else copied from its key's folder
    in the shared cache ``shared_root`` when that is complete, else built: ``build(private)`` writes a complete
    folder (the marker last) and returns the rejected rows, and the folder is published onto ``cache``. Then, with
    ``shared_root``, the folder is published there too (replaced after a ``no_cache`` rebuild), and the result's
    ``shared_cache_dir`` names it, so that workers on other nodes copy it (:func:`nre_ray.run.loop.open_splits`).

    Runs on one machine take turns (:func:`nre_ray.core.buildonce.turn`): the second one reuses the first one's
    result. ``load(folder)`` reads a complete folder into a :class:`nre_ray.data.pipeline.Prepared` (which this module
    does not import: the pipeline imports it)."""
    shared = storage.join(shared_root, cache.name) if shared_root else None

    def done(folder: Path) -> bool:
        return complete(folder, accepts)

    with buildonce.turn(cache):
        if not no_cache and done(cache):
            log.info("preprocess: reused the cache in %s (--no-cache rebuilds it)", cache)
            prepared = load(cache)
        elif not no_cache and shared and fetch(shared, cache, accepts):
            log.info("preprocess: reused the shared cache %s (copied to %s; --no-cache rebuilds it)", shared, cache)
            prepared = load(cache)
        else:
            log.info("preprocess: %s; the result is cached in %s%s",
                     "rebuilding (--no-cache)" if no_cache else "nothing cached yet for these inputs and settings",
                     cache, f" and published to {shared}" if shared else "")
            with buildonce.private_folder(cache) as private:
                rejected = build(private)
                buildonce.publish(private, cache, done, replace=True)
            prepared = load(cache)
            prepared.cache_hit, prepared.rejected = False, rejected
        if shared and (publish(cache, shared) if no_cache else ensure_published(cache, shared, accepts)):
            prepared.shared_cache_dir = shared
    return prepared

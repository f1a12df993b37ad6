"""Build a folder once, safely under concurrency: the one protocol of the preprocessing cache
(:func:`nre_ray.data.pipeline.prepare`), of the local copies of files in an object store
(:func:`local_copy`) and of a local MLflow sqlite store (:func:`nre_ray.tracking.sqlite_store.ready`,
built in a private folder too, then its file renamed).

* **Private folder, one rename.** A builder works in a private folder next to the target,
  ``<name>.tmp-<pid>.<start>-<random>-<host>`` (:func:`private_folder`; the same file system), and publishes it with one
  atomic rename onto ``<name>`` (:func:`publish`). A reader sees a complete folder or none; no builder touches
  another's files.
* **Builders on one machine take turns** (:func:`turn`: an advisory file lock per target, kept outside the target's
  folder), so the second one finds the first one's result instead of building it again. Builders on several machines
  (a folder that they all mount) may build at once: the first rename wins, and the others drop their copies and use
  the published one.
* **Builders that are gone leave nothing for long.** A private folder whose builder's process no longer runs on
  this machine, or (another machine's, whose process cannot be checked) in which nothing changed for
  :data:`PRIVATE_MAX_AGE` seconds, is removed by the next builder (:func:`remove_stale`, through the one sweeper
  :func:`nre_ray.core.tempfiles.remove_stale`); so are the private folders of builds in an object store, which follow
  the same naming.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import logging
import os
import re
import secrets
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

from nre_ray import storage
from nre_ray.core import tempfiles
from nre_ray.core.tempfiles import HOST

log = logging.getLogger(__name__)

PRIVATE_MAX_AGE = 24 * 3600
"""Seconds after which a private build folder whose builder cannot be checked (another machine's) counts as stale."""
_PRIVATE = re.compile(rf"(?P<name>[^/]+)\.tmp-{tempfiles.MAKER}-(?P<token>[0-9a-f]+)-(?P<host>[0-9a-f]{{8}})")
"""The name of a private build folder: ``<name>.tmp-<pid>.<start>-<random>-<host>`` next to the target ``<name>`` (a
key in hex digits for the cache's and the copies' folders, ``mlflow.db`` for a local MLflow store); the builder's
process as :data:`nre_ray.core.tempfiles.MAKER` names it (``<pid>`` alone in an older nre_ray's names), ``<host>`` its
machine (:data:`HOST`)."""
_PUBLISH_TRIES = 20


def private_name(name: str) -> str:
    """A new private name for a build of ``name`` by this process (:data:`_PRIVATE`)."""
    return f"{name}.tmp-{tempfiles.maker()}-{secrets.token_hex(4)}-{HOST}"


class Busy(Exception):
    """Another process on this machine holds the turn (:func:`turn` with ``wait=False``)."""


@contextlib.contextmanager
def turn(target: Path | str, waiting: Callable[[], None] | None = None, wait: bool = True) -> Iterator[None]:
    """Hold the turn to build ``target`` (a local path or a URI) among this machine's processes (a ``flock`` on a
    lock file of this user's under the temporary folder, named after the target's absolute path:
    :func:`nre_ray.storage.locked`): a second builder waits until the first one is done, then finds its result.
    ``waiting`` is called once when this one has to wait; with ``wait=False`` it does not wait but raises
    :class:`Busy`. The lock goes with the process that holds it, killed or not."""
    locks = Path(tempfile.gettempdir()) / f"nre_ray-{os.getuid()}" / "locks"
    locks.mkdir(parents=True, exist_ok=True)
    where = str(target) if storage.is_uri(target) else str(Path(target).absolute())
    name = hashlib.sha256(where.encode()).hexdigest()[:24]
    held = False
    try:
        with storage.locked(locks / f"{name}.lock", wait=None if wait else 0, waiting=waiting if wait else None):
            held = True
            yield
    except storage.LockTimeout:
        if held:  # not this turn's: raised by the block
            raise
        raise Busy(where) from None


@contextlib.contextmanager
def private_folder(target: Path) -> Iterator[Path]:
    """A new, empty private build folder next to ``target`` (created after removing the stale ones of builders that
    are gone); removed on exit, whether it was published (then it is gone already) or not."""
    target.parent.mkdir(parents=True, exist_ok=True)
    remove_stale(target.parent)
    while True:
        folder = target.parent / private_name(target.name)
        try:
            folder.mkdir()
        except FileExistsError:
            continue
        break
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def publish(private: Path, target: Path, complete: Callable[[Path], bool], replace: bool = False) -> bool:
    """Rename the finished folder ``private`` onto ``target`` (atomic: one file system); True when it is published.

    A folder already at ``target`` that is not ``complete`` (a result of an older layout, say), or any with
    ``replace``, is first moved aside and removed; a complete one (another builder's, published first) is kept:
    False, and ``private`` is left to the caller."""
    for _ in range(_PUBLISH_TRIES):
        try:
            os.rename(private, target)
            return True
        except OSError as err:
            if err.errno not in (errno.ENOTEMPTY, errno.EEXIST):
                raise
        if not replace and complete(target):
            return False
        discard(target)
        replace = False  # replaced once: a complete result that another builder publishes after that is as fresh
    raise RuntimeError(f"could not publish {target}: other builders kept replacing it")


def discard(folder: Path) -> None:
    """Move ``folder`` out of the way under a private name (one rename: readers see it whole or not at all), then
    remove it."""
    aside = folder.parent / private_name(folder.name)
    try:
        os.rename(folder, aside)
    except FileNotFoundError:
        return  # another builder moved it already
    shutil.rmtree(aside, ignore_errors=True)


def remove_stale(root: Path | str) -> None:
    """Remove the private build folders in ``root`` (a local folder, or a folder in an object store) whose builder is
    gone: its process no longer runs on this machine, or (another machine's) nothing in it changed for
    :data:`PRIVATE_MAX_AGE` seconds. Never a live builder's folder on this machine, nor a folder not named like a
    private build folder (:func:`nre_ray.core.tempfiles.remove_stale`, the one sweeper)."""
    tempfiles.remove_stale(root, _PRIVATE, max_age=PRIVATE_MAX_AGE, folders_only=True)


def default_cache_root() -> Path:
    """Where :func:`local_copy` keeps its copies: ``<tmp>/nre_ray-<uid>/remote``."""
    return Path(tempfile.gettempdir()) / f"nre_ray-{os.getuid()}" / "remote"


def local_copy(path: storage.PathLike, cache_root: storage.PathLike | None = None,
               skip_suffixes: tuple[str, ...] = ()) -> Path:
    """A local copy of the file or folder ``path``, downloaded once per machine; a local path is returned as it is.

    The copy lives in ``cache_root`` (default :func:`default_cache_root`) under a key made of the URI, the size and
    modification time of every file (a changed object is downloaded again) and ``skip_suffixes`` (files left out,
    e.g. the weights when only a tokenizer is needed); its name is the URI's last component. It is made by the
    protocol of this module: downloaded into a private folder and renamed into place, processes of one
    machine that ask at the same time waiting for one download."""
    if not storage.is_uri(path):
        return storage.as_local_path(path)
    uri = os.fspath(path).rstrip("/")
    listing = [row for row in storage.stamp(uri) if not str(row[0]).endswith(skip_suffixes)]
    key = hashlib.sha256(json.dumps([uri, listing, sorted(skip_suffixes)]).encode()).hexdigest()[:24]
    done = Path(cache_root if cache_root is not None else default_cache_root()) / key
    target = done / (storage.name_of(uri) or "copy")
    if done.is_dir():
        return target
    with turn(done):
        if not done.is_dir():  # else another process finished it while this one waited
            with private_folder(done) as private:
                storage.download(uri, private / target.name, skip_suffixes=skip_suffixes)
                publish(private, done, complete=Path.is_dir)
    return target

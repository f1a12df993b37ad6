"""Temporary files and folders named after the process that makes them, so that a later process removes the ones
whose maker is gone: a process killed with SIGKILL (a driver, or a training worker in the middle of a checkpoint save)
cannot remove its own. This module is the one sweeper of such leftovers (:func:`remove_stale`), for the temporaries
of the temporary folder and for the private build folders of :mod:`nre_ray.core.buildonce`.

A maker is named by :func:`maker`: ``<pid>.<start>`` (its process id and start time, as
:mod:`nre_ray.cluster.processes` reads them: an id the system gives to another program later is not taken for it) and
``<host>``, this machine (:data:`HOST`; a process id means something on its own machine only). Names written by an
older nre_ray carry the process id alone, ``<pid>``; they are still read, and judged by the id.

A temporary is ``nre_ray_<what>_<pid>.<start>-<host>-<random>`` in the temporary folder (:func:`prefix`;
``tempfile`` never puts a ``-`` in its random part). Anything else there is left alone, and so is every file of a
process that still runs, of another machine (a temporary folder shared with a container) or of another user.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import shutil
import socket
import tempfile
import time
from pathlib import Path

from nre_ray import storage
from nre_ray.cluster import processes

log = logging.getLogger(__name__)

HOST = hashlib.sha256(socket.gethostname().encode()).hexdigest()[:8]
"""This machine, in the names of temporaries (a process id means something on its own machine only)."""
MAKER = r"(?P<pid>[0-9]+)(?:\.(?P<start>[0-9]+))?"
"""The maker's process in a name (:func:`maker`): ``<pid>.<start>``, or ``<pid>`` in an older nre_ray's name."""
TEMPORARY = re.compile(rf"nre_ray_[a-z]+_{MAKER}-(?P<host>[0-9a-f]{{8}})-.*", re.DOTALL)
"""The name of a temporary in the temporary folder (:func:`prefix`)."""


def maker() -> str:
    """This process in the names of its temporaries: ``<pid>.<start time>`` (:data:`MAKER`)."""
    return f"{os.getpid()}.{processes.started()}"


def prefix(what: str) -> str:
    """The ``prefix=`` for ``tempfile.mkdtemp``/``mkstemp``/``TemporaryDirectory``:
    ``nre_ray_<what>_<pid>.<start>-<host>-``."""
    return f"nre_ray_{what}_{maker()}-{HOST}-"


def made_by_ended(match: re.Match[str]) -> bool:
    """Whether the name ``match`` (of a pattern with the groups of :data:`MAKER` and ``host``) was made on this
    machine by a process that has ended (:func:`nre_ray.cluster.processes.alive`: its id and start time, or its id
    alone in an older name)."""
    if match["host"] != HOST:
        return False
    start = match["start"]
    return not processes.alive(int(match["pid"]), int(start) if start is not None else None)


def remove_stale(folder: storage.PathLike | None = None, pattern: re.Pattern[str] = TEMPORARY,
                 max_age: float | None = None, folders_only: bool = False) -> None:
    """Remove the entries of ``folder`` (default: the temporary folder; a folder in an object store too) whose
    names ``pattern`` matches whole (its groups: those of :data:`MAKER`, and ``host``) and whose maker has ended
    (:func:`made_by_ended`). With ``max_age``, another machine's too (whose process cannot be checked from here)
    once nothing in it changed for ``max_age`` s. ``folders_only``: files are left alone. Never an entry of a live
    process of this machine's, nor one named otherwise; what cannot be listed or removed is left (and logged)."""
    folder = folder if folder is not None else tempfile.gettempdir()
    removed = []
    for entry, is_folder in _entries(folder, folders_only):
        match = pattern.fullmatch(storage.name_of(entry))
        if match is None:
            continue
        if match["host"] == HOST:
            stale = made_by_ended(match)
        else:
            stale = max_age is not None and time.time() - _last_change(entry) > max_age
        if stale:
            removed.append(entry)
            _remove(entry, is_folder)
    if len(removed) == 1:
        log.info("removed %s, left by a process that ended", removed[0])
    elif removed:  # one line, not one a leftover (a test suite's local-mode runs leave dozens)
        log.info("removed %d leftovers of processes that ended from %s (%s, ...)", len(removed), folder,
                 storage.name_of(min(removed)))


def _entries(folder: storage.PathLike, folders_only: bool) -> list[tuple[str, bool]]:
    """``(path, is a folder)`` of the entries of ``folder`` (none when it cannot be listed): a local folder's from
    one ``scandir`` (a link counts as a file), an object store's folders through :mod:`nre_ray.storage`."""
    if storage.is_uri(folder):
        if not folders_only:
            raise ValueError(f"{folder}: only folders are swept in an object store")
        try:
            return [(entry, True) for entry in storage.list_folders(folder)]
        except (OSError, storage.StorageError):
            return []
    try:
        with os.scandir(storage.as_local_path(folder)) as scan:
            found = [(entry.path, entry.is_dir(follow_symlinks=False)) for entry in scan]
    except OSError:
        return []
    return [(path, is_folder) for path, is_folder in found if is_folder or not folders_only]


def _remove(entry: str, is_folder: bool) -> None:
    """Remove a stale entry, a folder with all it holds; one that is gone already or cannot be removed is left."""
    if storage.is_uri(entry):
        try:
            storage.remove_tree(entry)
        except storage.StorageError as err:
            log.warning("cannot remove %s (%s)", entry, err)
    elif is_folder:
        shutil.rmtree(entry, ignore_errors=True)
    else:
        try:
            Path(entry).unlink(missing_ok=True)
        except OSError as err:  # another user's, in a shared temporary folder
            log.warning("cannot remove %s (%s)", entry, err)


def _last_change(entry: str) -> float:
    """The newest modification time of the folder ``entry`` and what it holds, one level down (a build adds files to
    its folder and to its subfolders); in an object store, of every object under it (0 when there is none)."""
    if storage.is_uri(entry):
        try:
            return max((row[2] for row in storage.stamp(entry) if row[2]), default=0) / 1e9
        except storage.StorageError:
            return time.time()  # vanishing or unreadable: not stale
    path = Path(entry)
    try:
        times = [path.stat().st_mtime]
        if path.is_dir():
            for child in path.iterdir():
                times.append(child.lstat().st_mtime)
    except OSError:
        return time.time()  # vanishing or unreadable: not stale
    return max(times)

"""Temporary files and folders named after the process that makes them, so that a later process removes the ones
whose maker is gone: a process killed with SIGKILL (a driver, or a training worker in the middle of a checkpoint save)
cannot remove its own.

A name is ``nre_ray_<what>_<pid>-<host>-<random>`` in the temporary folder (``<host>``: this machine, as
:mod:`nre_ray.buildonce` names it, since a process id means something on its own machine only; ``tempfile`` never
puts a ``-`` in its random part). Anything else there is left alone, and so is every file of a process that still
runs, of another machine (a temporary folder shared with a container) or of another user.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from pathlib import Path

from nre_ray.buildonce import HOST, process_alive

_NAME = re.compile(r"nre_ray_[a-z]+_(?P<pid>\d+)-(?P<host>[0-9a-f]{8})-")


def prefix(what: str) -> str:
    """The ``prefix=`` for ``tempfile.mkdtemp``/``mkstemp``/``TemporaryDirectory``: ``nre_ray_<what>_<pid>-<host>-``."""
    return f"nre_ray_{what}_{os.getpid()}-{HOST}-"


def remove_stale(folder: Path | None = None) -> None:
    """Remove the temporaries in ``folder`` (default: the temporary folder) whose process no longer runs here."""
    folder = Path(folder or tempfile.gettempdir())
    try:
        entries = list(folder.iterdir())
    except OSError:
        return
    for path in entries:
        match = _NAME.match(path.name)
        if match is None or match["host"] != HOST or process_alive(int(match["pid"])):
            continue
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)

"""A local MLflow sqlite store (``sqlite:///PATH``), created or migrated once, whatever number of runs open it at once.

MLflow creates the tables of a new sqlite file (and migrates them with alembic) in place, when a client first opens
it. Several processes doing that at the same moment fail (alembic's ``Online migration expected to match one row``,
``table _alembic_tmp_model_versions already exists``) and can leave a file no later run can open. :func:`ready`
follows the protocol of :mod:`nre_ray.core.buildonce` instead: the processes of this machine take turns; the one that
finds the file missing, empty or of an older MLflow's schema builds it in a private folder next to it (a copy of an
older one, migrated as ``mlflow db upgrade`` does) and renames it onto PATH, so that every process sees a whole store or
none. A builder killed half-way leaves only its private folder, which the next process that opens the store removes.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
from pathlib import Path

from nre_ray.core import buildonce
from nre_ray.core.user_error import ConfigError
from nre_ray.tracking import mlflow_private, uris

#: Seconds a reader of the store's schema waits while a run writes to it.
BUSY_TIMEOUT_S = 60.0
_READY: set[str] = set()
"""The sqlite URIs this process has found or made ready (checked once per process)."""


def ready(tracking_uri: str) -> None:
    """Make the sqlite store of ``tracking_uri`` ready for this MLflow: created, or migrated to its schema, once,
    under the turn of :func:`nre_ray.core.buildonce.turn` (see the module's docstring). Other tracking URIs (a server,
    another database) are MLflow's to open: nothing is done."""
    db = uris.sqlite_path(tracking_uri)
    if db is None or tracking_uri in _READY:
        return
    with buildonce.turn(db):
        buildonce.remove_stale(db.parent)  # a builder killed after its rename, before removing its private folder
        found = schema_version(db)
        if found != mlflow_private.latest_schema_revision():
            _refuse_a_newer_store(db, found)
            with buildonce.private_folder(db) as folder:
                _build(db, folder / db.name, tracking_uri)
    _READY.add(tracking_uri)


def _refuse_a_newer_store(db: Path, revision: str | None) -> None:
    """ConfigError when the store ``db`` is at a schema ``revision`` this MLflow does not know: a newer MLflow wrote
    it (another release of the tested range, e.g. MLflow 3.17 before 3.16), and this one can neither migrate nor
    open it. The file is left as it is."""
    if revision is not None and revision not in mlflow_private.known_schema_revisions():
        raise ConfigError(
            f"the MLflow store {db} was written by a newer MLflow than this one ({_mlflow_version()}; its schema "
            f"revision {revision} is unknown here): open it with that MLflow, or use another store (--tracking-uri)")


def _mlflow_version() -> str:
    """``MLflow X.Y.Z`` as installed (read from its metadata)."""
    from importlib import metadata

    return f"MLflow {metadata.version('mlflow')}"


def default_artifact_location(tracking_uri: str) -> str | None:
    """For a local sqlite store: ``<folder of the db>/mlruns`` (absolute), where ``mlflow ui`` looks by default.
    For a server: None (the server decides)."""
    db = uris.sqlite_path(tracking_uri)
    return (db.parent / "mlruns").absolute().as_uri() if db is not None else None


def schema_version(db: Path) -> str | None:
    """The alembic revision of the MLflow schema in the sqlite file ``db``; None when there is no such file, or it is
    empty, or it has no MLflow schema yet. The file is only read."""
    if not db.is_file() or db.stat().st_size == 0:
        return None
    try:
        with contextlib.closing(sqlite3.connect(f"{db.absolute().as_uri()}?mode=ro", uri=True,
                                                timeout=BUSY_TIMEOUT_S)) as connection:
            row = connection.execute("SELECT version_num FROM alembic_version").fetchone()
    except sqlite3.OperationalError as err:
        if "no such table" in str(err):  # no MLflow schema yet
            return None
        # Locked by a run writing to it (past the timeout): a live store, never to be rebuilt and renamed over (that
        # cut the other runs off their store: "attempt to write a readonly database", and lost their writes).
        raise
    except sqlite3.DatabaseError:  # not a database (_build says so)
        return None
    return row[0] if row else None


def _build(db: Path, private: Path, tracking_uri: str) -> None:
    """Build the store ``db`` (of ``tracking_uri``) as the file ``private`` (in a private folder next to it), then
    rename it onto ``db``: an existing ``db`` (an older MLflow's, or a sqlite file without MLflow's tables) is copied
    first, through sqlite's backup (a consistent copy), and migrated; a new one gets MLflow's tables and its Default
    experiment, with its artifacts where the runs' go (:func:`default_artifact_location`)."""
    private_uri = uris.sqlite_uri(private)
    if db.is_file() and db.stat().st_size > 0:
        with contextlib.closing(sqlite3.connect(db)) as source, contextlib.closing(sqlite3.connect(private)) as copy:
            source.backup(copy)
        if schema_version(private) is not None:
            mlflow_private.upgrade_schema(private_uri)
    mlflow_private.create_tables(private_uri, default_artifact_location(tracking_uri))  # (and checks the schema)
    os.replace(private, db)

"""A local MLflow sqlite store opened by several processes at the same moment (nre_ray.tracking.sqlite_store): real
processes, a real sqlite file. Without the lock, MLflow's own creation of a new store fails in most of them (alembic's
``table ... already exists``) and can leave a file no later run opens."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from nre_ray.core import buildonce
from nre_ray.core.user_error import ConfigError
from nre_ray.tracking import mlflow_private, sqlite_store

pytestmark = pytest.mark.timeout(180)

#: Each process imports what a run imports, says it is ready, waits for the go, then creates a run in the store: the
#: experiment and the store are created by whichever gets there first.
OPEN_AT_ONCE = """
import sys, time
from pathlib import Path
from nre_ray.tracking import store
import mlflow.store.tracking.sqlalchemy_store  # imported before the go: only the store's opening is raced
folder, i = Path(sys.argv[1]), sys.argv[2]
(folder / f"ready-{i}").touch()
while not (folder / "go").exists():
    time.sleep(0.005)
print(store.start_run(f"sqlite:///{folder / 'mlflow.db'}", "at-once", f"run-{i}", {}))
"""
#: An older MLflow's schema: the store as MLflow of that time left it (alembic revision "add evaluation datasets").
OLD_REVISION = "71994744cf8e"


def _open_at_once(folder: Path, n: int) -> list[subprocess.CompletedProcess]:
    """Start ``n`` processes that open the store in ``folder`` at the same moment; their results."""
    # MLflow's INFO lines ("Updating database tables") tell who migrated; a command run earlier in this test process
    # may have set MLFLOW_LOGGING_LEVEL=WARNING in its environment (nre_ray's QUIET_ENV)
    env = {**os.environ, "MLFLOW_LOGGING_LEVEL": "INFO"}
    procs = [subprocess.Popen([sys.executable, "-c", OPEN_AT_ONCE, str(folder), str(i)], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, env=env) for i in range(n)]
    deadline = time.time() + 120
    while len(list(folder.glob("ready-*"))) < n and time.time() < deadline and all(p.poll() is None for p in procs):
        time.sleep(0.05)
    (folder / "go").touch()
    done = []
    for proc in procs:
        out, err = proc.communicate(timeout=120)
        done.append(subprocess.CompletedProcess(proc.args, proc.returncode, out, err))
    return done


def _check_all_ran(folder: Path, done: list[subprocess.CompletedProcess]) -> MlflowClient:
    assert [p.returncode for p in done] == [0] * len(done), "\n".join(p.stderr[-2000:] for p in done)
    client = MlflowClient(f"sqlite:///{folder / 'mlflow.db'}")  # the store opens afterwards
    experiment = client.get_experiment_by_name("at-once")
    runs = client.search_runs([experiment.experiment_id])
    assert sorted(r.info.run_id for r in runs) == sorted(p.stdout.strip() for p in done)
    assert sorted(r.info.run_name for r in runs) == [f"run-{i}" for i in range(len(done))]
    assert experiment.tags["mlflow.experimentKind"] == "custom_model_development"
    assert experiment.artifact_location == (folder / "mlruns").as_uri()
    assert not list(folder.glob("*.tmp-*")), "a private build folder was left"
    return client


def test_processes_that_open_a_new_store_at_once_all_succeed(tmp_path: Path) -> None:
    done = _open_at_once(tmp_path, 4)
    client = _check_all_ran(tmp_path, done)
    assert client.get_experiment("0").artifact_location == (tmp_path / "mlruns" / "0").as_uri()
    assert not any("alembic" in p.stderr for p in done)


def test_an_older_store_is_migrated_once_and_keeps_its_runs(tmp_path: Path) -> None:
    from alembic import command
    from mlflow.store.db import utils as db_utils
    from mlflow.store.tracking.dbmodels.initial_models import Base as InitialBase

    db = tmp_path / "mlflow.db"
    engine = db_utils.create_sqlalchemy_engine(f"sqlite:///{db}")
    InitialBase.metadata.create_all(engine)  # what MLflow of that time created, migrated up to its revision
    config = db_utils._get_alembic_config(str(engine.url))
    with engine.begin() as connection:
        config.attributes["connection"] = connection
        command.upgrade(config, OLD_REVISION)
    engine.dispose()
    with sqlite3.connect(db) as connection:
        connection.execute("INSERT INTO experiments (experiment_id, name, artifact_location, lifecycle_stage) "
                           "VALUES (7, 'kept', '/somewhere', 'active')")
    assert sqlite_store.schema_version(db) == OLD_REVISION

    done = _open_at_once(tmp_path, 3)
    client = _check_all_ran(tmp_path, done)
    assert sqlite_store.schema_version(db) == db_utils._get_latest_schema_revision()
    assert client.get_experiment_by_name("kept").experiment_id == "7"
    assert sum(p.stderr.count("Updating database tables") for p in done) == 1  # migrated once, by one of them


def test_a_killed_builders_half_made_store_is_removed_and_never_opened(tmp_path: Path) -> None:
    """A builder killed half-way leaves its private folder (a half-made store in it) and no ``mlflow.db``: the next
    process that opens the store removes that folder and builds a whole store."""
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    left = tmp_path / f"mlflow.db.tmp-{dead.pid}-0badc0de-{buildonce.HOST}"
    left.mkdir()
    (left / "mlflow.db").write_bytes(b"SQLite format 3\x00 cut short")
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    sqlite_store.ready(uri)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mlflow.db"]
    assert MlflowClient(uri).get_experiment("0").name == "Default"


def test_a_store_a_run_is_writing_to_is_waited_for_not_rebuilt(tmp_path: Path) -> None:
    """Found by the fault drill: a process opening the store while a run held its write lock read "database is
    locked" as "no schema", rebuilt the store and renamed the copy over it; the runs writing to it then failed with
    "attempt to write a readonly database" and their writes were lost."""
    import threading

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    sqlite_store.ready(uri)
    db = tmp_path / "mlflow.db"
    inode, version = db.stat().st_ino, sqlite_store.schema_version(db)
    writer = sqlite3.connect(db, check_same_thread=False)
    writer.execute("BEGIN EXCLUSIVE")  # a run in the middle of a write
    threading.Timer(6.0, writer.rollback).start()  # longer than sqlite3.connect's default 5 s busy timeout
    sqlite_store._READY.discard(uri)  # as a new process would
    sqlite_store.ready(uri)
    writer.close()
    assert db.stat().st_ino == inode and sqlite_store.schema_version(db) == version  # the same file, not a copy


def test_a_store_of_a_newer_mlflow_is_refused_in_one_line_and_left_as_it_is(tmp_path: Path) -> None:
    """A store a newer MLflow wrote (MLflow 3.17.2's, opened by 3.16.1: its revision unknown there) cannot be migrated:
    alembic's ``Can't locate revision`` traceback became one ConfigError naming the store."""
    db = tmp_path / "mlflow.db"
    sqlite_store.ready(f"sqlite:///{db}")
    newer = "f" * 12  # a revision this MLflow's migrations do not have, as 3.17.2's dc11669786a5 is for 3.16.1
    with sqlite3.connect(db) as connection:
        connection.execute("UPDATE alembic_version SET version_num = ?", (newer,))
    before = db.read_bytes()
    sqlite_store._READY.discard(f"sqlite:///{db}")  # opened above: this process checks a store once
    with pytest.raises(ConfigError, match=rf"{db} was written by a newer MLflow .*revision {newer} is unknown"):
        sqlite_store.ready(f"sqlite:///{db}")
    assert db.read_bytes() == before and sorted(p.name for p in tmp_path.iterdir()) == ["mlflow.db"]
    assert newer not in mlflow_private.known_schema_revisions()

"""Contract tests of the MLflow internals that nre_ray.tracking.mlflow_private reaches (MLflow 3.17): each pins the
signature or attribute relied on, so that an MLflow release that changes one fails here, naming the touchpoint,
before a run's store fails to open."""

from __future__ import annotations

import inspect
from pathlib import Path

from nre_ray.tracking import mlflow_private, sqlite_store


def _parameters(function: object) -> list[str]:
    return list(inspect.signature(function).parameters)  # type: ignore[arg-type]


def test_latest_schema_revision_is_what_mlflow_checks_a_store_against() -> None:
    from mlflow.store.db import utils as db_utils

    assert _parameters(db_utils._get_latest_schema_revision) == []
    assert "_get_latest_schema_revision()" in inspect.getsource(db_utils._verify_schema)
    revision = mlflow_private.latest_schema_revision()
    assert isinstance(revision, str) and revision


def test_upgrade_schema_takes_an_engine_of_the_uri() -> None:
    from mlflow.store.db import utils as db_utils

    assert _parameters(db_utils.create_sqlalchemy_engine) == ["db_uri"]
    assert _parameters(db_utils._upgrade_db) == ["engine"]


def test_create_tables_makes_a_store_of_the_latest_schema(tmp_path: Path) -> None:
    from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore

    assert _parameters(SqlAlchemyStore.__init__)[:3] == ["self", "db_uri", "default_artifact_root"]
    db = tmp_path / "mlflow.db"
    mlflow_private.create_tables(f"sqlite:///{db}", (tmp_path / "mlruns").as_uri())
    assert sqlite_store.schema_version(db) == mlflow_private.latest_schema_revision()
    mlflow_private.upgrade_schema(f"sqlite:///{db}")  # already the latest: nothing to do, nothing broken
    assert sqlite_store.schema_version(db) == mlflow_private.latest_schema_revision()


def test_known_schema_revisions_are_mlflows_migrations_from_the_first_to_the_latest() -> None:
    from mlflow.store.db import utils as db_utils

    assert _parameters(db_utils._get_alembic_config)[0] == "db_url"
    known = mlflow_private.known_schema_revisions()
    assert mlflow_private.latest_schema_revision() in known
    assert {"451aebb31d03", "71994744cf8e"} <= known  # the first migration, and the one test_sqlite_store starts at

"""The one module that reaches into MLflow's private internals (MLflow 3.16.1 and 3.17); the rest of nre_ray uses
MLflow's public API. Each function says what it reaches and why no public API serves. Nothing of MLflow is imported
until a function is called.

Touchpoints: each line is one thing a function here relies on, and the contract test in
tests/unit/test_mlflow_contracts.py that pins it; tests/unit/test_mlflow_private.py runs the functions on a real
sqlite store. The contract tests check that this table, the tests and this module's functions agree.

    latest_schema_revision -> mlflow.store.db.utils._get_latest_schema_revision() -> \
        test_contract_get_latest_schema_revision
    known_schema_revisions -> mlflow.store.db.utils._get_alembic_config(db_url) -> test_contract_get_alembic_config
    upgrade_schema -> mlflow.store.db.utils.create_sqlalchemy_engine, _upgrade_db(engine) -> test_contract_upgrade_db
    create_tables -> SqlAlchemyStore(db_uri, default_artifact_root).engine -> test_contract_sqlalchemy_store

MLflow internals other modules use by name or by value (no import of a private name; pinned all the same):

    serve.app.RelationServer -> mlflow.pyfunc.scoring_server.invocations(data, content_type, model, input_schema) -> \
        test_contract_scoring_server_invocations
    standin_cluster.mlflow_auth_env -> the auth server's ini keys and MLFLOW_AUTH_* variables -> \
        test_contract_auth_config
"""

from __future__ import annotations


def latest_schema_revision() -> str:
    """The alembic revision of the schema this MLflow writes: what it checks a sqlite store against when it opens it."""
    # Private: mlflow.store.db.utils._get_latest_schema_revision is what MLflow itself compares a store's
    # alembic_version with (_verify_schema); no public API says which schema revision this MLflow expects.
    from mlflow.store.db.utils import _get_latest_schema_revision

    return _get_latest_schema_revision()


def known_schema_revisions() -> set[str]:
    """Every alembic revision of this MLflow's schema migrations: a store at one of them can be migrated to
    :func:`latest_schema_revision`; a store at another one was written by a newer MLflow (MLflow 3.17.2's
    ``dc11669786a5`` is unknown to 3.16.1, whose migration then fails with alembic's ``Can't locate revision``)."""
    # Private: mlflow.store.db.utils._get_alembic_config is how MLflow finds its migration scripts (its
    # _get_latest_schema_revision reads their heads the same way); no public API lists them.
    from alembic.script import ScriptDirectory
    from mlflow.store.db.utils import _get_alembic_config

    script = ScriptDirectory.from_config(_get_alembic_config(db_url=""))
    return {revision.revision for revision in script.walk_revisions()}


def upgrade_schema(db_uri: str) -> None:
    """Migrate the MLflow database ``db_uri`` (e.g. ``sqlite:///PATH``) to this MLflow's schema, as ``mlflow db
    upgrade`` does."""
    # Private: `mlflow db upgrade` is a CLI only (mlflow/db.py's upgrade: an engine, then _upgrade_db); running it as a
    # subprocess would start a second Python and import MLflow again for each migration.
    from mlflow.store.db import utils as db_utils

    engine = db_utils.create_sqlalchemy_engine(db_uri)
    try:
        db_utils._upgrade_db(engine)
    finally:
        engine.dispose()


def create_tables(db_uri: str, default_artifact_root: str | None) -> None:
    """Create MLflow's tables and its Default experiment (artifacts under ``default_artifact_root``) in the new
    database ``db_uri``, and check its schema, then let it go."""
    # Private (not underscored, but no public API): opening a SqlAlchemyStore is how MLflow creates a database's
    # tables (mlflow.tracking's registry does it when a client first opens a sqlite:/// URI); a client cannot be made
    # to do it in a file other than the one it will use, and the store is built in a private folder first.
    from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore

    store = SqlAlchemyStore(db_uri, default_artifact_root)
    store.engine.dispose()

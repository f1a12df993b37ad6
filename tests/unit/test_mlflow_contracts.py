"""Contract tests of the MLflow internals nre_ray relies on (issue 36): one test per touchpoint of
nre_ray/tracking/mlflow_private.py (and of the MLflow internals other modules use), each pinning what nre_ray's
code uses, with a message naming the touchpoint and the nre_ray function that depends on it. Cheap: imports and
source text only, no store is opened (tests/unit/test_mlflow_private.py runs the functions on a real sqlite store).
The table of touchpoints is mlflow_private's module docstring; the last test checks that it, these tests and
mlflow_private's functions agree.
"""

from __future__ import annotations

import ast
import inspect
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from nre_ray.tracking import mlflow_private


def _params(function: Callable[..., Any]) -> list[str]:
    return list(inspect.signature(function).parameters)


def test_contract_get_latest_schema_revision() -> None:
    from mlflow.store.db import utils as db_utils

    assert _params(db_utils._get_latest_schema_revision) == [], \
        "mlflow_private.latest_schema_revision relies on mlflow.store.db.utils._get_latest_schema_revision()"
    assert "_get_latest_schema_revision()" in inspect.getsource(db_utils._verify_schema), \
        ("mlflow_private.latest_schema_revision relies on MLflow checking a store against "
         "_get_latest_schema_revision() (mlflow.store.db.utils._verify_schema)")


def test_contract_get_alembic_config() -> None:
    from mlflow.store.db import utils as db_utils

    assert _params(db_utils._get_alembic_config)[0] == "db_url", \
        "mlflow_private.known_schema_revisions relies on mlflow.store.db.utils._get_alembic_config(db_url)"
    config = db_utils._get_alembic_config(db_url="")
    assert Path(config.get_main_option("script_location")).is_dir(), \
        "mlflow_private.known_schema_revisions relies on _get_alembic_config's script_location (the migrations)"


def test_contract_upgrade_db() -> None:
    from mlflow.store.db import utils as db_utils

    assert _params(db_utils.create_sqlalchemy_engine) == ["db_uri"], \
        "mlflow_private.upgrade_schema relies on mlflow.store.db.utils.create_sqlalchemy_engine(db_uri)"
    assert _params(db_utils._upgrade_db) == ["engine"], \
        "mlflow_private.upgrade_schema relies on mlflow.store.db.utils._upgrade_db(engine)"


def test_contract_sqlalchemy_store() -> None:
    from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore

    assert _params(SqlAlchemyStore.__init__)[:3] == ["self", "db_uri", "default_artifact_root"], \
        ("mlflow_private.create_tables relies on mlflow.store.tracking.sqlalchemy_store.SqlAlchemyStore(db_uri, "
         "default_artifact_root)")
    assert "self.engine = " in inspect.getsource(SqlAlchemyStore.__init__), \
        "mlflow_private.create_tables relies on SqlAlchemyStore.engine (disposed once the tables are made)"


def test_contract_scoring_server_invocations() -> None:
    from mlflow.pyfunc import scoring_server

    assert _params(scoring_server.invocations) == ["data", "content_type", "model", "input_schema"], \
        ("serve.app.RelationServer relies on mlflow.pyfunc.scoring_server.invocations(data, content_type, model, "
         "input_schema)")
    assert list(scoring_server.InvocationsResponse._fields) == ["response", "status", "mimetype"], \
        "serve.app.RelationServer relies on the InvocationsResponse's response, status, mimetype"


def test_contract_auth_config() -> None:
    import importlib.util

    from mlflow import environment_variables as env

    for name in ("MLFLOW_AUTH_CONFIG_PATH", "MLFLOW_AUTH_ADMIN_PASSWORD", "MLFLOW_FLASK_SERVER_SECRET_KEY"):
        assert getattr(env, name, None) is not None and getattr(env, name).name == name, \
            f"standin_cluster.mlflow_auth_env relies on MLflow reading {name}"
    # read as text: importing mlflow.server.auth loads MLflow's server apps (seconds)
    spec = importlib.util.find_spec("mlflow")
    assert spec is not None and spec.origin is not None
    source = (Path(spec.origin).parent / "server" / "auth" / "config.py").read_text(encoding="utf-8")
    for key in ("default_permission", "database_uri", "admin_username", "authorization_function",
                "auth_cache_ttl_seconds"):
        assert f'"{key}"' in source, f"standin_cluster (the auth ini it writes) relies on MLflow reading {key!r}"
    assert 'DEFAULT_AUTHORIZATION_FUNCTION = "mlflow.server.auth:authenticate_request_basic_auth"' in source, \
        "standin_cluster (the auth ini's authorization_function) relies on mlflow.server.auth's basic auth"


TABLE_LINE = re.compile(r"^\s*([\w.]+) -> (\S.*?)\s+->\s+(test_contract_\w+)\s*$")


def test_every_mlflow_touchpoint_has_a_contract_test() -> None:
    """Every function of mlflow_private is in its table with a contract test (each reaches an MLflow internal);
    every test in the table exists here, and every contract test here is in the table."""
    table = [m.groups() for m in map(TABLE_LINE.match, (mlflow_private.__doc__ or "").splitlines()) if m]
    assert len(table) >= 6, "mlflow_private's docstring lost its table of touchpoints"
    tree = ast.parse(Path(mlflow_private.__file__).read_text(encoding="utf-8"))
    functions = {node.name for node in tree.body if isinstance(node, ast.FunctionDef)}
    in_table = {function for function, _, _ in table}
    assert functions <= in_table, f"mlflow_private functions with no contract test in the table: {functions - in_table}"
    tests = {name for name in globals() if name.startswith("test_contract_")}
    listed = {test for _, _, test in table}
    assert listed == tests, \
        f"the table and the contract tests disagree: only in the table {listed - tests}, only here {tests - listed}"

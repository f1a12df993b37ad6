"""Test-session fixtures: one real local Ray cluster for the whole session (started on first use)."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest

pytest_plugins = ["tests.objectstore",  # object_store: a real S3-compatible server (moto_server)
                  "tests.standin_session"]  # standin_cluster: one stand-in for the session

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared" / "datasets"

for key, value in {"RAY_USAGE_STATS_ENABLED": "0",
                   "RAY_AUTH_MODE": "disabled", "RAY_DATA_DISABLE_PROGRESS_BARS": "1",
                   "RAY_TRAIN_ENABLE_PRINT_PATCH": "0",
                   # MLflow's telemetry is off in a test only once the test runs (PYTEST_CURRENT_TEST); modules that
                   # import MLflow at collection would write ~/.config/mlflow/telemetry.json.
                   "MLFLOW_DISABLE_TELEMETRY": "true",
                   # Keeps Train's placement-group cleaner from asking another cluster's dashboard (stack.md).
                   "RAY_API_SERVER_ADDRESS": "http://127.0.0.1:9",
                   # Each command a test starts (in this process or as a subprocess) starts a private local Ray, as
                   # a user's first command does; test_runs_at_once, test_docs_commands and the command matrix's
                   # cells share one (tests/session_ray.py).
                   "NRE_RAY_OWN_RAY": "1",
                   # ... without Ray's dashboard (about 4 s of CPU less for each of the suite's ~100 starts of a
                   # local Ray); the tests of the dashboard, the State API's pin and a user's shell set it back.
                   "NRE_RAY_DASHBOARD": "0"}.items():
    os.environ.setdefault(key, value)


@pytest.fixture(scope="session")
def ray_cluster():
    """A local Ray with 4 logical CPUs (on 2 cores), shared by every test that needs one; on the loopback address,
    as the commands' own local Rays are (nothing of it listens on the network), and without its dashboard (the State
    API is pinned to a closed port above; no test asks this Ray's dashboard)."""
    import ray

    from nre_ray.cluster.ray_private import loopback_node

    with loopback_node() as on_loopback:
        ray.init(address="local", num_cpus=4, logging_level=logging.WARNING, log_to_driver=True,
                 include_dashboard=False, **on_loopback)
    yield ray
    ray.shutdown()


@pytest.fixture(scope="session", autouse=True)
def ray_address_file_kept():
    """Ray's address file (RAY_TMPDIR/ray/ray_current_cluster) as it was before the session. ray.cluster_utils.Cluster
    (the preemption and spot-drain tests) records its head there as `ray start` does and leaves it behind when it
    shuts down; a later bare ``ray.init()`` on this machine, a user's, would then try to join that dead cluster."""
    from ray._common.utils import get_ray_address_file

    path = Path(get_ray_address_file(None))
    before = path.read_text() if path.exists() else None
    yield
    now = path.read_text() if path.exists() else None
    if now != before:
        if before is None:
            path.unlink(missing_ok=True)
        else:
            path.write_text(before)


@pytest.fixture(autouse=True)
def tracking_uri_kept():
    """No test leaves MLFLOW_TRACKING_URI (or the registry's) other than it found it. ``mlflow.set_tracking_uri``
    writes the variable too, and every later test of the same process would then resolve ``runs:/`` and ``models:/``
    URIs against that test's store (a clean-clone run failed so): set it only inside
    ``nre_ray.tracking.store.mlflow_settings`` or with monkeypatch."""
    names = ("MLFLOW_TRACKING_URI", "MLFLOW_REGISTRY_URI")
    before = {name: os.environ.get(name) for name in names}
    yield
    after = {name: os.environ.get(name) for name in names}
    if after != before:
        for name, value in before.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        pytest.fail(f"the test left the process's MLflow URIs changed: {before} before, {after} after")


@pytest.fixture
def shared_datasets() -> Path:
    """``../shared/datasets`` beside the checkout (read in place, never copied into the repo)."""
    if not SHARED.is_dir():
        pytest.skip(f"{SHARED} is not here")
    return SHARED


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Folders and markers agree: every test under tests/integration is marked ``integration`` (so that
    ``make test-fast``, ``-m "not integration"``, runs exactly tests/unit), and a test under tests/unit that needs the
    marker (a real Ray worker group, a server) is a collection error: it belongs in tests/integration."""
    integration = REPO / "tests" / "integration"
    misplaced = []
    for item in items:
        if Path(item.path).is_relative_to(integration):
            item.add_marker(pytest.mark.integration)
        elif item.get_closest_marker("integration") is not None:
            misplaced.append(item.nodeid)
    if misplaced:
        raise pytest.UsageError("tests marked integration outside tests/integration (move them there): "
                                + ", ".join(misplaced))


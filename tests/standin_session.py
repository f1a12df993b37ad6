"""One stand-in (``nre_ray.cluster.standin``) for every test of the session that only needs a cluster to run on.

* :func:`standin_cluster` (session fixture): the stand-in on free ports, started on first use and stopped at the end
  of the session, with the bundled sample in ``s3://nre-ray/nre_ray/data``. Authentication on (the default): a Ray
  token, an MLflow password and object store keys of its own. It does not log this process's MLflow client in
  (that would reach every later test of the session): a module that talks to its MLflow server does so in its own
  fixture, ``environ(state.mlflow_login())``.
* Its users run one after the other, in the order of their ``standin_order`` marker (0, 1 by default, 2), at the
  place of the first of them: the tests of an order-0 module (tests/integration/test_standin.py) see the stand-in as
  ``up`` left it (no autoscaled node yet); an order-2 test (``down`` and ``up`` again) runs last.

Tests of the stand-in's start as a user types it keep a stand-in of their own: the rehearsal of docs/cluster.md
(tests/integration/test_cluster_docs.py) runs ``standin up`` and ``down`` as written.
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from nre_ray.cluster import processes, standin
from tests.procs import free_port, free_port_between, kill_all, mentioning, with_env

FIXTURE = "standin_cluster"
SAMPLE = Path(__file__).resolve().parents[1] / "nre_ray" / "data" / "sample"


@dataclass
class SharedStandin:
    """The session's stand-in: ``state`` is the running one (a test that stops it and starts it again, as
    ``standin down``/``up`` do, calls :meth:`restarted`)."""

    folder: Path
    state: standin.Standin
    endpoints: set[str]  # the object store's endpoint of each stand-in started in the folder

    def restarted(self) -> standin.Standin:
        """After ``down`` and ``up`` in :attr:`folder`: the new stand-in, with the sample uploaded again (its bucket
        starts empty), for the tests that run after."""
        self.state = standin.Standin.load(self.folder)
        self.endpoints.add(self.state.endpoint)
        upload_sample(self.state)
        return self.state


def upload_sample(state: standin.Standin) -> None:
    """The bundled sample in ``s3://BUCKET/nre_ray/data``."""
    fs = state.filesystem()
    for path in SAMPLE.iterdir():
        with fs.open_output_stream(f"{state.bucket}/nre_ray/data/{path.name}") as out:
            out.write(path.read_bytes())


def left_of(state: standin.Standin) -> dict[int, str]:
    """What runs of ``state``'s stand-in: its recorded processes, those with its session mark or naming its Ray
    folder (as /proc shows them)."""
    pids = {p.pid for p in state.processes if p.current()} | set(with_env(standin.SESSION_ENV, state.session))
    return {pid: p.cmdline for pid in pids | set(mentioning(state.ray_temp)) if (p := processes.identify(pid))}


@pytest.fixture(scope="session")
def standin_cluster() -> Iterator[SharedStandin]:
    """The stand-in on free ports, its GCS port among the ports ``ray start`` would give its workers. Its folder is
    made open to all (0755, as a user's own folder may be) before ``up``, which makes it private and says so once.
    At the end, ``down`` leaves nothing of it, nor any process with its object store's endpoint in its environment
    (every process of the stand-in has it, and so has every command a test ran against it)."""
    folder = Path(tempfile.mkdtemp(prefix="nrs_", dir="/tmp"))  # short: Ray's socket paths live under it
    folder.chmod(0o755)
    said: list[str] = []
    state = standin.up(folder, ports={"s3": free_port(), "gcs": free_port_between(*standin.RAY_WORKER_PORTS),
                                      "dashboard": free_port(), "mlflow": free_port()}, say=said.append)
    shared = SharedStandin(folder, state, {state.endpoint})
    try:
        assert said == [f"made {folder} private (mode 700, was 755): it holds the stand-in's MLflow store, logs and "
                        "secrets"], said
        upload_sample(state)
        yield shared
    finally:
        # (the one started again by a test that stopped before it called restarted())
        last = standin.Standin.load(folder) if (folder / standin.STATE_FILE).exists() else shared.state
        standin.down(folder)
        left = {**left_of(state), **left_of(shared.state), **left_of(last)}
        strays = {pid: processes.cmdline(pid) for endpoint in shared.endpoints | {last.endpoint}
                  for pid in with_env("AWS_ENDPOINT_URL", endpoint)}
        kill_all(strays)
        assert not left, f"stand-in processes left behind after down: {left}"
        assert not strays, f"processes with the stand-in's store endpoint left behind after down: {strays}"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The users of :func:`standin_cluster` run one after the other, by their ``standin_order`` marker (stable
    within one order), where the first of them was."""
    users = [item for item in items if FIXTURE in getattr(item, "fixturenames", ())]
    if not users:
        return

    def order(item: pytest.Item) -> int:
        marker = item.get_closest_marker("standin_order")
        return marker.args[0] if marker else 1

    first = items.index(users[0])
    others = [item for item in items if FIXTURE not in getattr(item, "fixturenames", ())]
    items[:] = others[:first] + sorted(users, key=order) + others[first:]


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "standin_order(n): where a user of the session's stand-in runs among its "
                                       "users: 0 first (it needs the stand-in as up left it), 1, 2 last (it stops it)")

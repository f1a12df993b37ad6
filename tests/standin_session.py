"""One stand-in (``nre_ray.cluster.standin_cluster``) for every test of the session that only needs a cluster to run on.

* :func:`standin_cluster` (session fixture): the stand-in on free ports, started on first use and stopped right after
  its last user, with the bundled sample in ``s3://nre-ray/nre_ray/data``. Authentication on (the default): a Ray
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

from nre_ray.cluster import processes
from nre_ray.cluster import standin_cluster as standin
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


#: The session's stand-in while it runs (started by :func:`standin_cluster`, stopped by :func:`_stop_shared`).
_ACTIVE: list[SharedStandin] = []
#: Whether it was stopped after its last user (a user after that would find it gone).
_STOPPED: list[bool] = []


@pytest.fixture(scope="session")
def standin_cluster() -> Iterator[SharedStandin]:
    """The stand-in on free ports, its GCS port among the ports ``ray start`` would give its workers. Its folder is
    made open to all (0755, as a user's own folder may be) before ``up``, which makes it private and says so once.
    It is stopped right after its last user (:func:`pytest_runtest_teardown`), not at the end of the session: its
    idle processes (a Ray head, an MLflow server, the store) would take CPU from every later test."""
    folder = Path(tempfile.mkdtemp(prefix="nrs_", dir="/tmp"))  # short: Ray's socket paths live under it
    folder.chmod(0o755)
    said: list[str] = []
    state = standin.up(folder, ports={"s3": free_port(), "gcs": free_port_between(*standin.RAY_WORKER_PORTS),
                                      "dashboard": free_port(), "mlflow": free_port()}, say=said.append)
    shared = SharedStandin(folder, state, {state.endpoint})
    _ACTIVE.append(shared)
    try:
        assert said == [f"made {folder} private (mode 700, was 755): it holds the stand-in's MLflow store, logs and "
                        "secrets"], said
        upload_sample(state)
        yield shared
    finally:
        _stop_shared()


def _stop_shared() -> None:
    """``down`` for the session's stand-in, if it runs; then nothing of it may be left, nor any process with its
    object store's endpoint in its environment (every process of the stand-in has it, and so has every command a
    test ran against it)."""
    if not _ACTIVE:
        return
    shared = _ACTIVE.pop()
    _STOPPED.append(True)
    folder, state = shared.folder, shared.state
    # (the one started again by a test that stopped before it called restarted())
    last = standin.Standin.load(folder) if (folder / standin.STATE_FILE).exists() else state
    standin.down(folder)
    left = {**left_of(state), **left_of(last)}
    strays = {pid: processes.cmdline(pid) for endpoint in shared.endpoints | {last.endpoint}
              for pid in with_env("AWS_ENDPOINT_URL", endpoint)}
    kill_all(strays)
    assert not left, f"stand-in processes left behind after down: {left}"
    assert not strays, f"processes with the stand-in's store endpoint left behind after down: {strays}"


def _uses(item: pytest.Item | None) -> bool:
    return item is not None and FIXTURE in getattr(item, "fixturenames", ())


def pytest_runtest_setup(item: pytest.Item) -> None:
    """A user of the stand-in after its last one (they run one after the other: see below) would find it stopped."""
    if _uses(item) and _STOPPED:
        raise RuntimeError("the session's stand-in was stopped after what looked like its last user; its users must "
                           "run one after the other (tests/standin_session.py orders them)")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None):
    """After the last user of the stand-in (the next test does not use it), and that user's module fixtures: stop
    it (a leftover is an error of that test's teardown)."""
    result = yield
    if _uses(item) and not _uses(nextitem):
        _stop_shared()
    return result


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

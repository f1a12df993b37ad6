"""One stand-in (``nre_ray.cluster.standin_cluster``) for every test of the session that only needs a cluster to run on.

* :func:`standin_cluster` (session fixture): the stand-in on free ports, started on first use and stopped right after
  its last user, with the bundled sample in ``s3://nre-ray/nre_ray/data``. Authentication on (the default): a Ray
  token, an MLflow password and object store keys of its own. It does not log this process's MLflow client in
  (that would reach every later test of the session): a module that talks to its MLflow server does so in its own
  fixture, ``environ(state.mlflow_login())``.
* Its users run first, one after the other, in the order of their ``standin_order`` marker (0, 1 by default, 2),
  and in one process when pytest-xdist runs the suite in several (``make test``:
  :class:`StandinTogether`): the tests of an order-0 module (tests/integration/test_standin.py) see the stand-in as
  ``up`` left it (no autoscaled node yet); an order-2 test (``down`` and ``up`` again) runs last.

Tests of the stand-in's start as a user types it keep a stand-in of their own: the rehearsal of docs/cluster.md
(tests/integration/test_cluster_docs.py) runs ``standin up`` and ``down`` as written.
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from xdist.scheduler import LoadScopeScheduling

from nre_ray.cluster import processes
from nre_ray.cluster import standin_cluster as standin
from tests.procs import free_port, free_port_between, kill_all, mentioning, with_env

FIXTURE = "standin_cluster"
#: The test modules whose tests use :func:`standin_cluster` (collection fails for a user elsewhere): with pytest-xdist
#: they run in one process (:class:`StandinTogether`).
USER_MODULES = ("tests/integration/test_standin.py", "tests/integration/test_command_matrix.py")
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
    up = (folder / standin.STATE_FILE).exists()  # (not after a test that failed between its down and its up)
    last = standin.Standin.load(folder) if up else state
    if up:
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
    """The users of :func:`standin_cluster` run first, one after the other, by their ``standin_order`` marker
    (stable within one order): first because they take longest, which matters when pytest-xdist shares the tests out
    (:class:`StandinTogether`)."""
    users = [item for item in items if FIXTURE in getattr(item, "fixturenames", ())]
    if not users:
        return

    def order(item: pytest.Item) -> int:
        marker = item.get_closest_marker("standin_order")
        return marker.args[0] if marker else 1

    others = [item for item in items if FIXTURE not in getattr(item, "fixturenames", ())]
    items[:] = sorted(users, key=order) + others
    strays = sorted({item.nodeid.split("::")[0] for item in users} - set(USER_MODULES))
    if strays:  # pytest-xdist would run them in another process, with a stand-in of its own
        raise pytest.UsageError(f"{', '.join(strays)} use the session's stand-in: add them to USER_MODULES in "
                                "tests/standin_session.py")


class StandinTogether(LoadScopeScheduling):
    """How pytest-xdist hands out the tests when ``make test`` runs them in several processes (``-n 2``): a module at
    a time (``--dist loadscope``: its module fixtures, a trained model or a server, are set up once), to whichever
    process is free, in the order of collection (the stand-in's users first, then tests/integration, then
    tests/unit), except that the modules that use the stand-in (:data:`USER_MODULES`) go to one process as one unit,
    in their order. (``--dist loadgroup`` with
    ``xdist_group`` marks would group them too, but pytest-xdist 3.8 writes the group into ``Item._nodeid``, which
    pytest 9.2 no longer reads.)"""

    def __init__(self, config: pytest.Config, log: Any = None) -> None:
        super().__init__(config, log)
        config.option.loadscopereorder = False  # (by the number of tests: unit modules first, the longest last)

    def _split_scope(self, nodeid: str) -> str:
        return "standin" if nodeid.split("::")[0] in USER_MODULES else super()._split_scope(nodeid)


class _Scheduling:
    """The plugin that gives pytest-xdist :class:`StandinTogether` (registered only where pytest-xdist is loaded)."""

    @pytest.hookimpl
    def pytest_xdist_make_scheduler(self, config: pytest.Config, log: Any) -> LoadScopeScheduling | None:
        return StandinTogether(config, log) if config.getvalue("dist") == "load" else None


def pytest_configure(config: pytest.Config) -> None:
    if config.pluginmanager.hasplugin("xdist"):
        config.pluginmanager.register(_Scheduling(), "standin-together")
    config.addinivalue_line("markers", "standin_order(n): where a user of the session's stand-in runs among its "
                                       "users: 0 first (it needs the stand-in as up left it), 1, 2 last (it stops it)")

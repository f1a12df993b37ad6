"""One local Ray shared by the nre_ray commands a user runs on this machine at the same time.

A command given no Ray address (no ``--address``, no RAY_ADDRESS) used to start a private Ray of its own. Started
together, four runs started four Rays on two cores, and a Ray whose node did not register within Ray's fixed 30 s
failed its run. Now the first such command starts a Ray in a process of its own, the *host*
(``python -m nre_ray.cluster.shared_ray``), and every later one whose environment is the same joins it; the host stops
its Ray once no command that uses it runs any more.

What the commands agree on lives in the user's registry folder, ``$RAY_TMPDIR/nre_ray-<uid>/local-ray`` (``/tmp``
without RAY_TMPDIR; mode 0700, refused when another user owns it): ``lock`` (``fcntl.flock``: every look at or change
of the record is made holding it), ``record.json`` (the host's GCS address and dashboard, its process id and start
time, the environment fingerprint, the node's resources, and the commands that use it, each as process id and start
time: :mod:`nre_ray.cluster.processes`) and ``host.log`` (the host's own output). Rules:

- A command joins only a Ray whose host still runs, whose GCS answers within :data:`ANSWER_S`, and whose environment
  fingerprint (:func:`fingerprint`) is this command's: Ray's workers get the host's environment, not the joining
  command's, so a command whose environment differs starts a private Ray, as before.
- A record whose host has ended, or whose GCS does not answer, is stale: it is removed (its host stopped) and a new
  host started.
- The host looks at the commands of the record every :data:`CHECK_S` seconds, holding the lock; when none still runs
  it removes the record, releases the lock and stops Ray. A command registering at that moment either finds the record
  (and the host waits for it) or finds none and starts a new host: none is lost.
- The host runs the watchdog (:mod:`nre_ray.cluster.watchdog`): killed with SIGKILL, it leaves nothing of its Ray.
  A joining command killed so leaves nothing either: Ray ends a job's workers when its driver dies, and the host stops
  Ray once no command is left.

Resources: the shared node has :data:`CPU_FACTOR` logical CPUs per core, while each command still sizes its workers
as if it had the machine to itself (:func:`nre_ray.cluster.session.cluster` divides the CPUs back). Four commands
started together then fit on the node at once, as four private Rays did (each of one logical CPU per core), and a
fifth waits for room (its worker group's placement timeout, as on any full cluster). GPUs are not multiplied: GPU
runs queue for them.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from nre_ray import storage
from nre_ray.cluster import processes
from nre_ray.cluster.local_settings import QUIET_ENV, dashboard_args, env_switch

#: Set to 1 (or true, yes): every command starts a private local Ray, as before sharing (tests that need one, or a
#: user who wants a run apart). ``serve`` always starts a private one: Serve is one per Ray cluster.
OWN_RAY_ENV = "NRE_RAY_OWN_RAY"
#: Logical CPUs of the shared node per core of this machine (see the module docstring).
CPU_FACTOR = 4
#: How often the host looks whether a command still uses its Ray, in seconds.
CHECK_S = 1.0
#: How long a joining command waits for the shared Ray's GCS to answer one call.
ANSWER_S = 10.0
#: How long a command waits for the host it started to have its Ray up (Ray itself gives its node 30 s).
START_WAIT_S = 120.0
#: How long a command waits for the registry's lock (another command may be starting the host meanwhile).
LOCK_WAIT_S = START_WAIT_S + 60.0

#: Environment variables that do not reach Ray's workers in any way that matters, or that differ between two shells
#: of one user for no reason: left out of the :func:`fingerprint`.
VOLATILE = {"PWD", "OLDPWD", "SHLVL", "_", "PYTEST_CURRENT_TEST", "COLUMNS", "LINES", "RAY_COLOR_PREFIX", "PS1",
            "PS2", "PROMPT_COMMAND", "SSH_CLIENT", "SSH_CONNECTION", "SSH_TTY", "WINDOWID", "HISTFILE",
            "COLORTERM", "LS_COLORS", "TMUX_PANE", "STY", "WINDOW", OWN_RAY_ENV}
VOLATILE_PREFIXES = ("TERM",)

log = logging.getLogger("nre_ray")


def wanted() -> bool:
    """Whether commands share the local Ray (:data:`OWN_RAY_ENV` not set to a true value)."""
    return not env_switch(OWN_RAY_ENV, default=False)


def registry() -> Path:
    """The user's registry folder, made (0700) if missing. OSError when it is not this user's own folder."""
    base = Path(os.environ.get("RAY_TMPDIR") or "/tmp")
    top = base / f"nre_ray-{os.getuid()}"
    folder = top / "local-ray"
    for path in (top, folder):
        with contextlib.suppress(FileExistsError):
            path.mkdir(mode=0o700)
        info = path.lstat()
        if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid():
            raise OSError(f"{path} is not a folder of this user's: the shared local Ray's registry cannot be kept "
                          f"there (set {OWN_RAY_ENV}=1, or RAY_TMPDIR to a folder of yours)")
        if stat.S_IMODE(info.st_mode) != 0o700:
            path.chmod(0o700)
    return folder


def fingerprint(environ: dict[str, str] | None = None) -> str:
    """What decides how the shared Ray's workers run: every variable of ``environ`` (default :func:`ray_environ`) but
    the volatile ones (:data:`VOLATILE`, ``TERM*``), the Python interpreter, and where nre_ray and Ray are imported
    from. Two commands with the same fingerprint get the same workers from either's Ray."""
    import nre_ray

    env = ray_environ() if environ is None else environ
    kept = sorted((k, v) for k, v in env.items() if k not in VOLATILE and not k.startswith(VOLATILE_PREFIXES))
    what = {"env": kept, "python": sys.executable, "nre_ray": str(Path(nre_ray.__file__).parent),
            "ray": _ray_location()}
    return hashlib.sha256(json.dumps(what, sort_keys=True).encode()).hexdigest()


def ray_environ() -> dict[str, str]:
    """The environment the shared Ray is started with, and whose :func:`fingerprint` a command compares: this
    process's environment, without the variables that appeared after it started (some import in a thread of the
    command's, MLflow's own) other than those nre_ray sets before Ray starts (:data:`local_settings.QUIET_ENV`,
    RAY_AUTH_MODE). Two commands started alike then agree however far their start-up had got."""

    initial = processes.environ(os.getpid())
    if not initial:  # not readable here: the environment as it is
        return dict(os.environ)
    ours = {*QUIET_ENV, "RAY_AUTH_MODE", "RAY_COLOR_PREFIX", OWN_RAY_ENV}
    return {k: v for k, v in os.environ.items() if k in initial or k in ours}


def _ray_location() -> str:
    import importlib.util

    spec = importlib.util.find_spec("ray")
    return str(spec.origin) if spec is not None else ""


def locked(folder: Path, wait: float = LOCK_WAIT_S) -> contextlib.AbstractContextManager[None]:
    """Hold the registry's lock while the block runs; TimeoutError (:class:`nre_ray.storage.LockTimeout`) after
    ``wait`` s (another command holds it)."""
    return storage.locked(folder / "lock", wait=wait)


def read(folder: Path) -> dict[str, Any] | None:
    """The record (hold the lock), or None when there is none or it cannot be read."""
    try:
        record = json.loads((folder / "record.json").read_text())
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) else None


def write(folder: Path, record: dict[str, Any]) -> None:
    """Replace the record at once (a reader sees the old one or the new one, never half of one)."""
    storage.write_atomic(folder / "record.json", json.dumps(record).encode())


def remove(folder: Path) -> None:
    (folder / "record.json").unlink(missing_ok=True)


def me() -> list[int]:
    """This process as the record keeps it: ``[pid, start time]``."""
    return [os.getpid(), processes.started()]


def process_of(entry: list[int] | None) -> processes.Process | None:
    """The process ``[pid, start time]`` while it still runs (not another program under its id), else None."""
    if not entry or len(entry) != 2:
        return None
    return processes.find(int(entry[0]), int(entry[1]))


def running(entry: list[int] | None) -> bool:
    """Whether the process ``[pid, start time]`` still runs (not another program under its id)."""
    return process_of(entry) is not None


def host_of(record: dict[str, Any]) -> processes.Process | None:
    """The record's host process while it runs, else None."""
    return process_of(record.get("host"))


def answers(gcs: str, wait: float = ANSWER_S) -> bool:
    """Whether the GCS at ``gcs`` (``HOST:PORT``) answers one call within ``wait`` s."""
    from nre_ray.cluster.ray_private import ask_gcs

    host, _, port = gcs.rpartition(":")
    try:
        return ask_gcs(host, int(port), wait)[0] == "OK"
    except Exception:  # a token refusal, a bad port: not a Ray to join
        return False


#: The working folder of the command whose job's workers :func:`enter_command_folder` moves there.
FOLDER_ENV = "NRE_RAY_COMMAND_FOLDER"
#: A worker setup hook of the command's own, run after :func:`enter_command_folder`.
NEXT_HOOK_ENV = "NRE_RAY_NEXT_SETUP_HOOK"


def job_runtime_env(runtime_env: dict[str, Any] | None, folder: str) -> dict[str, Any]:
    """The job ``runtime_env`` a command joins the shared Ray with: its own ``runtime_env`` plus a worker setup hook
    (:func:`enter_command_folder`) that starts each worker of its job in ``folder``, the command's working folder.
    A private local Ray's workers start there because its raylet was started by the command; the shared Ray's
    raylet was started from the first command's folder, where another command's relative paths (``--data-dir data``
    read by a Ray Data task) name nothing. A hook of the command's own runs after it."""
    env = dict(runtime_env or {})
    env_vars = {**env.get("env_vars", {}), FOLDER_ENV: folder}
    if env.get("worker_process_setup_hook"):
        hook = env["worker_process_setup_hook"]
        if not isinstance(hook, str):
            raise ValueError("a worker setup hook joined to the shared Ray is given by its module path")
        env_vars[NEXT_HOOK_ENV] = hook
    return {**env, "env_vars": env_vars, "worker_process_setup_hook": f"{__name__}.enter_command_folder"}


def enter_command_folder() -> None:
    """Worker setup hook (:func:`job_runtime_env`): move this worker into its command's working folder, then run the
    command's own hook, if any."""
    folder = os.environ.get(FOLDER_ENV)
    if folder and os.path.isdir(folder):
        os.chdir(folder)
    hook = os.environ.get(NEXT_HOOK_ENV)
    if hook:
        import importlib

        module, _, name = hook.rpartition(".")
        getattr(importlib.import_module(module), name)()


def join_or_start(cpus: int, gpus: int, mine: str) -> tuple[str, dict[str, Any] | None]:
    """Register this process with the shared local Ray, starting its host first where none runs.

    Returns ``("joined", record)`` or ``("started", record)``; ``("own", None)`` where a shared Ray runs with
    another environment (the caller starts a private Ray). ``cpus``, ``gpus``: this machine's (the node gets
    :data:`CPU_FACTOR` logical CPUs per core); ``mine``: this process's :func:`fingerprint`. RuntimeError with the
    host's reason when its Ray did not start."""
    folder = registry()
    with locked(folder):
        record = read(folder)
        if record is not None:
            host = host_of(record)
            if host is not None and record.get("gcs") and answers(record["gcs"]):
                if record.get("fingerprint") != mine:
                    return "own", None
                record["runs"] = [r for r in record.get("runs", []) if running(r)] + [me()]
                write(folder, record)
                return "joined", record
            if host is not None:  # its GCS does not answer: stop what is left and start anew
                host.signal(signal.SIGTERM)
            remove(folder)
        return "started", _start_host(folder, cpus, gpus, mine)


def _start_host(folder: Path, cpus: int, gpus: int, mine: str) -> dict[str, Any]:
    """Start the host (holding the lock) with this process registered, and wait for its record to name its GCS."""
    write(folder, {"fingerprint": mine, "runs": [me()], "host": None, "gcs": None})
    host_log = open(folder / "host.log", "wb")  # handed to the host process
    with host_log:
        proc = subprocess.Popen([sys.executable, "-m", "nre_ray.cluster.shared_ray", str(folder), str(cpus),
                                 str(gpus), mine], cwd=folder, env=ray_environ(), stdin=subprocess.DEVNULL,
                                stdout=host_log, stderr=subprocess.STDOUT, start_new_session=True, close_fds=True)
    deadline = time.monotonic() + START_WAIT_S
    while time.monotonic() < deadline:
        record = read(folder) or {}
        if record.get("gcs"):
            return record
        if record.get("error") or proc.poll() is not None:
            remove(folder)
            raise RuntimeError(record.get("error") or f"the shared Ray's host ended ({proc.returncode}): see "
                               f"{folder / 'host.log'}")
        time.sleep(0.1)
    proc.terminate()
    remove(folder)
    raise RuntimeError(f"the shared local Ray did not start within {START_WAIT_S:g} s: see {folder / 'host.log'}")


# the host


class _Stop(Exception):
    """SIGTERM or SIGINT to the host."""


def _raise_stop(signum: int, frame: Any) -> None:
    raise _Stop()


def host(folder: Path, cpus: int, gpus: int, mine: str) -> int:
    """``python -m nre_ray.cluster.shared_ray FOLDER CPUS GPUS FINGERPRINT``: start the shared Ray, name it in the
    record, and stop it once no command of the record runs any more."""
    import ray

    from nre_ray.cluster import watchdog
    from nre_ray.cluster.ray_private import loopback_node

    signal.signal(signal.SIGTERM, _raise_stop)
    signal.signal(signal.SIGINT, _raise_stop)
    watchdog.start()  # a SIGKILL of the host leaves nothing of its Ray
    try:
        pinned = dashboard_args()
        with loopback_node() as on_loopback:
            ray.init(address="local", num_cpus=cpus * CPU_FACTOR, num_gpus=gpus, logging_level=logging.WARNING,
                     log_to_driver=False, **on_loopback, **pinned)
    except _Stop:
        return 0
    except Exception as err:  # told to the command that waits for this host
        # The command that started this host holds the lock while it waits for the record: written without it.
        write(folder, {**(read(folder) or {}), "error": f"the local Ray did not start: {_first_line(err)}"})
        return 1
    try:
        record = read(folder) or {"fingerprint": mine, "runs": []}
        record.update(host=me(), gcs=ray.get_runtime_context().gcs_address,
                      dashboard=os.environ.get("RAY_API_SERVER_ADDRESS"),
                      resources={"CPU": cpus * CPU_FACTOR, "GPU": gpus}, cores=cpus)
        write(folder, record)  # (as the error above: the starting command holds the lock)
        while _still_used(folder):
            time.sleep(CHECK_S)
    except _Stop:
        with locked(folder):
            if (read(folder) or {}).get("host") == me():
                remove(folder)
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        ray.shutdown()
    return 0


def _first_line(err: BaseException) -> str:
    text = str(err).strip()
    return text.splitlines()[0] if text else type(err).__name__


def _still_used(folder: Path) -> bool:
    """Holding the lock: drop the commands that have ended from the record; with none left, remove the record (the
    next command starts a new host) and return False. False too when the record is no longer this host's."""
    with locked(folder):
        record = read(folder)
        if record is None or record.get("host") != me():
            return False
        runs = [r for r in record.get("runs", []) if running(r)]
        if not runs:
            remove(folder)
            return False
        if runs != record.get("runs"):
            write(folder, {**record, "runs": runs})
        return True


if __name__ == "__main__":
    sys.exit(host(Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]))

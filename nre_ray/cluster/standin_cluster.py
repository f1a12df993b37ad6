"""The cluster stand-in (``python -m nre_ray.standin``): the AWS cluster of ``cluster.yaml``, rehearsed on this
machine before paying for it.

- **Ray with a real autoscaler**: a head started with ``RAY_FAKE_CLUSTER=1 ray start --head --autoscaling-config``
  and Ray's ``fake_multinode`` node provider. Its worker node type has ``min_workers: 0``: the autoscaler starts a
  node (a raylet process on this host) when a run asks for more than the cluster has, and removes it when idle.
- **An S3-compatible object store** on 127.0.0.1 standing in for S3, with one bucket: moto's S3 behind a signature
  check (:mod:`nre_ray.cluster.s3_store`) that admits only requests signed with the stand-in's own key pair, new at
  each ``up``. Like moto, it keeps everything in memory: ``down`` ends the bucket, and ``up`` starts MLflow's store
  afresh with it (so that no run points at artifacts that are gone).
- **An MLflow tracking server** whose artifacts go to that bucket (``--artifacts-destination s3://...``).
- **Authentication, as on the AWS cluster**: ``up`` generates the store's key pair, a Ray token and an MLflow password
  into ``<dir>/secrets/`` (a 0700 folder, each file 0600) and starts the head, every node the autoscaler adds
  (``RAY_AUTH_MODE=token``, ``RAY_AUTH_TOKEN_PATH``) and the MLflow server (``--app-name basic-auth``) with them.
  The MLflow server gets its admin password in its environment only (``MLFLOW_AUTH_ADMIN_PASSWORD``); the Ray
  processes get the MLflow credentials in MLflow's standard variables, which every worker and job driver inherits.
  ``env.sh`` reads the password and the store's keys from their files when sourced, so it never holds them. ``down``
  removes the secrets and the MLflow user store; the next ``up`` makes new ones. ``--no-auth`` starts Ray and MLflow
  without authentication (the store still takes its own keys only).

Every process of the stand-in gets the store's endpoint and keys in the standard variables (``AWS_ENDPOINT_URL``,
``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``), as an AWS node gets them from its instance profile; ``up`` writes
``<dir>/env.sh`` for your shell. The stand-in's folder is private (0700), and so is every file its processes create
(they run with umask 077).

``up`` checks its ports before it starts anything, and keeps them out of the ports Ray gives its workers. Every process
it starts carries a session mark of its own in its environment (:data:`SESSION_ENV`), which its descendants inherit
whoever their parent is now (Ray leaves its head's processes to init); ``up`` records each one by identity (process
id, start time, command line: :mod:`nre_ray.cluster.processes`). ``down`` stops exactly those still matching their
record, the processes with the mark, and everything below them, never every Ray process on the machine as
``ray stop`` would.
"""

from __future__ import annotations

import contextlib
import http.client
import importlib.util
import itertools
import json
import os
import re
import secrets
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Collection, Iterable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path

import yaml

from nre_ray import storage
from nre_ray.cluster import processes, ray_private
from nre_ray.cluster.local_settings import MLFLOW_SERVER_ENV
from nre_ray.cluster.ports import free_port
from nre_ray.cluster.processes import Process
from nre_ray.cluster.session import UsageError

#: The authentication settings a client of the stand-in holds in its environment (:meth:`Standin.credentials`):
#: never passed on from the shell that starts a stand-in to its processes, which get their own.
AUTH_VARIABLES = ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH", "MLFLOW_TRACKING_USERNAME",
                  "MLFLOW_TRACKING_PASSWORD", "MLFLOW_TRACKING_TOKEN", "AWS_SESSION_TOKEN", "AWS_PROFILE")
#: The object store's region (any would do: the store signs and checks with the one a request names).
STORE_REGION = "us-east-1"
STATE_FILE = "standin.json"
WORKER_TYPE = "cpu_worker"
#: Ray's fake_multinode provider with a runtime-environment folder per node (see nre_ray.cluster.provider).
PROVIDER = "nre_ray.cluster.provider.StandinNodeProvider"
#: The node id the fake_multinode provider gives the head (ray.autoscaler._private.fake_multi_node.node_provider).
HEAD_NODE_ID = "fffffffffffffffffffffffffffffffffffffffffffffffffff00000"
#: The variable that marks every process of one stand-in (its value: that stand-in's session, a random token).
SESSION_ENV = "NRE_RAY_STANDIN_SESSION"
#: The ports ``ray start`` gives the head's workers unless told otherwise (its --min-worker-port and
#: --max-worker-port defaults, ray/scripts/scripts.py in Ray 2.60); the stand-in passes a part of it that leaves out
#: its own ports.
RAY_WORKER_PORTS = (10002, 19999)
#: The options that set the stand-in's ports, by port name.
PORT_OPTIONS = {"s3": "--s3-port", "gcs": "--gcs-port", "dashboard": "--dashboard-port", "mlflow": "--mlflow-port"}
#: The folder of the stand-in's secrets (mode 0700), and its files (mode 0600): the Ray token, the MLflow password,
#: the object store's access key id and secret key.
SECRETS_DIR, TOKEN_FILE, PASSWORD_FILE = "secrets", "ray_auth_token", "mlflow_password"
KEY_ID_FILE, SECRET_KEY_FILE = "aws_access_key_id", "aws_secret_access_key"
#: MLflow's store in the stand-in's folder: removed by ``up`` (its runs' artifacts were in the bucket ``down`` ended).
MLFLOW_DB = "mlflow.db"
#: The mode of the stand-in's folder and the umask of the processes it starts: this user's only.
PRIVATE_DIR, PRIVATE_UMASK = 0o700, 0o077
#: The MLflow server's user (its admin) that the stand-in's clients log in as: the name is no secret.
MLFLOW_USER = "admin"
#: The MLflow server's basic-auth settings and user store (the password is in neither).
AUTH_CONFIG, AUTH_DB = "mlflow_auth.ini", "mlflow_auth.db"
#: ``ray job submit --working-dir .``: the repository's .rayignore leaves out .git, .venv and the rest; Ray's own
#: default excludes (the same folders) would warn about each one on every submit.
JOB_SUBMIT_ENV = {"RAY_OVERRIDE_RUNTIME_ENV_DEFAULT_EXCLUDES": ""}


@dataclass
class Standin:
    """A running stand-in: its ports, processes and folders (saved as ``<dir>/standin.json``)."""

    folder: str
    bucket: str
    s3_port: int
    gcs_port: int
    dashboard_port: int
    mlflow_port: int
    ray_temp: str
    session: str  #: the value of :data:`SESSION_ENV` in the environment of each of its processes
    worker_ports: tuple[int, int]  #: the first and last port of the head's Ray workers
    processes: list[Process] = field(default_factory=list)  #: as recorded by ``up``
    auth: bool = False  #: Ray token and MLflow password required (a record without it: a stand-in from before them)

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.s3_port}"

    @property
    def dashboard(self) -> str:
        return f"http://127.0.0.1:{self.dashboard_port}"

    @property
    def tracking_uri(self) -> str:
        return f"http://127.0.0.1:{self.mlflow_port}"

    @property
    def gcs_address(self) -> str:
        return f"127.0.0.1:{self.gcs_port}"

    @property
    def token_path(self) -> Path:
        return Path(self.folder) / SECRETS_DIR / TOKEN_FILE

    @property
    def password_path(self) -> Path:
        return Path(self.folder) / SECRETS_DIR / PASSWORD_FILE

    @property
    def key_paths(self) -> dict[str, Path]:
        """The files of the object store's key pair, by the variable each goes into."""
        secrets_dir = Path(self.folder) / SECRETS_DIR
        return {"AWS_ACCESS_KEY_ID": secrets_dir / KEY_ID_FILE, "AWS_SECRET_ACCESS_KEY": secrets_dir / SECRET_KEY_FILE}

    def store_credentials(self) -> dict[str, str]:
        """The object store's key pair (read from its files; none where they are gone, as after ``down``) and
        region, in AWS's standard variables."""
        return {**{k: p.read_text(encoding="utf-8") for k, p in self.key_paths.items() if p.exists()},
                "AWS_DEFAULT_REGION": STORE_REGION}

    def env(self) -> dict[str, str]:
        """The variables a shell (or a test) needs to use the stand-in like the cloud cluster: the object store's
        endpoint and keys, the dashboard (``ray job`` reads ``RAY_API_SERVER_ADDRESS`` before ``RAY_ADDRESS``) and
        the credentials (:meth:`credentials`)."""
        return {"AWS_ENDPOINT_URL": self.endpoint, **self.store_credentials(), "RAY_ADDRESS": self.dashboard,
                "RAY_API_SERVER_ADDRESS": self.dashboard, **self.credentials(), **JOB_SUBMIT_ENV}

    def credentials(self) -> dict[str, str]:
        """Ray's token settings and MLflow's user and password (read from its file), in their standard variables;
        ``RAY_AUTH_MODE=disabled`` alone for a stand-in without authentication."""
        if not self.auth:
            return {"RAY_AUTH_MODE": "disabled"}
        return {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(self.token_path), **self.mlflow_login()}

    def mlflow_login(self) -> dict[str, str]:
        """MLflow's user and password variables for its server (none without authentication)."""
        if not self.auth:
            return {}
        return {"MLFLOW_TRACKING_USERNAME": MLFLOW_USER,
                "MLFLOW_TRACKING_PASSWORD": self.password_path.read_text(encoding="utf-8")}

    def ray_headers(self) -> dict[str, str]:
        """The HTTP header that admits a request to the Ray dashboard and job API (none without authentication)."""
        return {"Authorization": f"Bearer {self.token_path.read_text(encoding='utf-8')}"} if self.auth else {}

    def shell(self) -> str:
        """``env.sh``: :meth:`env` plus ``BUCKET``, and the MLflow server in ``TRACKING_URI`` (for the commands of
        docs/cluster.md) and ``MLFLOW_TRACKING_URI`` (where MLflow itself looks, as for a ``runs:/`` model). The
        store's keys and the MLflow password are read from their files when the script is sourced: the script itself
        never holds them."""
        from_files = {**{k: str(p) for k, p in self.key_paths.items() if p.exists()},
                      **({"MLFLOW_TRACKING_PASSWORD": str(self.password_path)} if self.auth else {})}
        shown = {**self.env(), "BUCKET": self.bucket, "TRACKING_URI": self.tracking_uri,
                 "MLFLOW_TRACKING_URI": self.tracking_uri}
        lines = [f"export {k}={shlex.quote(v)}\n" for k, v in shown.items() if k not in from_files]
        lines += [f'export {k}="$(cat {shlex.quote(path)})"\n' for k, path in from_files.items()]
        return "".join(lines)

    def filesystem(self):  # -> pyarrow.fs.S3FileSystem
        """The object store as a pyarrow filesystem (paths ``bucket/key``), whatever this process's environment."""
        import pyarrow.fs

        keys = self.store_credentials()
        return pyarrow.fs.S3FileSystem(endpoint_override=self.endpoint, scheme="http", region=STORE_REGION,
                                       access_key=keys["AWS_ACCESS_KEY_ID"], secret_key=keys["AWS_SECRET_ACCESS_KEY"],
                                       allow_bucket_creation=True)

    def save(self) -> None:
        folder = Path(self.folder)
        (folder / STATE_FILE).write_text(json.dumps(asdict(self), indent=2), encoding="utf-8")
        (folder / "env.sh").write_text(self.shell(), encoding="utf-8")

    def record(self) -> None:
        """Record every process of the stand-in now running (:func:`own_processes`) and save."""
        self.processes = own_processes(self)
        self.save()

    @classmethod
    def load(cls, folder: Path) -> Standin:
        path = folder / STATE_FILE
        if not path.is_file():
            raise UsageError(f"no stand-in in {folder} ({path} is missing); start one with "
                             f"`python -m nre_ray.standin up --dir {folder}`")
        try:
            saved = json.loads(path.read_text(encoding="utf-8"))
            saved["worker_ports"] = tuple(saved["worker_ports"])
            saved["processes"] = [Process(**p) for p in saved["processes"]]
            return cls(**saved)
        except (ValueError, TypeError, KeyError) as err:
            raise UsageError(f"{path} is not a stand-in record this version reads ({type(err).__name__}: {err}); "
                             "stop that stand-in's processes by their ids, then remove the file") from None


def autoscaler_config(gcs_address: str, max_workers: int, cpus_per_node: float, head_cpus: float,
                      idle_minutes: float) -> dict:
    """The autoscaler config of the stand-in: the head type plus one worker type with ``min_workers: 0``. The
    ``fake_multinode`` provider (here :mod:`nre_ray.cluster.provider`) starts a node as raylet processes on this
    host; node updaters (SSH setup) are off, as there is nothing to set up."""
    return {
        "cluster_name": "nre-ray-standin",
        "max_workers": max_workers,
        "upscaling_speed": 1.0,
        "idle_timeout_minutes": idle_minutes,
        "provider": {"type": "external", "module": PROVIDER, "gcs_address": gcs_address, "use_node_id_as_ip": True,
                     "disable_node_updaters": True, "disable_launch_config_check": True},
        "auth": {"ssh_user": "ubuntu"},
        "head_node_type": "ray.head.default",
        "available_node_types": {
            "ray.head.default": {"resources": {"CPU": head_cpus}, "node_config": {}, "max_workers": 0},
            WORKER_TYPE: {"resources": {"CPU": cpus_per_node}, "node_config": {}, "min_workers": 0,
                          "max_workers": max_workers},
        },
        # ray start --autoscaling-config takes the config as `ray up` leaves it: every section present.
        "file_mounts": {}, "cluster_synced_files": [], "file_mounts_sync_continuously": False,
        "rsync_exclude": [], "rsync_filter": [], "initialization_commands": [], "setup_commands": [],
        "head_setup_commands": [], "worker_setup_commands": [], "head_start_ray_commands": [],
        "worker_start_ray_commands": [],
    }


def _port_free(port: int) -> bool:
    """True if a server could listen on ``port`` on every address now (as the stand-in's servers do, with
    SO_REUSEADDR: a connection just closed does not hold it)."""
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("0.0.0.0", port))
        except OSError:
            return False
        return True


def check_ports(ports: dict[str, int]) -> None:
    """UsageError unless each port of ``ports`` (by name, as :data:`PORT_OPTIONS`) is one of its own, from 1024 to
    65535, and free."""
    for name, port in ports.items():
        if not 1024 <= port <= 65535:
            raise UsageError(f"{PORT_OPTIONS[name]} {port}: the stand-in's ports are from 1024 to 65535; pass one "
                             "in that range")
    for port in ports.values():
        same = [PORT_OPTIONS[n] for n, p in ports.items() if p == port]
        if len(same) > 1:
            raise UsageError(f"{' and '.join(same)} are both {port}; give each its own port")
    busy = [f"{PORT_OPTIONS[name]} {port}" for name, port in ports.items() if not _port_free(port)]
    if busy:
        raise UsageError(f"port(s) in use on this machine: {', '.join(busy)}; pass free ones "
                         f"({', '.join(PORT_OPTIONS.values())})")


def worker_ports(taken: Iterable[int]) -> tuple[int, int]:
    """The longest run of :data:`RAY_WORKER_PORTS` without any port of ``taken``: the first and the last port."""
    low, high = RAY_WORKER_PORTS
    edges = [low - 1, *sorted(p for p in set(taken) if low <= p <= high), high + 1]
    start, end = max(itertools.pairwise(edges), key=lambda gap: gap[1] - gap[0])
    return start + 1, end - 1


def _tool(name: str) -> str:
    """A console script of this Python environment (``ray``, ``mlflow``, ``moto_server``), else from PATH."""
    local = Path(sys.executable).parent / name
    found = str(local) if local.exists() else shutil.which(name)
    if not found:
        raise UsageError(f"`{name}` is not installed here; run `pip install -e '.[standin]'`")
    return found


def _last_line(log: Path) -> str:
    """The line of ``log`` that says what went wrong: the last exception's (``ValueError: ...``), else the last."""
    lines = [line.strip() for line in log.read_text(errors="replace").splitlines() if line.strip()] \
        if log.exists() else []
    errors = [line for line in lines if re.match(r"[\w.]+(Error|Exception): ", line)]
    return (errors or lines or ["(its log is empty)"])[-1]


def _wait(what: str, check, timeout: float, log: Path, process: subprocess.Popen | None = None) -> None:
    """Until ``check()`` is true; UsageError with the last line of ``log`` when ``timeout`` passes, or at once when
    ``process`` (the server waited for) has exited. A connection refused, or an answer that is not HTTP (another
    program on the port), counts as not up yet."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if check():
                return
        except (OSError, http.client.HTTPException):
            pass
        if process is not None and process.poll() is not None:
            raise UsageError(f"{what} exited (status {process.returncode}) before it answered: {_last_line(log)} "
                             f"(its log: {log})")
        time.sleep(0.3)
    raise UsageError(f"{what} did not come up within {timeout:.0f} s: {_last_line(log)} (its log: {log})")


def _http_ok(url: str, headers: dict[str, str] | None = None) -> bool:
    with urllib.request.urlopen(urllib.request.Request(url, headers=headers or {}), timeout=2) as reply:
        return reply.status < 500


def _refuses_strangers(url: str) -> bool:
    """True once the object store answers an unsigned request, with its refusal (403)."""
    try:
        with urllib.request.urlopen(url, timeout=2):
            return False
    except urllib.error.HTTPError as err:
        return err.code == 403


@contextlib.contextmanager
def _private_files() -> Iterator[None]:
    """This process's umask at :data:`PRIVATE_UMASK` for the block: every file and folder created in it, here and
    by the processes started in it (and so by their descendants: Ray's head, its nodes, workers and job drivers),
    is this user's only."""
    before = os.umask(PRIVATE_UMASK)
    try:
        yield
    finally:
        os.umask(before)


def _make_private(folder: Path, say: Callable[[str], None]) -> None:
    """Create ``folder`` with mode 0700, or make an existing one 0700 (saying so when it was open to others)."""
    if not folder.exists():
        folder.mkdir(mode=PRIVATE_DIR, parents=True)
        return
    mode = folder.stat().st_mode & 0o777
    if mode & 0o077:
        folder.chmod(mode & ~0o077)
        say(f"made {folder} private (mode {mode & ~0o077:o}, was {mode:o}): it holds the stand-in's MLflow store, "
            "logs and secrets")


def _spawn(args: list[str], log: Path, env: dict[str, str], cwd: Path) -> subprocess.Popen:
    with open(log, "ab") as out:
        return subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=cwd,
                                start_new_session=True)


def up(folder: Path, bucket: str = "nre-ray", max_workers: int = 3, cpus_per_node: float = 1.0,
       head_cpus: float = 0.0, idle_minutes: float = 1.0, ports: dict[str, int] | None = None,
       heartbeat_timeout_s: int = 10, auth: bool = True, say: Callable[[str], None] = lambda _: None) -> Standin:
    """Start the object store, the Ray head with its autoscaler, and the MLflow server; returns the stand-in.
    UsageError, with nothing left running, if a port is taken or a part does not start.

    ``folder`` is made private (0700; ``say`` is told when an existing folder was open to others), and everything
    the stand-in creates is private too (:func:`_private_files`). An MLflow store left there by an earlier stand-in
    is removed (``say`` tells it): its runs' artifacts were in that stand-in's bucket, which ended with it.
    ``head_cpus``: 0 by default, as the training workers of cluster.yaml never run on its head: every worker (and
    every Ray task that needs a CPU) runs on a node the autoscaler adds.

    ``ports``: ``s3``, ``gcs``, ``dashboard``, ``mlflow`` (default 9000, 6379, 8265, 5000; tests pass free ones).
    Ray's workers on the head get the ports of :data:`RAY_WORKER_PORTS` less these (:func:`worker_ports`).
    ``heartbeat_timeout_s``: how long the autoscaler waits before it replaces a node that stopped answering.
    ``auth``: new secrets (:func:`make_secrets`); the head and its nodes in Ray's token mode, the MLflow server with
    basic authentication (False: ``--no-auth``, neither).
    """
    folder = folder.absolute()
    if (folder / STATE_FILE).is_file():
        raise UsageError(f"a stand-in is already recorded in {folder}; stop it first with "
                         f"`python -m nre_ray.standin down --dir {folder}`")
    ports = {"s3": 9000, "gcs": 6379, "dashboard": 8265, "mlflow": 5000, **(ports or {})}
    check_ports(ports)
    if auth and importlib.util.find_spec("flask_wtf") is None:
        raise UsageError("the MLflow server's password (its basic-auth app) needs Flask-WTF, which is not installed "
                         "here; run `pip install -e '.[standin]'`, or pass --no-auth")
    with _private_files():
        return _up(folder, bucket, max_workers, cpus_per_node, head_cpus, idle_minutes, ports, heartbeat_timeout_s,
                   auth, say)


def _up(folder: Path, bucket: str, max_workers: int, cpus_per_node: float, head_cpus: float, idle_minutes: float,
        ports: dict[str, int], heartbeat_timeout_s: int, auth: bool, say: Callable[[str], None]) -> Standin:
    """:func:`up` once its settings are checked, with this process's umask private."""
    client_port = free_port(taken=ports.values())
    agent_port = free_port(taken=[*ports.values(), client_port])
    first, last = worker_ports([*ports.values(), client_port, agent_port])
    _make_private(folder, say)
    logs = folder / "logs"
    logs.mkdir(exist_ok=True)
    for left in [*folder.iterdir(), *logs.iterdir()]:  # an earlier stand-in's files, from before they were private
        if left.is_file():
            left.chmod(left.stat().st_mode & ~0o077)
    if (folder / MLFLOW_DB).exists():
        (folder / MLFLOW_DB).unlink()
        say(f"removed the MLflow store of the stand-in stopped before ({folder / MLFLOW_DB}): its runs' artifacts "
            "were in that stand-in's bucket, which ends with it; runs and bucket start empty")
    # Ray's Unix sockets live under its temp folder: keep the path short, and private to this stand-in.
    ray_temp = tempfile.mkdtemp(prefix="nre_standin_", dir="/tmp")
    state = Standin(str(folder), bucket, ports["s3"], ports["gcs"], ports["dashboard"], ports["mlflow"], ray_temp,
                    secrets.token_hex(8), (first, last), auth=auth)
    make_secrets(state)
    # Each process gets the credentials it needs and no others: the Ray head (and so its nodes, workers and job
    # drivers) Ray's token and MLflow's client variables; the MLflow server its admin password.
    credentials = state.credentials()
    env = {**{k: v for k, v in os.environ.items() if k not in AUTH_VARIABLES}, **state.env(),
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}", "RAY_USAGE_STATS_ENABLED": "0",
           "MLFLOW_S3_ENDPOINT_URL": state.endpoint, "AUTOSCALER_HEARTBEAT_TIMEOUT_S": str(heartbeat_timeout_s),
           # Train's placement-group cleaner asks the dashboard about the run's controller: this cluster's own.
           "RAY_API_SERVER_ADDRESS": state.dashboard, SESSION_ENV: state.session}
    env.pop("RAY_ADDRESS", None)
    for key in credentials:
        env.pop(key, None)
    state.save()  # before anything starts: `down` (here on failure, or later) reads it
    try:
        _tool("moto_server")  # (installed: the store runs moto's application)
        s3 = _spawn([sys.executable, "-m", "nre_ray.cluster.s3_store", "--host", "127.0.0.1", "--port",
                     str(state.s3_port)], logs / "s3.log", env, folder)
        state.record()
        _wait("the object store", lambda: _refuses_strangers(state.endpoint), 60, logs / "s3.log", s3)
        _create_bucket(state)

        # The MLflow server before the Ray head: the head opens more ports than those it is given (its raylet's,
        # object manager's and agents'), each one the system has free, and could take the MLflow port in between.
        server = _spawn([_tool("mlflow"), "server", "--backend-store-uri", f"sqlite:///{folder / MLFLOW_DB}",
                         "--artifacts-destination", f"s3://{bucket}/mlflow-artifacts", "--host", "127.0.0.1",
                         "--port", str(state.mlflow_port), "--workers", "1",
                         *(["--app-name", "basic-auth"] if auth else [])],
                        logs / "mlflow.log", {**MLFLOW_SERVER_ENV, **env, **mlflow_auth_env(state)}, folder)
        state.record()
        _wait("the MLflow server", lambda: _http_ok(f"{state.tracking_uri}/health"), 120, logs / "mlflow.log", server)

        config = folder / "autoscaler.yaml"
        config.write_text(yaml.safe_dump(autoscaler_config(state.gcs_address, max_workers, cpus_per_node, head_cpus,
                                                           idle_minutes), sort_keys=False), encoding="utf-8")
        head = subprocess.run(
            [_tool("ray"), "start", "--head", "--node-ip-address", "127.0.0.1", "--port", str(state.gcs_port),
             "--num-cpus", f"{head_cpus:g}", "--autoscaling-config", str(config), "--temp-dir", ray_temp,
             "--dashboard-host", "127.0.0.1", "--dashboard-port", str(state.dashboard_port),
             "--ray-client-server-port", str(client_port), "--dashboard-agent-listen-port", str(agent_port),
             "--min-worker-port", str(first), "--max-worker-port", str(last), "--disable-usage-stats"],
            env={**env, **credentials, "RAY_FAKE_CLUSTER": "1"}, cwd=folder, capture_output=True, text=True,
            timeout=180)
        (logs / "ray-head.log").write_text(head.stdout + head.stderr, encoding="utf-8")
        state.record()  # the head's processes: `ray start` has left them to init
        if head.returncode != 0:
            raise UsageError(f"the Ray head did not start (exit {head.returncode}): "
                             f"{_last_line(logs / 'ray-head.log')} (its log: {logs / 'ray-head.log'})")
        _wait("the Ray dashboard", lambda: _http_ok(f"{state.dashboard}/api/version", state.ray_headers()), 90,
              logs / "ray-head.log")
    except BaseException:
        down(folder)
        raise
    state.record()
    return state


def _private_file(path: Path, text: str) -> None:
    """Write ``text`` to ``path``, readable and writable by this user only (0600) from its first byte."""
    path.unlink(missing_ok=True)
    with os.fdopen(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "w", encoding="utf-8") as out:
        out.write(text)


def make_secrets(state: Standin) -> None:
    """New secrets for ``state``, each in a 0600 file of the 0700 folder ``<dir>/secrets``: the object store's key
    pair (an access key id as AWS's look, ``AKIA`` and 16 characters, and a 40-character secret key); with
    authentication on, a Ray token (64 hex digits, as ``ray get-auth-token --generate`` makes) and an MLflow
    password, and the MLflow server's basic-auth settings (no password in them) with a new user store, in which the
    server creates its admin with this password."""
    folder = Path(state.folder) / SECRETS_DIR
    folder.mkdir(mode=0o700, exist_ok=True)
    folder.chmod(0o700)
    _private_file(state.key_paths["AWS_ACCESS_KEY_ID"], "AKIA" + secrets.token_hex(8).upper())
    _private_file(state.key_paths["AWS_SECRET_ACCESS_KEY"], secrets.token_urlsafe(30))
    if not state.auth:
        return
    _private_file(state.token_path, secrets.token_hex(32))
    _private_file(state.password_path, secrets.token_urlsafe(24))
    (Path(state.folder) / AUTH_DB).unlink(missing_ok=True)  # its admin would keep the old password
    (Path(state.folder) / AUTH_CONFIG).write_text(
        "[mlflow]\ndefault_permission = READ\n"
        f"database_uri = sqlite:///{Path(state.folder) / AUTH_DB}\n"
        f"admin_username = {MLFLOW_USER}\n"
        "authorization_function = mlflow.server.auth:authenticate_request_basic_auth\n"
        # one server process: a credential checked once a minute, not hashed again at every request
        "auth_cache_ttl_seconds = 60\n", encoding="utf-8")


def mlflow_auth_env(state: Standin) -> dict[str, str]:
    """The MLflow server's environment for basic authentication: its settings file; the admin password, which
    MLflow reads from this variable only when it creates the admin user (so no file of the stand-in holds it but
    ``secrets/``); and the key that signs the CSRF tokens of its login forms, new at each start (nothing to keep)."""
    if not state.auth:
        return {}
    return {"MLFLOW_AUTH_CONFIG_PATH": str(Path(state.folder) / AUTH_CONFIG),
            "MLFLOW_AUTH_ADMIN_PASSWORD": state.password_path.read_text(encoding="utf-8"),
            "MLFLOW_FLASK_SERVER_SECRET_KEY": secrets.token_hex(32)}


def _create_bucket(state: Standin) -> None:
    state.filesystem().create_dir(state.bucket)


def own_processes(state: Standin) -> list[Process]:
    """Every process of the stand-in now running: those recorded that are still the same process, those with its
    session mark in their environment (Ray's head processes, its client proxy and fake nodes, which Ray leaves to
    init), and every process below them (workers, whose titles replace their command line, and job drivers)."""
    tree = processes.parents()
    marked = {pid for pid in tree if processes.environ(pid).get(SESSION_ENV) == state.session}
    roots = marked | {p.pid for p in state.processes if p.current()}
    found = (processes.identify(pid) for pid in sorted(processes.descendants(roots, tree)))
    return [p for p in found if p is not None]


def worker_nodes(state: Standin) -> dict[str, list[Process]]:
    """The autoscaled worker nodes now running: node id -> its processes (raylet and the workers below it)."""
    tree = processes.parents()
    nodes: dict[str, list[Process]] = {}
    for process in own_processes(state):
        node_id = processes.environ(process.pid).get("RAY_OVERRIDE_NODE_ID_FOR_TESTING")
        if node_id and node_id != HEAD_NODE_ID and "raylet" in process.cmdline.split(" ")[0]:
            below = (processes.identify(pid) for pid in sorted(processes.descendants([process.pid], tree)))
            nodes[node_id] = [p for p in below if p is not None]
    return nodes


def kill_node(state: Standin, node_id: str | None = None, hosting: str = "") -> str:
    """Lose a worker node: SIGKILL its raylet and everything below it, as when a machine disappears. ``hosting``:
    prefer a node that runs a process whose command line contains it (e.g. ``RayTrainWorker``). Returns its id.
    The autoscaler notices the silence and replaces the node when there is work for it."""
    nodes = worker_nodes(state)
    if not nodes:
        raise UsageError("the stand-in has no worker node running")
    if node_id is None:
        busy = [n for n, found in nodes.items() if hosting and any(hosting in p.cmdline for p in found)]
        node_id = (busy or sorted(nodes))[0]
    if node_id not in nodes:
        raise UsageError(f"no worker node {node_id}; running: {', '.join(sorted(nodes))}")
    for process in nodes[node_id]:
        process.signal(signal.SIGKILL)
    return node_id


@dataclass
class Stopped:
    """What ``down`` did: the processes it stopped, and the recorded ones it left alone because their process id now
    belongs to another program (as after a reboot)."""

    stopped: list[Process]
    strangers: list[tuple[Process, Process]]  #: (as recorded, what runs under that id now)


def down(folder: Path) -> Stopped:
    """Stop every process of the stand-in in ``folder`` (:func:`own_processes`, each checked again just before its
    signal) and forget the stand-in."""
    folder = folder.absolute()
    state = Standin.load(folder)
    found = own_processes(state)
    ours = {p.pid for p in found}
    strangers = [(p, now) for p in state.processes
                 if p.pid not in ours and (now := processes.identify(p.pid)) is not None and now != p]
    stopped = processes.stop(found, grace=10)
    # A process started while the others stopped (a worker Ray replaced before its raylet went)
    stopped += processes.stop(own_processes(state), grace=2)
    shutil.rmtree(state.ray_temp, ignore_errors=True)
    shutil.rmtree(folder / SECRETS_DIR, ignore_errors=True)
    for name in (AUTH_DB, AUTH_CONFIG):
        (folder / name).unlink(missing_ok=True)
    (folder / STATE_FILE).unlink(missing_ok=True)
    (folder / "env.sh").unlink(missing_ok=True)
    return Stopped(stopped, strangers)


@contextlib.contextmanager
def standin_environ(state: Standin) -> Iterator[None]:
    """This process's environment with the stand-in's variables (env.sh's) for the block, then as it was: a command
    called in-process (a test's) must not leave another cluster's address and keys behind."""
    before = dict(os.environ)
    os.environ.update(state.env())
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(before)


def upload(state: Standin, local: Path, uri: str) -> None:
    """Copy a local file or folder into the stand-in's object store (what ``aws s3 cp --recursive`` does on AWS)."""
    with standin_environ(state):
        storage.upload(local, uri)


def status(state: Standin) -> str:
    nodes = worker_nodes(state)
    return "\n".join([
        f"Ray:    {state.dashboard} (dashboard; RAY_ADDRESS), GCS {state.gcs_address}, "
        f"worker ports {state.worker_ports[0]}-{state.worker_ports[1]}",
        f"nodes:  head + {len(nodes)} autoscaled worker node(s) of type {WORKER_TYPE}"
        + (f": {', '.join(n[-5:] for n in sorted(nodes))}" if nodes else ""),
        f"S3:     {state.endpoint} (AWS_ENDPOINT_URL), bucket s3://{state.bucket}; its keys (no others) in "
        f"{Path(state.folder) / SECRETS_DIR}/{KEY_ID_FILE} and {SECRET_KEY_FILE} (AWS_ACCESS_KEY_ID, "
        "AWS_SECRET_ACCESS_KEY)",
        f"MLflow: {state.tracking_uri} (artifacts in s3://{state.bucket}/mlflow-artifacts)",
        f"auth:   Ray token in {state.token_path} (RAY_AUTH_TOKEN_PATH); MLflow user {MLFLOW_USER}, password in "
        f"{state.password_path} (MLFLOW_TRACKING_USERNAME, MLFLOW_TRACKING_PASSWORD)" if state.auth
        else "auth:   none (--no-auth): anyone who reaches these ports can run code on Ray and read MLflow",
        f"env:    source {Path(state.folder) / 'env.sh'}",
    ])



def choose_node(asked: str | None, alive: dict[str, bool], training: Collection[str]) -> str:
    """The node to preempt: ``asked`` (a node id), else the first worker node that runs a training worker.
    ``alive``: node id -> whether it is the head; ``training``: the nodes that run a training worker. UsageError for
    an unknown node, the head, or (``asked`` None) no worker node with a training worker."""
    workers = sorted(node for node, head in alive.items() if not head)
    if asked is not None:
        if asked not in alive:
            raise UsageError(f"--node {asked}: no node of the stand-in has that id; its worker nodes: "
                             f"{', '.join(workers) or 'none'}")
        if alive[asked]:
            raise UsageError(f"--node {asked} is the head node, which a spot interruption never takes (it is not "
                             f"spot); pass a worker node: {', '.join(workers) or 'none is running'}")
        return asked
    busy = [node for node in workers if node in training]
    if not busy:
        raise UsageError("no worker node of the stand-in runs a training worker"
                         + (f" (worker nodes: {', '.join(workers)})" if workers else " (it has no worker node)")
                         + "; start a run first (docs/cluster.md), or pass --node")
    return busy[0]


def ray_nodes(state: Standin) -> tuple[dict[str, bool], set[str]]:
    """The nodes alive in the stand-in's Ray (node id -> whether it is the head) and those that run a Ray Train
    worker, from Ray's State API on its dashboard. UsageError if Ray does not answer."""
    # The State API takes RAY_API_SERVER_ADDRESS, then RAY_ADDRESS, over its address argument
    # (ray.dashboard.utils.get_address_for_submission_client): this stand-in's, whatever the shell had. Ray is
    # imported in the block too: it reads its authentication mode (RAY_AUTH_MODE) once, when first imported, and a
    # shell's `disabled` (or none) would leave the stand-in's token unsent.
    try:
        with standin_environ(state):
            from ray.util.state import list_actors, list_nodes

            # Every node, the dead ones kept apart here: with a state filter, the GCS leaves the dead nodes out and
            # the State API takes their absence for truncated output and raises ("Failed to retrieve all 4 nodes
            # ... due to data truncation"), as after the first preemption of a session.
            nodes = [n for n in list_nodes(address=state.dashboard, limit=10_000) if n.state == "ALIVE"]
            actors = list_actors(address=state.dashboard, filters=[("class_name", "=", "RayTrainWorker"),
                                                                   ("state", "=", "ALIVE")], limit=10_000)
    except Exception as err:  # the State API raises its own and connection errors alike
        raise UsageError(f"the stand-in's Ray at {state.dashboard} does not answer ({type(err).__name__}: {err}); "
                         f"is it still up? `python -m nre_ray.standin status --dir {state.folder}`") from None
    return {n.node_id: bool(n.is_head_node) for n in nodes}, {a.node_id for a in actors}


def preempt_node(state: Standin, node_id: str | None, deadline_s: float, say: Callable[[str], None]) -> str:
    """What AWS does to a spot instance: a preemption notice ``deadline_s`` seconds ahead (a Ray drain with reason
    PREEMPTION and that deadline, :func:`nre_ray.cluster.ray_private.drain_for_preemption`), then the node is lost at
    the deadline (:func:`kill_node`). ``node_id``: by default the first worker node that runs a training worker
    (:func:`choose_node`). ``say`` is told each step. Returns the node's id."""
    node = choose_node(node_id, *ray_nodes(state))
    deadline = time.time() + deadline_s
    try:
        with standin_environ(state):  # the stand-in's token, whatever the shell has
            ray_private.drain_for_preemption(node, deadline_s, state.gcs_address,
                                             f"preempted by the stand-in (python -m nre_ray.standin preempt-node): "
                                             f"the node goes in {deadline_s:g} s")
    except RuntimeError as err:
        raise UsageError(f"{err}; is node {node} still up? `python -m nre_ray.standin status`") from None
    say(f"preemption notice sent to node {node}: it goes at {time.strftime('%H:%M:%S', time.localtime(deadline))} "
        f"(in {deadline_s:g} s)")
    time.sleep(max(0.0, deadline - time.time()))
    if node not in worker_nodes(state):
        say(f"node {node} had already left (Ray ends a drained node once nothing runs on it)")
    else:
        kill_node(state, node)
        say(f"node {node} lost at its deadline")
    return node

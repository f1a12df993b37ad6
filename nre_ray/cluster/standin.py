"""The cluster stand-in (``python -m nre_ray.standin``): the AWS cluster of ``cluster.yaml``, rehearsed on this
machine before paying for it.

- **Ray with a real autoscaler**: a head started with ``RAY_FAKE_CLUSTER=1 ray start --head --autoscaling-config``
  and Ray's ``fake_multinode`` node provider. Its worker node type has ``min_workers: 0``: the autoscaler starts a
  node (a raylet process on this host) when a run asks for more than the cluster has, and removes it when idle.
- **An S3-compatible object store** on 127.0.0.1 (moto's server) standing in for S3, with one bucket.
- **An MLflow tracking server** whose artifacts go to that bucket (``--artifacts-destination s3://...``).

Every process of the stand-in gets the store's endpoint and credentials in the standard variables
(``AWS_ENDPOINT_URL``, ``AWS_ACCESS_KEY_ID``, ...), as an AWS node gets them from its instance profile; ``up`` writes
them to ``<dir>/env.sh`` for your shell. ``down`` stops exactly the processes the stand-in started (by process id and
by its private Ray folder), never every Ray process on the machine as ``ray stop`` would.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import asdict, dataclass, field
from pathlib import Path

import yaml

#: Credentials of the local object store: moto accepts any, and they are not secret (nothing leaves this host).
STORE_CREDENTIALS = {"AWS_ACCESS_KEY_ID": "standin", "AWS_SECRET_ACCESS_KEY": "standin",
                     "AWS_DEFAULT_REGION": "us-east-1"}
STATE_FILE = "standin.json"
WORKER_TYPE = "cpu_worker"
#: Ray's fake_multinode provider with a runtime-environment folder per node (see nre_ray.cluster.provider).
PROVIDER = "nre_ray.cluster.provider.StandinNodeProvider"
#: The node id the fake_multinode provider gives the head (ray.autoscaler._private.fake_multi_node.node_provider).
HEAD_NODE_ID = "fffffffffffffffffffffffffffffffffffffffffffffffffff00000"


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
    pids: dict[str, int] = field(default_factory=dict)

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

    def env(self) -> dict[str, str]:
        """The variables a shell (or a test) needs to use the stand-in like the cloud cluster: the object store's
        endpoint and keys, and the dashboard (``ray job`` reads ``RAY_API_SERVER_ADDRESS`` before ``RAY_ADDRESS``)."""
        return {"AWS_ENDPOINT_URL": self.endpoint, **STORE_CREDENTIALS, "RAY_ADDRESS": self.dashboard,
                "RAY_API_SERVER_ADDRESS": self.dashboard}

    def shell(self) -> str:
        """``env.sh``: :meth:`env` plus ``BUCKET`` and ``TRACKING_URI`` for the commands of docs/cluster.md."""
        return "".join(f"export {k}={v}\n" for k, v in {**self.env(), "BUCKET": self.bucket,
                                                          "TRACKING_URI": self.tracking_uri}.items())

    def filesystem(self):  # -> pyarrow.fs.S3FileSystem
        """The object store as a pyarrow filesystem (paths ``bucket/key``), whatever this process's environment."""
        import pyarrow.fs

        return pyarrow.fs.S3FileSystem(endpoint_override=self.endpoint, scheme="http", region="us-east-1",
                                       access_key=STORE_CREDENTIALS["AWS_ACCESS_KEY_ID"],
                                       secret_key=STORE_CREDENTIALS["AWS_SECRET_ACCESS_KEY"],
                                       allow_bucket_creation=True)

    def save(self) -> None:
        folder = Path(self.folder)
        (folder / STATE_FILE).write_text(json.dumps(asdict(self), indent=2), encoding="utf-8")
        (folder / "env.sh").write_text(self.shell(), encoding="utf-8")

    @classmethod
    def load(cls, folder: Path) -> Standin:
        path = folder / STATE_FILE
        if not path.is_file():
            raise SystemExit(f"error: no stand-in in {folder} ({path} is missing); start one with "
                             f"`python -m nre_ray.standin up --dir {folder}`")
        return cls(**json.loads(path.read_text(encoding="utf-8")))


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


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _port_free(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) != 0


def _tool(name: str) -> str:
    """A console script of this Python environment (``ray``, ``mlflow``, ``moto_server``), else from PATH."""
    local = Path(sys.executable).parent / name
    found = str(local) if local.exists() else shutil.which(name)
    if not found:
        raise SystemExit(f"error: `{name}` is not installed here; run `pip install -e '.[standin]'`")
    return found


def _wait(what: str, check, timeout: float, log: Path) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if check():
                return
        except OSError:
            pass
        time.sleep(0.3)
    tail = log.read_text(errors="replace")[-2000:] if log.exists() else ""
    raise SystemExit(f"error: {what} did not come up within {timeout:.0f} s; its log {log}:\n{tail}")


def _http_ok(url: str) -> bool:
    with urllib.request.urlopen(url, timeout=2) as reply:
        return reply.status < 500


def _spawn(args: list[str], log: Path, env: dict[str, str], cwd: Path) -> subprocess.Popen:
    with open(log, "ab") as out:
        return subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=cwd,
                                start_new_session=True)


def up(folder: Path, bucket: str = "nre-ray", max_workers: int = 3, cpus_per_node: float = 1.0,
       head_cpus: float = 1.0, idle_minutes: float = 1.0, ports: dict[str, int] | None = None,
       heartbeat_timeout_s: int = 10) -> Standin:
    """Start the object store, the Ray head with its autoscaler, and the MLflow server; returns the stand-in.

    ``ports``: ``s3``, ``gcs``, ``dashboard``, ``mlflow`` (default 9000, 6379, 8265, 5000; tests pass free ones).
    ``heartbeat_timeout_s``: how long the autoscaler waits before it replaces a node that stopped answering.
    """
    folder = folder.absolute()
    if (folder / STATE_FILE).is_file():
        raise SystemExit(f"error: a stand-in is already recorded in {folder}; stop it first with "
                         f"`python -m nre_ray.standin down --dir {folder}`")
    ports = {"s3": 9000, "gcs": 6379, "dashboard": 8265, "mlflow": 5000, **(ports or {})}
    busy = [f"{name} {port}" for name, port in ports.items() if not _port_free(port)]
    if busy:
        raise SystemExit(f"error: port(s) in use on 127.0.0.1: {', '.join(busy)}; pass free ones "
                         "(--s3-port, --gcs-port, --dashboard-port, --mlflow-port)")
    folder.mkdir(parents=True, exist_ok=True)
    logs = folder / "logs"
    logs.mkdir(exist_ok=True)
    # Ray's Unix sockets live under its temp folder: keep the path short, and private to this stand-in.
    ray_temp = tempfile.mkdtemp(prefix="nre_standin_", dir="/tmp")
    state = Standin(str(folder), bucket, ports["s3"], ports["gcs"], ports["dashboard"], ports["mlflow"], ray_temp)
    env = {**os.environ, **state.env(), "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
           "RAY_USAGE_STATS_ENABLED": "0", "RAY_AUTH_MODE": "disabled",
           "MLFLOW_S3_ENDPOINT_URL": state.endpoint, "AUTOSCALER_HEARTBEAT_TIMEOUT_S": str(heartbeat_timeout_s),
           # Train's placement-group cleaner asks the dashboard about the run's controller: this cluster's own.
           "RAY_API_SERVER_ADDRESS": state.dashboard}
    env.pop("RAY_ADDRESS", None)
    try:
        store = _spawn([_tool("moto_server"), "-H", "127.0.0.1", "-p", str(state.s3_port)], logs / "s3.log", env,
                       folder)
        state.pids["s3"] = store.pid
        state.save()
        _wait("the object store", lambda: _http_ok(state.endpoint), 60, logs / "s3.log")
        _create_bucket(state)

        config = folder / "autoscaler.yaml"
        config.write_text(yaml.safe_dump(autoscaler_config(state.gcs_address, max_workers, cpus_per_node, head_cpus,
                                                           idle_minutes), sort_keys=False), encoding="utf-8")
        head = subprocess.run(
            [_tool("ray"), "start", "--head", "--node-ip-address", "127.0.0.1", "--port", str(state.gcs_port),
             "--num-cpus", f"{head_cpus:g}", "--autoscaling-config", str(config), "--temp-dir", ray_temp,
             "--dashboard-host", "127.0.0.1", "--dashboard-port", str(state.dashboard_port),
             "--ray-client-server-port", str(_free_port()), "--dashboard-agent-listen-port", str(_free_port()),
             "--disable-usage-stats"],
            env={**env, "RAY_FAKE_CLUSTER": "1"}, cwd=folder, capture_output=True, text=True, timeout=180)
        (logs / "ray-head.log").write_text(head.stdout + head.stderr, encoding="utf-8")
        if head.returncode != 0:
            raise SystemExit(f"error: the Ray head did not start (exit {head.returncode}); see {logs}/ray-head.log:\n"
                             f"{(head.stdout + head.stderr)[-2000:]}")
        _wait("the Ray dashboard", lambda: _http_ok(f"{state.dashboard}/api/version"), 90, logs / "ray-head.log")

        mlflow = _spawn([_tool("mlflow"), "server", "--backend-store-uri", f"sqlite:///{folder}/mlflow.db",
                         "--artifacts-destination", f"s3://{bucket}/mlflow-artifacts", "--host", "127.0.0.1",
                         "--port", str(state.mlflow_port), "--workers", "1"], logs / "mlflow.log", env, folder)
        state.pids["mlflow"] = mlflow.pid
        state.save()
        _wait("the MLflow server", lambda: _http_ok(f"{state.tracking_uri}/health"), 120, logs / "mlflow.log")
    except BaseException:
        down(folder, quiet=True)
        raise
    state.save()
    return state


def _create_bucket(state: Standin) -> None:
    state.filesystem().create_dir(state.bucket)


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def _parent(pid: int) -> int:
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
        return int(text[text.rindex(")") + 2:].split()[1])
    except (OSError, ValueError, IndexError):
        return 0


def _environ(pid: int) -> dict[str, str]:
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return {}
    return dict(item.split("=", 1) for item in raw.decode(errors="replace").split("\0") if "=" in item)


def _processes() -> list[int]:
    return [int(p) for p in os.listdir("/proc") if p.isdigit() and int(p) != os.getpid()]


def own_processes(state: Standin) -> list[int]:
    """Every process of the stand-in: those it recorded, those under its private Ray folder (head, monitor, fake
    nodes, workers: Ray's processes name their session folder), and their descendants."""
    roots = {pid for pid in state.pids.values()}
    roots |= {pid for pid in _processes() if state.ray_temp in _cmdline(pid) or _head_client_proxy(state, pid)}
    parents = {pid: _parent(pid) for pid in _processes()}
    found, todo = set(), [p for p in roots if p in parents]
    while todo:
        pid = todo.pop()
        if pid not in found:
            found.add(pid)
            todo.extend(child for child, parent in parents.items() if parent == pid)
    return sorted(pid for pid in found if _alive(pid))


def _head_client_proxy(state: Standin, pid: int) -> bool:
    """The head's Ray Client proxy (``python -m ray.util.client.server --address=IP:GCS_PORT --mode=proxy``): its
    command line names no session folder, and Ray leaves it to init when the head stops, so it is found by this
    stand-in's GCS port instead."""
    args = _cmdline(pid).split(" ")
    return "ray.util.client.server" in args and any(a.startswith("--address=") and a.endswith(f":{state.gcs_port}")
                                                    for a in args)


def worker_nodes(state: Standin) -> dict[str, list[int]]:
    """The autoscaled worker nodes now running: node id -> its processes (raylet and the workers below it)."""
    nodes: dict[str, list[int]] = {}
    parents = {pid: _parent(pid) for pid in _processes()}
    for pid in own_processes(state):
        node_id = _environ(pid).get("RAY_OVERRIDE_NODE_ID_FOR_TESTING")
        if node_id and node_id != HEAD_NODE_ID and "raylet" in _cmdline(pid).split(" ")[0]:
            below, todo = [pid], [pid]
            while todo:
                parent = todo.pop()
                kids = [c for c, p in parents.items() if p == parent]
                below += kids
                todo += kids
            nodes[node_id] = below
    return nodes


def kill_node(state: Standin, node_id: str | None = None, hosting: str = "") -> str:
    """Lose a worker node: SIGKILL its raylet and everything below it, as when a machine disappears. ``hosting``:
    prefer a node that runs a process whose command line contains it (e.g. ``RayTrainWorker``). Returns its id.
    The autoscaler notices the silence and replaces the node when there is work for it."""
    nodes = worker_nodes(state)
    if not nodes:
        raise SystemExit("error: the stand-in has no worker node running")
    if node_id is None:
        busy = [n for n, pids in nodes.items() if hosting and any(hosting in _cmdline(p) for p in pids)]
        node_id = (busy or sorted(nodes))[0]
    if node_id not in nodes:
        raise SystemExit(f"error: no worker node {node_id}; running: {', '.join(sorted(nodes))}")
    for pid in nodes[node_id]:
        _kill(pid, signal.SIGKILL)
    return node_id


def _kill(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except (OSError, IndexError):
        return False


def down(folder: Path, quiet: bool = False) -> int:
    """Stop every process of the stand-in in ``folder`` and forget it; returns how many were stopped."""
    folder = folder.absolute()
    try:
        state = Standin.load(folder)
    except SystemExit:
        if quiet:
            return 0
        raise
    pids = own_processes(state)
    for pid in pids:
        _kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any(_alive(p) for p in pids):
        time.sleep(0.2)
    for pid in own_processes(state) + pids:
        _kill(pid, signal.SIGKILL)
    shutil.rmtree(state.ray_temp, ignore_errors=True)
    (folder / STATE_FILE).unlink(missing_ok=True)
    return len(pids)


def upload(state: Standin, local: Path, uri: str) -> None:
    """Copy a local file or folder into the stand-in's object store (what ``aws s3 cp --recursive`` does on AWS)."""
    from nre_ray import storage

    os.environ.update(state.env())
    storage.upload(local, uri)


def status(state: Standin) -> str:
    nodes = worker_nodes(state)
    return "\n".join([
        f"Ray:    {state.dashboard} (dashboard; RAY_ADDRESS), GCS {state.gcs_address}",
        f"nodes:  head + {len(nodes)} autoscaled worker node(s) of type {WORKER_TYPE}"
        + (f": {', '.join(n[-5:] for n in sorted(nodes))}" if nodes else ""),
        f"S3:     {state.endpoint} (AWS_ENDPOINT_URL), bucket s3://{state.bucket}",
        f"MLflow: {state.tracking_uri} (artifacts in s3://{state.bucket}/mlflow-artifacts)",
        f"env:    source {Path(state.folder) / 'env.sh'}",
    ])


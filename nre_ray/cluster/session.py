"""The Ray session every command shares: start or join Ray, learn what the cluster has and can grow to, size the
workers, and refuse paths that the other nodes cannot reach.

``train``, ``evaluate``, ``predict`` and ``python -m nre_ray.data`` import from here; nothing here touches tensors.
"""

from __future__ import annotations

import ipaddress
import logging
import math
import os
import re
import socket
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from nre_ray import storage
from nre_ray.cluster.local_settings import (
    QUIET_ENV,
    TELEMETRY_ENV,
    dashboard_args,
    local_train_settings,
    with_dashboard,
)
from nre_ray.config import MIN_CPUS_PER_WORKER
from nre_ray.core.versions import warn_if_untested
from nre_ray.tracking import uris

log = logging.getLogger("nre_ray")

#: Ray Train's wait for a worker group to be placed: its controller reads it from this variable only
#: (:func:`set_placement_timeout`).
PLACEMENT_TIMEOUT_ENV = "RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S"
#: The maximum of a node group whose autoscaler sets no limit (Ray's cluster config says -1).
UNLIMITED_NODES = 2**31 - 1
#: Autoscaler providers whose nodes are processes on the head's machine: Ray's fake_multinode and the stand-in's.
ONE_HOST_PROVIDERS = ("fake_multinode", "nre_ray.cluster.provider.StandinNodeProvider")
#: The default wait: a fixed cluster places a worker group in seconds; an autoscaler starts nodes in minutes.
FIXED_CLUSTER_WAIT_S, AUTOSCALING_WAIT_S = 60.0, 900.0


class UsageError(Exception):
    """A problem the user can fix (resources, paths, existing runs); printed without a traceback."""


@dataclass
class NodeType:
    """A worker node type the cluster's autoscaler may start: its resources per node (empty when the autoscaler
    fills them in from the instance type and did not say) and how many of it may run at once."""

    name: str
    resources: dict[str, float]
    max_count: int

    def describe(self) -> str:
        shown = ", ".join(f"{k} {v:g}" for k, v in sorted(self.resources.items()) if k in ("CPU", "GPU"))
        return f"{self.name} (up to {self.max_count} x {{{shown or 'resources unknown'}}})"


@dataclass
class Cluster:
    """What the driver knows of the cluster: the alive nodes, the worker node types an autoscaler may add, and the
    autoscaler's provider (``aws``, ``fake_multinode``, ...; None on a cluster without one)."""

    nodes: list[dict[str, float]]
    node_types: list[NodeType] = field(default_factory=list)
    provider: str | None = None
    addresses: set[str] = field(default_factory=set)  # the alive nodes' IP addresses

    @property
    def can_grow(self) -> bool:
        return any(t.max_count > 0 for t in self.node_types)

    @property
    def multi_node(self) -> bool:
        """More than one node now, or an autoscaler that can add some."""
        return len(self.nodes) > 1 or self.can_grow

    @property
    def one_host(self) -> bool:
        """Every node, now and later, runs on this machine (one Ray node, a ``ray.cluster_utils.Cluster``, or the
        ``fake_multinode`` provider and the stand-in, whose nodes are processes here)."""
        return len(self.addresses) <= 1 and (not self.can_grow or self.provider in ONE_HOST_PROVIDERS)

    def describe_types(self) -> str:
        return "; ".join(t.describe() for t in self.node_types)

    def describe(self) -> str:
        """``2 node(s), 3 CPUs``, and the node types an autoscaler may add."""
        cpus = sum(n.get("CPU", 0) for n in self.nodes)
        gpus = sum(n.get("GPU", 0) for n in self.nodes)
        return (f"{len(self.nodes)} node(s), {cpus:g} CPUs" + (f", {gpus:g} GPUs" if gpus else "")
                + (f"; the autoscaler may add {self.describe_types()}" if self.can_grow else ""))


@dataclass
class Resources:
    """How each worker is placed; ``waits`` when the alive nodes cannot hold the group yet (the autoscaler must add
    nodes first); ``placement_timeout``: how long Ray Train waits for the group to be placed (None: Ray's default)."""

    per_worker: dict[str, float]
    threads: int
    waits: bool = False
    placement_timeout: float | None = None


#: Nodes of one kind and how many of them: an alive node once, a node type as often as the autoscaler may start it.
NodeGroup = tuple[dict[str, float], int]


def node_groups(nodes: list[dict[str, float]], node_types: list[NodeType]) -> list[NodeGroup]:
    """The nodes the cluster has or can grow to, counted, never listed one by one (KubeRay reports 2147483647 as
    the maximum of a worker group that sets none): each node type whose resources are known ``max_count`` times,
    and each alive node that is none of those types' nodes (the head, a node joined by hand) once. An alive node
    of a type (:func:`of_type`) is one of its ``max_count``, not one more: what the cluster can hold does not depend
    on which of its nodes happen to be up."""
    known = [t for t in node_types if t.resources and t.max_count > 0]
    left = {t.name: t.max_count for t in known}
    others = []
    for node in nodes:
        kind = next((t for t in known if left[t.name] > 0 and of_type(node, t)), None)
        if kind is None:
            others.append((node, 1))
        else:
            left[kind.name] -= 1
    return others + [(t.resources, t.max_count) for t in known]


def of_type(node: dict[str, float], node_type: NodeType) -> bool:
    """Whether the alive node whose resources are ``node`` is a node of ``node_type``: the same CPUs, GPUs and
    custom resources as the type declares (Ray adds its own per node, ``node:IP``, memory, which are ignored). The
    head is never one: Ray marks it with ``node:__internal_head__``."""
    if "node:__internal_head__" in node:
        return False
    keys = {"CPU", "GPU", *(k for k in node_type.resources if k not in ("memory", "object_store_memory"))}
    return all(math.isclose(node.get(k, 0.0), node_type.resources.get(k, 0.0)) for k in keys)


def plan_resources(num_workers: int, use_gpu: bool, nodes: list[dict[str, float]],
                   cpus_per_worker: float | None = None, node_types: list[NodeType] | None = None,
                   plus: int = 0) -> Resources:
    """Size each worker from what the cluster has or can grow to, or raise UsageError if it can never be placed.

    ``nodes``: the ``Resources`` dict of each alive node; ``node_types``: the worker node types an autoscaler may add
    (each counted ``max_count`` times on top of the alive nodes, by arithmetic: any maximum is sized at once). CPU
    workers share the CPUs evenly, at most one each and at least :data:`MIN_CPUS_PER_WORKER` (so 4 workers run on
    2 cores, 64 are refused); GPU workers take one GPU each and a share of their node's CPUs (at most 4).
    ``cpus_per_worker`` (``--cpus-per-worker``) sets the CPUs instead, any share the nodes hold (oversubscription
    on purpose). A worker runs as many torch threads as it has whole CPUs (at least 1). ``plus``: that many more
    CPU shares sized like a worker's that are not workers (``predict``'s reading tasks); the messages count workers.
    """
    node_types = node_types or []
    possible = node_groups(nodes, node_types)
    if any(not t.resources for t in node_types) and not _fits(num_workers + plus, use_gpu, possible):
        # The autoscaler knows these types' resources from their instance types, and did not tell: trust it.
        per = {"CPU": cpus_per_worker or 1.0, **({"GPU": 1} if use_gpu else {})}
        return Resources(per, max(1, int(per["CPU"])), waits=True)
    where = f" (node types it may add: {'; '.join(t.describe() for t in node_types)})" if node_types else ""
    plan = _plan(num_workers, use_gpu, possible, cpus_per_worker, where, Cluster(nodes, node_types), plus)
    plan.waits = _holds(nodes, plan.per_worker) < num_workers + plus
    return plan


def _fits(num_workers: int, use_gpu: bool, groups: list[NodeGroup]) -> bool:
    """Whether the default sizing places ``num_workers`` on the nodes of ``groups``."""
    try:
        _plan(num_workers, use_gpu, groups, None, "", Cluster([]))
    except UsageError:
        return False
    return True


def _plan(num_workers: int, use_gpu: bool, groups: list[NodeGroup], cpus_per_worker: float | None,
          where: str, info: Cluster, plus: int = 0) -> Resources:
    """:func:`plan_resources` over the nodes of ``groups`` (``where``: how the messages name the node types;
    ``info``: the cluster the refusals describe)."""
    if use_gpu:
        gpus = sum(int(n.get("GPU", 0)) * count for n, count in groups)
        if gpus == 0:
            none = " and its autoscaler adds none" if info.can_grow else ""
            raise UsageError(f"--use-gpu: this Ray cluster has no GPU{none} ({info.describe()}). Drop --use-gpu to "
                             "run on CPUs, or join a cluster with GPUs (--address).")
        if gpus < num_workers:
            raise UsageError(f"--num-workers {num_workers} with --use-gpu needs {num_workers} GPUs, but the cluster "
                             f"has {gpus}{where}. Use --num-workers {gpus} or add GPU nodes.")
        if cpus_per_worker is None:
            cpu = min(n.get("CPU", 0) / max(int(n.get("GPU", 0)), 1) for n, _ in groups if n.get("GPU", 0) >= 1)
            cpu = max(min(math.floor(cpu * 100) / 100, 4.0), 0.01)
        else:
            cpu = cpus_per_worker
            room = sum(min(int(n.get("GPU", 0)), _slots(n.get("CPU", 0), cpu)) * count for n, count in groups)
            _check_fits(num_workers, cpu, room, "one GPU and ", where)
        return Resources({"CPU": cpu, "GPU": 1}, max(1, int(cpu)))
    cpus = sum(n.get("CPU", 0.0) * count for n, count in groups)
    if cpus <= 0:
        raise UsageError(f"this Ray cluster has no CPUs to run workers on{where}.")
    if cpus_per_worker is not None:
        _check_fits(num_workers, cpus_per_worker, _room(groups, cpus_per_worker) - plus, "", where)
        return Resources({"CPU": cpus_per_worker}, max(1, int(cpus_per_worker)))
    total = num_workers + plus
    per = _even_share(groups, total, MIN_CPUS_PER_WORKER)
    if per is None:
        raise UsageError(_too_many(num_workers, groups, info, plus))
    return Resources({"CPU": per}, max(1, int(per)))


def _even_share(groups: list[NodeGroup], num_workers: int, least: float) -> float | None:
    """The largest share of a CPU, in hundredths and at most 1, at which the nodes of ``groups`` hold
    ``num_workers`` workers, if it is ``least`` or more (None otherwise): the CPUs split evenly, then less for
    nodes whose CPUs do not divide."""
    cpus = sum(n.get("CPU", 0.0) * count for n, count in groups)
    per = math.floor(min(1.0, cpus / num_workers) * 100) / 100
    while per > least and _room(groups, per) < num_workers:
        per = max(math.floor(per * 90) / 100, least)
    return per if per >= least and _room(groups, per) >= num_workers else None


def _too_many(num_workers: int, groups: list[NodeGroup], info: Cluster, plus: int) -> str:
    """The refusal of ``num_workers`` CPU workers that the cluster can never hold at a sensible share each: what
    the cluster has and holds, what to ask instead, and how to oversubscribe on purpose."""
    room = max(_room(groups, MIN_CPUS_PER_WORKER) - plus, 0)
    share = _even_share(groups, num_workers + plus, 0.01)
    fewer = f"Use --num-workers {room} or fewer, or join a larger cluster (--address)" if room else \
        "Join a larger cluster (--address)"
    on_purpose = (f"; to oversubscribe on purpose, pass --cpus-per-worker {share:g} ({num_workers} workers "
                  "sharing the CPUs start and train slowly)" if share is not None
                  else "; not even --cpus-per-worker 0.01 places that many")
    return (f"--num-workers {num_workers}: this Ray cluster can never hold that many workers at "
            f"{MIN_CPUS_PER_WORKER:g} CPU or more each ({info.describe()}; room for {room} such workers). "
            f"{fewer}{on_purpose}.")


def _room(groups: list[NodeGroup], cpus_per_worker: float) -> int:
    """How many workers of ``cpus_per_worker`` CPUs the nodes of ``groups`` hold together."""
    return sum(_slots(n.get("CPU", 0.0), cpus_per_worker) * count for n, count in groups)


def _holds(nodes: list[dict[str, float]], per_worker: dict[str, float]) -> int:
    """How many workers of ``per_worker`` the ``nodes`` hold together (a worker never spans nodes)."""
    total = 0
    for node in nodes:
        fits = [math.floor(node.get(k, 0.0) / v + 1e-9) for k, v in per_worker.items() if v > 0]
        total += min(fits) if fits else 0
    return total


def _slots(cpus: float, per_worker: float) -> int:
    """How many workers of ``per_worker`` CPUs a node with ``cpus`` CPUs holds (tolerant of float rounding)."""
    return math.floor(cpus / per_worker + 1e-9)


def _check_fits(num_workers: int, cpus_per_worker: float, room: int, what: str, where: str) -> None:
    """UsageError unless the nodes hold ``num_workers`` workers (``room``: how many they hold together)."""
    if room < num_workers:
        raise UsageError(f"--num-workers {num_workers} with --cpus-per-worker {cpus_per_worker:g}: the cluster's "
                         f"nodes have room for {room} workers of {what}{cpus_per_worker:g} CPUs"
                         f"{where}. Lower --cpus-per-worker or --num-workers, or leave --cpus-per-worker out to share "
                         "the CPUs evenly.")


@dataclass(frozen=True)
class RayAddress:
    """Where a command's Ray is: ``local`` (a Ray on this machine: the one nre_ray commands share, or a private one,
    :func:`start_ray`), ``auto`` (the Ray that ``ray start``
    runs on this machine), ``gcs`` (``HOST:PORT`` of a cluster head's GCS, as a ``ray job`` driver gets it in
    RAY_ADDRESS) or ``client`` (``ray://HOST:PORT``, Ray Client). ``given``: the address as written (None for
    ``local``); ``source``: ``--address`` or ``RAY_ADDRESS``."""

    kind: str
    given: str | None = None
    source: str = "--address"
    host: str | None = None
    port: int | None = None

    def joining(self) -> str:
        """What the console's ``ray`` phase says it does (for a local Ray the commands share: :func:`ray_phase`)."""
        if self.kind == "local":
            return "starting a local Ray"
        if self.kind == "auto":
            return "joining the Ray started on this machine (auto)"
        return f"joining the Ray cluster at {self.given}"


def resolve_address(address: str | None) -> RayAddress:
    """The Ray to join: ``address`` (``--address``) if given, else RAY_ADDRESS, else a local one. UsageError for an
    address that is not one of Ray's (a dashboard's ``http://`` address among them: ``ray job`` reads that one, a
    driver cannot join it)."""
    source, given = ("--address", address) if address else ("RAY_ADDRESS", os.environ.get("RAY_ADDRESS") or None)
    if not given or given == "local":
        return RayAddress("local", None, source)
    if given == "auto":
        return RayAddress("auto", given, source)
    scheme, _, rest = given.rpartition("://")
    if scheme.lower() in ("http", "https"):
        raise UsageError(f"{source} {given} is the Ray dashboard (for ray job submit); to run on that cluster submit "
                         "the command with ray job submit, or give --address HOST:GCS_PORT")
    try:
        parsed = urlparse(f"//{rest}")
        host, port = parsed.hostname, parsed.port
    except ValueError:
        host = port = None
    if scheme not in ("", "ray") or not host or port is None or parsed.path:
        raise UsageError(f"{source} {given}: not a Ray address; give HOST:PORT (the head's GCS, port 6379 by default), "
                         "ray://HOST:PORT (Ray Client, port 10001 by default) or auto")
    return RayAddress("client" if scheme == "ray" else "gcs", given, source, host, port)


def ray_phase(address: str | None) -> str:
    """What the console's ``ray`` phase says :func:`start_ray` does with ``address``: use the Ray this process has
    already joined (a test session, a script that called ``ray.init``), join a cluster, or start one."""
    from nre_ray.cluster import shared_ray

    ray = sys.modules.get("ray")  # not imported yet: not initialised either (the phase times the import)
    if ray is not None and ray.is_initialized():
        return "using the Ray this process has already joined"
    where = resolve_address(address)
    if where.kind == "local" and shared_ray.wanted():  # a note in the phase says which (:func:`_start_shared`)
        return "joining the local Ray shared by nre_ray runs on this machine, or starting it"
    return where.joining()


def start_ray(address: str | None, log_to_driver: bool = True,
              runtime_env: dict[str, Any] | None = None, share: bool = True) -> RayAddress:
    """Join ``address`` (or RAY_ADDRESS; see :func:`resolve_address`), else the local Ray that nre_ray commands on
    this machine share, starting it where none runs (:func:`_start_shared`; ``share=False`` or
    ``NRE_RAY_OWN_RAY=1``: a private local Ray, :func:`_start_local`); nothing when this process has joined a Ray
    already. ``log_to_driver=False``: the workers' output stays in Ray's log files (for commands whose own output is
    the point). ``runtime_env``: the job's, on a local Ray only (a cluster's jobs keep their own). Returns where Ray
    is; UsageError when nothing answers at the address."""
    import ray

    from nre_ray.cluster.ray_private import keep_ray_notices_off_console

    quiet_environ()
    if not (sys.stdout.isatty() and sys.stderr.isatty()):  # lines Ray forwards from its processes: no colour codes
        os.environ.setdefault("RAY_COLOR_PREFIX", "0")     # in a log file
    where = resolve_address(address)
    keep_ray_notices_off_console()
    if ray.is_initialized():
        return where
    if where.source == "--address":
        # --address wins: ray.init reads RAY_ADDRESS itself when its address is "auto" or none (env.sh's dashboard
        # address would fail it), and so do the State API's clients in this process.
        os.environ.pop("RAY_ADDRESS", None)
    if where.kind == "local":
        from nre_ray.cluster import shared_ray

        if share and shared_ray.wanted():
            _start_shared(log_to_driver, runtime_env)
        else:
            _start_local(log_to_driver, runtime_env)
        return where
    if where.host is not None:
        _check_answers(where)
    from ray.exceptions import AuthenticationError

    try:
        ray.init(address=where.given, logging_level=logging.WARNING, log_to_driver=log_to_driver)
    except AuthenticationError as err:  # token mode here, and no token (RAY_AUTH_TOKEN_PATH names no file, ...)
        reason = str(getattr(err, "message", "") or err).strip().splitlines()[0]
        raise UsageError(refused(where, reason)) from None
    except ConnectionError as err:  # "auto" with no Ray (or several) on this machine; a Ray Client that timed out
        reason = _token_refusal(err)
        if reason:
            raise UsageError(refused(where, reason)) from None
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise UsageError(f"{where.source} {where.given}: could not join Ray: {first}") from None
    return where


def _token_refusal(err: BaseException) -> str | None:
    """Ray's reason when a failure to join is the GCS refusing this client's token (``InvalidAuthToken: ...``,
    somewhere in the exceptions behind ``err``: Ray passes it on as the text of a RuntimeError); else None."""
    seen: BaseException | None = err
    while seen is not None:
        found = re.search(r"InvalidAuthToken: ([^.\n]+)", str(seen))
        if found:
            return found[1]
        seen = seen.__cause__ or seen.__context__
    return None


def refused(where: RayAddress, reason: str) -> str:
    """The one line for a cluster that refused to admit this client for want of its token: Ray's own ``reason``
    (such as "Authentication token is missing or incorrect"), then what to do."""
    reason = re.sub(r"^RPC error: \w+: ", "", reason).rstrip(".")
    return (f"{where.source} {where.given}: the Ray cluster did not admit this client: {reason}. It runs with token "
            "authentication: set RAY_AUTH_MODE=token and RAY_AUTH_TOKEN_PATH to a file holding the cluster's token "
            "(the stand-in's env.sh sets both; docs/cluster.md)")


#: How long :func:`start_ray` waits for a TCP connection to the address it is about to join.
CONNECT_TIMEOUT_S = 5.0
#: How long it then waits for the GCS (or Ray Client server) there to answer one call (:func:`_check_answers`).
ANSWER_TIMEOUT_S = 5.0
#: How long a port that does not speak gRPC has to answer an HTTP request (to tell a dashboard from other things).
HTTP_TIMEOUT_S = 2.0


def check_address(address: str | None) -> RayAddress:
    """:func:`resolve_address`, and for a cluster to join (``HOST:PORT``, ``ray://HOST:PORT``) the checks
    :func:`start_ray` makes before ``ray.init`` (:func:`_check_answers`): a command calls it before it creates
    anything (a run's folder, its log, an MLflow run), so that an address Ray cannot join, or a cluster that does not
    admit this client, stops it first. Nothing is asked when this process has joined a Ray already."""
    where = resolve_address(address)
    ray = sys.modules.get("ray")
    if where.host is not None and not (ray is not None and ray.is_initialized()):
        _check_answers(where)
    return where


def _check_answers(where: RayAddress) -> None:
    """UsageError unless Ray's GCS (a Ray Client server for ``ray://``) answers at ``where`` and admits this client,
    found within seconds: nothing accepts a TCP connection there (``ray.init`` retries such an address for minutes,
    a Ray Client for 30 s); the GCS refuses this client's token (``ray.init`` says so only after about 20 s of C++
    warnings on the console); the port answers HTTP (the dashboard's port, 8265: ``ray.init`` waits there forever,
    repeating warnings), or accepts connections and answers nothing, or answers another protocol."""
    from nre_ray.cluster.ray_private import ask_gcs

    port_name = "Ray Client server port (10001 by default)" if where.kind == "client" else "GCS port (6379 by default)"
    host, port = where.host or "", where.port or 0
    try:
        with socket.create_connection((host, port), timeout=CONNECT_TIMEOUT_S):
            pass
    except OSError as err:
        why = err.strerror or str(err) or type(err).__name__
        raise UsageError(f"{where.source} {where.given}: nothing answers there ({why}). Check that the cluster is up "
                         f"and that this is its head's {port_name}.") from None
    from ray.exceptions import AuthenticationError

    try:
        code, details = ask_gcs(host, port, ANSWER_TIMEOUT_S)
    except AuthenticationError as err:  # token mode here, and no token (RAY_AUTH_TOKEN_PATH names no file, ...)
        raise UsageError(refused(where, str(getattr(err, "message", "") or err).strip().splitlines()[0])) from None
    if code == "OK" or (code == "UNIMPLEMENTED" and where.kind == "client"):  # a Ray Client server: not a GCS
        return
    if code == "UNAUTHENTICATED":
        found = re.search(r"InvalidAuthToken: ([^.\n]+)", details)
        raise UsageError(refused(where, found[1] if found else details or "refused (UNAUTHENTICATED)"))
    is_ray = "a Ray Client server" if where.kind == "client" else "Ray's GCS"
    if code == "UNIMPLEMENTED":  # gRPC, but not the GCS: a Ray Client server's port given as HOST:PORT
        raise UsageError(f"{where.source} {where.given}: a gRPC server answers there, but not {is_ray} (a Ray Client "
                         "server's port, 10001 by default, is given as ray://HOST:PORT). Give the head's GCS port "
                         "(6379 by default).")
    web = _web_server(host, port) if code == "UNAVAILABLE" else None  # (an HTTP server fails gRPC at once)
    if web is not None:
        submit = f"submit the command with ray job submit --address http://{_host_port(where)}"
        raise UsageError(f"{where.source} {where.given}: {web}, not {is_ray}. Give the head's {port_name}, "
                         f"or {submit}")
    if code == "DEADLINE_EXCEEDED":
        raise UsageError(f"{where.source} {where.given}: something accepts connections there but does not answer as "
                         f"{is_ray} within {ANSWER_TIMEOUT_S:g} s. Check that this is the head's {port_name}, "
                         "and that the cluster is not overloaded.")
    if code == "UNAVAILABLE":
        first = details.strip().splitlines()[0] if details.strip() else code
        raise UsageError(f"{where.source} {where.given}: does not answer as {is_ray} ({first}). Check that this is "
                         f"the head's {port_name}.")
    # any other answer is the GCS's own (it answered gRPC): ray.init says the rest


def _host_port(where: RayAddress) -> str:
    """``HOST:PORT`` of ``where`` (an IPv6 host in brackets)."""
    host = f"[{where.host}]" if where.host and ":" in where.host else where.host
    return f"{host}:{where.port}"


def _web_server(host: str, port: int) -> str | None:
    """What answers HTTP at ``host``:``port``, in words (``the Ray dashboard's port`` where ``/api/version`` names a
    Ray version, else ``a web server (HTTP)``), or None where nothing answers HTTP within :data:`HTTP_TIMEOUT_S`."""
    import json
    import urllib.error
    import urllib.request

    bracketed = f"[{host}]" if ":" in host else host
    try:
        with urllib.request.urlopen(f"http://{bracketed}:{port}/api/version", timeout=HTTP_TIMEOUT_S) as answer:
            body = answer.read(4096)
    except urllib.error.HTTPError:  # it answers HTTP (a dashboard with token auth says 401)
        return "that port answers HTTP (a web server, such as the Ray dashboard: port 8265 by default)"
    except (OSError, ValueError):  # no HTTP answer (urllib's URLError is an OSError)
        return None
    try:
        ray_version = json.loads(body).get("ray_version")
    except (ValueError, AttributeError):
        ray_version = None
    if ray_version:
        return f"that port is the Ray dashboard's (Ray {ray_version}; for ray job submit)"
    return "that port answers HTTP (a web server, such as the Ray dashboard: port 8265 by default)"


def _start_local(log_to_driver: bool, runtime_env: dict[str, Any] | None = None) -> None:
    """A private local Ray of :func:`local_node`'s resources. Every server of Ray's in it (GCS, raylet, object
    manager, workers, dashboard and its agents) listens on the loopback address only
    (:func:`ray_private.loopback_node`), so it can be reached from this machine alone; it runs without token
    authentication (``RAY_AUTH_MODE=disabled`` unless the user set the mode), so other users of this machine could
    reach it while the command runs. The workers' PyTorch rendezvous on it listens on 127.0.0.1 too
    (:func:`torch_config`).
    ``address="local"``: a bare ``ray.init()`` joins the cluster the last ``ray start`` on this machine recorded
    (RAY_TMPDIR's ``ray/ray_current_cluster``), which would put the run on the user's cluster, and fail there on
    ``num_cpus``."""
    import ray

    from nre_ray.cluster import watchdog
    from nre_ray.cluster.ray_private import loopback_node

    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    local_train_settings(with_dashboard())
    node = local_node()
    watchdog.start()  # what a SIGKILL of this process would leave of its Ray is stopped
    try:
        with loopback_node() as on_loopback:
            ray.init(address="local", num_cpus=int(node["CPU"]), num_gpus=int(node.get("GPU", 0)),
                     logging_level=logging.WARNING, log_to_driver=log_to_driver, runtime_env=runtime_env,
                     **on_loopback, **dashboard_args())
    except Exception as err:  # Ray raises a bare Exception when its raylet does not register within 30 s
        if "timed out during startup" not in str(err):
            raise
        raise UsageError(_not_started()) from None


def _not_started() -> str:
    """The refusal when the local Ray's node did not register in time."""
    return (f"the local Ray did not start: its node did not register within Ray's fixed 30 s (1-minute load average "
            f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs). The machine is too busy; try again when it is "
            "quieter, or start Ray once with `ray start --head` and pass --address auto.")


#: Whether this process runs on the local Ray shared by nre_ray commands (:func:`_start_shared`): its node has
#: :data:`shared_ray.CPU_FACTOR` logical CPUs per core, which :func:`cluster` divides back.
_on_shared_ray = False


def _start_shared(log_to_driver: bool, runtime_env: dict[str, Any] | None = None) -> None:
    """Join the local Ray that the nre_ray commands of this user on this machine share, or start it
    (:mod:`nre_ray.cluster.shared_ray`): a Ray on the loopback address like :func:`_start_local`'s, run by a host
    process of its own that stops it when the last command using it has ended. Where one runs with another
    environment (its workers would not get this command's), a private Ray (:func:`_start_local`). The console's
    ``ray`` phase says which it did. ``runtime_env``: this command's job's, passed as it joins."""
    import ray

    from nre_ray.cluster import shared_ray
    from nre_ray.cluster.ray_private import loopback_node

    global _on_shared_ray
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    node = local_node()
    try:
        outcome, record = shared_ray.join_or_start(int(node["CPU"]), int(node.get("GPU", 0)),
                                                   shared_ray.fingerprint())
    except RuntimeError as err:
        raise UsageError(_not_started() if "timed out during startup" in str(err) else str(err)) from None
    except (OSError, TimeoutError) as err:
        raise UsageError(f"the local Ray shared by nre_ray runs: {err}; set {shared_ray.OWN_RAY_ENV}=1 to start a "
                         "private one") from None
    if outcome == "own" or record is None:
        _say("the local Ray shared by nre_ray runs on this machine runs with another environment (its workers "
             "would not get this command's): starting a private local Ray")
        _start_local(log_to_driver, runtime_env)
        return
    if not os.environ.get("RAY_API_SERVER_ADDRESS") and record.get("dashboard"):
        os.environ["RAY_API_SERVER_ADDRESS"] = record["dashboard"]  # the State API asks the shared Ray's dashboard
    with loopback_node() as on_loopback:  # the driver on the node's own address, 127.0.0.1
        ray.init(address=record["gcs"], logging_level=logging.WARNING, log_to_driver=log_to_driver,
                 runtime_env=shared_ray.job_runtime_env(runtime_env, os.getcwd()),
                 _node_ip_address=on_loopback["_node_ip_address"])
    _on_shared_ray = True
    local_train_settings(bool(record.get("dashboard")))
    _say(f"started a local Ray (shared with later runs; it stops when its last run ends; process {record['host'][0]})"
         if outcome == "started" else
         f"joined the local Ray shared by nre_ray runs on this machine (process {record['host'][0]}; "
         f"{len(record.get('runs', []))} run(s) on it)")


def _say(text: str) -> None:
    """A note in the console's running ``ray`` phase, if there is one."""
    from nre_ray.core import console

    for phase in console.get().running:
        if phase.name == "ray":
            phase.note(text)
            return


def torch_config() -> Any:
    """The ``TorchConfig`` of a run's workers on the joined Ray: where every alive node is on the loopback address
    (the local Ray a command starts, :func:`_start_local`), one whose PyTorch rendezvous store listens on 127.0.0.1
    alone (:func:`ray_private.loopback_torch_config`; PyTorch's own binds every interface); elsewhere Ray Train's
    default, whose rendezvous the other nodes reach over the network."""
    import ray
    from ray.train.torch import TorchConfig

    from nre_ray.cluster.ray_private import loopback_torch_config

    hosts = {str(n.get("NodeManagerAddress")) for n in ray.nodes() if n.get("Alive")}
    try:
        on_loopback = bool(hosts) and all(ipaddress.ip_address(host).is_loopback for host in hosts)
    except ValueError:  # a host name
        on_loopback = False
    return loopback_torch_config() if on_loopback else TorchConfig()


def local_node(gpus: bool = True) -> dict[str, float]:
    """The resources of the local Ray a command starts (:func:`start_ray` without an address): a CPU per core of
    this machine, and the GPUs Ray finds here (CUDA_VISIBLE_DEVICES respected). ``gpus=False``: the CPUs alone,
    without asking Ray (that imports Ray, about a second on 2 cores, which a command that uses no GPU then pays
    before its start-up can overlap it with the other imports)."""
    if not gpus:
        return {"CPU": float(os.cpu_count() or 1)}
    from nre_ray.cluster.ray_private import local_gpus

    gpus_found = local_gpus()
    return {"CPU": float(os.cpu_count() or 1), **({"GPU": float(gpus_found)} if gpus_found else {})}


def local_cluster(address: str | None, use_gpu: bool = True) -> Cluster | None:
    """The cluster :func:`start_ray` will start for ``address``, known before it starts: a local Ray's one node
    (:func:`local_node`), so that workers it can never hold are refused before Ray starts (:func:`size_workers`).
    None when ``address`` names a cluster to join (what it holds is known once joined: :func:`cluster`) or when
    this process has joined a Ray already. ``use_gpu=False``: for sizing workers that use no GPU (its GPUs are not
    looked for: :func:`local_node`)."""
    ray = sys.modules.get("ray")
    if (ray is not None and ray.is_initialized()) or resolve_address(address).kind != "local":
        return None
    return Cluster([local_node(gpus=use_gpu)], addresses={"127.0.0.1"})


def alive_nodes() -> list[dict[str, float]]:
    """Resources of the cluster's alive nodes."""
    import ray

    return [n["Resources"] for n in ray.nodes() if n.get("Alive")]


def cluster() -> Cluster:
    """The joined cluster: alive nodes and, where the driver can see the autoscaler's config, its node types."""
    import ray

    alive = [n for n in ray.nodes() if n.get("Alive")]
    types, provider = autoscaler_node_types()
    if _on_shared_ray:  # each command sizes its workers as if it had the machine to itself (shared_ray's docstring)
        from nre_ray.cluster.shared_ray import CPU_FACTOR

        return Cluster([{**n["Resources"], "CPU": n["Resources"].get("CPU", 0.0) / CPU_FACTOR} for n in alive],
                       types, provider, {str(n.get("NodeManagerAddress")) for n in alive})
    return Cluster([n["Resources"] for n in alive], types, provider,
                   {str(n.get("NodeManagerAddress")) for n in alive})


def autoscaler_node_types() -> tuple[list[NodeType], str | None]:
    """The worker node types the cluster's autoscaler may start, and its provider type.

    Read from the cluster config in Ray's GCS where a platform reports one (KubeRay, autoscaler v2), else from the
    autoscaling config on this machine: the file the head's monitor was started with (``--autoscaling-config``),
    or ``~/ray_bootstrap_config.yaml`` that ``ray up`` writes on the head (where ``ray job submit`` runs the
    driver). ``([], None)`` when neither is visible: the cluster is taken to be as large as it is now.
    """
    import ray

    from nre_ray.cluster.ray_private import autoscaler_node_groups

    groups = autoscaler_node_groups()
    if groups is not None:
        return [NodeType(name, resources, count if count >= 0 else UNLIMITED_NODES)
                for name, resources, count in groups if count != 0], None
    path = _autoscaling_config_path(ray.get_runtime_context().gcs_address)
    if path is None:
        return [], None
    return read_node_types(path)


def read_node_types(path: Path) -> tuple[list[NodeType], str | None]:
    """Worker node types (``max_workers`` > 0, the head type excluded) and provider type of an autoscaler YAML."""
    import yaml

    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except (OSError, yaml.YAMLError) as err:
        log.warning("could not read the autoscaler config %s (%s); sizing from the alive nodes only", path, err)
        return [], None
    head = raw.get("head_node_type")
    cap = int(raw.get("max_workers", 1_000_000))
    types = [NodeType(name, {k: float(v) for k, v in (spec.get("resources") or {}).items()},
                      min(int(spec.get("max_workers", cap)), cap))
             for name, spec in (raw.get("available_node_types") or {}).items()
             if name != head and int(spec.get("max_workers", cap)) > 0]
    provider = raw.get("provider") or {}
    return types, provider.get("module") if provider.get("type") == "external" else provider.get("type")


def _autoscaling_config_path(gcs_address: str) -> Path | None:
    """The autoscaling config of the joined cluster's head when it runs on this machine (see
    :func:`autoscaler_node_types`): the ``--autoscaling-config`` of the monitor process whose ``--gcs-address`` is
    the cluster's. Another cluster's monitor on the same machine (a stand-in beside a local run) is not this one.
    With no monitor visible at all, ``~/ray_bootstrap_config.yaml`` (the driver of a job on a ``ray up`` head)."""
    monitors = 0
    for pid in (p for p in os.listdir("/proc") if p.isdigit()) if Path("/proc").is_dir() else ():
        try:
            args = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
        except OSError:
            continue
        if not any("autoscaler" in a and a.endswith("/monitor.py") for a in args[:3]):  # v1's or v2's
            continue
        monitors += 1
        flags = dict(re.match(r"(--[\w-]+)=(.*)", a).groups() for a in args if re.match(r"--[\w-]+=", a))
        # the same machine: the GCS port tells the clusters apart (the host part may be any of its addresses)
        if _port(flags.get("--gcs-address", "")) == _port(gcs_address) and flags.get("--autoscaling-config"):
            return Path(os.path.expanduser(flags["--autoscaling-config"]))
    bootstrap = Path("~/ray_bootstrap_config.yaml").expanduser()
    return bootstrap if not monitors and bootstrap.is_file() else None


def _port(address: str) -> str:
    return address.rsplit(":", 1)[-1]


def placement_timeout(requested: float | None, info: Cluster) -> float:
    """Seconds Ray Train waits for the worker group to be placed: ``--placement-timeout``, else 60 s on a fixed
    cluster and 15 minutes where an autoscaler can add nodes."""
    if requested is not None:
        return requested
    return AUTOSCALING_WAIT_S if info.can_grow else FIXED_CLUSTER_WAIT_S


def size_workers(info: Cluster, num_workers: int, use_gpu: bool = False, cpus_per_worker: float | None = None,
                 wait: float | None = None, plus: int = 0) -> Resources:
    """The workers of ``train`` and ``evaluate`` (and ``predict``'s actors, ``plus`` its reading tasks' share) on
    the cluster: :func:`plan_resources` over its alive nodes and the node types its autoscaler may add, and the
    placement timeout (``wait``: ``--placement-timeout``, else by the cluster's kind: :func:`placement_timeout`).
    Called with the joined cluster, and before Ray starts with :func:`local_cluster`'s."""
    resources = plan_resources(num_workers, use_gpu, info.nodes, cpus_per_worker, info.node_types, plus)
    resources.placement_timeout = placement_timeout(wait, info)
    return resources


def set_placement_timeout(seconds: float | None) -> None:
    """Give the Ray Train controller of the trainer being built ``seconds`` to place its worker group (None: leave
    Ray's default, or the user's own setting). Call it where the trainer is built.

    Ray Train 2.60 takes this wait from no argument: its controller reads :data:`PLACEMENT_TIMEOUT_ENV`, which
    ``fit()`` copies from the driver's environment into the controller's runtime env
    (``ray.train.v2._internal.constants.get_env_vars_to_propagate``). This is the one place nre_ray writes it."""
    if seconds is not None:
        os.environ[PLACEMENT_TIMEOUT_ENV] = f"{seconds:g}"


def local_tracking(uri: str) -> bool:
    """An MLflow tracking URI that only this machine can reach: a sqlite file, a folder, or an HTTP server on the
    loopback address."""
    scheme = uris.scheme(uri)
    if scheme in ("file", "sqlite") or (not scheme and ("/" in uri or uri.startswith("."))):
        return True
    if uris.is_server(uri):
        host = uris.server_host(uri)
        if host == "localhost":
            return True
        try:
            return ipaddress.ip_address(host).is_loopback
        except ValueError:
            return False
    return False  # databricks, a database server, ...: reachable as configured


def check_shared_paths(info: Cluster, storage_path: str, tracking_uri: str, allow_local: bool) -> list[str]:
    """On a cluster with more than one node, the storage path and the tracking URI must reach every node.

    Raises UsageError for a driver-local one; with ``allow_local`` (``--allow-local-storage``: a folder mounted at
    the same path on every node, such as NFS) returns warnings instead.
    """
    if not info.multi_node:
        return []
    problems = []
    nodes = f"{len(info.nodes)} nodes" + (f", node types it may add: {info.describe_types()}" if info.can_grow
                                          else "")
    if not storage.is_uri(storage_path):
        problems.append(f"--storage-path {storage_path} is a folder on this machine, but the cluster has {nodes}: the "
                        "workers on other nodes write checkpoints there and a restarted run reads them back. Use "
                        "shared storage, e.g. --storage-path s3://BUCKET/nre_ray/checkpoints")
    file_store = local_tracking(tracking_uri) and not uris.is_server(tracking_uri)
    if file_store or (local_tracking(tracking_uri) and not info.one_host):
        problems.append(f"the MLflow tracking URI {tracking_uri} is only reachable from this machine, but rank 0 "
                        f"may run on another node ({nodes}). Run an MLflow server and give its address that every "
                        "node reaches, e.g. --tracking-uri http://HEAD-PRIVATE-IP:5000")
    if problems and not allow_local:
        raise UsageError("; and ".join(problems) + ". If this path is mounted at the same place on every node "
                         "(NFS), pass --allow-local-storage.")
    return problems


def quiet_environ(keys: tuple[str, ...] | None = None) -> None:
    """Give this process, and so the processes it starts, the settings of :data:`QUIET_ENV` (``keys``: those alone)
    that the user has not set. Call it before Ray and MLflow are imported: both read them then. Every command calls
    it first, so it is also where a Ray or MLflow release outside the tested ones gets its one warning line
    (:func:`nre_ray.core.versions.warn_if_untested`, once per process)."""
    warn_if_untested()
    for key, value in QUIET_ENV.items():
        if keys is None or key in keys:
            os.environ.setdefault(key, value)


#: glibc's allocator in the workers that run the model (train, evaluate, serve): no fresh mapping for each large
#: block, and freed memory kept for the next step. PyTorch on the CPU allocates and frees the same large tensors every
#: step, and by default glibc maps each block over 32 MB (a pretrained encoder's attention on a document, say) anew
#: and unmaps it when freed, so each step faults all its pages in again: a document model on MiniLM spent most of
#: its CPU time in the kernel so. Measured on CDR (``docs/benchmarks.md``): the same losses and scores, 1.24x the
#: training speed. A worker's memory stays at its peak (which every step reaches anyway); GPU memory is another
#: allocator's. A variable set in the driver's environment is passed on instead.
CPU_ALLOCATOR_ENV = {"MALLOC_MMAP_MAX_": "0", "MALLOC_TRIM_THRESHOLD_": str(1 << 34)}


def cpu_allocator_env() -> dict[str, str]:
    """:data:`CPU_ALLOCATOR_ENV`, with the values the driver's environment sets kept."""
    return {key: os.environ.get(key, value) for key, value in CPU_ALLOCATOR_ENV.items()}


def quiet_env_for_workers() -> dict[str, str]:
    """The Ray part of :data:`QUIET_ENV`, normal priority and glibc's allocator settings (:data:`CPU_ALLOCATOR_ENV`),
    for the runtime env of the workers that run the model (training, serve's replicas)."""
    # Ray starts workers at nice 15; the training workers are the job, so they run at normal priority (as Ray's
    # own job drivers do): at nice 15 any other process on the machine starves them.
    return {**ray_quiet_env(), "RAY_worker_niceness": "0", **cpu_allocator_env()}


def ray_quiet_env() -> dict[str, str]:
    """The Ray part of :data:`QUIET_ENV` (for a runtime env: Ray's own processes read these), and MLflow's telemetry
    switch as this driver has it: the workers import MLflow, and on a cluster they do not inherit the driver's
    environment."""
    return {**{k: v for k, v in QUIET_ENV.items() if k.startswith("RAY_")},
            TELEMETRY_ENV: os.environ.get(TELEMETRY_ENV, QUIET_ENV[TELEMETRY_ENV])}


def root_cause(err: BaseException) -> str:
    """The innermost error message of a Ray training failure."""
    text = str(err)
    for line in reversed(text.strip().splitlines()):
        if line.strip() and not line.startswith(" "):
            return line.strip()
    return text


def placement_failed(err: BaseException) -> bool:
    """True when a Ray Train failure is the worker group not being placed in time."""
    return "WorkerGroupStartupTimeoutError" in repr(err) or "worker group startup timed out" in str(err).lower() \
        or "InsufficientClusterResourcesError" in repr(err)


def restore_cwd(path: str) -> None:
    """Change back into ``path`` when this process's working directory was deleted and made again under it.

    Ray replaces a job's ``--working-dir`` folder whenever a node sets it up; nodes that share one machine and one
    Ray folder (the stand-in's autoscaled nodes, or several raylets on one host) then delete the folder the job's
    driver runs in, and anything that asks for the working directory (MLflow does) fails.
    """
    try:
        os.getcwd()
    except FileNotFoundError:
        os.chdir(path)

"""Process helpers for tests that start the CLI, Ray nodes or an MLflow server as subprocesses.

Processes are found through ``/proc`` (Linux) by ancestry, so a test only ever signals the processes it started and
their descendants: never ``ray stop``, ``pkill`` or anything matched by name across the machine.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import random
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

from nre_ray.cluster import processes
from nre_ray.cluster.ports import free_port  # noqa: F401 (the tests' free port is the product's)
from nre_ray.cluster.processes import cmdline

#: Environment for subprocess Ray drivers and nodes: quiet, no token auth on 127.0.0.1, and Train's placement-group
#: cleaner kept from asking another cluster's dashboard on this shared host (see the stack notes).
RAY_ENV = {"RAY_USAGE_STATS_ENABLED": "0", "RAY_AUTH_MODE": "disabled", "RAY_DATA_DISABLE_PROGRESS_BARS": "1",
           "RAY_API_SERVER_ADDRESS": "http://127.0.0.1:9"}


def env(**extra: str) -> dict[str, str]:
    """This process's environment for a subprocess: RAY_ENV added, any RAY_ADDRESS of the test session removed. The
    session's NRE_RAY_OWN_RAY=1 (tests/conftest.py) stays: a command started with it starts a private local Ray, as a
    user's first command does (tests/session_ray.py keeps one shared Ray warm where a test runs many commands)."""
    out = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    out.update(RAY_ENV, **extra)
    return out


@contextlib.contextmanager
def environ(values: dict[str, str]) -> Iterator[None]:
    """This process's environment with ``values`` set while the block runs, then as it was (e.g. a stand-in's MLflow
    user and password for this test's own MLflow client, which reads them from the environment at each call)."""
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def alive(pid: int) -> bool:
    """True while ``pid`` exists and is not a zombie (:func:`nre_ray.cluster.processes.alive`)."""
    return processes.alive(pid)


def descendants(root: int) -> list[int]:
    """Every process below ``root`` (children, grandchildren, ...), from one snapshot of /proc."""
    return sorted(processes.descendants([root], processes.parents()) - {root})


def train_workers(root: int) -> list[int]:
    """Ray Train worker processes below ``root``."""
    return [p for p in descendants(root) if cmdline(p).startswith("ray::RayTrainWorker")]


def wait_for(what: str, check: Callable[[], Any], timeout: float, interval: float = 0.2,
             proc: subprocess.Popen | None = None, log: Path | None = None) -> Any:
    """Poll ``check`` until it returns something truthy; fail after ``timeout`` s or when ``proc`` exits early."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        if proc is not None and proc.poll() is not None:
            tail = log.read_text(errors="replace")[-3000:] if log and log.exists() else ""
            raise AssertionError(f"process exited ({proc.returncode}) while waiting for {what}\n{tail}")
        time.sleep(interval)
    tail = log.read_text(errors="replace")[-3000:] if log and log.exists() else ""
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}\n{tail}")


def kill_all(pids: Iterable[int], grace: float = 5.0) -> None:
    """SIGTERM ``pids``, wait up to ``grace`` s, then SIGKILL what is left."""
    pids = [p for p in pids if alive(p)]
    for pid in pids:
        _signal(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and any(alive(p) for p in pids):
        time.sleep(0.1)
    for pid in pids:
        if alive(pid):
            _signal(pid, signal.SIGKILL)


def mentioning(text: str) -> list[int]:
    """Processes whose command line contains ``text`` (e.g. a test's own temporary folder)."""
    return [int(n) for n in os.listdir("/proc") if n.isdigit() and text in cmdline(int(n)) and int(n) != os.getpid()]


def with_env(key: str, value: str) -> list[int]:
    """Processes whose environment sets ``key`` to ``value`` (e.g. the endpoint of a test's own object store, which
    every process started for that test inherits, whoever its parent is now)."""
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == os.getpid():
            continue
        try:
            with open(f"/proc/{name}/environ", "rb") as fh:
                variables = fh.read().split(b"\0")
        except OSError:
            continue
        if f"{key}={value}".encode() in variables:
            found.append(int(name))
    return found


def stop_tree(proc: subprocess.Popen, grace: float = 5.0) -> None:
    """Stop a process started by a test (with :func:`start`: its own session and process group) and everything
    below it: its descendants, found before signalling, and what is left in its process group (orphans)."""
    pids = [*descendants(proc.pid), proc.pid]
    kill_all([proc.pid], grace)  # the parent first: `ray start --block` and mlflow stop their children themselves
    kill_all(pids, grace)
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    try:
        proc.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        pass


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


def listening(pids: Iterable[int]) -> list[tuple[int, str, str, int]]:
    """The TCP sockets that the processes ``pids`` listen on: ``(pid, command line, address, port)``, from
    /proc/net/tcp and tcp6 and each process's open files (``ss -ltnp`` without ``ss``). ``::`` and ``0.0.0.0`` are
    every interface; an IPv4 address in a tcp6 socket shows as ``::ffff:A.B.C.D``."""
    sockets = {}  # inode -> (address, port)
    for table in ("tcp", "tcp6"):
        lines = Path(f"/proc/net/{table}").read_text().splitlines()[1:]
        for fields in (line.split() for line in lines):
            if fields[3] != "0A":  # TCP_LISTEN
                continue
            address, port = fields[1].split(":")
            raw = bytes.fromhex(address)  # each 32-bit word in host (little-endian) order
            words = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
            ip = ipaddress.IPv4Address(words) if table == "tcp" else ipaddress.IPv6Address(words)
            sockets[int(fields[9])] = (str(ip), int(port, 16))
    found = []
    for pid in pids:
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:  # gone
            continue
        for fd in fds:
            try:
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if target.startswith("socket:[") and int(target[8:-1]) in sockets:
                found.append((pid, cmdline(pid)[:100], *sockets[int(target[8:-1])]))
    return found


def loopback(address: str) -> bool:
    """True for 127.0.0.0/8, ::1 and an IPv4 loopback address in IPv6 form (``::ffff:127.0.0.1``)."""
    ip = ipaddress.ip_address(address)
    mapped = getattr(ip, "ipv4_mapped", None)
    return (mapped or ip).is_loopback


def free_port_between(low: int, high: int) -> int:
    """A TCP port from ``low`` to ``high`` that was free a moment ago on 127.0.0.1."""
    for port in random.sample(range(low, high + 1), min(200, high + 1 - low)):
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise AssertionError(f"no free port from {low} to {high}")


def start(args: list[str], log: Path, cwd: Path, extra_env: dict[str, str] | None = None) -> subprocess.Popen:
    """Start ``args`` in its own session, stdout and stderr to ``log``."""
    with open(log, "ab") as out:
        return subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, cwd=cwd, env=env(**(extra_env or {})),
                                start_new_session=True)


def cli(*args: str) -> list[str]:
    """``python -m nre_ray.train ARGS`` with this interpreter."""
    return [sys.executable, "-m", "nre_ray.train", *args]

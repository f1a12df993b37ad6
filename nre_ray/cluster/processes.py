"""Processes known by their identity, read from /proc (Linux): the process id together with the moment the process
started and its command line. After the process ends, or after a reboot, the system gives its id to another program;
a process is signalled only while the three still match what was recorded, so that program is never touched.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Process:
    """One process as /proc shows it."""

    pid: int
    start: int  #: when it started, in clock ticks after boot (field 22 of /proc/<pid>/stat)
    cmdline: str  #: its arguments joined by spaces (a Ray worker shows its title, e.g. ``ray::RayTrainWorker``)

    def current(self) -> bool:
        """True while this very process runs (a zombie has ended; another program under its id is not it)."""
        return identify(self.pid) == self

    def signal(self, sig: int) -> bool:
        """Send ``sig`` if this is still the process recorded; returns whether it was sent. The check and the signal
        go through one pidfd, so an id handed to a new process in between cannot be hit."""
        try:
            fd = os.pidfd_open(self.pid)
        except OSError:  # gone
            return False
        try:
            if not self.current():
                return False
            signal.pidfd_send_signal(fd, sig)
            return True
        except OSError:  # ended meanwhile, or not ours to signal
            return False
        finally:
            os.close(fd)

    def describe(self) -> str:
        return f"{self.pid} (`{self.cmdline[:80]}`)"


def stat_fields(pid: int) -> list[str] | None:
    """The fields of /proc/<pid>/stat after ``(comm)`` (index 0 is field 3, the state; 1 the parent; 19 field 22, the
    start time); None when it is gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return text[text.rindex(")") + 2:].split()


def cmdline(pid: int) -> str:
    """The command line of ``pid``, its arguments joined by spaces ('' when it is gone); a Ray worker shows its title
    (``ray::RayTrainWorker``)."""
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return ""
    return raw.replace(b"\0", b" ").decode(errors="replace").strip()


def identify(pid: int) -> Process | None:
    """The process now running as ``pid``; None if there is none, or only a zombie."""
    fields = stat_fields(pid)
    if fields is None or fields[0] in ("Z", "X"):
        return None
    return Process(pid, int(fields[19]), cmdline(pid))


def find(pid: int, start: int | None = None) -> Process | None:
    """The process running as ``pid`` while it is the one recorded: with ``start`` (its start time,
    :attr:`Process.start`), only that very process, not another program the system gave its id to later; None when
    it has ended (a zombie has), or runs no more as that one."""
    found = identify(pid)
    return found if found is not None and (start is None or found.start == start) else None


def alive(pid: int, start: int | None = None) -> bool:
    """Whether the process ``pid`` (with ``start``: that very one, see :func:`find`) still runs: the one liveness
    check of nre_ray. A process of another user's that ``/proc`` hides (``hidepid``) cannot be told apart from a
    later one: it counts as running. Without ``start`` (a record of an older nre_ray that kept only the id), any
    process under that id counts."""
    if find(pid, start) is not None:
        return True
    if stat_fields(pid) is not None:  # visible: ended (a zombie), or another program now
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's, hidden from this one: not to be judged
        return True
    return start is None  # not in /proc a moment ago: that one ended, and another has its id now


def started(pid: int | None = None) -> int:
    """The start time (:attr:`Process.start`) of ``pid`` (default: this process); 0 when it has ended."""
    fields = stat_fields(os.getpid() if pid is None else pid)
    return int(fields[19]) if fields is not None else 0


def parents() -> dict[int, int]:
    """Every process id (but this process's) -> its parent's, from one look at /proc."""
    found = {}
    for name in os.listdir("/proc"):
        if name.isdigit() and int(name) != os.getpid():
            fields = stat_fields(int(name))
            if fields is not None:
                found[int(name)] = int(fields[1])
    return found


def descendants(roots: Iterable[int], tree: dict[int, int]) -> set[int]:
    """``roots`` and every process below them (children, grandchildren, ...) in ``tree`` (:func:`parents`)."""
    children: dict[int, list[int]] = {}
    for pid, parent in tree.items():
        children.setdefault(parent, []).append(pid)
    found, todo = set(), list(roots)
    while todo:
        pid = todo.pop()
        if pid not in found:
            found.add(pid)
            todo.extend(children.get(pid, []))
    return found


def environ(pid: int) -> dict[str, str]:
    """The environment ``pid`` started with ({} when it is gone or not this user's)."""
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return {}
    return dict(item.split("=", 1) for item in raw.decode(errors="replace").split("\0") if "=" in item)


def stop(processes: Iterable[Process], grace: float) -> list[Process]:
    """SIGTERM each process that is still the one recorded, SIGKILL what is left after ``grace`` s; returns those
    signalled. Zombies left among this process's own children are reaped."""
    signalled = [p for p in processes if p.signal(signal.SIGTERM)]
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and any(p.current() for p in signalled):
        time.sleep(0.2)
    for process in signalled:
        process.signal(signal.SIGKILL)
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and any(p.current() for p in signalled):
        time.sleep(0.1)
    for process in signalled:
        try:
            os.waitpid(process.pid, os.WNOHANG)
        except ChildProcessError:  # not this process's child: its parent (or init) reaps it
            pass
    return signalled

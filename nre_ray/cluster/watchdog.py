"""What a command leaves behind when it is killed: the watchdog of the local Ray a command starts.

A local Ray shares its fate with the command that started it, but not all of it: killed with SIGKILL (the OOM killer,
``kill -9``, a scheduler's hard stop), the command takes Ray's GCS and raylet with it, while Ray's dashboard and
runtime-env agents stay (they try to tell the dead GCS, for ever), and so does the HAProxy of Serve's ingress, which
keeps the command's port. :func:`start` runs ``python -m nre_ray.cluster.watchdog PID`` beside the command: it notes
every process below the command, once a second, and when the command has ended it gives Ray a few seconds to stop its
own, then stops what is left of them and of what they started meanwhile (:func:`stop_all`). It touches nothing but
processes it saw below the command, each known by its start time as well as its id (:mod:`nre_ray.cluster.processes`).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from nre_ray.cluster import processes

#: How often the watchdog looks at the command's processes, in seconds.
INTERVAL_S = 1.0
#: How long, after the command has ended, Ray has to stop its own processes before the watchdog stops the rest.
GRACE_S = 3.0

_started: subprocess.Popen | None = None


def start() -> None:
    """Watch this process's descendants from a process of its own (once per process). It runs in a session of its
    own, so that a Ctrl-C to the command's process group does not stop it before the command has ended."""
    global _started
    if _started is not None or not os.path.isdir("/proc"):
        return
    _started = subprocess.Popen([sys.executable, "-m", "nre_ray.cluster.watchdog", str(os.getpid())],
                                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                start_new_session=True, close_fds=True)


def look(roots: list[int], seen: dict[tuple[int, int], processes.Process]) -> None:
    """Add every process now below ``roots`` to ``seen`` (keyed by id and start time), as it is now."""
    for pid in processes.descendants(roots, processes.parents()) - {*roots, os.getpid()}:
        found = processes.identify(pid)
        if found is not None:
            seen[(found.pid, found.start)] = found


def still_running(seen: dict[tuple[int, int], processes.Process]) -> list[processes.Process]:
    """The processes of ``seen`` that still run, as they are now (a Ray worker retitles itself: ray::IDLE, then
    ray::ServeReplica...); another program under a recorded id is not one of them."""
    return [now for pid, begun in seen if (now := processes.identify(pid)) is not None and now.start == begun]


def watch(command: processes.Process, interval: float = INTERVAL_S,
          grace: float = GRACE_S) -> dict[tuple[int, int], processes.Process]:
    """Every process seen below ``command``: looked at every ``interval`` s while it runs, then for ``grace`` s
    below those of them that still run (a process started in the last moments of the command, after the last look,
    has a parent among them: Serve's proxy restarts HAProxy when the replicas change)."""
    seen: dict[tuple[int, int], processes.Process] = {}
    while command.current():
        look([command.pid], seen)
        time.sleep(interval)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        look([p.pid for p in still_running(seen)], seen)
        time.sleep(min(0.5, interval))
    return seen


def stop_all(seen: dict[tuple[int, int], processes.Process]) -> list[processes.Process]:
    """Stop what still runs of ``seen`` and of what they have started since: freeze them (SIGSTOP), look below them
    again until nothing new turns up (a frozen process starts nothing more; Serve's HAProxy manager restarts HAProxy
    when the replicas it knew of are gone, and one restarted while the others were being stopped outlived them
    before), then SIGKILL them all. Returns those killed. (The command is gone, SIGKILLed: what is left of its Ray has
    no one to report to; a SIGTERM would reach a frozen process only once it is let go again.)"""
    while True:
        running = still_running(seen)
        for process in running:
            process.signal(signal.SIGSTOP)
        known = len(seen)
        look([p.pid for p in running], seen)
        if len(seen) == known:
            break
    running = still_running(seen)
    for process in running:
        process.signal(signal.SIGKILL)
    return running


def main(argv: list[str]) -> int:
    """``python -m nre_ray.cluster.watchdog PID``: watch PID's processes; stop what is left of them once it ends."""
    command = processes.identify(int(argv[0]))
    if command is None:
        return 0
    stop_all(watch(command))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""The one liveness check of nre_ray (:func:`nre_ray.cluster.processes.alive`, :func:`find`): a process counts as
running while it is the very process recorded, by its id and its start time."""

from __future__ import annotations

import os
import subprocess
import sys
import time

from nre_ray.cluster import processes


def test_a_process_counts_while_it_runs_and_only_itself() -> None:
    me, start = os.getpid(), processes.started()
    assert start > 0 and processes.alive(me, start) and processes.find(me, start).pid == me
    assert processes.alive(me)  # a record of an older nre_ray: the id alone
    # The id given to another program (a reuse after this one ended): same id, another start time.
    assert not processes.alive(me, start + 1) and processes.find(me, start + 1) is None
    ended = subprocess.Popen([sys.executable, "-c", "pass"])
    ended.wait()
    assert not processes.alive(ended.pid, start) and not processes.alive(ended.pid)
    assert processes.started(ended.pid) == 0


def test_a_zombie_has_ended() -> None:
    """A child that exited but was not reaped yet is still in the process table (``kill(pid, 0)`` succeeds): it has
    ended all the same, and its temporaries are stale."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    start = processes.started(child.pid)
    try:
        while processes.stat_fields(child.pid)[0] != "Z":
            time.sleep(0.01)
        os.kill(child.pid, 0)  # still there for the kernel
        assert not processes.alive(child.pid, start) and not processes.alive(child.pid)
    finally:
        child.wait()


"""The watchdog of a command's local Ray: when the command is killed outright, what it started and left behind is
stopped (a child in a session of its own, as Serve's HAProxy, and its child), and nothing else is touched."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from nre_ray.cluster.processes import cmdline
from tests.procs import alive, descendants, wait_for

#: A command that starts its watchdog, then a child in a session of its own (which a signal to the command's
#: process group does not reach) with a grandchild, prints their ids and waits to be killed.
COMMAND = """
import subprocess, sys, time
from nre_ray.cluster import watchdog
watchdog.start()
child = subprocess.Popen(["sh", "-c", "sleep 600 & exec sleep 600"], start_new_session=True)
time.sleep(0.5)
print(child.pid, flush=True)
time.sleep(600)
"""


def test_a_command_killed_outright_leaves_nothing_it_started(tmp_path):
    bystander = subprocess.Popen(["sleep", "600"])  # not below the command: never touched
    command = subprocess.Popen([sys.executable, "-c", COMMAND], stdout=subprocess.PIPE, text=True, cwd=tmp_path,
                               env={**os.environ, "PYTHONPATH": os.getcwd()})
    try:
        child = int(command.stdout.readline())
        wait_for("the watchdog to see the child", lambda: len(descendants(command.pid)) >= 3, timeout=10)
        time.sleep(1.5)  # a look at the processes after they were all there
        below = descendants(command.pid)
        watcher = [p for p in below if "nre_ray.cluster.watchdog" in cmdline(p)]
        assert len(watcher) == 1 and child in below, [cmdline(p) for p in below]
        command.send_signal(signal.SIGKILL)
        command.wait(timeout=10)
        wait_for("what the command started to end", lambda: not [p for p in below if alive(p)], timeout=20)
        assert bystander.poll() is None
    finally:
        command.kill()
        bystander.kill()
        bystander.wait()

"""A driver's events file (the Ray Train controller's lines for its console) is named after the driver, and the
files of drivers that are gone (a SIGKILLed command cannot remove its own) are removed by the next run."""

from __future__ import annotations

import os
import subprocess
import sys

from nre_ray.runner import EVENTS_PREFIX, remove_stale_events


def test_the_events_files_of_drivers_that_are_gone_are_removed(tmp_path):
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True,
                          check=True)
    dead = tmp_path / f"{EVENTS_PREFIX}{gone.stdout.strip()}_k3x9.jsonl"
    mine = tmp_path / f"{EVENTS_PREFIX}{os.getpid()}_a1b2.jsonl"
    other = tmp_path / f"{EVENTS_PREFIX}q_z9.jsonl"  # not named after a driver: not ours to judge
    unrelated = tmp_path / "notes.jsonl"
    for path in (dead, mine, other, unrelated):
        path.write_text("{}\n", encoding="utf-8")
    remove_stale_events(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(p.name for p in (mine, other, unrelated))

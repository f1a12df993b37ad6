"""Temporaries are named after the process that makes them (:mod:`nre_ray.tempfiles`), and those of processes that
are gone (a SIGKILLed driver's events file, a killed worker's half-saved checkpoint) are removed by the next run."""

from __future__ import annotations

import subprocess
import sys
import tempfile

from nre_ray import tempfiles
from nre_ray.buildonce import HOST


def test_the_temporaries_of_processes_that_are_gone_are_removed(tmp_path):
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True,
                          check=True).stdout.strip()
    dead_file = tmp_path / f"nre_ray_events_{gone}-{HOST}-k3x9_a.jsonl"
    dead_folder = tmp_path / f"nre_ray_ckpt_{gone}-{HOST}-q1w2e3r4"
    (dead_folder / "sub").mkdir(parents=True)
    (dead_folder / "sub" / "state.pt").write_bytes(b"half")
    mine = tempfile.mkdtemp(prefix=tempfiles.prefix("report"), dir=tmp_path)
    kept = [f"nre_ray_ckpt_{gone}-0badf00d-abcd1234",  # another machine's (a temporary folder shared with a container)
            "nre_ray_ckpt_q1w2_e3r4",  # an older name, without a process id: not ours to judge
            "notes.jsonl"]
    dead_file.write_text("{}\n", encoding="utf-8")
    for name in kept:
        (tmp_path / name).write_text("x", encoding="utf-8")
    tempfiles.remove_stale(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([*kept, mine.rsplit("/", 1)[-1]])

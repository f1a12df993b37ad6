"""Temporaries are named after the process that makes them (:mod:`nre_ray.core.tempfiles`), and those of processes that
are gone (a SIGKILLed driver's events file, a killed worker's half-saved checkpoint) are removed by the next run."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile

from nre_ray.cluster import processes
from nre_ray.core import buildonce, tempfiles
from nre_ray.core.tempfiles import HOST


def test_the_temporaries_of_processes_that_are_gone_are_removed(tmp_path, caplog):
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
    with caplog.at_level("INFO", logger=tempfiles.__name__):
        tempfiles.remove_stale(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([*kept, mine.rsplit("/", 1)[-1]])
    # one line for all of them, not one a leftover
    assert [r.getMessage() for r in caplog.records] == [f"removed 2 leftovers of processes that ended from {tmp_path} "
                                                        f"({min(dead_file.name, dead_folder.name)}, ...)"]


def test_a_name_keeps_its_makers_start_time_and_a_reused_id_does_not_keep_its_files(tmp_path):
    """A temporary's name carries its maker's process id and start time (:func:`tempfiles.maker`): a file of an
    ended process whose id runs another program now is removed, this process's own are kept; a name of an older
    nre_ray (the id alone) is judged by the id."""
    me, start = os.getpid(), processes.started()
    assert tempfiles.prefix("ckpt") == f"nre_ray_ckpt_{me}.{start}-{HOST}-"
    reused = tmp_path / f"nre_ray_ckpt_{me}.{start + 1}-{HOST}-a1"  # this id, another process: ended
    mine = tmp_path / f"nre_ray_ckpt_{me}.{start}-{HOST}-b2"
    older_mine = tmp_path / f"nre_ray_ckpt_{me}-{HOST}-c3"
    for path in (reused, mine, older_mine):
        path.write_text("x", encoding="utf-8")
    tempfiles.remove_stale(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([mine.name, older_mine.name])


def test_one_sweeper_serves_the_build_folders_too(tmp_path):
    """buildonce's private build folders (``<name>.tmp-<pid>.<start>-<random>-<host>``) are swept by the same
    function: a folder of this process is kept, one of an ended process (or of a reused id) removed, a file named
    like one is left alone (folders only), as is another machine's folder until it is old enough."""
    me, start = os.getpid(), processes.started()
    mine = tmp_path / buildonce.private_name("key")
    assert mine.name.startswith(f"key.tmp-{me}.{start}-") and mine.name.endswith(f"-{HOST}")
    reused = tmp_path / f"key.tmp-{me}.{start + 1}-0badc0de-{HOST}"
    a_file = tmp_path / f"file.tmp-{me}.{start + 1}-0badc0de-{HOST}"
    elsewhere = tmp_path / f"key.tmp-1.1-0badc0de-{'e' * 8}"
    for folder in (mine, reused, elsewhere):
        (folder / "work").mkdir(parents=True)
    a_file.write_text("x", encoding="utf-8")
    buildonce.remove_stale(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([mine.name, a_file.name, elsewhere.name])
    tempfiles.remove_stale(tmp_path, buildonce._PRIVATE, max_age=-1, folders_only=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([mine.name, a_file.name])

"""The preprocessing cache under concurrency (the protocol of :mod:`nre_ray.core.buildonce`): two runs that start at
once on the same inputs on one machine (two terminals) take turns: one builds in a private folder and publishes it with
one atomic rename, the other waits and loads that; neither ever sees a half-written cache, and what they load equals a
single run's build. The cache folder's rules without Ray are in tests/unit/test_cache_rules.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from nre_ray.data import pipeline
from nre_ray.data.batches import EncodedSplit
from tests import procs

RACER = r"""
import hashlib, json, logging, os, sys, time
from pathlib import Path

import ray

from nre_ray.config import DataConfig
from nre_ray.data import pipeline

name, cache, out, barrier, reference = sys.argv[1:6]
logging.basicConfig(level=logging.WARNING, stream=sys.stdout, format="%(name)s: %(message)s")
logging.getLogger("nre_ray").setLevel(logging.INFO)
ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False, logging_level=logging.WARNING)


def digest(prepared):
    arrays = {}
    for split, enc in sorted(prepared.splits.items()):
        for key, value in sorted(enc.arrays.items()):
            h = hashlib.sha256(f"{value.dtype}{value.shape}".encode())
            h.update(value.tobytes())
            arrays[f"{split}.{key}"] = h.hexdigest()
    return {"arrays": arrays, "vocab": prepared.vocab.tokens, "labels": prepared.labels, "audit": prepared.audit,
            "sources": prepared.sources, "cache_dir": prepared.cache_dir, "cache_hit": prepared.cache_hit,
            "rejected_count": prepared.rejected_count}


# both racers start preprocessing at the same moment, once both Rays are up
Path(barrier, name).touch()
deadline = time.monotonic() + 180
while len(os.listdir(barrier)) < 2:
    if time.monotonic() > deadline:
        sys.exit("the other racer never got ready")
    time.sleep(0.01)
started = time.monotonic()
result = {"race": digest(pipeline.prepare(DataConfig(cache_dir=cache), 1)), "seconds": time.monotonic() - started}
if reference != "-":  # then a single run's build into a cache folder of its own
    result["reference"] = digest(pipeline.prepare(DataConfig(cache_dir=reference), 1))
Path(out).write_text(json.dumps(result))
ray.shutdown()
"""


def folder_contents(root: Path) -> dict[str, object]:
    """Every file under ``root`` (relative path -> its bytes; the splits' ``.npy`` files carry no write times)."""
    return {path.relative_to(root).as_posix(): path.read_bytes()
            for path in sorted(p for p in root.rglob("*") if p.is_file())}


@pytest.mark.integration
@pytest.mark.timeout(600)
def test_two_runs_at_once_share_one_cache_and_load_what_a_single_run_builds(tmp_path: Path) -> None:
    cache, reference, barrier = tmp_path / "cache", tmp_path / "reference", tmp_path / "barrier"
    barrier.mkdir()
    runs: dict[str, tuple[subprocess.Popen, Path, Path]] = {}
    seen: list[str] = []  # what a reader saw in the cache folder while the racers ran: never a half-written cache
    done = threading.Event()
    watcher = threading.Thread(target=watch, args=(cache, seen, done), daemon=True)
    watcher.start()
    try:
        for name in ("a", "b"):
            out, log = tmp_path / f"{name}.json", tmp_path / f"{name}.log"
            args = [sys.executable, "-c", RACER, name, str(cache), str(out), str(barrier),
                    str(reference) if name == "a" else "-"]
            runs[name] = (procs.start(args, log, cwd=procs_cwd()), out, log)
        for name, (proc, _, log) in runs.items():
            try:
                code = proc.wait(timeout=400)
            except subprocess.TimeoutExpired:
                code = None
            assert code == 0, f"racer {name} exited with {code}:\n{log.read_text(errors='replace')[-4000:]}"
    finally:
        done.set()
        watcher.join(timeout=10)
        for proc, _, _ in runs.values():
            procs.stop_tree(proc)

    results = {name: json.loads(out.read_text()) for name, (_, out, _) in runs.items()}
    logs = {name: log.read_text(errors="replace") for name, (_, _, log) in runs.items()}
    # racer a then builds the reference, which logs "nothing cached yet" too, in another folder
    built = [name for name, text in logs.items() if f"nothing cached yet for these inputs and settings; the result " \
             f"is cached in {cache}{os.sep}" in text]
    assert len(built) == 1, logs  # one machine: the runs took turns, and one of them built
    (waited,) = set(logs) - set(built)
    assert "is building the same result" in logs[waited] and "waiting for it" in logs[waited], logs[waited]
    assert "another run published the same result" in logs[waited], logs[waited]
    assert results[waited]["race"]["cache_hit"] and not results[built[0]]["race"]["cache_hit"]
    assert seen and all(state == "complete" for state in seen), sorted(set(seen))
    single = results["a"]["reference"]
    assert not single["cache_hit"]
    (key,) = [p.name for p in reference.iterdir()]
    for name, result in results.items():
        race = result["race"]
        assert race["cache_dir"] == str(cache / key), name
        assert {k: race[k] for k in ("arrays", "vocab", "labels", "audit", "sources", "rejected_count")} == \
            {k: single[k] for k in ("arrays", "vocab", "labels", "audit", "sources", "rejected_count")}, name
    assert sorted(p.name for p in cache.iterdir()) == [key], "private folders were left behind"
    assert folder_contents(cache / key) == folder_contents(reference / key)
    assert not list(tmp_path.rglob("*.tmp-*"))
    loaded = pipeline.load_prepared(cache / key)
    assert loaded.cache_dir == str(cache / key)
    print(f"\nrace: preprocessing took {results['a']['seconds']:.1f} s and {results['b']['seconds']:.1f} s")


def watch(cache: Path, seen: list[str], done: threading.Event) -> None:
    """Until ``done``: every 20 ms, what a reader finds in each cache folder under ``cache`` (private build folders
    aside): "complete" (meta.json and every split it names) or what is missing."""
    while not done.wait(0.02):
        for folder in cache.iterdir() if cache.is_dir() else []:
            if ".tmp-" in folder.name:
                continue
            try:
                meta = json.loads((folder / pipeline.MARKER).read_text())
                missing = [f for s in meta["splits"] for f in EncodedSplit.files(s) if not (folder / f).is_file()]
                seen.append(f"missing {missing}" if missing else "complete")
            except (OSError, ValueError) as err:
                seen.append(f"{folder.name} without a readable meta.json ({type(err).__name__})")


def procs_cwd() -> Path:
    """The repository root (so that ``nre_ray`` and ``tests`` import in the racers)."""
    return Path(__file__).resolve().parents[2]

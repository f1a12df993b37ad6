"""Start-up of a command's Ray: a private local Ray (the baseline, ``NRE_RAY_OWN_RAY=1``), the shared local Ray
started by the first command, and the shared local Ray joined by a later one (nre_ray.cluster.shared_ray).

Each measurement is a fresh Python process that imports Ray and nre_ray first (not timed), then times
``nre_ray.cluster.session.start_ray(None)``. Every round measures the three in turn, in one run of this script, so the
ratios compare like with like on a machine whose load changes. The shared Ray lives under a fresh RAY_TMPDIR of its
own and is stopped (by its host, once its last command has ended) before the next round.

    .venv/bin/python scripts/bench_ray_start.py --rounds 3
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PROBE = """
import json, sys, time
import ray
from nre_ray.cluster import session
t = time.perf_counter()
session.start_ray(None, log_to_driver=False)
took = time.perf_counter() - t
print(json.dumps({"s": took, "shared": session._on_shared_ray}), flush=True)
sys.stdin.read()  # held until the parent closes stdin (the holder keeps the shared Ray in use meanwhile)
ray.shutdown()
"""


def probe(env: dict[str, str], hold: bool = False) -> tuple[float, subprocess.Popen]:
    """Run the probe; the seconds ``start_ray`` took, and the process (still running when ``hold``)."""
    proc = subprocess.Popen([sys.executable, "-c", PROBE], env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True)
    line = proc.stdout.readline() if proc.stdout else ""
    if not line:
        proc.kill()
        raise SystemExit(f"the probe failed ({proc.wait()})")
    if not hold:
        proc.communicate("")
    return json.loads(line)["s"], proc


def wait_stopped(tmp: Path, timeout: float = 60.0) -> None:
    """Until the shared Ray's record under ``tmp`` is gone (its host stopped it)."""
    record = tmp / f"nre_ray-{os.getuid()}" / "local-ray" / "record.json"
    deadline = time.monotonic() + timeout
    while record.exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    time.sleep(2.0)  # Ray's own processes end a moment after


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="nrebench", dir="/tmp"))  # short: Ray's socket paths live under it
    base = {**os.environ, "RAY_TMPDIR": str(tmp), "RAY_USAGE_STATS_ENABLED": "0", "RAY_AUTH_MODE": "disabled"}
    base.pop("RAY_ADDRESS", None)
    base.pop("RAY_API_SERVER_ADDRESS", None)
    times: dict[str, list[float]] = {"own": [], "start shared": [], "join shared": []}
    try:
        for _ in range(args.rounds):
            times["own"].append(probe({**base, "NRE_RAY_OWN_RAY": "1"})[0])
            shared = {**base, "NRE_RAY_OWN_RAY": ""}
            times["start shared"].append(probe(shared)[0])
            wait_stopped(tmp)
            _, holder = probe(shared, hold=True)
            times["join shared"].append(probe(shared)[0])
            holder.communicate("")
            wait_stopped(tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    own = statistics.median(times["own"])
    print(f"{args.rounds} rounds on {os.cpu_count()} CPUs, 1-minute load average {os.getloadavg()[0]:.1f}")
    print("| a command's Ray | start_ray, median (s) | all rounds (s) | vs. a private Ray |")
    print("|---|---|---|---|")
    names = {"own": "private local Ray (baseline, NRE_RAY_OWN_RAY=1)", "start shared": "starts the shared Ray",
             "join shared": "joins the shared Ray"}
    for key, values in times.items():
        median = statistics.median(values)
        print(f"| {names[key]} | {median:.2f} | {', '.join(f'{v:.2f}' for v in values)} | {median / own:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())

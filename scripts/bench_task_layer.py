#!/usr/bin/env python3
"""Sentence-level results before and after the task layer (issue 37): the same training commands run by the code of
``--before`` (default 3942d04, the last commit before ``nre_ray/tasks/``) and by this checkout, side by side.

The earlier code is checked out into a temporary git worktree and imported from there (``PYTHONPATH``; the Ray
workers of a local Ray inherit it), with this venv's packages. Each case is one ``python -m nre_ray.train`` run with
the same flags, seed and worker count, and the same empty preprocessing cache folder of its own; the validation and
test scores its ``--summary-json`` reports are compared to the last digit::

    .venv/bin/python scripts/bench_task_layer.py --out docs/results_task_layer.json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from bench_common import BENCH_ENV, REPO, SHARED, machine, table

SAMPLE = REPO / "nre_ray" / "data" / "sample"
#: name -> the run's flags (data, model, epochs, workers); every case also gets --seed 1.
CASES: dict[str, list[str]] = {
    "sample, cnn, 1 worker": ["--data-dir", str(SAMPLE), "--epochs", "3", "--num-workers", "1"],
    "sample, cnn, 2 workers": ["--data-dir", str(SAMPLE), "--epochs", "3", "--num-workers", "2"],
    "sample, cnn, 3 workers": ["--data-dir", str(SAMPLE), "--epochs", "3", "--num-workers", "3"],
    # with --negative-label: the positive-class and SemEval scorer's scores too
    "sample, pcnn, 2 workers, no_relation negative": ["--data-dir", str(SAMPLE), "--epochs", "3", "--num-workers", "2",
                                                      "--model", "pcnn", "--negative-label", "no_relation"],
    "FewRel, cnn, 2 workers": ["--data-dir", str(SHARED / "fewrel" / "csv"), "--epochs", "2", "--num-workers", "2"],
    "DeepKE Chinese, bilstm, 2 workers": ["--data-dir", str(SHARED / "deepke_chinese" / "csv"), "--epochs", "2",
                                          "--num-workers", "2", "--model", "bilstm"],
}


def run(code: Path | None, flags: list[str], work: Path, timeout: float) -> dict[str, Any]:
    """``python -m nre_ray.train FLAGS`` with nre_ray imported from ``code`` (None: this checkout), in ``work``; its
    summary."""
    work.mkdir(parents=True)
    env = {**os.environ, **BENCH_ENV}
    if code is not None:
        env["PYTHONPATH"] = os.pathsep.join([str(code), *filter(None, [os.environ.get("PYTHONPATH")])])
    cmd = [sys.executable, "-m", "nre_ray.train", *flags, "--seed", "1", "--tracking-uri",
           f"sqlite:///{work}/mlflow.db", "--storage-path", str(work / "runs"), "--cache-dir", str(work / "cache"),
           "--summary-json", str(work / "summary.json"), "--no-log-model"]
    with open(work / "train.log", "w", encoding="utf-8") as log:
        done = subprocess.run(cmd, cwd=work, env=env, stdout=log, stderr=subprocess.STDOUT, timeout=timeout,
                              check=False)
    if done.returncode != 0:
        tail = (work / "train.log").read_text(encoding="utf-8", errors="replace")[-3000:]
        raise SystemExit(f"{' '.join(cmd)} (code {code or REPO}) exited {done.returncode}:\n{tail}")
    return json.loads((work / "summary.json").read_text(encoding="utf-8"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--before", default="3942d04", help="the commit before the task layer (default 3942d04)")
    parser.add_argument("--cases", default=";".join(CASES), help="which cases, separated by ';' (default: all)")
    parser.add_argument("--timeout", type=float, default=1800, help="seconds allowed per run")
    parser.add_argument("--out", type=Path, default=Path("bench_task_layer.json"), help="JSON results")
    args = parser.parse_args()

    after = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True,
                           check=True).stdout.strip()
    scratch = Path(tempfile.mkdtemp(prefix="nre_layer_"))
    before = scratch / "before"
    subprocess.run(["git", "worktree", "add", "--detach", str(before), args.before], cwd=REPO, check=True,
                   capture_output=True)
    rows, cases = [], {}
    try:
        for i, name in enumerate(args.cases.split(";")):
            flags = CASES[name]
            old = run(before, flags, scratch / f"{i}-before", args.timeout)
            new = run(None, flags, scratch / f"{i}-after", args.timeout)
            keys = sorted(set(old["test"]) & set(new["test"]))
            same = all(old[s].get(k) == new[s].get(k) for s in ("valid", "test") for k in keys)
            cases[name] = {"flags": flags, "before": {s: old[s] for s in ("valid", "test", "best_epoch")},
                           "after": {s: new[s] for s in ("valid", "test", "best_epoch")}, "identical": same}
            rows.append([name, old["test"].get("macro_f1"), new["test"].get("macro_f1"), old["test"].get("micro_f1"),
                         new["test"].get("micro_f1"), old["best_epoch"], new["best_epoch"],
                         "yes" if same else "no"])
            print(f"{name}: test macro_f1 {old['test'].get('macro_f1')} before, {new['test'].get('macro_f1')} after; "
                  f"every score the same: {same}", flush=True)
    finally:
        subprocess.run(["git", "worktree", "remove", "--force", str(before)], cwd=REPO, check=False)
    result = {"before": args.before, "after": after, "machine": machine(), "cases": cases}
    args.out.write_text(json.dumps(result, indent=2), encoding="utf-8")
    print()
    print(table(["case", f"test macro-F1 ({args.before})", f"test macro-F1 ({after})", "test micro-F1 (before)",
                 "test micro-F1 (after)", "best epoch (before)", "best epoch (after)", "every score the same"], rows))
    print(f"\nwrote {args.out}; runs in {scratch}")


if __name__ == "__main__":
    main()

"""Data that outgrows one machine: preprocessing and the first epoch at 1M and 5M rows, against single-process pandas.

For each size the script writes a training file by repeating the rows of a real dataset (FewRel's train.csv; the
real test.csv is the test split, the validation split is drawn from train), then measures in the same run:

* ``pandas``: the preprocessing steps in one process, on the same pure functions (``bench_preprocess.single_process``:
  read in chunks, check, tokenize, keep the rows in memory, draw the validation split, count, encode), in a
  subprocess so that its memory is its own: seconds and peak RSS.
* ``ray``: ``nre_ray.data.pipeline.prepare`` (``--no-cache``) on a local Ray with 2 CPUs, started once beforehand (its
  start-up is reported apart): seconds, the driver's peak RSS, and the peak RSS of driver + Ray worker processes.
  Both results are checked to be the same arrays (a digest of every split).
* the encoded cache: bytes per row on disk (every split's ``.npy`` files over their rows), against the tokens
  themselves (4 bytes per token id);
* training: ``python -m nre_ray.train --num-workers 2 --epochs 1`` on the cache the pipeline built: the first epoch's
  examples/s, the peak RSS of each training worker, and the target it is held to (its shard of every split's encoded
  bytes + the model's checkpoint state + 500 MB), the driver's peak RSS, and the machine's swap use.

Prints a Markdown table and writes everything as JSON (``--json``). 1M rows take ~10 minutes, 5M rows ~40 on 2 cores.

    python scripts/bench_scale.py                           # 1M and 5M rows
    python scripts/bench_scale.py --rows 100000 --json bench_scale_small.json
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_common import BENCH_ENV, FEWREL_TEST, FEWREL_TRAIN, machine, run_nre_ray, table
from bench_preprocess import PeakMemory, digest, make_data, psutil

MIB = 2**20
WORKER_ALLOWANCE = 500 * MIB
"""What a training worker may hold beyond its shard and the model: Python, torch, Ray's worker runtime."""


class TreeMemory:
    """Samples every process under this one (a ``python -m nre_ray.train`` subprocess and the Ray processes it
    started) in a background thread: the peak RSS and PSS of each training worker (``RayTrainWorker`` in its command
    line; PSS shares the pages of the libraries every worker maps out between them), of the
    training driver, and the machine's swap in use."""

    def __init__(self, interval: float) -> None:
        self.interval = interval
        self.workers: dict[int, int] = {}
        self.workers_pss: dict[int, int] = {}
        self.driver = 0
        self.swap_start = psutil.swap_memory().used
        self.swap_peak = self.swap_start
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        me = psutil.Process()
        while not self._stop.is_set():
            for proc in me.children(recursive=True):
                try:
                    cmd = " ".join(proc.cmdline())
                    rss = proc.memory_info().rss
                except (psutil.NoSuchProcess, psutil.AccessDenied):
                    continue
                if "RayTrainWorker" in cmd:
                    self.workers[proc.pid] = max(self.workers.get(proc.pid, 0), rss)
                    try:
                        pss = proc.memory_full_info().pss
                    except (psutil.NoSuchProcess, psutil.AccessDenied, AttributeError):
                        continue
                    self.workers_pss[proc.pid] = max(self.workers_pss.get(proc.pid, 0), pss)
                elif "nre_ray.train" in cmd:
                    self.driver = max(self.driver, rss)
            self.swap_peak = max(self.swap_peak, psutil.swap_memory().used)
            self._stop.wait(self.interval)

    def __enter__(self) -> TreeMemory:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def cache_bytes(folder: Path) -> dict[str, Any]:
    """Bytes and rows of each encoded split in a cache folder, and the tokens it holds."""
    import numpy as np

    from nre_ray.data.batches import EncodedSplit

    out: dict[str, Any] = {"splits": {}}
    meta = json.loads((folder / "meta.json").read_text())
    for split in meta["splits"]:
        size = sum((folder / f).stat().st_size for f in EncodedSplit.files(split))
        lengths = np.load(folder / f"{split}.lengths.npy", mmap_mode="r")
        out["splits"][split] = {"bytes": size, "rows": len(lengths), "tokens": int(lengths.sum())}
    out["bytes"] = sum(s["bytes"] for s in out["splits"].values())
    out["rows"] = sum(s["rows"] for s in out["splits"].values())
    out["tokens"] = sum(s["tokens"] for s in out["splits"].values())
    return out


def run_pipeline(data_dir: Path, cache: Path, seed: int, interval: float) -> dict[str, Any]:
    """``prepare`` with ``--no-cache`` on the running Ray; keeps the cache for the training run."""
    from nre_ray.config import DataConfig
    from nre_ray.data import pipeline

    cfg = DataConfig(data_dir=str(data_dir), cache_dir=str(cache), no_cache=True)
    started = time.perf_counter()
    with PeakMemory(interval, ray_workers=True) as memory:
        prepared = pipeline.prepare(cfg, seed)
        seconds = time.perf_counter() - started
    return {"seconds": seconds, "peak_rss": memory.peak["rss"], "peak_driver_rss": memory.peak["driver_rss"],
            "digest": digest(prepared.splits), "rows": {s: len(x) for s, x in prepared.splits.items()},
            "cache_dir": prepared.cache_dir}


def run_training(data_dir: Path, cache: Path, work: Path, workers: int, interval: float,
                 timeout: float, extra: list[str] | None = None) -> dict[str, Any]:
    """One epoch of ``python -m nre_ray.train`` on the cache the pipeline left (a cache hit), with its memory;
    ``extra``: more flags for it (``--train-args``)."""
    flags = ["--data-dir", str(data_dir), "--cache-dir", str(cache), "--num-workers", str(workers), "--epochs", "1",
             *(extra or [])]
    with TreeMemory(interval) as memory:
        run = run_nre_ray(work, flags, timeout)
    states = sorted((work / "ray_results").rglob("state.pt"), key=lambda p: p.stat().st_mtime)
    first = run["epochs"][0] if run["epochs"] else {}
    return {"flags": flags, "wall_s": run["wall_s"], "examples_per_sec": first.get("examples_per_sec"),
            "epoch_seconds": first.get("epoch_seconds"),
            "worker_peak_rss": sorted(memory.workers.values(), reverse=True),
            "worker_peak_pss": sorted(memory.workers_pss.values(), reverse=True), "driver_peak_rss": memory.driver,
            "swap_used_start": memory.swap_start, "swap_used_peak": memory.swap_peak,
            "model_state_bytes": states[-1].stat().st_size if states else 0, "log": run["log"],
            "cache_hit": "reused the cache" in Path(run["log"]).read_text(encoding="utf-8", errors="replace")}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog="\n\n".join(__doc__.split("\n\n")[1:]))
    parser.add_argument("--rows", type=int, nargs="+", default=[1_000_000, 5_000_000],
                        help="training rows per measurement (default: 1000000 5000000)")
    parser.add_argument("--source", type=Path, default=FEWREL_TRAIN, help="rows to repeat (default: FewRel train)")
    parser.add_argument("--test", type=Path, default=FEWREL_TEST, help="the test split (default: FewRel test)")
    parser.add_argument("--cpus", type=int, default=2, help="Ray's logical CPUs (default: 2)")
    parser.add_argument("--workers", type=int, default=2, help="training workers (default: 2)")
    parser.add_argument("--interval", type=float, default=0.5, help="memory sampling interval in seconds")
    parser.add_argument("--skip-pandas", action="store_true", help="measure the Ray side only")
    parser.add_argument("--skip-training", action="store_true", help="measure preprocessing only")
    parser.add_argument("--timeout", type=float, default=7200, help="seconds a training run may take")
    parser.add_argument("--train-args", default="", help="more flags for the training run, in one string (e.g. "
                        "'--batch-size 256': a CPU epoch of 4.5M rows takes ~45 min at the default 32 per worker)")
    parser.add_argument("--workdir", type=Path, help="where the generated data goes (default: a temporary folder)")
    parser.add_argument("--json", type=Path, default=Path("bench_scale.json"), help="write the results here")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args(argv)
    for key, value in BENCH_ENV.items():
        os.environ.setdefault(key, value)

    import ray

    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    work = args.workdir or Path(tempfile.mkdtemp(prefix="bench_scale_"))
    results: dict[str, Any] = {"machine": machine(), "cpus": args.cpus, "workers": args.workers,
                               "train_args": args.train_args,
                               "source": str(args.source), "runs": []}
    rows_table = []
    try:
        for rows in args.rows:
            data_dir = make_data(args.source, args.test, rows, work / f"rows_{rows}")
            run: dict[str, Any] = {"rows": rows, "load_avg_start": os.getloadavg()[0]}
            if not args.skip_pandas:
                print(f"{rows:,} rows: single process ...", file=sys.stderr, flush=True)
                out = work / f"single_{rows}.json"
                subprocess.run([sys.executable, str(Path(__file__).parent / "bench_preprocess.py"), "--single-process",
                                str(data_dir), str(out), "--seed", str(args.seed), "--interval", str(args.interval)],
                               check=True)
                run["pandas"] = json.loads(out.read_text())
            print(f"{rows:,} rows: ray pipeline ...", file=sys.stderr, flush=True)
            started = time.perf_counter()
            ray.init(address="local", num_cpus=args.cpus, include_dashboard=False, logging_level=logging.WARNING,
                     log_to_driver=False)
            run["ray_start_s"] = time.perf_counter() - started
            try:
                run["ray"] = run_pipeline(data_dir, work / "cache", args.seed, args.interval)
            finally:
                ray.shutdown()
            run["cache"] = cache_bytes(Path(run["ray"]["cache_dir"]))
            total = run["cache"]["rows"]
            if "pandas" in run:
                run["speedup"] = run["pandas"]["seconds"] / run["ray"]["seconds"]
                run["memory_ratio_rss"] = run["ray"]["peak_rss"] / run["pandas"]["peak_rss"]
                run["same_output"] = run["ray"]["digest"] == run["pandas"]["digest"]
            if not args.skip_training:
                print(f"{rows:,} rows: one epoch, {args.workers} workers ...", file=sys.stderr, flush=True)
                run["training"] = training = run_training(data_dir, work / "cache", work / f"train_{rows}",
                                                          args.workers, args.interval, args.timeout,
                                                          shlex.split(args.train_args))
                shard = run["cache"]["bytes"] / args.workers
                training["worker_target_bytes"] = shard + training["model_state_bytes"] + WORKER_ALLOWANCE
                training["worker_within_target"] = bool(training["worker_peak_rss"]) and \
                    max(training["worker_peak_rss"]) <= training["worker_target_bytes"]
            run["load_avg_end"] = os.getloadavg()[0]
            results["runs"].append(run)
            training = run.get("training", {})
            pandas = run.get("pandas", {})
            rows_table.append([
                f"{rows:,}",
                round(total / run["ray"]["seconds"]),
                round(total / pandas["seconds"]) if pandas else "-",
                run.get("speedup", "-"),
                run["ray"]["peak_driver_rss"] / MIB,
                run["ray"]["peak_rss"] / MIB,
                pandas["peak_rss"] / MIB if pandas else "-",
                run["cache"]["bytes"] / total,
                4 * run["cache"]["tokens"] / total,
                training.get("examples_per_sec") or "-",
                " / ".join(f"{r / MIB:.0f}" for r in training.get("worker_peak_rss", [])) or "-",
                " / ".join(f"{r / MIB:.0f}" for r in training.get("worker_peak_pss", [])) or "-",
                training["worker_target_bytes"] / MIB if training else "-",
                (training["swap_used_peak"] - training["swap_used_start"]) / MIB if training else "-",
                ("yes" if run["same_output"] else "NO") if "same_output" in run else "-",
            ])
            shutil.rmtree(data_dir, ignore_errors=True)
            shutil.rmtree(work / "cache", ignore_errors=True)
            args.json.write_text(json.dumps(results, indent=2))
    finally:
        if not args.workdir:
            shutil.rmtree(work, ignore_errors=True)
    headers = ["train rows", "ray rows/s", "pandas rows/s", "speed ratio (ray/pandas)", "ray driver peak RSS MiB",
               "ray driver+workers peak RSS MiB", "pandas peak RSS MiB", "cache bytes/row", "token-id bytes/row",
               "first epoch ex/s", "training worker peak RSS MiB", "training worker peak PSS MiB", "worker target MiB",
               "swap growth MiB",
               "same arrays"]
    print(f"{results['machine']['nproc']} cores, Ray with {args.cpus} CPUs, {args.workers} training workers"
          f"{' (' + args.train_args + ')' if args.train_args else ''}; rows/s over all splits")
    print(table(headers, rows_table))
    args.json.write_text(json.dumps(results, indent=2))
    print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

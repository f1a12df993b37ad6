"""Preprocessing throughput and peak memory: the streaming Ray Data pipeline against a single-process pandas loop.

For each size (default 10k, 100k and 1M rows) the script writes a training file by repeating the rows of a real
dataset (FewRel's train.csv; the real test.csv is the test split, the validation split is drawn from train), then
measures in the same run:

* ``ray``: ``nre_ray.data.pipeline.prepare`` (``--no-cache``) on a local Ray started once beforehand (its start-up is
  reported apart); peak memory is the driver's plus that of every Ray worker process the driver started, sampled with
  psutil (RSS, which counts shared object-store pages in every process that maps them, and PSS, which shares them
  out);
* ``pandas``: the same steps in one process, in a plain loop over the same chunks, calling the same pure functions
  (``read_chunks`` -> ``check_rows`` -> ``tokenize_batch`` (+ ``row_stats``) -> the seeded validation split ->
  ``token_counts`` -> ``Vocab.build`` -> ``encode_split``), keeping the tokenized rows in memory
  between the vocabulary and the encoding as a plain implementation does; run in a subprocess so that its memory is
  its own.

Both results are checked to be the same arrays (a digest per run). Prints a Markdown table with the ratios and writes
everything as JSON. 1M rows take several minutes per implementation on two cores.

    python scripts/bench_preprocess.py                       # 10k, 100k, 1M rows
    python scripts/bench_preprocess.py --rows 10000 100000 --json bench_preprocess.json
"""

from __future__ import annotations

import argparse
import hashlib
import importlib
import json
import logging
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

try:
    import psutil
except ImportError:  # Ray ships psutil (ray/thirdparty_files) and puts it on sys.path when imported
    importlib.import_module("ray")
    psutil = importlib.import_module("psutil")

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_common import BENCH_ENV, FEWREL_TEST, FEWREL_TRAIN, machine, table

MIB = 2**20


# --------------------------------------------------------------------------------------------------------------------
# measuring


class PeakMemory:
    """Samples the memory of this process (and, with ``ray_workers``, of the Ray worker processes it started) in a
    background thread; ``peak`` holds the largest sums seen (bytes)."""

    def __init__(self, interval: float, ray_workers: bool) -> None:
        self.interval, self.ray_workers = interval, ray_workers
        self.me = psutil.Process()
        self.peak = {"rss": 0, "pss": 0, "driver_rss": 0, "workers": 0}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def processes(self) -> list[psutil.Process]:
        found = [self.me]
        if self.ray_workers:
            for child in self.me.children(recursive=True):
                try:
                    if child.cmdline()[:1] and child.cmdline()[0].startswith("ray::"):
                        found.append(child)
                except (psutil.NoSuchProcess, psutil.AccessDenied):
                    continue
        return found

    def sample(self) -> dict[str, int]:
        now = {"rss": 0, "pss": 0, "driver_rss": 0, "workers": 0}
        for proc in self.processes():
            try:
                info = proc.memory_full_info()
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                continue
            now["rss"] += info.rss
            now["pss"] += getattr(info, "pss", info.rss)
            if proc.pid == self.me.pid:
                now["driver_rss"] = info.rss
            else:
                now["workers"] += 1
        return now

    def _run(self) -> None:
        while not self._stop.is_set():
            now = self.sample()
            for key, value in now.items():
                self.peak[key] = max(self.peak[key], value)
            self._stop.wait(self.interval)

    def __enter__(self) -> PeakMemory:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def digest(splits: dict[str, Any]) -> str:
    """A short hash of every array of every split (to check that both implementations made the same data)."""
    from nre_ray.data.batches import STORED_KEYS

    h = hashlib.sha1()
    for name in sorted(splits):
        for key in STORED_KEYS:  # the stored form: token ids, row offsets, per-row arrays (positions follow from them)
            array = np.ascontiguousarray(splits[name].flat[key])
            h.update(f"{name}/{key}/{array.dtype}/{array.shape}".encode())
            h.update(array.tobytes())
    return h.hexdigest()[:16]


# --------------------------------------------------------------------------------------------------------------------
# the data


def make_data(source: Path, test: Path, rows: int, folder: Path) -> Path:
    """``folder/train.csv`` with ``rows`` rows (``source`` repeated) and ``folder/test.csv`` (a copy of ``test``)."""
    folder.mkdir(parents=True, exist_ok=True)
    base = pd.read_csv(source, keep_default_na=False, dtype=str)
    train = folder / "train.csv"
    written = 0
    while written < rows:
        part = base.head(rows - written)
        part.to_csv(train, mode="w" if written == 0 else "a", header=written == 0, index=False)
        written += len(part)
    shutil.copyfile(test, folder / "test.csv")
    return folder


# --------------------------------------------------------------------------------------------------------------------
# the single-process implementation


def single_process(data_dir: Path, seed: int) -> tuple[dict[str, Any], dict[str, Any]]:
    """The pipeline's steps in one process over the same chunks, with the same pure functions."""
    from nre_ray.config import DataConfig
    from nre_ray.data import pipeline
    from nre_ray.data.audit import build_audit, row_stats
    from nre_ray.data.batches import EncodedSplit, encode_split, token_counts, tokenize_batch
    from nre_ray.data.read import check_rows, read_chunks, read_labels
    from nre_ray.data.vocab import Vocab

    cfg = DataConfig(data_dir=str(data_dir))
    files = pipeline.resolve_files(cfg)
    keep = ["line", "relation", "tokens", "head_start", "head_end", "tail_start", "tail_end", "ntok", "gap", "reach",
            "key", "overlap"]
    frames: dict[str, pd.DataFrame] = {}
    for split in pipeline.SPLITS:
        if split not in files:
            continue
        parts = []
        for chunk in read_chunks(files[split], cfg.format, None, pipeline.ROWS_PER_CHUNK):
            tokenized = tokenize_batch(check_rows(chunk), cfg.tokenizer, cfg.lowercase, cfg.entity_markers,
                                       cfg.typed_markers)
            tokenized = tokenized.assign(**row_stats(tokenized))
            parts.append(tokenized.loc[tokenized["problem"] == "", keep])
        frames[split] = pd.concat(parts, ignore_index=True)
    labels = read_labels(files["labels"]) if "labels" in files else sorted(frames["train"]["relation"].unique())
    frames = {s: f[f["relation"].isin(labels)].reset_index(drop=True) for s, f in frames.items()}
    if "valid" not in files:  # the seeded stratified split, as the pipeline draws it
        rng = np.random.default_rng(seed)
        train = frames["train"]
        chosen: list[int] = []
        for _, group in train.groupby("relation", sort=True):
            if len(group) >= 2:
                take = max(1, round(len(group) * cfg.valid_fraction))
                chosen.extend(rng.choice(group.index.to_numpy(), size=min(take, len(group) - 1), replace=False))
        moved = train.index.isin(chosen)
        frames["valid"], frames["train"] = train[moved].reset_index(drop=True), train[~moved].reset_index(drop=True)
    counts: Counter[str] = Counter()
    for start in range(0, len(frames["train"]), pipeline.ROWS_PER_CHUNK):
        part = token_counts(frames["train"].iloc[start:start + pipeline.ROWS_PER_CHUNK])
        counts.update(dict(zip(part["token"], part["count"].tolist(), strict=True)))
    vocab = Vocab.build(counts, cfg.min_freq)
    splits = {}
    for split in pipeline.SPLITS:
        frame = frames.get(split)
        if frame is None or not len(frame):
            continue
        parts = [encode_split(frame.iloc[start:start + pipeline.ROWS_PER_CHUNK], vocab.tokens, labels,
                              cfg.max_length, cfg.position_window).flat
                 for start in range(0, len(frame), pipeline.ROWS_PER_CHUNK)]
        splits[split] = EncodedSplit(concat_flat(parts))
    audit = build_audit({s: f.assign(label=f["relation"].map({n: i for i, n in enumerate(labels)}))
                         for s, f in frames.items() if len(f)}, labels, cfg.max_length)
    return splits, audit


def concat_flat(parts: list[dict[str, Any]]) -> dict[str, Any]:
    """Flat arrays of consecutive blocks of rows (:class:`EncodedSplit` form) as one."""
    out = {key: np.concatenate([p[key] for p in parts]) for key in parts[0] if key != "offsets"}
    out["offsets"] = np.zeros(len(out["lengths"]) + 1, dtype=np.int64)
    np.cumsum(out["lengths"], out=out["offsets"][1:])
    return out


def run_single_process(data_dir: Path, out: Path, seed: int, interval: float) -> None:
    """``--single-process``: measure :func:`single_process` in this process and write the numbers to ``out``."""
    started = time.perf_counter()
    with PeakMemory(interval, ray_workers=False) as memory:
        splits, _ = single_process(data_dir, seed)
        seconds = time.perf_counter() - started
    out.write_text(json.dumps({"seconds": seconds, "peak_rss": memory.peak["rss"], "peak_pss": memory.peak["pss"],
                               "ru_maxrss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
                               "digest": digest(splits), "rows": {s: len(x) for s, x in splits.items()}}))


# --------------------------------------------------------------------------------------------------------------------
# the Ray pipeline


def run_pipeline(data_dir: Path, cache: Path, seed: int, interval: float) -> dict[str, Any]:
    from nre_ray.config import DataConfig
    from nre_ray.data import pipeline

    cfg = DataConfig(data_dir=str(data_dir), cache_dir=str(cache), no_cache=True)
    idle = PeakMemory(interval, ray_workers=True).sample()
    started = time.perf_counter()
    with PeakMemory(interval, ray_workers=True) as memory:
        prepared = pipeline.prepare(cfg, seed)
        seconds = time.perf_counter() - started
    shutil.rmtree(cache, ignore_errors=True)
    return {"seconds": seconds, "peak_rss": memory.peak["rss"], "peak_pss": memory.peak["pss"],
            "peak_driver_rss": memory.peak["driver_rss"], "max_workers": memory.peak["workers"],
            "idle_rss": idle["rss"], "idle_pss": idle["pss"], "digest": digest(prepared.splits),
            "rows": {s: len(x) for s, x in prepared.splits.items()}}


# --------------------------------------------------------------------------------------------------------------------
# main


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog="\n\n".join(__doc__.split("\n\n")[1:]))
    parser.add_argument("--rows", type=int, nargs="+", default=[10_000, 100_000, 1_000_000],
                        help="training rows per measurement (default: 10000 100000 1000000)")
    parser.add_argument("--source", type=Path, default=FEWREL_TRAIN, help="rows to repeat (default: FewRel train)")
    parser.add_argument("--test", type=Path, default=FEWREL_TEST, help="the test split (default: FewRel test)")
    parser.add_argument("--cpus", type=int, default=os.cpu_count() or 1, help="Ray's logical CPUs (default: cores)")
    parser.add_argument("--interval", type=float, default=0.25, help="memory sampling interval in seconds")
    parser.add_argument("--workdir", type=Path, help="where the generated data goes (default: a temporary folder)")
    parser.add_argument("--json", type=Path, default=Path("bench_preprocess.json"), help="write the results here")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--single-process", nargs=2, type=Path, metavar=("DATA_DIR", "OUT"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    for key, value in BENCH_ENV.items():
        os.environ.setdefault(key, value)
    if args.single_process:
        run_single_process(args.single_process[0], args.single_process[1], args.seed, args.interval)
        return 0

    import ray

    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    for noisy in ("ray", "ray.data", "nre_ray"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    work = args.workdir or Path(tempfile.mkdtemp(prefix="bench_preprocess_"))
    results: dict[str, Any] = {"machine": machine(), "cpus": args.cpus, "source": str(args.source), "runs": []}
    started = time.perf_counter()
    ray.init(address="local", num_cpus=args.cpus, include_dashboard=False, logging_level=logging.WARNING,
             log_to_driver=False)
    results["ray_start_s"] = time.perf_counter() - started
    rows_table = []
    try:
        for rows in args.rows:
            data_dir = make_data(args.source, args.test, rows, work / f"rows_{rows}")
            print(f"{rows} rows: ray pipeline ...", file=sys.stderr, flush=True)
            ray_run = run_pipeline(data_dir, work / "cache", args.seed, args.interval)
            print(f"{rows} rows: single process ...", file=sys.stderr, flush=True)
            out = work / f"single_{rows}.json"
            subprocess.run([sys.executable, __file__, "--single-process", str(data_dir), str(out), "--seed",
                            str(args.seed), "--interval", str(args.interval)], check=True)
            plain = json.loads(out.read_text())
            total = rows + sum(1 for _ in open(args.test, encoding="utf-8")) - 1
            run = {"rows": rows, "rows_all_splits": total, "ray": ray_run, "pandas": plain,
                   "speedup": plain["seconds"] / ray_run["seconds"],
                   "memory_ratio_rss": ray_run["peak_rss"] / plain["peak_rss"],
                   "memory_ratio_pss": ray_run["peak_pss"] / plain["peak_pss"],
                   "same_output": ray_run["digest"] == plain["digest"]}
            results["runs"].append(run)
            rows_table.append([
                f"{rows:,}", round(total / ray_run["seconds"]), round(total / plain["seconds"]), run["speedup"],
                ray_run["peak_rss"] / MIB, ray_run["peak_pss"] / MIB, ray_run["peak_driver_rss"] / MIB,
                plain["peak_rss"] / MIB, run["memory_ratio_rss"], run["memory_ratio_pss"],
                "yes" if run["same_output"] else "NO"])
            shutil.rmtree(data_dir, ignore_errors=True)
            args.json.write_text(json.dumps(results, indent=2))
    finally:
        ray.shutdown()
        if not args.workdir:
            shutil.rmtree(work, ignore_errors=True)
    headers = ["train rows", "ray rows/s", "pandas rows/s", "speed ratio (ray/pandas)", "ray peak RSS MiB",
               "ray peak PSS MiB", "ray driver RSS MiB", "pandas peak RSS MiB", "mem ratio RSS", "mem ratio PSS",
               "same arrays"]
    print(f"{results['machine']['nproc']} cores, Ray with {args.cpus} CPUs (start-up {results['ray_start_s']:.1f} s, "
          "not counted); rows/s over all splits; ray memory = driver + Ray worker processes")
    print(table(headers, rows_table))
    args.json.write_text(json.dumps(results, indent=2))
    print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

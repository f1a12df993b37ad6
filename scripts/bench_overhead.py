#!/usr/bin/env python3
"""What Ray Train costs one worker: nre_ray against a plain single-process PyTorch loop, same everything else.

Both train the same model on the same encoded data (``nre_ray.data.pipeline.prepare``, one cache) with the same batch
size, seed and torch thread count (the number nre_ray's ``plan_resources`` gives one worker on this machine):

* plain: the loop written below, in this process, no Ray: ``EncodedDataset`` -> DataLoader -> forward, loss,
  backward, clip, Adam; then a validation pass and a ``torch.save`` of model + optimizer each epoch;
* nre_ray: ``python -m nre_ray.train --num-workers 1`` in a subprocess with its own working folder and MLflow store;
  its per-epoch ``examples_per_sec`` / ``epoch_seconds`` and start-up marks are read back from that store.

Steady-state throughput is the median over the epochs after the first. Start-up is command start to the first
training step, split into Python start + imports, Ray start, preprocessing (cold: the first run builds the cache;
warm: later runs reuse it), other driver work (MLflow run, ``ray.put`` of the arrays, trainer set-up) and worker start.
The two are run alternately, ``--repeats`` times; the ratio is taken within each repeat and its median reported.

    .venv/bin/python scripts/bench_overhead.py --repeats 3 --out bench_overhead.json

``--startup-only``: no plain loop and one epoch per run: the start-up table alone (command -> first training step,
split into its phases), ``--repeats`` runs, the first cold (it builds the preprocessing cache), the rest warm; cheap
enough to repeat on a shared machine, where only the ratios between runs made close together mean much.

``--use-gpu``: both on one GPU with nre_ray's mixed precision (nre_ray ``--use-gpu``; the plain loop on ``cuda:0`` with
the same autocast and loss scaler), and the GPU utilisation sampled by ``nvidia-smi`` during the counted epochs.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench_common import (
    FEWREL_TEST,
    FEWREL_TRAIN,
    GpuUtilisation,
    accuracy_pass,
    add_run_options,
    device_for,
    finish,
    load_data,
    machine,
    median,
    run_nre_ray,
    spread,
    steady,
    table,
    train_config,
    train_pass,
    wait_for_quiet,
)


def plain_loop(prepared: Any, model_name: str, batch_size: int, epochs: int, seed: int, threads: int,
               folder: Path, use_gpu: bool = False) -> list[dict[str, float]]:
    """Train with a plain PyTorch loop (on the GPU with nre_ray's mixed precision when ``use_gpu``); per-epoch
    timings."""
    import torch
    from torch.utils.data import DataLoader

    from nre_ray.data.encode import EncodedDataset, identity_collate
    from nre_ray.models.registry import ModelSpec
    from nre_ray.tasks.sentence.classifier import build_model

    cfg = train_config(model_name, batch_size, epochs, seed)
    torch.set_num_threads(threads)
    torch.manual_seed(seed)
    device = device_for(use_gpu)
    model = build_model(cfg.model, ModelSpec(len(prepared.vocab), len(prepared.labels), prepared.num_positions))
    model = model.to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=cfg.train.lr, weight_decay=cfg.train.weight_decay)
    train_loader = DataLoader(EncodedDataset(prepared.splits["train"]), batch_size=batch_size, shuffle=True,
                              collate_fn=identity_collate, generator=torch.Generator().manual_seed(seed))
    valid_loader = DataLoader(EncodedDataset(prepared.splits["valid"]), batch_size=256, collate_fn=identity_collate)
    out = []
    for epoch in range(1, epochs + 1):
        start, cpu_start = time.perf_counter(), time.process_time()
        totals, _ = train_pass(model, train_loader, optimizer, cfg.train.grad_clip, device, cfg.train.amp)
        train_s, cpu_s = time.perf_counter() - start, time.process_time() - cpu_start
        correct, total = accuracy_pass(model, valid_loader, device).tolist()
        torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "epoch": epoch},
                   folder / "plain_checkpoint.pt")
        wall = time.perf_counter() - start
        seen = float(totals[1])
        out.append({"epoch": epoch, "examples_per_sec": seen / train_s, "epoch_seconds": train_s,
                    "cpu_seconds": cpu_s, "cpu_examples_per_sec": seen / cpu_s, "wall_seconds": wall,
                    "train_loss": float(totals[0] / totals[1]), "valid_acc": correct / total,
                    "ended_at": time.time()})
        print(f"  plain   epoch {epoch}: {seen / train_s:7.0f} ex/s  train {train_s:6.2f} s  wall {wall:6.2f} s  "
              f"valid_acc {correct / total:.3f}", flush=True)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--train", type=Path, default=FEWREL_TRAIN, help="training file (default: FewRel train)")
    parser.add_argument("--test", type=Path, default=FEWREL_TEST, help="test file (default: FewRel test)")
    parser.add_argument("--model", default="cnn", help="nre_ray model name (default: cnn)")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--epochs", type=int, default=4, help="epochs per run; the first is not counted (default: 4)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--use-gpu", action="store_true", help="both on one GPU, mixed precision")
    parser.add_argument("--startup-only", action="store_true", help="only nre_ray's start-up, one epoch per run "
                        "(no plain loop; see above)")
    add_run_options(parser, 3, "runs of each, alternating", "bench_overhead.json")
    args = parser.parse_args(argv)
    if args.startup_only:
        return startup_only(args)
    if args.epochs < 2:
        parser.error("--epochs must be >= 2 (the first epoch is not counted)")

    from nre_ray.cluster.session import plan_resources

    node = {"CPU": float(os.cpu_count() or 1), **({"GPU": 1.0} if args.use_gpu else {})}
    threads = plan_resources(1, args.use_gpu, [node]).threads
    work = (args.work_dir or Path(tempfile.mkdtemp(prefix="nre_ray_bench_overhead_"))).absolute()
    work.mkdir(parents=True, exist_ok=True)
    cache = work / "cache"  # fresh: the first nre_ray run pays (and reports) the cold preprocessing
    tracking_uri = f"sqlite:///{work}/mlflow.db"  # one store, as a user re-running in one folder has
    flags = ["--num-workers", "1", "--train", str(args.train), "--test", str(args.test), "--model", args.model,
             "--batch-size", str(args.batch_size), "--epochs", str(args.epochs), "--seed", str(args.seed),
             "--cache-dir", str(cache), *(["--use-gpu"] if args.use_gpu else [])]
    info = machine()
    print(f"machine: {info['nproc']} CPUs ({info['cpu_model']}), {info['ram_gib']} GiB; load average "
          f"{info['loadavg_at_start'][0]:.2f}; torch threads {threads}; work dir {work}", flush=True)

    repeats: list[dict[str, Any]] = []
    prepared = None
    for r in range(args.repeats):
        order = ("nre_ray", "plain") if r % 2 == 0 else ("plain", "nre_ray")  # run 1 builds the cache: nre_ray first
        rec: dict[str, Any] = {"repeat": r + 1, "order": list(order)}
        for what in order:
            rec[f"{what}_loadavg"] = wait_for_quiet(args.max_load)
            with GpuUtilisation(args.use_gpu) as gpu:
                if what == "nre_ray":
                    print(f"repeat {r + 1}: nre_ray --num-workers 1", flush=True)
                    res = run_nre_ray(work / f"nre_ray_{r + 1}", flags, args.timeout, tracking_uri,
                                      f"bench-overhead-{r + 1}")
                    for e in res["epochs"]:
                        print(f"  nre_ray epoch {e['epoch']}: {e['examples_per_sec']:7.0f} ex/s  "
                              f"train {e['epoch_seconds']:6.2f} s", flush=True)
                    ends = [e["logged_at"] for e in res["epochs"]]
                else:
                    print(f"repeat {r + 1}: plain PyTorch loop", flush=True)
                    if prepared is None:
                        t0 = time.perf_counter()
                        prepared = load_data(args.train, args.test, cache, args.seed)
                        rec["plain_data_load_s"] = time.perf_counter() - t0
                    res = {"epochs": plain_loop(prepared, args.model, args.batch_size, args.epochs, args.seed,
                                                threads, work, args.use_gpu)}
                    ends = [e["ended_at"] for e in res["epochs"]]
            res.update(gpu.summary(ends[0], ends[-1]))  # the counted epochs (2 to the last)
            rec[what] = res
        for key in ("nre_ray", "plain"):
            rec[key]["steady_examples_per_sec"] = steady(rec[key]["epochs"], "examples_per_sec")
            rec[key]["best_examples_per_sec"] = steady(rec[key]["epochs"], "examples_per_sec", "best")
            rec[key]["steady_cpu_examples_per_sec"] = steady(rec[key]["epochs"], "cpu_examples_per_sec")
        rec["ratio"] = rec["nre_ray"]["steady_examples_per_sec"] / rec["plain"]["steady_examples_per_sec"]
        rec["best_ratio"] = rec["nre_ray"]["best_examples_per_sec"] / rec["plain"]["best_examples_per_sec"]
        rec["cpu_ratio"] = rec["nre_ray"]["steady_cpu_examples_per_sec"] / rec["plain"]["steady_cpu_examples_per_sec"]
        rec["plain"]["all_epochs_wall_s"] = sum(e["wall_seconds"] for e in rec["plain"]["epochs"])
        print(f"repeat {r + 1}: nre_ray/plain steady-state throughput {rec['ratio']:.3f}", flush=True)
        repeats.append(rec)

    ratios = [x["ratio"] for x in repeats]
    result = {
        "machine": info, "threads": threads, "train": str(args.train), "test": str(args.test), "model": args.model,
        "batch_size": args.batch_size, "epochs": args.epochs, "seed": args.seed,
        "device": "gpu" if args.use_gpu else "cpu",
        "command": [sys.executable, *sys.argv], "nre_ray_flags": flags, "repeats": repeats,
        "median": {
            "plain_examples_per_sec": median(x["plain"]["steady_examples_per_sec"] for x in repeats),
            "nre_ray_examples_per_sec": median(x["nre_ray"]["steady_examples_per_sec"] for x in repeats),
            "ratio": median(ratios), "ratio_spread": spread(ratios),
            "best_ratio": median(x["best_ratio"] for x in repeats),
            "best_ratio_spread": spread([x["best_ratio"] for x in repeats]),
            "cpu_ratio": median(x["cpu_ratio"] for x in repeats),
            "cpu_ratio_spread": spread([x["cpu_ratio"] for x in repeats]),
        },
    }
    if args.use_gpu:
        for who in ("plain", "nre_ray"):
            result["median"][f"{who}_gpu_util_mean"] = median(x[who]["gpu_util_mean"] or float("nan") for x in repeats)
            result["median"][f"{who}_gpu_mem_max_mib"] = median(x[who]["gpu_mem_max_mib"] or float("nan")
                                                                for x in repeats)
    finish(result, render(result), args, work)
    return 0


STARTUP_KEYS = ("command_to_first_step_s", "python_and_imports_s", "ray_s", "preprocess_s", "driver_other_s",
                "worker_group_s", "loop_setup_s")
STARTUP_HEADERS = ["run", "command -> first step", "Python + imports", "Ray start", "preprocessing",
                   "MLflow run + ray.put", "worker group start", "loop set-up"]


def startup_table(runs: list[dict[str, Any]]) -> str:
    """Start-up phases of each run (``{"startup": ..., "loadavg": ...}``; the first cold) and the warm median."""
    rows = [[f"{i + 1} ({'cold' if i == 0 else 'warm'}, load {r.get('loadavg', float('nan')):.1f})",
             *(r["startup"].get(k, float("nan")) for k in STARTUP_KEYS)] for i, r in enumerate(runs)]
    warm = [r["startup"] for r in runs[1:]]
    if warm:
        rows.append(["**median warm**", *(median(s.get(k, float("nan")) for s in warm) for k in STARTUP_KEYS)])
    return table(STARTUP_HEADERS, rows)


def startup_only(args: argparse.Namespace) -> int:
    """``--startup-only``: nre_ray's start-up, ``--repeats`` runs of one epoch each."""
    work = (args.work_dir or Path(tempfile.mkdtemp(prefix="nre_ray_bench_startup_"))).absolute()
    work.mkdir(parents=True, exist_ok=True)
    flags = ["--num-workers", "1", "--train", str(args.train), "--test", str(args.test), "--model", args.model,
             "--batch-size", str(args.batch_size), "--epochs", "1", "--seed", str(args.seed),
             "--cache-dir", str(work / "cache"), "--no-log-model", *(["--use-gpu"] if args.use_gpu else [])]
    info = machine()
    runs = []
    for r in range(args.repeats):
        load = wait_for_quiet(args.max_load)
        res = run_nre_ray(work / f"run_{r + 1}", flags, args.timeout, f"sqlite:///{work}/mlflow.db",
                          f"bench-startup-{r + 1}")
        runs.append({"startup": res["startup"], "wall_s": res["wall_s"], "loadavg": load})
        print(f"run {r + 1}: command -> first step {res['startup'].get('command_to_first_step_s', float('nan')):.1f} s "
              f"(load average {load:.1f})", flush=True)
    result = {"machine": info, "mode": "startup-only", "command": [sys.executable, *sys.argv], "nre_ray_flags": flags,
              "runs": runs}
    finish(result, "Start-up of `python -m nre_ray.train --num-workers 1 --epochs 1`, seconds:\n\n"
           + startup_table(runs), args, work)
    return 0


def render(result: dict[str, Any]) -> str:
    """The tables of a result (also pasted into docs/benchmarks.md)."""
    reps, m = result["repeats"], result["median"]

    def row(label: Any, xs: list[dict[str, Any]], bold: bool = False) -> list[Any]:
        def get(path: str) -> float:
            who, key = path.split(".")
            return median((x[who][key] if who else x[key]) for x in xs)

        ratio, best = get(".ratio"), get(".best_ratio")
        return [label, get("plain.steady_examples_per_sec"), get("nre_ray.steady_examples_per_sec"),
                f"**{ratio:.3f}**" if bold else ratio, get("plain.best_examples_per_sec"),
                get("nre_ray.best_examples_per_sec"), f"**{best:.3f}**" if bold else best,
                get("plain.steady_cpu_examples_per_sec"), get("nre_ray.steady_cpu_examples_per_sec"), get(".cpu_ratio"),
                *([get(".plain_loadavg"), get(".nre_ray_loadavg")] if len(xs) == 1 else ["", ""])]

    rows = [row(x["repeat"], [x]) for x in reps] + [row("**median**", reps, bold=True)]
    throughput = table(["repeat", "plain ex/s", "nre_ray ex/s", "nre_ray / plain", "plain best epoch ex/s",
                        "nre_ray best epoch ex/s", "nre_ray / plain (best epochs)", "plain ex/CPU-s",
                        "nre_ray ex/CPU-s", "CPU-time ratio", "load avg (plain)", "load avg (nre_ray)"], rows)
    wrows = [[x["repeat"], x["plain"]["all_epochs_wall_s"], x["nre_ray"]["startup"].get("first_step_to_exit_s"),
              x["nre_ray"]["wall_s"]] for x in reps]
    whole = table(["repeat", f"plain: {result['epochs']} epochs (train, valid, save)",
                   "nre_ray: first step -> exit", "nre_ray: command -> exit"], wrows)
    keys = ("command_to_first_step_s", "python_and_imports_s", "ray_s", "preprocess_s", "driver_other_s",
            "worker_group_s", "loop_setup_s")
    srows = []
    for x in reps:
        s = x["nre_ray"]["startup"]
        srows.append([f"{x['repeat']} ({'cold' if x['repeat'] == 1 else 'warm'})",
                      *(s.get(k, float("nan")) for k in keys)])
    warm = [x["nre_ray"]["startup"] for x in reps[1:]]
    if warm:
        srows.append(["**median warm**", *(median(s.get(k, float("nan")) for s in warm) for k in keys)])
    startup = table(["run", "command -> first step", "Python + imports", "Ray start", "preprocessing",
                     "MLflow run + ray.put", "worker group start", "loop set-up"], srows)
    gpu = ""
    if "plain_gpu_util_mean" in m:
        gpu = "\n\nGPU (nvidia-smi over the counted epochs, median of the repeats):\n\n" + table(
            ["", "plain", "nre_ray"],
            [["utilisation %", m["plain_gpu_util_mean"], m["nre_ray_gpu_util_mean"]],
             ["peak memory MiB", m["plain_gpu_mem_max_mib"], m["nre_ray_gpu_mem_max_mib"]]])
    return (f"Steady-state training throughput, {result['model']}, batch {result['batch_size']}, "
            f"{result['threads']} torch thread(s), epochs 2-{result['epochs']} (median epoch, and best epoch); spread "
            f"of the ratio over repeats {m['ratio_spread']:.1%} (median epochs), {m['best_ratio_spread']:.1%} (best "
            f"epochs), {m['cpu_ratio_spread']:.1%} (CPU time):\n\n{throughput}\n\n"
            f"Start-up of `python -m nre_ray.train --num-workers 1`, seconds (run 1: empty preprocessing cache and "
            f"new MLflow store; later runs reuse both):\n\n{startup}\n\n"
            f"Whole runs, seconds (nre_ray's first step -> exit adds to the epochs: per-epoch checkpoints and "
            f"reports, final test scoring, MLflow artifacts and model, Ray shutdown):\n\n{whole}{gpu}")


if __name__ == "__main__":
    sys.exit(main())

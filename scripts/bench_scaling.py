#!/usr/bin/env python3
"""Scaling on this machine: nre_ray with 1 and 2 workers against the same model under plain DDP started by torchrun.

* nre_ray: ``python -m nre_ray.train --num-workers N`` (each worker gets the CPUs ``plan_resources`` gives it: one
  torch thread per worker on a 2-core machine); per-epoch ``epoch_seconds`` read back from its MLflow store;
* torchrun: ``torchrun --standalone --nproc_per_node N scripts/ddp_baseline.py`` (gloo, DistributedSampler with
  set_epoch, rank 0 saves each epoch; ``OMP_NUM_THREADS=1`` and one torch thread per process). Like the original
  project it wraps even one process in DDP, which Ray Train's ``prepare_model`` does not; so the 1-process run is
  also made with ``--ddp multi`` (no DDP for one process), and the speed-ups are given from both bases.

``--use-gpu``: one GPU per worker on both sides (nre_ray ``--use-gpu``, the baseline on ``cuda:LOCAL_RANK`` with NCCL,
both with mixed precision), and the GPU utilisation sampled by ``nvidia-smi`` during the counted epochs.

Both train the same model on the same encoded data (one preprocessing cache, filled before the first run) with the
same per-worker batch size. The epoch time is the training pass (median over the epochs after the first); the
speed-up is t(1 worker) / t(N workers) of the same launcher, and the ratios compare the two launchers within each
repeat. Runs alternate between the launchers; ``--repeats`` rounds, medians reported.

    .venv/bin/python scripts/bench_scaling.py --repeats 3 --out bench_scaling.json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench_common import (
    BENCH_ENV,
    FEWREL_TEST,
    FEWREL_TRAIN,
    GpuUtilisation,
    add_run_options,
    finish,
    load_data,
    machine,
    median,
    run_nre_ray,
    spread,
    steady,
    table,
    wait_for_quiet,
)

HERE = Path(__file__).resolve().parent


def run_torchrun(work: Path, n: int, args: argparse.Namespace, cache: Path, ddp: str = "always") -> dict[str, Any]:
    """One ``torchrun --nproc_per_node n scripts/ddp_baseline.py --ddp DDP`` run; its per-epoch timings."""
    work.mkdir(parents=True, exist_ok=True)
    out = work / "ddp.json"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(n),
           str(HERE / "ddp_baseline.py"), "--train", str(args.train), "--test", str(args.test),
           "--cache-dir", str(cache), "--model", args.model, "--batch-size", str(args.batch_size),
           "--epochs", str(args.epochs), "--seed", str(args.seed), "--threads", "1", "--out", str(out),
           "--ddp", ddp, *(["--use-gpu"] if args.use_gpu else [])]
    log_path = work / "torchrun.log"
    started = time.time()
    with open(log_path, "w", encoding="utf-8") as log:
        proc = subprocess.run(cmd, cwd=work, env={**os.environ, **BENCH_ENV, "OMP_NUM_THREADS": "1"}, stdout=log,
                              stderr=subprocess.STDOUT, timeout=args.timeout, check=False)
    if proc.returncode != 0:
        tail = "\n".join(log_path.read_text(encoding="utf-8", errors="replace").splitlines()[-30:])
        raise RuntimeError(f"{' '.join(cmd)} exited with {proc.returncode}; log {log_path}:\n{tail}")
    return {"command": cmd, "wall_s": time.time() - started, "epochs": json.loads(out.read_text())["epochs"],
            "log": str(log_path)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--train", type=Path, default=FEWREL_TRAIN, help="training file (default: FewRel train)")
    parser.add_argument("--test", type=Path, default=FEWREL_TEST, help="test file (default: FewRel test)")
    parser.add_argument("--model", default="cnn", help="nre_ray model name (default: cnn)")
    parser.add_argument("--batch-size", type=int, default=64, help="per worker (default: 64)")
    parser.add_argument("--epochs", type=int, default=4, help="epochs per run; the first is not counted (default: 4)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--use-gpu", action="store_true", help="one GPU per worker on both sides, mixed precision")
    parser.add_argument("--workers", default="1,2", help="worker counts, comma-separated; the first is the "
                        "speed-up's base (default: 1,2)")
    add_run_options(parser, 2, "rounds over all configurations", "bench_scaling.json")
    args = parser.parse_args(argv)
    workers = [int(w) for w in args.workers.split(",")]
    if args.epochs < 2:
        parser.error("--epochs must be >= 2 (the first epoch is not counted)")

    work = (args.work_dir or Path(tempfile.mkdtemp(prefix="nre_ray_bench_scaling_"))).absolute()
    work.mkdir(parents=True, exist_ok=True)
    cache = work / "cache"
    tracking_uri = f"sqlite:///{work}/mlflow.db"
    info = machine()
    print(f"machine: {info['nproc']} CPUs ({info['cpu_model']}), {info['ram_gib']} GiB; load average "
          f"{info['loadavg_at_start'][0]:.2f}; work dir {work}", flush=True)
    print("preprocessing once (cache shared by every run) ...", flush=True)
    load_data(args.train, args.test, cache, args.seed)

    repeats = []
    for r in range(args.repeats):
        rec: dict[str, Any] = {"repeat": r + 1, "nre_ray": {}, "torchrun": {}, "torchrun_no_ddp": {}}
        for i, n in enumerate(workers):
            launchers = ("nre_ray", "torchrun") if (r + i) % 2 == 0 else ("torchrun", "nre_ray")
            if n == 1:
                launchers = (*launchers, "torchrun_no_ddp")
            for launcher in launchers:
                load = wait_for_quiet(args.max_load)
                print(f"repeat {r + 1}: {launcher} with {n} worker(s) (load average {load:.2f})", flush=True)
                with GpuUtilisation(args.use_gpu) as gpu:
                    if launcher == "nre_ray":
                        flags = ["--num-workers", str(n), "--train", str(args.train), "--test", str(args.test),
                                 "--model", args.model, "--batch-size", str(args.batch_size), "--epochs",
                                 str(args.epochs), "--seed", str(args.seed), "--cache-dir", str(cache),
                                 *(["--use-gpu"] if args.use_gpu else [])]
                        res = run_nre_ray(work / f"nre_ray_{n}_{r + 1}", flags, args.timeout, tracking_uri,
                                          f"bench-scaling-{n}-{r + 1}")
                        ends = [e["logged_at"] for e in res["epochs"]]
                    else:
                        res = run_torchrun(work / f"{launcher}_{n}_{r + 1}", n, args, cache,
                                           "multi" if launcher == "torchrun_no_ddp" else "always")
                        ends = [e["ended_at"] for e in res["epochs"]]
                res.update(gpu.summary(ends[0], ends[-1]) if len(ends) > 1 else gpu.summary())
                res["steady_epoch_seconds"] = steady(res["epochs"], "epoch_seconds")
                res["best_epoch_seconds"] = steady(res["epochs"], "epoch_seconds", "best")
                res["steady_examples_per_sec"] = steady(res["epochs"], "examples_per_sec")
                res["steady_cpu_examples_per_sec"] = steady(res["epochs"], "cpu_examples_per_sec")
                per_epoch = ", ".join(f"{e['epoch_seconds']:.2f}" for e in res["epochs"])
                print(f"  epoch {res['steady_epoch_seconds']:.2f} s  {res['steady_examples_per_sec']:.0f} ex/s  "
                      f"(epochs: {per_epoch})", flush=True)
                res["loadavg"] = load
                rec[launcher][n] = res
        base = workers[0]
        for stat in ("steady", "best"):
            suffix = "" if stat == "steady" else "_best"
            for launcher in ("nre_ray", "torchrun"):
                rec[f"{launcher}_speedup{suffix}"] = {n: rec[launcher][base][f"{stat}_epoch_seconds"]
                                                      / rec[launcher][n][f"{stat}_epoch_seconds"] for n in workers}
            rec[f"throughput_ratio{suffix}"] = {n: rec["torchrun"][n][f"{stat}_epoch_seconds"]
                                                / rec["nre_ray"][n][f"{stat}_epoch_seconds"] for n in workers}
            rec[f"speedup_ratio{suffix}"] = {n: rec[f"nre_ray_speedup{suffix}"][n] / rec[f"torchrun_speedup{suffix}"][n]
                                             for n in workers}
            if base == 1:  # the same, from the 1-process baseline without DDP (what Ray Train runs for one worker)
                single = rec["torchrun_no_ddp"][1][f"{stat}_epoch_seconds"]
                rec[f"torchrun_no_ddp_speedup{suffix}"] = {n: single / rec["torchrun"][n][f"{stat}_epoch_seconds"]
                                                           for n in workers}
                rec[f"speedup_ratio_no_ddp{suffix}"] = {
                    n: rec[f"nre_ray_speedup{suffix}"][n] / rec[f"torchrun_no_ddp_speedup{suffix}"][n]
                    for n in workers}
        rec["cpu_ratio"] = {n: rec["nre_ray"][n]["steady_cpu_examples_per_sec"]
                            / rec["torchrun"][n]["steady_cpu_examples_per_sec"] for n in workers}
        last = workers[-1]
        print(f"repeat {r + 1}: speed-up nre_ray {rec['nre_ray_speedup'][last]:.2f}, torchrun "
              f"{rec['torchrun_speedup'][last]:.2f} (best epochs: {rec['nre_ray_speedup_best'][last]:.2f}, "
              f"{rec['torchrun_speedup_best'][last]:.2f})", flush=True)
        repeats.append(rec)

    result = {"machine": info, "train": str(args.train), "test": str(args.test), "model": args.model,
              "device": "gpu" if args.use_gpu else "cpu",
              "batch_size": args.batch_size, "epochs": args.epochs, "seed": args.seed, "workers": workers,
              "command": [sys.executable, *sys.argv], "repeats": repeats}
    result["median"] = {key: {n: median(get(x, key, n) for x in repeats) for n in workers}
                        for key in ("nre_ray_speedup", "torchrun_speedup", "throughput_ratio", "speedup_ratio",
                                    "nre_ray_speedup_best", "torchrun_speedup_best", "throughput_ratio_best",
                                    "speedup_ratio_best", "cpu_ratio")}
    result["median"]["epoch_seconds"] = {lc: {n: median(x[lc][n]["steady_epoch_seconds"] for x in repeats)
                                              for n in workers} for lc in ("nre_ray", "torchrun")}
    result["median"]["best_epoch_seconds"] = {lc: {n: median(x[lc][n]["best_epoch_seconds"] for x in repeats)
                                                   for n in workers} for lc in ("nre_ray", "torchrun")}
    result["median"]["speedup_ratio_spread"] = {n: spread([x["speedup_ratio"][n] for x in repeats]) for n in workers}
    result["median"]["speedup_ratio_best_spread"] = {n: spread([x["speedup_ratio_best"][n] for x in repeats])
                                                     for n in workers}
    if workers[0] == 1:
        for key in ("torchrun_no_ddp_speedup", "speedup_ratio_no_ddp", "torchrun_no_ddp_speedup_best",
                    "speedup_ratio_no_ddp_best"):
            result["median"][key] = {n: median(get(x, key, n) for x in repeats) for n in workers}
        result["median"]["no_ddp_epoch_seconds"] = median(x["torchrun_no_ddp"][1]["steady_epoch_seconds"]
                                                          for x in repeats)
        result["median"]["no_ddp_best_epoch_seconds"] = median(x["torchrun_no_ddp"][1]["best_epoch_seconds"]
                                                               for x in repeats)
        result["median"]["speedup_ratio_no_ddp_spread"] = {n: spread([x["speedup_ratio_no_ddp"][n] for x in repeats])
                                                           for n in workers}
    if args.use_gpu:
        result["median"]["gpu_util_mean"] = {lc: {n: median(x[lc][n]["gpu_util_mean"] or float("nan")
                                                           for x in repeats) for n in workers}
                                             for lc in ("nre_ray", "torchrun")}
    finish(result, render(result), args, work)
    return 0


def get(x: dict[str, Any], *path: Any) -> Any:
    """``x[path[0]][path[1]]...``, also after a JSON round trip (which turns int keys into strings)."""
    for p in path:
        x = x[p] if p in x else x[str(p)]
    return x


def render(result: dict[str, Any]) -> str:
    """The tables of a result (also pasted into docs/benchmarks.md): each cell is median epoch / best epoch."""
    workers, reps, m = result["workers"], result["repeats"], result["median"]

    def pair(a: float, b: float, bold: bool = False) -> str:
        text = f"{a:.3g} / {b:.3g}"
        return f"**{text}**" if bold else text

    rows = []
    for n in workers:
        for x in reps:
            rows.append([n, x["repeat"],
                         pair(get(x, "nre_ray", n, "steady_epoch_seconds"), get(x, "nre_ray", n, "best_epoch_seconds")),
                         pair(get(x, "torchrun", n, "steady_epoch_seconds"),
                              get(x, "torchrun", n, "best_epoch_seconds")),
                         pair(get(x, "nre_ray_speedup", n), get(x, "nre_ray_speedup_best", n)),
                         pair(get(x, "torchrun_speedup", n), get(x, "torchrun_speedup_best", n)),
                         pair(get(x, "throughput_ratio", n), get(x, "throughput_ratio_best", n)),
                         pair(get(x, "speedup_ratio", n), get(x, "speedup_ratio_best", n)),
                         get(x, "cpu_ratio", n),
                         f"{get(x, 'nre_ray', n, 'loadavg'):.1f} / {get(x, 'torchrun', n, 'loadavg'):.1f}"])
        rows.append([n, "**median**",
                     pair(get(m, "epoch_seconds", "nre_ray", n), get(m, "best_epoch_seconds", "nre_ray", n)),
                     pair(get(m, "epoch_seconds", "torchrun", n), get(m, "best_epoch_seconds", "torchrun", n)),
                     pair(get(m, "nre_ray_speedup", n), get(m, "nre_ray_speedup_best", n)),
                     pair(get(m, "torchrun_speedup", n), get(m, "torchrun_speedup_best", n)),
                     pair(get(m, "throughput_ratio", n), get(m, "throughput_ratio_best", n)),
                     pair(get(m, "speedup_ratio", n), get(m, "speedup_ratio_best", n), bold=True),
                     get(m, "cpu_ratio", n), ""])
    last = workers[-1]
    no_ddp = ""
    if "speedup_ratio_no_ddp" in m:
        no_ddp_rows = [[x["repeat"], pair(get(x, "torchrun_no_ddp", 1, "steady_epoch_seconds"),
                                          get(x, "torchrun_no_ddp", 1, "best_epoch_seconds")),
                        pair(get(x, "torchrun_no_ddp_speedup", last), get(x, "torchrun_no_ddp_speedup_best", last)),
                        pair(get(x, "nre_ray_speedup", last), get(x, "nre_ray_speedup_best", last)),
                        pair(get(x, "speedup_ratio_no_ddp", last), get(x, "speedup_ratio_no_ddp_best", last))]
                       for x in reps]
        no_ddp_rows.append(["**median**", pair(m["no_ddp_epoch_seconds"], m["no_ddp_best_epoch_seconds"]),
                            pair(get(m, "torchrun_no_ddp_speedup", last), get(m, "torchrun_no_ddp_speedup_best", last)),
                            pair(get(m, "nre_ray_speedup", last), get(m, "nre_ray_speedup_best", last)),
                            pair(get(m, "speedup_ratio_no_ddp", last), get(m, "speedup_ratio_no_ddp_best", last),
                                 bold=True)])
        no_ddp = (f"\n\nThe same speed-ups with torchrun's 1-process base run without DDP (`ddp_baseline.py --ddp "
                  f"multi`, as Ray Train runs one worker); spread of the ratio over repeats "
                  f"{get(m, 'speedup_ratio_no_ddp_spread', last):.1%}:\n\n"
                  + table(["repeat", "torchrun 1 process, no DDP: epoch s", f"torchrun speed-up to {last}",
                           f"nre_ray speed-up to {last}", "nre_ray / torchrun speed-up"], no_ddp_rows))
    gpu = ""
    if "gpu_util_mean" in m:
        gpu = "\n\nGPU utilisation (nvidia-smi, mean over the counted epochs, median of the repeats):\n\n" + table(
            ["workers", "nre_ray %", "torchrun %"],
            [[n, get(m, "gpu_util_mean", "nre_ray", n), get(m, "gpu_util_mean", "torchrun", n)] for n in workers])
    return (f"{result['model']}, batch {result['batch_size']} per worker, 1 torch thread per worker; training-pass "
            f"time of epochs 2-{result['epochs']}, each cell median epoch / best epoch; spread of the {last}-worker "
            f"speed-up ratio over repeats {get(m, 'speedup_ratio_spread', last):.1%} (median epochs), "
            f"{get(m, 'speedup_ratio_best_spread', last):.1%} (best epochs):\n\n"
            + table(["workers", "repeat", "nre_ray epoch s", "torchrun epoch s", "nre_ray speed-up",
                     "torchrun speed-up", "nre_ray / torchrun throughput", "nre_ray / torchrun speed-up",
                     "nre_ray / torchrun ex per CPU-s", "load avg (nre_ray / torchrun)"], rows) + no_ddp + gpu)


if __name__ == "__main__":
    sys.exit(main())

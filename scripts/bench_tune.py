"""A hyperparameter sweep on FewRel against the default settings: is the sweep worth its time on this machine?

Runs ``python -m nre_ray.tune`` (``--num-samples`` trials, ASHA, the default search space of ``--model``) and
``python -m nre_ray.train`` with nre_ray's default settings, on the same data, epochs and workers per run. Both
select their checkpoint on validation only and are scored on the test split once. While the sweep runs, the CPU time
of its whole process tree (the driver, Ray, the trials and their workers) is sampled every second; the core-busy
share is that CPU time over the wall time times the machine's cores (the machine may be shared: the load average at
the start is recorded). The result is written between the ``bench_tune`` markers of ``docs/results.md`` (the rest
of that file belongs to ``scripts/bench_accuracy.py``) and as JSON in the work folder::

    nice -n 10 .venv/bin/python scripts/bench_tune.py                 # 12 trials of up to 20 epochs, cnn
    .venv/bin/python scripts/bench_tune.py --num-samples 4 --epochs 3 --no-write   # a quick look, nothing written

A sweep that does not finish within ``--timeout`` is stopped (Ctrl-C, so its MLflow runs are closed) and the
section says so, with what it reached.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
RESULTS_MD = REPO / "docs" / "results.md"
BEGIN, END = "<!-- bench_tune:begin -->", "<!-- bench_tune:end -->"
FEWREL = REPO.parent / "shared" / "datasets" / "fewrel" / "csv"


TICKS = os.sysconf("SC_CLK_TCK")


def _proc_stats() -> dict[int, tuple[int, float]]:
    """``{pid: (parent pid, CPU seconds user + system)}`` of every process, from /proc."""
    out = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            raw = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        fields = raw[raw.rindex(")") + 2:].split()  # after the command name, which may hold spaces
        out[int(entry)] = (int(fields[1]), (int(fields[11]) + int(fields[12])) / TICKS)
    return out


class TreeCpu:
    """Samples the CPU seconds (user + system) of a process and all its descendants, once a second (from /proc:
    a process that ends between two samples counts up to its last sample)."""

    def __init__(self, pid: int) -> None:
        self.root = pid
        self.seen: dict[int, float] = {}
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self.stop.is_set():
            stats = _proc_stats()
            children: dict[int, list[int]] = {}
            for pid, (ppid, _) in stats.items():
                children.setdefault(ppid, []).append(pid)
            todo = [self.root]
            while todo:
                pid = todo.pop()
                if pid in stats:
                    self.seen[pid] = max(self.seen.get(pid, 0.0), stats[pid][1])
                todo.extend(children.get(pid, []))
            self.stop.wait(1.0)

    def __enter__(self) -> TreeCpu:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join()

    @property
    def seconds(self) -> float:
        return sum(self.seen.values())


def run(cmd: list[str], timeout: float, log: Path) -> tuple[int, float, float]:
    """Run ``cmd`` (its output to ``log``); returns (exit status, wall seconds, CPU seconds of its process tree).
    Past ``timeout`` it gets SIGINT (and 10 minutes later SIGKILL)."""
    start = time.perf_counter()
    with log.open("w", encoding="utf-8") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, cwd=log.parent)
        with TreeCpu(proc.pid) as cpu:
            try:
                proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                proc.send_signal(signal.SIGINT)
                try:
                    proc.wait(timeout=600)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
    return proc.returncode, time.perf_counter() - start, cpu.seconds


def training_cpu_seconds(summary: dict[str, Any], workers: int) -> float:
    """CPU seconds the trials' workers spent in training passes (rank 0's ``epoch_cpu_seconds`` x workers)."""
    from mlflow.tracking import MlflowClient

    from nre_ray.tracking.store import mlflow_name

    client = MlflowClient(summary["tracking_uri"])
    name = mlflow_name("epoch_cpu_seconds")
    total = 0.0
    for trial in summary["trials"]:
        if trial.get("mlflow_run_id"):
            total += sum(m.value for m in client.get_metric_history(trial["mlflow_run_id"], name))
    return total * workers


def section(result: dict[str, Any]) -> str:
    """The markdown written between the markers."""
    a = result["args"]
    lines = [BEGIN, f"## Hyperparameter sweep on FewRel (`python -m nre_ray.tune`, {a['model']})", ""]
    sweep, default = result.get("sweep"), result.get("default")
    lines.append(
        f"`scripts/bench_tune.py`: {a['num_samples']} trials of up to {a['epochs']} epochs over the default "
        f"{a['model']} search space (docs/tune.md), ASHA on validation macro-F1 (grace {a['grace_period']} epoch, "
        f"reduction 2), {result['at_once']}; against one "
        f"`python -m nre_ray.train` run with nre_ray's default settings, the same epochs and workers. Both choose "
        f"their checkpoint on validation (the sweep: the best trial's best epoch) and are scored on test once. "
        f"FewRel train.csv (a seeded 10% validates), test.csv; {result['machine']}.")
    lines.append("")
    if sweep is None:
        lines += [f"**Not finished**: {result.get('status')}", "", END]
        return "\n".join(lines)
    best = sweep["best_params"]
    lines += ["| run | settings | valid macro-F1 | test macro-F1 | test accuracy | wall time |",
              "|---|---|---|---|---|---|"]
    if default:
        lines.append(f"| default settings | nre_ray defaults | {100 * default['valid']['macro_f1']:.2f} | "
                     f"{100 * default['test']['macro_f1']:.2f} | {100 * default['test']['accuracy']:.2f} | "
                     f"{result['default_wall_s'] / 60:.1f} min |")
    shown = ", ".join(f"{k.split('.', 1)[1]} {_short(v)}" for k, v in best.items())
    lines.append(f"| best of {len(sweep['trials'])} trials ({sweep['best_trial']}) | {shown} | "
                 f"{100 * sweep['best_valid']:.2f} | {100 * sweep['test']['macro_f1']:.2f} | "
                 f"{100 * sweep['test']['accuracy']:.2f} | {result['sweep_wall_s'] / 60:.1f} min (whole sweep) |")
    lines.append("")
    if default:
        gain = 100 * (sweep["test"]["macro_f1"] - default["test"]["macro_f1"])
        verdict = "met" if gain >= 1.0 else "not met"
        lines.append(f"Gain of the sweep's choice over the defaults: **{gain:+.2f} points** of test macro-F1 (target: "
                     f"at least +1.00: {verdict}).")
    counts = {o: sum(t["outcome"] == o for t in sweep["trials"]) for o in ("completed", "stopped early (ASHA)",
                                                                           "error", "unfinished")}
    lines.append(f"Trials: {counts['completed']} completed, {counts['stopped early (ASHA)']} stopped early by ASHA"
                 + (f", {counts['error']} failed" if counts["error"] else "")
                 + f"; {result['trial_epochs']} trial epochs in all (a full search: {a['num_samples'] * a['epochs']}).")
    lines.append(f"Cores busy: the sweep's processes used {result['sweep_cpu_s'] / 60:.1f} CPU minutes in "
                 f"{result['sweep_wall_s'] / 60:.1f} minutes on {result['cores']} cores: "
                 f"**{100 * result['busy_share']:.0f}%** of the cores' time (training passes alone: "
                 f"{100 * result['training_share']:.0f}%; the rest is start-up of each trial's Ray Train run, "
                 "validation, checkpoints, MLflow and Tune). Other work on this shared machine competed for the same "
                 "cores (see the load above).")
    lines += ["", "| trial | outcome | epochs | best valid macro-F1 | " + " | ".join(k.split(".", 1)[1] for k in best)
              + " |", "|---|---|---|---|" + "---|" * len(best)]
    for t in sorted(sweep["trials"], key=lambda t: -(t["best_valid_macro_f1"] or 0)):
        score = t["best_valid_macro_f1"]
        lines.append(f"| {t['trial_id']} | {t['outcome']} | {t['epochs']} | "
                     + (f"{100 * score:.2f}" if score is not None and not math.isnan(score) else "")
                     + " | " + " | ".join(_short(t[k]) for k in best) + " |")
    lines += ["", END]
    return "\n".join(lines)


def _short(value: Any) -> str:
    return f"{value:.3g}" if isinstance(value, float) else str(value)


def write_section(text: str) -> None:
    """Replace the ``bench_tune`` section of docs/results.md, or append it; nothing else in the file changes."""
    current = RESULTS_MD.read_text(encoding="utf-8") if RESULTS_MD.exists() else "# Results\n"
    if BEGIN in current and END in current:
        current = current[:current.index(BEGIN)] + text + current[current.index(END) + len(END):]
    else:
        current = current.rstrip("\n") + "\n\n" + text + "\n"
    RESULTS_MD.write_text(current, encoding="utf-8")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data-dir", type=Path, default=FEWREL)
    parser.add_argument("--model", default="cnn")
    parser.add_argument("--epochs", type=int, default=20, help="most epochs per trial, and the default run's")
    parser.add_argument("--num-samples", type=int, default=12)
    parser.add_argument("--num-workers", type=int, default=1, help="workers per trial and for the default run")
    parser.add_argument("--max-concurrent-trials", type=int, help="default: as many as fit (nre_ray.tune)")
    parser.add_argument("--grace-period", type=int, default=2)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--timeout", type=float, default=3 * 3600, help="seconds the sweep may take")
    parser.add_argument("--work", type=Path, help="keep the runs here (default: a temporary folder)")
    parser.add_argument("--no-write", action="store_true", help="print the section, leave docs/results.md alone")
    parser.add_argument("--from-json", type=Path, help="only write the section again from a run's bench_tune.json")
    args = parser.parse_args()
    if args.from_json:
        text = section(json.loads(args.from_json.read_text(encoding="utf-8")))
        print(text)
        if not args.no_write:
            write_section(text)
        return 0
    if not args.data_dir.is_dir():
        print(f"error: {args.data_dir} is not a folder (FewRel's csv folder is expected)", file=sys.stderr)
        return 2
    work = args.work or Path(tempfile.mkdtemp(prefix="bench_tune_"))
    work.mkdir(parents=True, exist_ok=True)
    python = sys.executable
    common = ["--data-dir", str(args.data_dir.absolute()), "--model", args.model, "--epochs", str(args.epochs),
              "--num-workers", str(args.num_workers), "--seed", str(args.seed), "--cache-dir", str(work / "cache"),
              "--tracking-uri", f"sqlite:///{work / 'mlflow.db'}", "--storage-path", str(work / "ray_results")]
    load = os.getloadavg()[0]
    result: dict[str, Any] = {"args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
                              "cores": os.cpu_count(), "machine": f"{os.cpu_count()} cores, load {load:.1f} at the "
                              "start (shared machine)", "at_once": "trials at once as planned by nre_ray.tune"}
    sweep_cmd = [python, "-m", "nre_ray.tune", *common, "--num-samples", str(args.num_samples),
                 "--grace-period", str(args.grace_period), "--run-name", "sweep",
                 "--summary-json", str(work / "sweep.json")]
    if args.max_concurrent_trials:
        sweep_cmd += ["--max-concurrent-trials", str(args.max_concurrent_trials)]
    print(f"sweep: {' '.join(sweep_cmd)}\n  (log: {work / 'sweep.log'})", flush=True)
    code, wall, cpu = run(sweep_cmd, args.timeout, work / "sweep.log")
    result.update(sweep_wall_s=wall, sweep_cpu_s=cpu, busy_share=cpu / (wall * (os.cpu_count() or 1)))
    planned = next((line for line in (work / "sweep.log").read_text(encoding="utf-8").splitlines()
                    if line.startswith("sweep sweep:")), "")
    if "trial(s) at once" in planned:
        result["at_once"] = planned.split("epoch(s), ", 1)[1].split(";", 1)[0]
    if code != 0 or not (work / "sweep.json").exists():
        tail = (work / "sweep.log").read_text(encoding="utf-8").splitlines()[-15:]
        result["status"] = (f"the sweep stopped with status {code} after {wall / 60:.1f} min "
                            f"({'timeout' if wall >= args.timeout else 'error'}); its last lines:\n\n```\n"
                            + "\n".join(tail) + "\n```")
    else:
        sweep = json.loads((work / "sweep.json").read_text(encoding="utf-8"))
        result["sweep"] = sweep
        result["trial_epochs"] = sum(t["epochs"] for t in sweep["trials"])
        result["training_share"] = training_cpu_seconds(sweep, args.num_workers) / (wall * (os.cpu_count() or 1))
        default_cmd = [python, "-m", "nre_ray.train", *common, "--run-name", "default", "--no-log-model",
                       "--summary-json", str(work / "default.json")]
        print(f"default: {' '.join(default_cmd)}", flush=True)
        code, wall, _ = run(default_cmd, args.timeout, work / "default.log")
        result["default_wall_s"] = wall
        if code == 0:
            result["default"] = json.loads((work / "default.json").read_text(encoding="utf-8"))
    (work / "bench_tune.json").write_text(json.dumps(result, indent=2, default=str), encoding="utf-8")
    text = section(result)
    print(text)
    if not args.no_write:
        write_section(text)
        print(f"wrote the bench_tune section of {RESULTS_MD}")
    print(f"runs and JSON in {work}")
    return 0 if "sweep" in result else 1


if __name__ == "__main__":
    sys.exit(main())

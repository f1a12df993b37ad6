#!/usr/bin/env python3
"""The work one preemption costs, in three ways of training, measured in one run on the cluster stand-in.

It starts a stand-in (``python -m nre_ray.standin``: a Ray head whose autoscaler adds 1-CPU worker nodes, an object
store, an MLflow server) on free ports, uploads the training data, and trains the same run (3 workers: the head's
CPU and two autoscaled nodes) five times, one after another:

- two undisturbed runs, the baselines: fixed-size (``--num-workers 3``) and elastic (``--num-workers 1-3``);
- ``fixed-restart``: ``--num-workers 3``, a node preempted in the middle of an epoch (``preempt-node --deadline``).
  A fixed-size run saves no mid-epoch checkpoint: Ray restarts it from the last epoch's checkpoint once its 3
  workers can be placed again, on the node the autoscaler adds in place of the lost one;
- ``fixed-wait``: ``--num-workers 3-3``, an elastic run that cannot shrink: it saves a just-in-time checkpoint on the
  notice, so no epoch is started over, and waits for the replacement node as the fixed-size run does;
- ``elastic``: ``--num-workers 1-3``: the just-in-time checkpoint, and it goes on with the 2 workers left at once,
  growing back to 3 when the replacement node has come (Ray looks for room every 60 s).

The notice is sent at the same point of each run (``--at`` of the way into epoch ``--epoch``, by the baseline's
epoch time) and the node goes at its deadline, as AWS takes a spot instance. Each run's training time is from its
first step to its last epoch's end (MLflow's timestamps), so Ray's start, the preprocessing and the first nodes'
arrival are left out. The figures, for each disturbed run against its own baseline (the fixed-size one for
``fixed-restart``, the elastic one for the others): the training time and its ratio to the baseline's, the
wall-clock lost (the difference), the work re-done (examples trained a second time: from the checkpoint the restart
went on from to the node's end, at the baseline's speed), and each epoch's workers.

Processes: the stand-in is stopped (exactly its own processes) at the end, also on failure or Ctrl-C.

    python scripts/bench_faults.py --epochs 3 --deadline 20
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench_common import BENCH_ENV, REPO, add_run_options, finish, machine, table, wait_for_quiet

SAMPLE = REPO / "nre_ray" / "data" / "sample"
#: The runs, in the order they are made: name, --num-workers, the baseline it is compared with (None: a baseline).
RUNS = [("baseline-fixed", "3", None), ("baseline-elastic", "1-3", None),
        ("fixed-restart", "3", "baseline-fixed"), ("fixed-wait", "3-3", "baseline-elastic"),
        ("elastic", "1-3", "baseline-elastic")]
#: The console's line for a restart: where it went on from (nre_ray.core.console).
GOING_ON = re.compile(r"going on from (?:step (\d+) of )?epoch (\d+)")
#: The console's line for the worker group's start after a restart, with its time since the command started.
STARTED_AGAIN = re.compile(r"^\[\s*([\d.]+)s\] workers: (\d+) started again", re.MULTILINE)
JIT_LINE = "saved a mid-epoch checkpoint"


@dataclass
class Outcome:
    """One run: its times (Unix seconds), its epochs, and what the preemption did."""

    name: str
    num_workers: str
    wall_s: float = 0.0
    first_step: float = 0.0
    epoch_ends: dict[int, float] = field(default_factory=dict)  #: epoch -> when its metrics were logged
    workers: dict[int, int] = field(default_factory=dict)  #: epoch -> world size that ended it
    epoch_seconds: dict[int, float] = field(default_factory=dict)
    train_rows: int = 0
    notice_at: float | None = None
    lost_at: float | None = None
    jit_at: float | None = None  #: when the console said the just-in-time checkpoint was saved
    went_on_from: str = ""  #: the restart line's start point
    restarted_at: float | None = None  #: when the worker group started again after the node's end
    restarted_with: int = 0  #: with how many workers
    preemptions: str = ""  #: the MLflow tag
    status: str = ""

    @property
    def training_s(self) -> float:
        return max(self.epoch_ends.values()) - self.first_step


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog="example: python scripts/bench_faults.py --epochs 3 --deadline 20")
    parser.add_argument("--epochs", type=int, default=3, help="epochs of every run (default 3)")
    parser.add_argument("--epoch", type=int, default=2, help="the epoch the notice comes in (default 2)")
    parser.add_argument("--at", type=float, default=0.1,
                        help="how far into that epoch, as a fraction of the baseline's epoch time (default 0.1)")
    parser.add_argument("--deadline", type=float, default=20.0,
                        help="seconds from the notice to the node's end (default 20; AWS gives 120)")
    parser.add_argument("--model", default="bilstm", help="--model of the runs (default bilstm: slow enough on "
                        "CPUs for an epoch to outlast the notice's handling)")
    parser.add_argument("--batch-size", type=int, default=8, help="--batch-size of the runs (default 8)")
    parser.add_argument("--train-rows", type=int, default=12000,
                        help="rows of training data: the bundled sample's 3000 cut or repeated (default 12000: "
                             "epochs longer than the notice, as on a real cluster, where an epoch takes hours)")
    parser.add_argument("--seed", type=int, default=7, help="--seed of the runs (default 7)")
    parser.add_argument("--modes", default=",".join(name for name, _, _ in RUNS),
                        help="the runs to make, comma-separated (default: all five)")
    add_run_options(parser, None, "", "results_faults.json", timeout=420, kept="logs, the stand-in's logs")
    args = parser.parse_args(argv)
    unknown = set(args.modes.split(",")) - {name for name, _, _ in RUNS}
    if unknown:
        parser.error(f"--modes: unknown run(s) {', '.join(sorted(unknown))}; choose among "
                     f"{', '.join(name for name, _, _ in RUNS)}")
    if not 2 <= args.epoch <= args.epochs:
        parser.error(f"--epoch {args.epoch}: the notice comes in an epoch after the first (2 to --epochs)")
    return args


def free_ports(count: int) -> list[int]:
    """``count`` different ports the system has free now (the stand-in's defaults may be taken on a shared host)."""
    from nre_ray.cluster.ports import free_port

    ports: list[int] = []
    for _ in range(count):
        ports.append(free_port(taken=ports))
    return ports


def upload_data(state: Any, rows: int, folder: Path) -> None:
    """The bundled sample, its train.csv cut or repeated to ``rows`` rows, into s3://BUCKET/data."""
    folder.mkdir(parents=True, exist_ok=True)
    for path in SAMPLE.iterdir():
        text = path.read_text(encoding="utf-8")
        if path.name == "train.csv":  # the rows cycled up to ``rows`` (repeats: more work per epoch, same data)
            header, *lines = text.splitlines(keepends=True)
            text = header + "".join(lines[i % len(lines)] for i in range(rows))
        (folder / path.name).write_text(text, encoding="utf-8")
    fs = state.filesystem()
    for path in folder.iterdir():
        with fs.open_output_stream(f"{state.bucket}/data/{path.name}") as out:
            out.write(path.read_bytes())


def mlflow_run(state: Any, name: str) -> Any:
    """The MLflow run named ``name`` in the stand-in's MLflow server, or None."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(state.tracking_uri)
    runs = client.search_runs([e.experiment_id for e in client.search_experiments()],
                              f"tags.`nre_ray.run_name` = '{name}'")
    return runs[0] if runs else None


def epochs_logged(state: Any, name: str) -> dict[int, float]:
    """Epoch -> when its metrics reached MLflow, for the run ``name`` ({} before its first)."""
    from mlflow.tracking import MlflowClient

    run = mlflow_run(state, name)
    if run is None:
        return {}
    history = MlflowClient(state.tracking_uri).get_metric_history(run.info.run_id, "epoch/train_loss")
    return {m.step: m.timestamp / 1000 for m in history}


def preempt_when(state: Any, name: str, epoch: int, delay: float, deadline: float, outcome: Outcome,
                 proc: subprocess.Popen, log: Path) -> None:
    """Once epoch ``epoch - 1`` of run ``name`` has been logged, wait ``delay`` seconds and preempt the node of a
    training worker (a notice, then the node's end at ``deadline``)."""
    while proc.poll() is None:
        if epoch - 1 in epochs_logged(state, name):
            break
        time.sleep(0.5)
    else:
        return
    time.sleep(delay)
    outcome.notice_at = time.time()
    # As a user does (a process of its own: Ray reads its authentication settings once per process)
    done = subprocess.run([sys.executable, "-m", "nre_ray.standin", "--dir", state.folder, "preempt-node",
                           "--deadline", f"{deadline:g}"], capture_output=True, text=True, timeout=deadline + 120,
                          env={**os.environ, **BENCH_ENV}, check=False)
    if done.returncode != 0:  # the run's outcome then shows no preemption
        print(f"  preempt-node failed: {done.stdout}{done.stderr}", flush=True)
        return
    outcome.lost_at = time.time()


def train(state: Any, args: argparse.Namespace, name: str, num_workers: str, work: Path,
          preempt_delay: float | None) -> Outcome:
    """One run on the stand-in (a driver on this machine joined to its Ray), preempted after ``preempt_delay`` s of
    epoch ``--epoch`` when given; its outcome read back from MLflow and its console."""
    from mlflow.tracking import MlflowClient

    outcome = Outcome(name, num_workers, train_rows=args.train_rows)
    log = work / f"{name}.log"
    cmd = [sys.executable, "-m", "nre_ray.train", "--address", state.gcs_address, "--num-workers", num_workers,
           "--model", args.model,
           "--epochs", str(args.epochs), "--patience", "0", "--batch-size", str(args.batch_size), "--seed",
           str(args.seed), "--data-dir", f"s3://{state.bucket}/data", "--storage-path",
           f"s3://{state.bucket}/checkpoints", "--tracking-uri", state.tracking_uri, "--run-name", name,
           "--experiment-name", "bench_faults", "--no-log-model", "--max-failures", "1"]
    wait_for_quiet(args.max_load)
    started = time.time()
    with open(log, "w", encoding="utf-8") as out:
        proc = subprocess.Popen(cmd, cwd=work, stdout=out, stderr=subprocess.STDOUT,
                                env={**os.environ, **BENCH_ENV, **state.env()})
    striker = None
    if preempt_delay is not None:
        striker = threading.Thread(target=preempt_when, daemon=True,
                                   args=(state, name, args.epoch, preempt_delay, args.deadline, outcome, proc, log))
        striker.start()
    jit_seen = None
    try:
        while proc.poll() is None and time.time() - started < args.timeout:
            if jit_seen is None and JIT_LINE in log.read_text(errors="replace"):
                jit_seen = time.time()
            time.sleep(0.5)
        if proc.poll() is None:
            proc.terminate()
            proc.wait(timeout=60)
            raise RuntimeError(f"{name}: no end within --timeout {args.timeout:g} s; its log: {log}")
    finally:
        if proc.poll() is None:
            proc.kill()
    if striker is not None:
        striker.join(timeout=args.deadline + 30)
    outcome.wall_s = time.time() - started
    outcome.jit_at = jit_seen
    text = log.read_text(errors="replace")
    if proc.returncode != 0:
        tail = "\n".join(text.splitlines()[-30:])
        raise RuntimeError(f"{name} exited with {proc.returncode}; its log {log}:\n{tail}")
    again = [(started + float(t), int(n)) for t, n in STARTED_AGAIN.findall(text)]
    after = [(at, n) for at, n in again if outcome.lost_at is not None and at >= outcome.lost_at]
    if after:
        outcome.restarted_at, outcome.restarted_with = after[0]
    found = GOING_ON.search(text)
    if found:
        outcome.went_on_from = f"step {found[1]} of epoch {found[2]}" if found[1] else f"the end of epoch {found[2]}"
    client = MlflowClient(state.tracking_uri)
    run = mlflow_run(state, name)
    outcome.status = run.info.status
    outcome.preemptions = run.data.tags.get("preemptions", "")
    history = client.get_metric_history(run.info.run_id, "epoch/train_loss")
    steps = sorted(m.step for m in history)
    if steps != list(range(1, args.epochs + 1)):
        raise RuntimeError(f"{name}: epochs logged {steps}, not each of 1..{args.epochs} once")
    outcome.epoch_ends = {m.step: m.timestamp / 1000 for m in history}
    outcome.workers = {m.step: int(m.value) for m in client.get_metric_history(run.info.run_id, "workers")}
    outcome.epoch_seconds = {m.step: m.value for m in client.get_metric_history(run.info.run_id,
                                                                                "system/epoch_seconds")}
    first = client.get_metric_history(run.info.run_id, "system/startup_workers_s")
    outcome.first_step = first[0].timestamp / 1000 if first else started
    return outcome


def redone(outcome: Outcome, baseline: Outcome) -> tuple[float, float]:
    """(examples trained a second time, their seconds at the baseline's speed): from the checkpoint the restart went
    on from (the just-in-time one, or the end of the epoch before) to the node's end."""
    if outcome.lost_at is None:
        return 0.0, 0.0
    if outcome.jit_at is not None and "step" in outcome.went_on_from:
        since = outcome.jit_at
    else:
        since = outcome.epoch_ends.get(outcome_epoch(outcome) - 1, outcome.first_step)
    seconds = max(0.0, outcome.lost_at - since)
    per_example = baseline.training_s / len(baseline.epoch_ends) / baseline.train_rows  # evaluation included
    return seconds / per_example, seconds


def outcome_epoch(outcome: Outcome) -> int:
    """The epoch the node was lost in: the first that ended after it."""
    return min((e for e, at in outcome.epoch_ends.items() if at >= (outcome.lost_at or 0)), default=0)


def median_epoch_seconds(outcome: Outcome) -> float:
    values = sorted(outcome.epoch_seconds.values())
    return values[len(values) // 2] if values else float("nan")


def report(outcomes: dict[str, Outcome], args: argparse.Namespace) -> tuple[str, list[dict[str, Any]]]:
    rows, records = [], []
    for name, _, base_name in RUNS:
        if name not in outcomes:
            continue
        outcome = outcomes[name]
        base = outcomes.get(base_name) if base_name else None
        examples, seconds = redone(outcome, base) if base else (0.0, 0.0)
        ratio = outcome.training_s / base.training_s if base else 1.0
        lost = outcome.training_s - base.training_s if base else 0.0
        workers = " ".join(str(outcome.workers[e]) for e in sorted(outcome.workers))
        record = {"run": name, "num_workers": outcome.num_workers, "baseline": base_name or "",
                  "training_s": outcome.training_s, "ratio": ratio, "wall_clock_lost_s": lost,
                  "examples_redone": examples, "redone_s": seconds, "workers_per_epoch": workers,
                  "went_on_from": outcome.went_on_from, "preemptions": outcome.preemptions,
                  "status": outcome.status, "wall_s": outcome.wall_s,
                  "notice_to_jit_s": (outcome.jit_at - outcome.notice_at) if outcome.jit_at and outcome.notice_at
                  else None}
        waited = outcome.restarted_at - outcome.lost_at if outcome.restarted_at and outcome.lost_at else None
        record.update(node_lost_to_restart_s=waited, restarted_with=outcome.restarted_with)
        records.append(record)
        rows.append([name, f"`--num-workers {outcome.num_workers}`", base_name or "(baseline)",
                     outcome.training_s, f"{ratio:.2f}", lost if base else "", round(examples) if base else "",
                     f"{waited:.0f} s, {outcome.restarted_with} workers" if waited is not None else "",
                     workers, outcome.went_on_from or "", outcome.status])
    text = table(["run", "workers", "against", "training (s)", "x baseline", "wall-clock lost (s)",
                  "examples re-done", "node lost to restart", "workers per epoch", "went on from", "MLflow"], rows)
    return text, records


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from nre_ray.cluster import standin_cluster

    work = (args.work_dir or Path(tempfile.mkdtemp(prefix="bench_faults_"))).absolute()
    work.mkdir(parents=True, exist_ok=True)
    info = machine()
    began = time.time()
    folder = work / "standin"
    ports = dict(zip(("s3", "gcs", "dashboard", "mlflow"), free_ports(4), strict=True))
    print(f"starting the stand-in in {folder}", flush=True)
    # Idle nodes stay 10 minutes: every run starts on the nodes the first one brought (the 3 workers at once).
    state = standin_cluster.up(folder, ports=ports, idle_minutes=10)
    outcomes: dict[str, Outcome] = {}
    try:
        upload_data(state, args.train_rows, work / "data")
        os.environ.update(state.mlflow_login())  # this process's MLflow client reads the server's password here
        wanted = args.modes.split(",")
        for name, num_workers, base_name in RUNS:
            if name not in wanted:
                continue
            delay = None
            if base_name:
                base = outcomes.get(base_name)
                epoch_s = median_epoch_seconds(base) if base else 20.0
                delay = args.at * epoch_s
            print(f"{name}: --num-workers {num_workers}"
                  + (f", a node preempted {delay:.0f} s into epoch {args.epoch}" if delay is not None else ""),
                  flush=True)
            outcomes[name] = train(state, args, name, num_workers, work, delay)
            done = outcomes[name]
            print(f"  training {done.training_s:.0f} s; workers per epoch "
                  f"{' '.join(str(done.workers[e]) for e in sorted(done.workers))}", flush=True)
    finally:
        standin_cluster.down(folder)
    text, records = report(outcomes, args)
    load = os.getloadavg()
    header = (f"bench_faults: {args.epochs} epochs of {args.train_rows} rows, --model {args.model} --batch-size "
              f"{args.batch_size}, a "
              f"node preempted {args.at:g} of the way into epoch {args.epoch} with --deadline {args.deadline:g}; "
              f"{info['nproc']} cores, load {info['loadavg_at_start'][0]:.1f} at the start and {load[0]:.1f} at "
              f"the end; {time.time() - began:.0f} s in all")
    result = {"machine": info, "args": {k: str(v) for k, v in vars(args).items()}, "runs": records,
              "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "loadavg_at_end": load}
    finish(result, header + "\n\n" + text, argparse.Namespace(out=args.out, keep=args.keep, work_dir=args.work_dir),
           work)
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""A fault drill: several training runs at once in one folder, SIGKILL and SIGINT struck into their drivers and
workers at random moments, then a check that nothing was lost.

It starts ``--runs`` commands ``python -m nre_ray.train`` together in one working folder, as a user would from
several terminals: the default MLflow store (``mlflow.db``) and storage path (``ray_results``) of that folder, one
preprocessing cache, each command with its own local Ray. Each run trains ``--epochs`` epochs on a small cut of the
bundled sample. Meanwhile it strikes ``--faults`` faults, drawn from ``--seed``: a SIGKILL or a SIGINT (what Ctrl-C
sends) to a run's driver or to one of its Ray Train workers, at a moment of the run (a phase of its output: Ray's
start, preprocessing, the MLflow run's creation, the workers' start, an epoch, the model's logging) plus a fraction
of a second; one fault to a driver per command (a run's next fault waits for the command that continues it). A run
whose command ended by a fault is continued as docs/faults.md tells a user to: the same command
with ``--resume`` (or without it when the run had not reached MLflow yet); a killed worker is restarted by the run
itself (``--max-failures``).

Then it checks:

- the MLflow store opens, and each run is one MLflow run;
- every run is FINISHED, FAILED or KILLED, none left RUNNING; and, after its resumes, FINISHED;
- every finished run has each epoch's metrics exactly once, its test scores and its model;
- each command ended as documented: exit 130 and KILLED after a SIGINT to the driver, RUNNING after a SIGKILL to
  the driver (until ``--resume``), no failure without a fault;
- no temporary file or folder is left (the runs' temporary folder, TMPDIR, is one of the working folder), and no
  process: every process the drill started and their descendants, found by ancestry (the drill is their
  subreaper: orphans stay below it) and known by identity (PID and start time), never by name.

It prints the faults, the runs and the checks as tables, writes them with ``--json``, and exits 1 when a check
fails. Processes are signalled only by identity (a pidfd opened after checking the start time); never ``ray stop``,
never a name pattern. Linux only (/proc).

    python scripts/fault_drill.py --runs 3 --faults 4 --epochs 2 --seed 1
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from nre_ray.cluster import processes
from nre_ray.cluster.processes import cmdline, stat_fields

REPO = Path(__file__).resolve().parents[1]
SAMPLE = REPO / "nre_ray" / "data" / "sample"
EXPERIMENT = "nre_ray"  # the default experiment: the runs are plain `python -m nre_ray.train` commands
#: Moments a fault can strike at: the first line of each of these phases in the run's output (an epoch: the first
#: epoch line of that command), then a fraction of a second.
DRIVER_MOMENTS = ("ray", "preprocess", "mlflow", "workers", "training", "epoch", "model")
WORKER_MOMENTS = ("training", "epoch")  # the workers exist then
PHASE_LINE = re.compile(r"^\[\s*[\d.]+s\] (\w+): ")
EPOCH_LINE = re.compile(r"^epoch\s+\d+/\d+ ")
RESTART = re.compile(r"\] workers: \d+ started again$")  # nre_ray.core.console's line for a worker-group restart
RUN_ID = re.compile(r"(?:mlflow: run |\(MLflow run )([0-9a-f]{32})")
#: Names of temporaries: files mid-write (``*.partial``: nre_ray.storage's atomic writer, the checkpoint's files
#: among them; ``*.tmp`` of an older nre_ray), private build folders of the cache (``<key>.tmp-<pid>.<start>-...``,
#: or ``<key>.tmp-<pid>-...`` of an older nre_ray).
TEMP_NAME = re.compile(r"\.tmp$|\.partial$|\.tmp-\d+[.-]")
#: In the runs' TMPDIR but not nre_ray's leftovers: its lock files (kept on purpose, one per cache entry:
#: nre_ray.core.buildonce), torch's compile cache (``torchinductor_<user>``, kept on purpose by torch), and the folders
#: of the multiprocessing forkserver of Ray's dashboard (``pymp-*``: each local Ray leaves one, even after a clean
#: ``ray.shutdown``, which kills the dashboard before Python can remove it).
NOT_NRE_RAYS = re.compile(r"^(nre_ray-\d+(/locks(/[^/]+\.lock)?)?|torchinductor_[^/]+(/.*)?|pymp-\w+(/listener-\w+)?)$")
PR_SET_CHILD_SUBREAPER = 36


# --- processes, by identity -----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Proc:
    """A process by identity: its PID and its start time (clock ticks after boot), which a reused PID does not share."""

    pid: int
    start: int


def identity(pid: int) -> Proc | None:
    """``pid`` as a :class:`Proc`, or None when it is gone or a zombie."""
    found = processes.identify(pid)
    return Proc(pid, found.start) if found is not None else None


def alive(proc: Proc) -> bool:
    """True while that very process runs (not a zombie, not a later process with the same PID): nre_ray's one
    liveness check."""
    return processes.alive(proc.pid, proc.start)


def process_table() -> dict[int, tuple[int, int, str]]:
    """One snapshot of /proc: PID -> (parent PID, start time, state)."""
    table = {}
    for name in os.listdir("/proc"):
        if name.isdigit() and (fields := stat_fields(int(name))) is not None:
            table[int(name)] = (int(fields[1]), int(fields[19]), fields[0])
    return table


def descendants(root: int, table: dict[int, tuple[int, int, str]]) -> list[int]:
    """The PIDs below ``root`` in ``table`` (children, grandchildren, ...)."""
    children: dict[int, list[int]] = {}
    for pid, (ppid, _, _) in table.items():
        children.setdefault(ppid, []).append(pid)
    found, todo = [], [root]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def ignores(pid: int, sig: int) -> bool:
    """True when ``pid`` ignores ``sig`` (its SigIgn mask in /proc/PID/status)."""
    try:
        with open(f"/proc/{pid}/status") as fh:
            mask = next(int(line.split()[1], 16) for line in fh if line.startswith("SigIgn:"))
    except (OSError, StopIteration):
        return False
    return bool(mask >> (sig - 1) & 1)


def send(proc: Proc, sig: int) -> bool:
    """Signal that very process: a pidfd is opened first, then the start time checked, so a PID reused in between
    is never signalled. False when it is gone."""
    try:
        fd = os.pidfd_open(proc.pid)
    except ProcessLookupError:
        return False
    try:
        if not alive(proc):
            return False
        signal.pidfd_send_signal(fd, sig)
        return True
    except ProcessLookupError:
        return False
    finally:
        os.close(fd)


def become_subreaper() -> None:
    """Orphans of the drill's processes (Ray's, when a driver is killed) are re-parented to the drill, not to init, so
    that every process it started stays among its descendants."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_CHILD_SUBREAPER)")


# --- the plan -------------------------------------------------------------------------------------------------------


@dataclass
class Fault:
    """One fault: a signal to a run's driver or worker at a moment of the run; then what happened."""

    number: int
    run: str
    target: str  # "driver" or "worker"
    signal: str  # "SIGKILL" or "SIGINT"
    moment: str  # a phase of DRIVER_MOMENTS / WORKER_MOMENTS
    delay_s: float  # after the phase's first line
    attempt: int | None = None  # the command (1: the first, 2: the first --resume, ...) it struck
    at_s: float | None = None  # seconds after the drill started
    pid: int | None = None
    result: str = "not struck: the run ended before its moment"
    ignored: bool = False  # the process ignores that signal
    late: bool = False  # struck after the command had printed its summary
    restarts_before: int = 0  # worker-group restarts of the command before it struck


def plan_faults(rng: random.Random, runs: list[str], count: int) -> list[Fault]:
    """``count`` faults: each kind (driver/worker x SIGKILL/SIGINT) once in a shuffled order before any twice; spread
    over the runs in a shuffled order; each at a random moment."""
    kinds = [(target, sig) for target in ("driver", "worker") for sig in ("SIGKILL", "SIGINT")]
    rng.shuffle(kinds)
    order = rng.sample(runs, len(runs))
    faults = []
    for number in range(count):
        target, sig = kinds[number % len(kinds)]
        moment = rng.choice(DRIVER_MOMENTS if target == "driver" else WORKER_MOMENTS)
        faults.append(Fault(number + 1, order[number % len(order)], target, sig, moment, round(rng.uniform(0, 2), 1)))
    return faults


# --- the runs -------------------------------------------------------------------------------------------------------


@dataclass
class Attempt:
    """One command of a run: the first, or a ``--resume``."""

    number: int
    resume: bool
    log: str
    exit: int | None = None
    status_after: str | None = None  # the MLflow run's status when the command had ended
    faults: list[int] = field(default_factory=list)
    note: str = ""


@dataclass
class Run:
    """One run of the drill: its commands, its faults (struck in order), what it ended as."""

    name: str
    model: str
    faults: list[Fault]
    attempts: list[Attempt] = field(default_factory=list)
    run_id: str | None = None
    done: bool = False
    problem: str = ""  # why the drill stopped continuing it, when not finished
    final: str | None = None  # its MLflow status at the end
    lost: list[str] = field(default_factory=list)  # what the checks found missing
    # the command running now
    proc: subprocess.Popen | None = field(default=None, repr=False)
    driver: Proc | None = None
    seen: dict[str, float] = field(default_factory=dict, repr=False)  # phase -> when its first line was read
    offset: int = 0
    restarts: int = 0  # worker-group restarts of the running command (its "started again" lines)

    def pending(self) -> Fault | None:
        """The next fault to strike (faults strike in order)."""
        return next((f for f in self.faults if f.at_s is None), None)


class Drill:
    """The runs, the faults, the processes seen, and the checks."""

    def __init__(self, args: argparse.Namespace, work: Path) -> None:
        self.args, self.work = args, work
        self.began = time.monotonic()
        self.tmp = work / "tmp"
        self.logs = work / "logs"
        self.data = work / "data"
        self.tracking_uri = f"sqlite:///{work / 'mlflow.db'}"
        rng = random.Random(args.seed)
        models = args.model.split(",")
        names = [f"drill-{i + 1}" for i in range(args.runs)]
        faults = plan_faults(rng, names, args.faults)
        self.faults = faults
        self.runs = [Run(name, models[i % len(models)], [f for f in faults if f.run == name])
                     for i, name in enumerate(names)]
        self.rng = rng
        self.seen: dict[Proc, str] = {}  # every process below the drill, with the run it belongs to
        self.problems: list[str] = []

    # set-up

    def prepare(self) -> None:
        """The working folder: a small cut of the bundled sample, the logs, the runs' temporary folder."""
        for folder in (self.tmp, self.logs, self.data):
            folder.mkdir(parents=True)
        rows = {"train.csv": self.args.rows, "valid.csv": max(20, self.args.rows // 5),
                "test.csv": max(20, self.args.rows // 5)}
        for name, count in rows.items():
            lines = (SAMPLE / name).read_text(encoding="utf-8").splitlines(keepends=True)
            (self.data / name).write_text("".join(lines[:count + 1]), encoding="utf-8")
        shutil.copyfile(SAMPLE / "relation.txt", self.data / "relation.txt")

    def env(self) -> dict[str, str]:
        """The commands' environment: this checkout's nre_ray, a local Ray each (no RAY_ADDRESS, NRE_RAY_OWN_RAY=1: the
        drill's faults strike runs as separate as separate machines would keep them), its own State API
        address (nre_ray pins one per run), the working folder's temporary folder for everything but Ray's session
        folders, unbuffered output."""
        out = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "RAY_API_SERVER_ADDRESS")}
        out.setdefault("RAY_TMPDIR", tempfile.gettempdir())  # Ray's sessions where they would be (short socket paths)
        path = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p)
        out.update(TMPDIR=str(self.tmp), PYTHONUNBUFFERED="1", PYTHONPATH=path, NRE_RAY_OWN_RAY="1")
        return out

    def command(self, run: Run, resume: bool) -> list[str]:
        """The run's command line (relative paths: it runs in the working folder)."""
        cmd = [sys.executable, "-m", "nre_ray.train", "--data-dir", "data", "--model", run.model,
               "--epochs", str(self.args.epochs), "--patience", "0", "--num-workers", str(self.args.workers),
               "--max-failures", str(self.args.max_failures), "--run-name", run.name, "--cache-dir", "cache"]
        return [*cmd, "--resume"] if resume else cmd

    # the loop

    def now(self) -> float:
        """Seconds since the drill started."""
        return time.monotonic() - self.began

    def go(self) -> None:
        """Start every run, strike the faults, continue the runs they stopped, until every run is done."""
        deadline = time.monotonic() + self.args.timeout
        for run in self.runs:
            self.start(run, resume=False)
        while not all(run.done for run in self.runs):
            if time.monotonic() > deadline:
                self.problems.append(f"the drill ran past --timeout {self.args.timeout:g} s; its processes were "
                                     "stopped")
                for run in self.runs:
                    if run.proc is not None and run.proc.poll() is None:
                        send(run.driver, signal.SIGKILL)
                        run.proc.wait()
                    run.done, run.problem = True, run.problem or "stopped at the drill's --timeout"
                break
            self.watch()
            for run in self.runs:
                if not run.done:
                    self.step(run)
            time.sleep(0.2)
        self.watch()

    def start(self, run: Run, resume: bool) -> None:
        number = len(run.attempts) + 1
        log = self.logs / f"{run.name}.{number}.log"
        with open(log, "wb") as out:
            run.proc = subprocess.Popen(self.command(run, resume), cwd=self.work, env=self.env(), stdout=out,
                                        stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        run.driver = identity(run.proc.pid) or Proc(run.proc.pid, -1)
        self.seen[run.driver] = run.name
        run.attempts.append(Attempt(number, resume, str(log.relative_to(self.work))))
        run.seen, run.offset, run.restarts = {}, 0, 0

    def watch(self) -> None:
        """Note every process below the drill (with its run: a driver's, or its nearest noted ancestor's) and reap
        the orphans that ended below it (the drivers are reaped by their Popen)."""
        table = process_table()
        me = os.getpid()
        drivers = {run.proc.pid for run in self.runs if run.proc is not None}
        for pid in descendants(me, table):
            ppid, start, state = table[pid]
            if state in ("Z", "X"):
                if ppid == me and pid not in drivers:
                    try:
                        os.waitpid(pid, os.WNOHANG)
                    except ChildProcessError:
                        pass
                continue
            proc = Proc(pid, start)
            if proc not in self.seen:
                parent = table.get(ppid)
                owner = self.seen.get(Proc(ppid, parent[1])) if parent else None
                self.seen[proc] = owner or "?"

    def read_output(self, run: Run) -> None:
        """Note the phases the running command has reached (from its output)."""
        with open(self.work / run.attempts[-1].log, "rb") as fh:
            fh.seek(run.offset)
            chunk = fh.read()
        end = chunk.rfind(b"\n") + 1
        run.offset += end
        for line in chunk[:end].decode(errors="replace").splitlines():
            phase = PHASE_LINE.match(line)
            name = phase[1] if phase else "epoch" if EPOCH_LINE.match(line) else \
                "summary" if line.startswith(f"run {run.name} (MLflow run ") else None
            if name is not None:
                run.seen.setdefault(name, time.monotonic())
            run.restarts += bool(RESTART.search(line))
            if run.run_id is None and (found := RUN_ID.search(line)):
                run.run_id = found[1]

    def step(self, run: Run) -> None:
        """Strike the run's next fault when its moment has come; deal with the command's end."""
        self.read_output(run)
        if run.proc.poll() is not None:
            self.read_output(run)
            self.ended(run)
            return
        fault = run.pending()
        if fault is None or fault.moment not in run.seen or time.monotonic() < run.seen[fault.moment] + fault.delay_s:
            return
        if any(f.target == "driver" for f in self.faults if f.number in run.attempts[-1].faults):
            return  # one fault to a driver per command (its end is checked against it): the next strikes the resume
        if fault.target == "driver":
            target = run.driver
        else:
            workers = [p for p, owner in self.seen.items() if owner == run.name and alive(p)
                       and cmdline(p.pid).startswith("ray::RayTrainWorker")]
            if not workers:  # between two worker groups: strike at the next one
                return
            target = self.rng.choice(sorted(workers, key=lambda p: p.pid))
        sig = getattr(signal, fault.signal)
        ignored = ignores(target.pid, sig)
        if send(target, sig):
            attempt = run.attempts[-1]
            fault.attempt, fault.at_s, fault.pid = attempt.number, round(self.now(), 1), target.pid
            fault.result, fault.ignored, fault.restarts_before = "struck", ignored, run.restarts
            fault.late = "summary" in run.seen
            attempt.faults.append(fault.number)

    def ended(self, run: Run) -> None:
        """The command ended: note how, check it against what docs/faults.md says, and continue the run if a fault
        stopped it."""
        attempt = run.attempts[-1]
        attempt.exit = run.proc.returncode
        run.proc = None
        text = (self.work / attempt.log).read_text(encoding="utf-8", errors="replace")
        struck = [f for f in self.faults if f.number in attempt.faults]
        driver = next((f for f in struck if f.target == "driver"), None)
        workers = [f for f in struck if f.target == "worker"]
        if run.run_id is not None:
            attempt.status_after = self.status(run.run_id)
        restarted = 0  # the restarts seen, given to the worker faults in the order they struck
        for fault in workers:
            if run.restarts > max(fault.restarts_before, restarted):
                restarted = max(fault.restarts_before, restarted) + 1
                fault.result = "the run restarted its worker group from the latest checkpoint"
            elif fault.ignored:
                fault.result = "none: the worker process ignores " + fault.signal
            elif fault.signal == "SIGINT" or attempt.exit == 0:
                fault.result = "none: the worker went on"
            else:
                fault.result = f"no restart; the command exited {attempt.exit}"
        if driver is not None:
            self.check_driver_fault(run, attempt, driver)
        if attempt.exit == 0:
            run.done = True
            return
        if attempt.resume and "has already finished" in text:
            attempt.note = "the run had finished before the fault: nothing to resume"
            run.done = True
            return
        if attempt.resume and "no MLflow run named" in text:
            attempt.note = "stopped before MLflow had the run: started again without --resume"
            self.start(run, resume=False)
            return
        if driver is None and len([f for f in workers if not f.ignored]) <= self.args.max_failures:
            error = next((line for line in reversed(text.splitlines()) if line.startswith("error:")), "")
            run.problem = f"command {attempt.number} exited {attempt.exit} without a fault that explains it: " \
                          f"{error or 'see ' + attempt.log}"
            run.done = True
            return
        if len(run.attempts) > 2 * len(run.faults) + 2:
            run.problem = "still not finished after a resume for every fault"
            run.done = True
            return
        self.start(run, resume=True)

    def check_driver_fault(self, run: Run, attempt: Attempt, fault: Fault) -> None:
        """A command whose driver got a fault must have ended as docs/faults.md says: a SIGINT (Ctrl-C) stops it with
        exit 130 and the MLflow run KILLED (FINISHED if it had closed the run; exit 0 too if the summary was printed
        already); a SIGKILL leaves the run RUNNING for --resume (FINISHED if it had closed it). A fault before the
        command reached its MLflow run leaves the run as the command before it had (a resume's early fault: the run
        the last fault stopped, KILLED or RUNNING)."""
        before = {run.attempts[-2].status_after} if len(run.attempts) > 1 else set()
        if fault.signal == "SIGINT":
            allowed = [(130, {"KILLED", "FINISHED", None} | before)] + ([(0, {"FINISHED"})] if fault.late else [])
        else:
            allowed = [(-signal.SIGKILL, {"RUNNING", "FINISHED", None} | before)]
        fault.result = f"exit {attempt.exit}, MLflow {attempt.status_after or 'no run yet'}"
        if not any(attempt.exit == code and attempt.status_after in statuses for code, statuses in allowed):
            expected = " or ".join(f"exit {code} with {'/'.join(sorted(s or 'no run' for s in statuses))}"
                                   for code, statuses in allowed)
            self.problems.append(f"{run.name} command {attempt.number}: after a {fault.signal} to the driver "
                                 f"({fault.moment} +{fault.delay_s:g} s) it exited {attempt.exit} with the MLflow "
                                 f"run {attempt.status_after or 'not created'} (expected {expected})")

    def status(self, run_id: str) -> str | None:
        """The MLflow run's status (None when the store cannot tell). Read up to 5 times, 2 s apart: the other runs
        write to the same sqlite store, and a read under a load of 30 once failed (MlflowException) where the next
        would not have."""
        from nre_ray.tracking.store import run_status

        for attempt in range(5):
            try:
                return run_status(self.tracking_uri, run_id)
            except Exception as err:  # the store itself is checked at the end
                if attempt == 4:
                    return f"unreadable ({type(err).__name__}: {str(err)[:200]})"
                time.sleep(2)
        return None

    # the checks

    def left_processes(self) -> list[str]:
        """Processes the drill started (and their descendants) still running ``grace`` s after the last command
        ended; stopped now (SIGTERM, then SIGKILL, by identity), so that the drill leaves none either."""
        deadline = time.monotonic() + self.args.grace
        while time.monotonic() < deadline:
            self.watch()
            if not any(alive(p) for p in self.seen):
                return []
            time.sleep(0.5)
        left = [p for p in self.seen if alive(p)]
        names = [f"{self.seen[p]}: pid {p.pid} {cmdline(p.pid)[:80]}" for p in left]
        for sig in (signal.SIGTERM, signal.SIGKILL):
            for proc in left:
                send(proc, sig)
            time.sleep(3)
        self.watch()
        return names

    def left_temporaries(self) -> list[list[str]]:
        """Temporary files and folders left, by their paths in the working folder: nre_ray's (anything in the runs'
        TMPDIR, temporaries' names anywhere), and the top folders of Ray's and torch's (:data:`NOT_NRE_RAYS`), which
        are not counted."""
        ours, theirs = [], []
        for path in self.tmp.rglob("*"):
            inside = str(path.relative_to(self.tmp))
            if not NOT_NRE_RAYS.match(inside):
                ours.append(path)
            elif "/" not in inside and not inside.startswith("nre_ray-"):
                theirs.append(path)
        ours += [p for p in self.work.rglob("*") if TEMP_NAME.search(p.name) and self.tmp not in p.parents]
        return [sorted(str(p.relative_to(self.work)) for p in found) for found in (ours, theirs)]

    def check(self) -> dict[str, Any]:
        """Every check, with the state of each run in MLflow."""
        checks: list[dict[str, Any]] = []

        def add(name: str, problems: list[str]) -> None:
            checks.append({"check": name, "ok": not problems, "problems": problems})

        runs, store_problem = self.mlflow_runs()
        add("the MLflow store opens", [store_problem] if store_problem else [])
        add("each run is one MLflow run", [f"{r.name}: {len(runs.get(r.name, []))} MLflow runs" for r in self.runs
                                           if len(runs.get(r.name, [])) != 1] if not store_problem else [])
        final = {r.name: runs[r.name][0] for r in self.runs if len(runs.get(r.name, [])) == 1}
        add("every run is FINISHED, FAILED or KILLED, none left RUNNING",
            [f"{name}: {info['status']}" for name, info in final.items()
             if info["status"] not in ("FINISHED", "FAILED", "KILLED")])
        add("every run finished (after its resumes)",
            [f"{r.name}: {final[r.name]['status'] if r.name in final else 'no MLflow run'}"
             + (f"; {r.problem}" if r.problem else "") for r in self.runs
             if r.name not in final or final[r.name]["status"] != "FINISHED"])
        add("every finished run has each epoch's metrics once, its test scores and its model",
            [f"{name}: {', '.join(info['lost'])}" for name, info in final.items()
             if info["status"] == "FINISHED" and info["lost"]])
        add("each command ended as documented", list(self.problems))
        left, others = self.left_temporaries()
        add("no temporary file or folder is left", left)
        if others:
            checks[-1]["not counted"] = others
        add("no process is left", self.left_processes())
        for run in self.runs:
            info = final.get(run.name, {})
            run_lost = info.get("lost", []) if info else ["no MLflow run" if not store_problem else "store unreadable"]
            if run.problem:
                run_lost = [*run_lost, run.problem]
            run.lost, run.final = run_lost, info.get("status")
        return {"checks": checks, "ok": all(c["ok"] for c in checks)}

    def mlflow_runs(self) -> tuple[dict[str, list[dict[str, Any]]], str]:
        """The drill's runs in the store (name -> MLflow runs, each with its status and what it lacks), and why the
        store could not be read ('' when it could)."""
        if not (self.work / "mlflow.db").exists():
            return {}, f"no store at {self.work / 'mlflow.db'}"
        try:
            from mlflow.tracking import MlflowClient

            from nre_ray.tracking.store import metric_history, run_metrics

            client = MlflowClient(self.tracking_uri)
            experiment = client.get_experiment_by_name(EXPERIMENT)
            if experiment is None:
                return {}, f"no experiment {EXPERIMENT!r} in the store"
            models: dict[str, list[str]] = {}
            for model in client.search_logged_models([experiment.experiment_id]):
                models.setdefault(model.source_run_id, []).append(str(model.status))
            found: dict[str, list[dict[str, Any]]] = {}
            for mlrun in client.search_runs([experiment.experiment_id]):
                run_id, name = mlrun.info.run_id, mlrun.data.tags.get("nre_ray.run_name", "?")
                epochs = [step for step, _ in metric_history(self.tracking_uri, run_id, "train_loss")]
                lost = []
                missing = sorted(set(range(1, self.args.epochs + 1)) - set(epochs))
                twice = sorted({e for e in epochs if epochs.count(e) > 1})
                if missing:
                    lost.append(f"no metrics of epoch {', '.join(map(str, missing))}")
                if twice:
                    lost.append(f"epoch {', '.join(map(str, twice))} logged more than once")
                if "test_macro_f1" not in run_metrics(self.tracking_uri, run_id):
                    lost.append("no test scores")
                statuses = models.get(run_id, [])
                if not any(s.endswith("READY") for s in statuses):
                    lost.append("no model")
                elif len(statuses) > 1:
                    lost.append(f"{len(statuses)} models ({', '.join(statuses)})")
                found.setdefault(name, []).append({"run_id": run_id, "status": mlrun.info.status, "lost": lost,
                                                   "epochs_logged": epochs, "models": statuses})
            return found, ""
        except Exception as err:
            return {}, f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"


# --- the report -----------------------------------------------------------------------------------------------------


def table(headers: list[str], rows: list[list[Any]]) -> str:
    """A markdown table."""
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    return "\n".join(lines + ["| " + " | ".join(str(v) for v in row) + " |" for row in rows])


def report(drill: Drill, result: dict[str, Any], seconds: float) -> str:
    """The tables a person reads: the faults, the runs, the checks, and one line of what was lost."""
    struck = [f for f in drill.faults if f.at_s is not None]
    faults = table(["#", "run", "command", "signal", "to", "moment", "at (s)", "what followed"],
                   [[f.number, f.run, f.attempt or "", f.signal, f.target, f"{f.moment} +{f.delay_s:g} s",
                     f.at_s if f.at_s is not None else "", f.result] for f in drill.faults])
    runs = table(["run", "model", "commands (exit: MLflow status after)", "MLflow status", "lost"],
                 [[r.name, r.model, "; ".join(f"{'resume' if a.resume else 'start'} {a.exit}: {a.status_after or '-'}"
                                              for a in r.attempts), r.final or "-", ", ".join(r.lost) or "nothing"]
                  for r in drill.runs])
    checks = table(["check", "result"], [[c["check"], ("ok" if c["ok"] else "FAILED: " + "; ".join(c["problems"]))
                                          + (f" (not counted, Ray's and torch's: {', '.join(c['not counted'])})"
                                             if c.get("not counted") else "")] for c in result["checks"]])
    kinds = ", ".join(f"{sum(1 for f in struck if f.signal == s)} {s}" for s in ("SIGKILL", "SIGINT"))
    lost = [f"{r.name}: {', '.join(r.lost)}" for r in drill.runs if r.lost]
    return (f"faults struck: {len(struck)} of {len(drill.faults)} ({kinds}; {sum(f.target == 'driver' for f in struck)}"
            f" to drivers, {sum(f.target == 'worker' for f in struck)} to workers); runs: {len(drill.runs)}, "
            f"{drill.args.epochs} epochs each; {seconds:.0f} s\n\n{faults}\n\n{runs}\n\n{checks}\n\n"
            f"lost: {'; '.join(lost) if lost else 'nothing'}")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog="example: python scripts/fault_drill.py --runs 3 --faults 4 --epochs 2 "
                                            "--seed 1")
    parser.add_argument("--runs", type=int, default=3, help="runs at once (default: 3)")
    parser.add_argument("--faults", type=int, default=4, help="faults to strike, over all runs (default: 4)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the faults' kinds, runs and moments (default: 0)")
    parser.add_argument("--epochs", type=int, default=2, help="epochs per run (default: 2)")
    parser.add_argument("--model", default="cnn", help="encoder, or a comma-separated list given to the runs in turn "
                        "(default: cnn)")
    parser.add_argument("--workers", type=int, default=1, help="Ray Train workers per run (default: 1)")
    parser.add_argument("--max-failures", type=int, default=1, help="the runs' --max-failures (default: 1)")
    parser.add_argument("--rows", type=int, default=300, help="training rows cut from the bundled sample; valid "
                        "and test get a fifth as many (default: 300)")
    parser.add_argument("--work-dir", type=Path, default=None, help="the working folder, new or empty (default: a "
                        "new temporary folder, removed at the end when every check passed)")
    parser.add_argument("--keep", action="store_true", help="keep the working folder (logs, store, checkpoints)")
    parser.add_argument("--grace", type=float, default=30.0, help="seconds the processes get to end after the last "
                        "command (default: 30)")
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds for the whole drill (default: 900)")
    parser.add_argument("--json", type=Path, default=None, help="write the faults, runs and checks to this file")
    args = parser.parse_args(argv)
    for name in ("runs", "epochs", "workers", "rows"):
        if getattr(args, name) < 1:
            parser.exit(2, f"error: --{name} must be at least 1\n")
    if args.faults < 0 or args.max_failures < 0:
        parser.exit(2, "error: --faults and --max-failures must be 0 or more\n")
    if not sys.platform.startswith("linux"):
        parser.exit(2, "error: the drill finds processes through /proc: it runs on Linux only\n")
    if args.work_dir is not None and args.work_dir.exists() and any(args.work_dir.iterdir()):
        parser.exit(2, f"error: --work-dir {args.work_dir} is not empty; give a new or empty folder\n")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    sys.path.insert(0, str(REPO))  # the checks read the store with this checkout's nre_ray, as the runs use it
    work = (args.work_dir or Path(tempfile.mkdtemp(prefix="nre_ray_drill_"))).absolute()
    work.mkdir(parents=True, exist_ok=True)
    become_subreaper()
    drill = Drill(args, work)
    drill.prepare()
    print(f"fault drill: {args.runs} runs at once in {work}, {args.faults} faults (seed {args.seed})", flush=True)
    try:
        drill.go()
    except KeyboardInterrupt:
        drill.problems.append("the drill was interrupted")
        for run in drill.runs:
            run.done, run.problem = True, run.problem or "the drill was interrupted"
    result = drill.check()
    seconds = drill.now()
    print(report(drill, result, seconds))
    if args.json:
        args.json.write_text(json.dumps({
            "ok": result["ok"], "seconds": round(seconds, 1), "work_dir": str(work), "seed": args.seed,
            "faults": [asdict(f) for f in drill.faults], "checks": result["checks"],
            "runs": [{"run": r.name, "model": r.model, "status": r.final, "lost": r.lost, "run_id": r.run_id,
                      "commands": [asdict(a) for a in r.attempts]} for r in drill.runs]}, indent=2), encoding="utf-8")
    if result["ok"] and not args.keep and args.work_dir is None:
        shutil.rmtree(work, ignore_errors=True)
    else:
        print(f"logs, store and checkpoints kept in {work}")
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())

"""A hyperparameter sweep (``python -m nre_ray.tune``), each trial a TorchTrainer run, ASHA stopping the weak ones.

The sweep takes the data, model and train options of ``python -m nre_ray.train`` as fixed values and searches the
space of ``--search-space`` (see :mod:`nre_ray.tune.space`; a default space per ``--model`` without it). In order:

1. the space is read and checked, and the resources planned (each trial's workers and how many trials fit at once,
   said up front), before anything runs;
2. the data is preprocessed once, on this driver (cached like a training run's); every trial reads the same cache;
3. an MLflow parent run records the sweep; each trial (:mod:`nre_ray.tune.trial`) logs into a child run;
4. Ray Tune runs the trials, ASHA (or Optuna's TPE sampler where installed, with ASHA) on the validation metric;
5. the best trial (by its best validation score) has its best checkpoint scored on the test split once
   (:mod:`nre_ray.inference.evaluation`); that checkpoint is the sweep's MLflow model (registered with
   ``--register-model``), and the parent run gets the table of all trials and a parallel-coordinates plot.

``--resume`` continues an interrupted sweep (Ctrl-C, a lost node): Tune restores its experiment, finished trials
are kept, unfinished ones restart from their latest Train checkpoint, all in the same MLflow runs.
"""

from __future__ import annotations

import json
import logging
import tempfile
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nre_ray import storage as fs
from nre_ray.cluster.session import (
    NodeType,
    Resources,
    UsageError,
    check_shared_paths,
    cluster,
    local_cluster,
    node_groups,
    placement_timeout,
    plan_resources,
    ray_phase,
    start_ray,
)
from nre_ray.config import Config, option
from nre_ray.core import console
from nre_ray.core.redact import redact
from nre_ray.run.runner import claim_run, default_run_name, prepare_data, resolve_target, trainer_data
from nre_ray.tracking import store as tracking
from nre_ray.tune.space import describe, load_space, to_tune

log = logging.getLogger("nre_ray")

#: CPUs each trial's driver (the Tune actor that runs the TorchTrainer and waits on it) holds; the planning leaves
#: them free so that the trials' workers can always be placed.
DRIVER_CPU = 0.01
SEARCHERS = ("auto", "random", "optuna")


@dataclass
class SweepOptions:
    """The sweep's own options (the rest is the training Config): the "sweep options" of ``python -m nre_ray.tune``,
    one flag each."""

    search_space: str | None = option(
        None, "TOML file (a local path or a URI): [model]/[train] tables with one distribution per option, e.g. "
              "lr = { loguniform = [1e-4, 1e-2] }, batch_size = { choice = [32, 64] }, "
              "dropout = { uniform = [0.1, 0.5] }, hidden_size = { int = [128, 320] }. "
              "Default: a space for the chosen --model (docs/tune.md lists them).", metavar="SPACE.toml")
    num_samples: int = option(8, "Trials to run (default: 8).")
    max_concurrent_trials: int | None = option(
        None, "Trials at once; default: as many as the cluster holds with one CPU (or GPU) per worker. More than that "
              "shares the CPUs (fractions, at least half a CPU per worker unless --cpus-per-worker says otherwise; "
              "fewer trials when they do not fit), fewer leaves room.")
    grace_period: int = option(1, "ASHA: epochs every trial trains before it can be stopped (default: 1).")
    reduction_factor: int = option(2, "ASHA: at each rung only the best 1/N of the trials go on (default: 2).")
    searcher: str = option("auto", "How values are drawn: 'random', or 'optuna' (TPE; needs `pip install optuna`); "
                                   "'auto' (default) uses optuna where installed, else random.", choices=SEARCHERS)
    search_seed: int | None = option(None, "Seed of the searcher's draws (default: --seed).")


@dataclass
class TrialPlan:
    """Each trial's workers (``per_worker`` resources, torch ``threads``) and how many trials run at once."""

    per_worker: dict[str, float]
    threads: int
    at_once: int
    waits: bool = False
    requested: int | None = None
    placement_timeout: float | None = None  # how long each trial's worker group may wait to be placed

    def describe(self, num_workers: int) -> str:
        each = ", ".join(f"{k} {v:g}" for k, v in self.per_worker.items())
        fewer = (f" (--max-concurrent-trials {self.requested} does not fit)" if self.requested
                 and self.requested > self.at_once else "")
        return (f"{self.at_once} trial(s) at once{fewer}, each {num_workers} worker(s) x {{{each}}} and a trial "
                f"driver of {DRIVER_CPU:g} CPU")


def plan_trials(num_workers: int, use_gpu: bool, nodes: list[dict[str, float]], cpus_per_worker: float | None,
                node_types: list[NodeType] | None, requested: int | None, most: int | None = None) -> TrialPlan:
    """Size the trials' workers like a training run's (:func:`nre_ray.cluster.session.plan_resources`), for as many
    trials at once as ``requested`` (``--max-concurrent-trials``), or by default as many as the cluster holds with one
    CPU (or one GPU) per worker, at most ``most`` (``--num-samples``); fewer when they do not fit. Counted by
    arithmetic, whatever the number of nodes the autoscaler may add. UsageError when not even one trial fits."""
    node_types = node_types or []
    if requested is None:
        key = "GPU" if use_gpu else "CPU"
        total = sum(n.get(key, 0) * count for n, count in node_groups(nodes, node_types))
        if use_gpu:
            requested = max(1, int(total) // num_workers)
        else:
            requested = max(1, int(total // ((cpus_per_worker or 1.0) * num_workers)))
        requested = min(requested, most) if most else requested
        asked = None
    else:
        asked = requested

    def plan(at_once: int) -> Resources:
        room = [{**n, "CPU": max(n.get("CPU", 0.0) - DRIVER_CPU * at_once, 0.0)} for n in nodes]
        return plan_resources(num_workers * at_once, use_gpu, room, cpus_per_worker, node_types)

    try:
        best = plan(1)
    except UsageError as err:
        raise UsageError(f"not even one trial fits beside its driver's {DRIVER_CPU:g} CPU: {err}") from None
    # More trials at once never fit where fewer do not: the most that fit, found by halving the range.
    fits, too_many = 1, requested + 1
    while too_many - fits > 1:
        middle = (fits + too_many) // 2
        try:
            best, fits = plan(middle), middle
        except UsageError:
            too_many = middle
    return TrialPlan(best.per_worker, best.threads, fits, best.waits, asked)


def resolve_searcher(name: str) -> str:
    """``random`` or ``optuna``; UsageError for optuna when it is not installed."""
    try:
        import optuna  # noqa: F401
    except ImportError:
        if name == "optuna":
            raise UsageError("--searcher optuna needs the optuna package: pip install optuna (or use --searcher "
                             "random)") from None
        return "random"
    return "optuna" if name in ("auto", "optuna") else "random"


def _trial_dirname(trial: Any) -> str:
    return trial.trial_id


def run(cfg: Config, opts: SweepOptions) -> dict[str, Any]:
    """Run (or with ``--resume`` continue) the sweep, each step a console phase as in a training run; returns the
    summary. A sweep of the same ``--run-name`` running meanwhile on this machine is refused."""
    with claim_run(cfg, "sweep"):
        return _run(cfg, opts)


def _run(cfg: Config, opts: SweepOptions) -> dict[str, Any]:
    """:func:`run`, its name held."""
    out = console.get()
    with out.phase("setup", "checking the search space, the settings and the sweep's storage") as step:
        # deferred: importing it loads torch, pandas, numpy
        from nre_ray.tasks.lookup import task_for

        task = task_for(cfg.data.data_dir, bags=cfg.model.bag_aggregator is not None)
        refused = task.unsupported("tune")  # a task whose data tune does not take
        if refused:
            raise UsageError(refused)
        # refused before anything starts; without --search-space the task's own space, else --model's
        space = load_space(opts.search_space, cfg, task.search_space(cfg.model.model), task.unit)
        searcher = resolve_searcher(opts.searcher)
        check_scale(cfg, opts)  # workers the local Ray can never hold: before Ray starts
        from ray import tune  # (seconds: after the first line)

        # deferred: importing it loads ray, pandas, pyarrow, numpy
        from nre_ray.tune.report import ProgressPrinter
        from nre_ray.tune.results import close_children, close_running, collect, finish, interrupted

        # deferred: importing it loads ray, pandas, pyarrow, numpy
        from nre_ray.tune.trial import trial_trainable

        cfg.run.run_name = cfg.run.run_name or default_run_name(f"tune-{cfg.model.model}")
        # storage, tracking URI, the task's checks of the settings and its selection metric unless given; with
        # --resume the parent MLflow run
        target = resolve_target(cfg)
        path = fs.join(target.storage, target.run_name)
        can_restore = tune.Tuner.can_restore(path)
        if cfg.run.resume and not can_restore:
            raise UsageError(f"--resume: {path} holds no sweep to continue (no Tune experiment state). Give the "
                             "--run-name and --storage-path the sweep was started with.")
        if not cfg.run.resume and (can_restore or (not fs.is_uri(path) and Path(path).exists())):
            raise UsageError(f"sweep {target.run_name!r} already exists in {path}; nothing was overwritten. Continue "
                             "it with --resume, or choose another --run-name.")
        step.done(f"sweep {target.run_name!r}; trials in {path}")
    metric = f"valid_{cfg.select_metric}"
    with out.phase("ray", ray_phase(cfg.run.address)) as step:
        plan = connect(cfg, target, opts.max_concurrent_trials, opts.num_samples, step)
    out.line(f"sweep {target.run_name}: {opts.num_samples} trial(s) of up to {cfg.train.epochs} epoch(s), "
             f"{plan.describe(cfg.train.num_workers)}; ASHA on {metric} (grace {opts.grace_period} epoch(s), "
             f"reduction {opts.reduction_factor}); {searcher} search over")
    out.line(describe(space), stamp=False)
    with out.phase("preprocess", "reading, checking and encoding the data (Ray Data)") as step:
        prepared = prepare_data(cfg, target, step)  # once for the whole sweep: every trial reads this cache
    with out.phase("mlflow", f"creating the sweep's run in {redact(target.tracking_uri)}") as step:
        parent = open_parent(cfg, opts, target, prepared, space, searcher, metric)
        step.done(f"run {parent} in experiment {cfg.run.experiment_name!r}")

    sweep = {"config": cfg.to_dict(), "data": trainer_data(prepared, ("train", "valid")),
             "trials_storage": fs.join(path, "trials"), "tracking_uri": target.tracking_uri,
             "experiment": cfg.run.experiment_name, "parent_run_id": parent, "sweep_name": target.run_name,
             "task": target.task,
             "per_worker": plan.per_worker, "threads": plan.threads,
             "placement_timeout": plan.placement_timeout}
    trainable = tune.with_resources(trial_trainable(sweep), {"CPU": DRIVER_CPU})
    keys = [d.key for d in space]
    printer = ProgressPrinter(metric, cfg.train.epochs, keys)
    run_config = tune.RunConfig(
        name=target.run_name, storage_path=target.storage, verbose=0,  # the console shows the printer's lines
        callbacks=[printer],
        # a trial whose driver died (a lost node) starts again; its Train run continues from its checkpoint
        failure_config=tune.FailureConfig(max_failures=max(cfg.train.max_failures, 1)))
    status = "KILLED"
    waits = "; the alive nodes cannot hold them all yet: the autoscaler adds nodes" if plan.waits else ""
    try:
        with out.phase("training", f"{opts.num_samples} trial(s), {plan.at_once} at once{waits}") as step:
            if cfg.run.resume:
                tuner = tune.Tuner.restore(path, trainable=trainable, resume_unfinished=True, resume_errored=True)
            else:
                tuner = tune.Tuner(trainable, param_space=to_tune(space), run_config=run_config,
                                   tune_config=tune_config(cfg, opts, searcher, metric, plan.at_once))
            grid = tuner.fit()
            trials = collect(grid, target.tracking_uri, parent, keys, metric, cfg.train.epochs)
            cut = interrupted(trials, opts.num_samples, printer.ended)
            if cut is not None:
                close_children(target.tracking_uri, trials, cut)
                raise KeyboardInterrupt
            close_children(target.tracking_uri, trials)
            outcomes = Counter(t["outcome"] for t in trials)
            step.done(f"{len(trials)} trial(s): " + ", ".join(f"{n} {how}" for how, n in outcomes.items()))
        summary = finish(cfg, target, prepared, grid, trials, space, parent, metric, path)
        status = "FINISHED"
        return summary
    except KeyboardInterrupt:  # a second Ctrl-C ends Tune at once: no trial closed its child run
        close_running(target.tracking_uri, parent)
        raise
    except Exception:
        status = "FAILED"
        raise
    finally:
        tracking.end_run(target.tracking_uri, parent, status)


def check_scale(cfg: Config, opts: SweepOptions) -> None:
    """Before Ray starts: UsageError when not even one trial fits on the local Ray this command would start, by the
    planning of :func:`connect` over :func:`nre_ray.cluster.session.local_cluster`. Joining a cluster,
    :func:`connect` refuses it once joined."""
    ahead = local_cluster(cfg.run.address, cfg.train.use_gpu)
    if ahead is not None:
        plan_trials(cfg.train.num_workers, cfg.train.use_gpu, ahead.nodes, cfg.train.cpus_per_worker,
                    ahead.node_types, opts.max_concurrent_trials, opts.num_samples)


def connect(cfg: Config, target: Any, requested: int | None, num_samples: int, step: console.Phase) -> TrialPlan:
    """Start or join Ray (workers' output stays in Ray's logs: the sweep prints one line per trial epoch), plan the
    trials (``requested``: ``--max-concurrent-trials``; at most ``num_samples`` by default) and their placement
    timeout, check the storage and tracking reach every node. ``step``: the console phase that says so."""
    start_ray(cfg.run.address, log_to_driver=False)
    info = cluster()
    plan = plan_trials(cfg.train.num_workers, cfg.train.use_gpu, info.nodes, cfg.train.cpus_per_worker,
                       info.node_types, requested, num_samples)
    plan.placement_timeout = placement_timeout(cfg.train.placement_timeout, info)
    for warning in check_shared_paths(info, target.storage, target.tracking_uri, cfg.run.allow_local_storage):
        step.note(f"warning: {warning}")
    step.done(info.describe())
    return plan


def tune_config(cfg: Config, opts: SweepOptions, searcher: str, metric: str, at_once: int) -> Any:
    """Tune's TuneConfig: ASHA on ``metric`` by epoch, the searcher, the number of trials and how many at once."""
    from ray import tune
    from ray.tune.schedulers import ASHAScheduler

    seed = cfg.train.seed if opts.search_seed is None else opts.search_seed
    if searcher == "optuna":
        from ray.tune.search.optuna import OptunaSearch

        search_alg = OptunaSearch(seed=seed)
    else:
        from ray.tune.search import BasicVariantGenerator

        search_alg = BasicVariantGenerator(max_concurrent=at_once, random_state=seed)
    # time_attr "epoch" (the loop's own count), not Tune's training_iteration: a trial resumed from its checkpoint
    # reports from its next epoch on, while Tune's count starts again.
    scheduler = ASHAScheduler(time_attr="epoch", max_t=cfg.train.epochs, grace_period=opts.grace_period,
                              reduction_factor=opts.reduction_factor)
    return tune.TuneConfig(metric=metric, mode="max", scheduler=scheduler, search_alg=search_alg,
                           num_samples=opts.num_samples, max_concurrent_trials=at_once,
                           trial_dirname_creator=_trial_dirname)


def open_parent(cfg: Config, opts: SweepOptions, target: Any, prepared: Any, space: list, searcher: str,
                metric: str) -> str:
    """The sweep's MLflow parent run (reopened with ``--resume``): the fixed settings, the sweep options, the search
    space (param and ``search_space.json``), the data's sources and audit. Returns its run id."""
    # deferred: importing it loads pandas, pyarrow, numpy
    from nre_ray.data.audit import write_audit

    # deferred: importing it loads torch, pandas, numpy
    from nre_ray.tasks.lookup import task_named

    space_json = json.dumps([d.as_json() for d in space])
    if target.resumed is not None:
        run_id = target.resumed.info.run_id
        started = target.resumed.data.params.get("tune.search_space")
        if started is not None and started != space_json[:6000]:
            raise UsageError(f"--resume: the search space differs from the one sweep {target.run_name!r} started "
                             f"with ({started}); resume with the same --search-space (or none if it had none).")
        tracking.reopen_run(target.tracking_uri, run_id)
        tracker = tracking.MlflowTracker(target.tracking_uri, run_id)
        resumes = int(target.resumed.data.tags.get("nre_ray.resumes", 0)) + 1
        tracker.set_tags({"nre_ray.resumes": str(resumes)})
        console.get().line(f"resuming sweep {target.run_name!r} (MLflow run {run_id}): finished trials are kept, "
                           "unfinished ones continue from their checkpoints")
        return run_id
    tags = {"nre_ray.run_name": target.run_name, "nre_ray.kind": "sweep", "storage_path": target.storage,
            "workers": str(cfg.train.num_workers), "device": "gpu" if cfg.train.use_gpu else "cpu"}
    with tracking.store_errors(target.tracking_uri):  # the sweep's first MLflow call
        run_id = tracking.start_run(target.tracking_uri, cfg.run.experiment_name, target.run_name, tags)
    tracker = tracking.MlflowTracker(target.tracking_uri, run_id)
    tracker.log_params({**cfg.flat(), "tune.search_space": space_json, "tune.num_samples": opts.num_samples,
                        "tune.searcher": searcher, "tune.metric": metric, "tune.grace_period": opts.grace_period,
                        "tune.reduction_factor": opts.reduction_factor,
                        "tune.max_concurrent_trials": opts.max_concurrent_trials or "auto",
                        **{f"data.source.{k}": v for k, v in prepared.sources.items()}})
    with tempfile.TemporaryDirectory() as folder:
        (Path(folder) / "search_space.json").write_text(json.dumps([d.as_json() for d in space], indent=2),
                                                        encoding="utf-8")
        tracker.log_artifact(Path(folder) / "search_space.json")
        if opts.search_space:
            tracker.log_artifact(Path(opts.search_space))
        for audit in write_audit(prepared.audit, Path(folder), task_named(target.task).audit_markdown(prepared.audit)):
            tracker.log_artifact(audit, "data")
    return run_id

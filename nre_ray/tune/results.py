"""The end of a sweep: what each trial did, closing its MLflow child run, and the best trial's test score and model.

:func:`collect` reads Tune's results and the trials' curves in MLflow; :func:`close_children` closes the child runs
a stopped trial could not close itself; :func:`interrupted` tells a Ctrl-C from the end; :func:`finish` logs the
trials table and plot to the parent run and scores the best trial's checkpoint on test once
(:mod:`nre_ray.inference.evaluation`, on the encoded test split of the sweep's preprocessing), logging it as the sweep's
model.
"""

from __future__ import annotations

import math
import tempfile
from pathlib import Path
from typing import Any

from nre_ray import storage as fs
from nre_ray.cluster.ray_private import trial_statuses
from nre_ray.cluster.session import UsageError
from nre_ray.config import Config
from nre_ray.core import console
from nre_ray.tracking import store as tracking


def collect(grid: Any, tracking_uri: str, parent: str, keys: list[str], metric: str, epochs: int) -> list[dict]:
    """One dict per trial: id, outcome, epochs reached, best validation score and its epoch, the searched values,
    the child run id, the Train run's folder and Tune's error if any."""
    # deferred: importing it loads ray, pandas, pyarrow, numpy
    from nre_ray.tune.report import outcome

    # deferred: importing it loads ray, pandas, pyarrow, numpy
    from nre_ray.tune.trial import child_runs

    children = child_runs(tracking_uri, parent)
    statuses = trial_statuses(grid)  # Tune's own view of each trial
    trials = []
    for result in grid:
        config = result.config or {}
        trial_id = (result.metrics or {}).get("trial_id") or Path(result.path).name
        best, best_epoch, history = math.nan, None, []
        if children.get(trial_id):  # every epoch of the trial, across resumes: its child run's curve
            history = tracking.metric_history(tracking_uri, children[trial_id], metric)
            for epoch, value in history:  # the first epoch that reached the best score, as the loop selects
                if math.isnan(best) or value > best:
                    best, best_epoch = value, epoch
        # the child run's last epoch counts too: a trial resumed after its last checkpointed epoch, whose metrics
        # its lost process never passed to Tune, trains no further epoch (tune_trial.log_missed_epoch logged it)
        last_epoch = max([int((result.metrics or {}).get("epoch", 0) or 0), *(int(e) for e, _ in history)])
        trials.append({"trial_id": trial_id, "outcome": outcome(statuses.get(trial_id, "ERROR" if result.error
                                                                             else "TERMINATED"), last_epoch, epochs),
                       "epochs": last_epoch, f"best_{metric}": best, "best_epoch": best_epoch,
                       **{k: config.get(k) for k in keys}, "mlflow_run_id": children.get(trial_id),
                       "error": str(result.error).strip().splitlines()[-1] if result.error else None})
    return trials


def close_children(tracking_uri: str, trials: list[dict], cut: set[str] | None = None) -> None:
    """Close the child runs the trials could not close themselves (ASHA stops a trial by ending its actor): stopped
    and completed ones FINISHED, failed ones FAILED, and the runs still open of the trials in ``cut`` (an
    interrupted sweep's) KILLED, as ``unfinished``; each gets its outcome as the tag ``nre_ray.tune.outcome``."""
    # deferred: importing it loads ray, pandas, pyarrow, numpy
    from nre_ray.tune.report import ERROR, UNFINISHED

    for trial in trials:
        run_id = trial["mlflow_run_id"]
        if not run_id:
            continue
        running = tracking.run_status(tracking_uri, run_id) == "RUNNING"
        outcome = UNFINISHED if running and trial["trial_id"] in (cut or set()) else trial["outcome"]
        tracking.set_run_tags(tracking_uri, run_id, {"nre_ray.tune.outcome": outcome})
        status = {ERROR: "FAILED", UNFINISHED: "KILLED"}.get(outcome, "FINISHED")
        if running or status == "FAILED":
            tracking.end_run(tracking_uri, run_id, status)


def interrupted(trials: list[dict], num_samples: int, ended: set[str]) -> set[str] | None:
    """None when the sweep ran to its end; after a Ctrl-C, the ids of the trials it cut short (``--resume``
    continues them). Tune then returns early: trials not yet drawn are missing, and the running ones are stopped and
    marked TERMINATED like the ones that ended, so the cut ones are those that did not end (complete, or get stopped
    by ASHA) in this session, ``ended``, while their child run is still open (:func:`close_children` checks that)."""
    # deferred: importing it loads ray, pandas, pyarrow, numpy
    from nre_ray.tune.report import UNFINISHED

    if len(trials) >= num_samples and not any(t["outcome"] == UNFINISHED for t in trials):
        return None
    return {t["trial_id"] for t in trials if t["trial_id"] not in ended}


def close_running(tracking_uri: str, parent: str) -> None:
    """Mark the parent's child runs still RUNNING as KILLED (``--resume`` reopens them)."""
    # deferred: importing it loads ray, pandas, pyarrow, numpy
    from nre_ray.tune.trial import child_runs

    for run_id in child_runs(tracking_uri, parent).values():
        if tracking.run_status(tracking_uri, run_id) == "RUNNING":
            tracking.end_run(tracking_uri, run_id, "KILLED")


def finish(cfg: Config, target: Any, prepared: Any, grid: Any, trials: list[dict], space: list, parent: str,
           metric: str, path: str) -> dict[str, Any]:
    """Log the trials table and plot to the parent run, score the best trial's best checkpoint on test once, log
    it as the sweep's model; return the summary."""
    import ray.train

    # deferred: importing it loads ray, torch, pandas, pyarrow, numpy
    from nre_ray.run.loop import SELECTION_RANK

    # deferred: importing it loads ray, pandas, pyarrow, numpy
    from nre_ray.tune.report import COMPLETED, ERROR, STOPPED_EARLY, plot_parallel, trials_table, write_table

    keys = [d.key for d in space]
    tracker = tracking.MlflowTracker(target.tracking_uri, parent)
    frame = trials_table(trials, keys, metric)
    with tempfile.TemporaryDirectory() as folder:
        for file in write_table(frame, Path(folder)):
            tracker.log_artifact(file)
        scored = frame[frame[f"best_{metric}"].notna()]
        if len(scored):
            tracker.log_artifact(plot_parallel(scored, {d.key: d.kind for d in space}, metric,
                                               Path(folder) / "trials_parallel.png"))
    count = {name: sum(t["outcome"] == name for t in trials) for name in (COMPLETED, STOPPED_EARLY, ERROR)}
    tracker.log_metrics({"trials_completed": count[COMPLETED], "trials_stopped_early": count[STOPPED_EARLY],
                         "trials_failed": count[ERROR]}, step=0)
    scored_trials = [t for t in trials if not math.isnan(t[f"best_{metric}"])]
    if not scored_trials:
        errors = "; ".join(f"{t['trial_id']}: {t['error']}" for t in trials if t["error"])
        raise UsageError(f"no trial reported a validation score. {errors}")
    best = max(scored_trials, key=lambda t: t[f"best_{metric}"])
    train_run = ray.train.Result.from_path(fs.join(path, "trials", best["trial_id"]))
    checkpoint = train_run.get_best_checkpoint(metric=SELECTION_RANK, mode="max")
    tracker.log_params({f"best.{k}": best[k] for k in keys})
    tracker.set_tags({"nre_ray.best_trial": best["trial_id"], "nre_ray.best_run_id": best["mlflow_run_id"] or ""})
    tracker.log_metrics({f"best_{metric}": best[f"best_{metric}"], "best_epoch": best["best_epoch"]}, step=0)
    test, model = score_and_log(cfg, target, prepared, checkpoint, tracker, parent)
    return {"sweep": target.run_name, "task": target.task, "run_id": parent, "experiment": cfg.run.experiment_name,
            "experiment_id": tracking.experiment_id(target.tracking_uri, parent), "tracking_uri": target.tracking_uri,
            "storage_path": path, "select_metric": metric,
            "trials": trials, "best_trial": best["trial_id"], "best_run_id": best["mlflow_run_id"],
            "best_params": {k: best[k] for k in keys}, "best_valid": best[f"best_{metric}"],
            "best_epoch": best["best_epoch"], "best_checkpoint": fs.with_scheme(checkpoint.path, target.storage),
            "test": test, **model}


def score_and_log(cfg: Config, target: Any, prepared: Any, checkpoint: Any, tracker: Any,
                  parent: str) -> tuple[dict[str, float], dict[str, str | None]]:
    """Score ``checkpoint`` once on the test split as preprocessing encoded it for the sweep (the evaluation code of
    ``python -m nre_ray.evaluate``, on the cache's rows: the raw test file is not read again: the task's
    :meth:`~nre_ray.tasks.base.Task.checkpoint_scores`, bags' F1 at the checkpoint's validation threshold), log the
    scores and the task's reports of them (:meth:`~nre_ray.tasks.base.Task.checkpoint_reports`) to the parent run,
    and log the checkpoint as its model."""
    import numpy as np

    # deferred: importing it loads ray, torch, pandas, pyarrow, numpy
    from nre_ray.inference.evaluation import evaluate_split, trained_metrics

    # deferred: importing it loads starlette, pandas, pyarrow, numpy
    from nre_ray.inference.pyfunc import log_model

    # deferred: importing it loads torch, numpy
    from nre_ray.run.checkpoint import load_checkpoint

    # deferred: importing it loads torch, pandas, numpy
    from nre_ray.tasks.lookup import task_named

    test: dict[str, float] = {}
    model: dict[str, str | None] = {"model_uri": None, "registered_model_uri": None}
    with checkpoint.as_directory() as folder:
        if "test" in prepared.splits:
            report = evaluate_split(folder, prepared, "test", num_workers=cfg.train.num_workers,
                                    negative_label=cfg.data.negative_label, address=cfg.run.address,
                                    cpus_per_worker=cfg.train.cpus_per_worker,
                                    name=fs.with_scheme(checkpoint.path, target.storage))
            test = {k: float(v) for k, v in report["metrics"].items() if isinstance(v, (int, float))}
            tracker.log_metrics({f"test_{k}": v for k, v in test.items()}, step=0)
            trained = trained_metrics(load_checkpoint(Path(folder)))  # what checkpoint_scores read on the workers
            with tempfile.TemporaryDirectory() as out:
                # the task's counts as evaluate returns them (the sentence task's confusion matrix, ...)
                task_named(report["task"]).checkpoint_reports(np.asarray(report["confusion_matrix"]), report["labels"],
                                                              trained, Path(out), "test", "test (best trial)")
                tracker.log_artifacts(Path(out), "reports")
        if cfg.run.log_model:
            with console.phase("model", "logging the best trial's checkpoint as the sweep's MLflow model") as step:
                logged = log_model(folder, target.tracking_uri, parent, cfg.run.register_model)
                step.done(logged.model_uri)
            model = {"model_uri": logged.model_uri, "registered_model_uri": logged.registered_uri}
    return test, model

"""One trial of a sweep: the Tune function that launches its own TorchTrainer and its MLflow child run.

A trial runs in a Ray Tune actor: it builds the trial's config (the sweep's fixed settings with the sampled values),
opens its MLflow child run (or reopens it when the sweep resumes), and fits the same TorchTrainer as
``python -m nre_ray.train`` with two callbacks: :class:`~nre_ray.tracking.callback.EpochMetricsLogger` (each epoch's
metrics into the child run) and Ray's ``TuneReportCallback`` (the same metrics up to Tune, where ASHA reads them).
The Train run is named after the trial id under ``<sweep folder>/trials``, so a trial restarted by ``--resume`` (or
after a lost node) continues from its latest checkpoint.
"""

from __future__ import annotations

import json
import threading
import time
from typing import Any

import ray
import ray.train

from nre_ray.cluster.ray_private import function_trainable
from nre_ray.cluster.session import Resources, root_cause
from nre_ray.config import Config
from nre_ray.core.console import NOTES_KEY
from nre_ray.run.runner import Target, build_trainer, placement_tags
from nre_ray.tracking import store as tracking
from nre_ray.tune.space import apply

#: Tags of a child run: the Tune trial it records, and (MLflow's own) the sweep's parent run.
TRIAL_TAG, PARENT_TAG = "nre_ray.trial_id", "mlflow.parentRunId"
#: How long a trial stopped after its last epoch waits for the loop to score and log its best checkpoint.
FINAL_WAIT_S = 600.0
#: The trial running in this actor process: ``queue`` (where its Train controller sends its handle), ``controller``
#: (that handle, once received), ``stopping`` (set when Tune stops the trial) and ``ended`` (an Event set when
#: :func:`run_trial` has returned).
_RUN: dict[str, Any] = {}


class ControllerHandle(ray.train.UserCallback):
    """Sends the Train controller's actor handle to the trial at the first report, so that a trial Tune stops (ASHA,
    Ctrl-C) can abort its Train run: the abort stops the workers and frees their placement group. (Ray's own
    placement-group cleaner, which acts when the controller dies with the trial, cannot always reach the State API.)
    """

    def __init__(self, queue: Any) -> None:
        self.queue = queue
        self.sent = False

    def after_report(self, run_context: Any, metrics: list[dict[str, Any]], checkpoint: Any) -> None:
        if not self.sent:
            self.queue.put(ray.get_runtime_context().current_actor)
            self.sent = True


def trial_trainable(sweep: dict[str, Any]) -> type:
    """Tune's trainable: :func:`run_trial` with the sweep's settings, as a function trainable whose ``cleanup`` (run
    when Tune stops the trial) lets a trial past its last epoch finish, and aborts the Train run of any other."""
    from ray import tune

    base = function_trainable(tune.with_parameters(_run_trial_to_its_end, sweep=sweep), name="trial")
    epochs = int(sweep["config"]["train"]["epochs"])

    class SweepTrial(base):  # type: ignore[misc, valid-type]
        def cleanup(self) -> None:
            stop_train_run(self.get_state()["last_result"], epochs)
            super().cleanup()

    return SweepTrial


def _run_trial_to_its_end(params: dict[str, Any], sweep: dict[str, Any]) -> None:
    """:func:`run_trial`, then say that it returned (to :func:`stop_train_run`, in this process's other thread)."""
    _RUN["ended"] = ended = threading.Event()
    try:
        run_trial(params, sweep)
    finally:
        ended.set()


def stop_train_run(last_result: dict[str, Any] | None, epochs: int) -> None:
    """Tune stops this trial. After its last epoch (ASHA stops every trial at ``max_t``), the loop is still scoring
    and logging its best checkpoint: wait for it. Otherwise abort the Train run (its workers and their resources)."""
    if int((last_result or {}).get("epoch", 0)) >= epochs:
        ended = _RUN.get("ended")
        if ended is not None:
            ended.wait(timeout=FINAL_WAIT_S)
        return
    _RUN["stopping"] = True
    controller = _RUN.get("controller")
    if controller is None and _RUN.get("queue") is not None and not _RUN["queue"].empty():
        controller = _RUN["controller"] = _RUN["queue"].get_nowait()
    if controller is None:  # stopped before its first report: nothing registered yet
        return
    try:
        ray.get(controller.abort.remote(), timeout=60)
    except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError):
        pass  # abort ends the controller's process: the call does not return a value


def _without_notes(callback: type) -> type:
    """Ray's ``TuneReportCallback`` passing on every report but the console's notes (``nre_ray.run.loop.tell_console``):
    a result without the sweep's metric would make Tune fail the trial."""
    class Report(callback):  # type: ignore[misc, valid-type]
        def after_report(self, run_context: Any, metrics: list[dict[str, Any]], checkpoint: Any) -> None:
            if not (metrics and NOTES_KEY in metrics[0]):
                super().after_report(run_context, metrics, checkpoint)

    return Report


def run_trial(params: dict[str, Any], sweep: dict[str, Any]) -> None:
    """Tune's trainable. ``params``: the sampled ``{"section.field": value}``; ``sweep`` (the same for every trial):
    ``config`` (the fixed Config.to_dict()), ``data`` (:func:`nre_ray.run.runner.trainer_data` of train and valid),
    ``trials_storage``, ``tracking_uri``, ``experiment``, ``parent_run_id``, ``sweep_name``, ``task`` (its name:
    :attr:`nre_ray.run.runner.Target.task`), ``per_worker``,
    ``threads``, ``placement_timeout``."""
    import ray.tune
    from ray.tune.integration.ray_train import TuneReportCallback
    from ray.util.queue import Queue

    context = ray.tune.get_context()
    trial_id, trial_name = context.get_trial_id(), context.get_trial_name()
    cfg = Config.from_dict(apply(sweep["config"], params), source=f"trial {trial_id}")
    run_id = open_child_run(sweep["tracking_uri"], sweep["experiment"], sweep["parent_run_id"], sweep["sweep_name"],
                            trial_id, trial_name, params,
                            logged={**cfg.flat(), **tracking.data_params(sweep["data"])},
                            tags=placement_tags(cfg, sweep["threads"]))
    target = Target(run_name=trial_id, storage=sweep["trials_storage"], tracking_uri=sweep["tracking_uri"],
                    task=sweep["task"])  # the loop trains the sweep's task (sentences, documents, bags)
    _RUN.update(queue=Queue(1, actor_options={"num_cpus": 0}), controller=None, stopping=False)
    resources = Resources(dict(sweep["per_worker"]), sweep["threads"], placement_timeout=sweep["placement_timeout"])
    trainer = build_trainer(cfg, target, sweep["data"], resources, run_id, time.time(),
                            extra_callbacks=(ControllerHandle(_RUN["queue"]), _without_notes(TuneReportCallback)()))
    try:
        result = trainer.fit()
    except Exception as err:
        if _RUN["stopping"]:  # Tune stopped the trial and its Train run was aborted: the driver closes the run
            return
        tracking.end_run(sweep["tracking_uri"], run_id, "FAILED")
        raise RuntimeError(f"trial {trial_id} failed: {root_cause(err)}") from None
    # Not reported to Tune (a report from this thread would block the trial's end): the sweep's table reads it here.
    log_missed_epoch(sweep["tracking_uri"], run_id, result.metrics)
    tracking.end_run(sweep["tracking_uri"], run_id, "FINISHED")


def log_missed_epoch(tracking_uri: str, run_id: str, metrics: dict[str, Any] | None) -> dict[str, Any] | None:
    """The Train run's latest checkpoint's ``metrics`` when their epoch is missing from the child run, logged now
    (at step ``epoch``); None when the child run has it. A trial whose process died after Ray registered an epoch's
    checkpoint but before the callbacks logged it (and passed it to Tune) resumes after that epoch: with no epoch
    left to train, nothing else would ever report it."""
    if not metrics or "epoch" not in metrics:
        return None
    epoch = int(metrics["epoch"])
    if epoch in tracking.metric_steps(tracking_uri, run_id, "train_loss"):
        return None
    tracking.MlflowTracker(tracking_uri, run_id).log_metrics(metrics, step=epoch)
    return dict(metrics)


def open_child_run(tracking_uri: str, experiment: str, parent_run_id: str, sweep_name: str, trial_id: str,
                   trial_name: str, params: dict[str, Any], logged: dict[str, Any] | None = None,
                   tags: dict[str, str] | None = None) -> str:
    """The trial's MLflow child run: the one already there for this trial (a resumed sweep: marked RUNNING again,
    the loop continues its curves), else a new one under the parent, with the run parameters ``logged`` and the
    ``tags``. Returns its run id."""
    found = find_child_run(tracking_uri, parent_run_id, trial_id)
    if found is not None:
        tracking.reopen_run(tracking_uri, found)
        return found
    tags = {**(tags or {}), PARENT_TAG: parent_run_id, TRIAL_TAG: trial_id,
            "nre_ray.run_name": f"{sweep_name}/{trial_id}", "nre_ray.searched": json.dumps(params, sort_keys=True)}
    run_id = tracking.start_run(tracking_uri, experiment, trial_name, tags)
    if logged:
        tracking.MlflowTracker(tracking_uri, run_id).log_params(logged)
    return run_id


def find_child_run(tracking_uri: str, parent_run_id: str, trial_id: str) -> str | None:
    """The run id of the child run of ``parent_run_id`` for ``trial_id``, or None."""
    runs = child_runs(tracking_uri, parent_run_id)
    return runs.get(trial_id)


def child_runs(tracking_uri: str, parent_run_id: str) -> dict[str, str]:
    """``{trial id: run id}`` of the parent's child runs (the oldest run per trial, should there be two)."""
    experiment_id = tracking.experiment_id(tracking_uri, parent_run_id)
    out: dict[str, str] = {}
    for run in tracking.search_runs(tracking_uri, experiment_id, f"tags.`{PARENT_TAG}` = '{parent_run_id}'"):
        trial = run.data.tags.get(TRIAL_TAG)
        if trial:
            out[trial] = run.info.run_id  # newest first: the oldest one wins
    return out

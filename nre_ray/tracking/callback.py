"""Ray Train controller callbacks: each epoch's metrics to MLflow, and the run's events to the driver's console.

Ray Train keeps an epoch only once its checkpoint is registered: the controller picks up the workers' reports at its
next poll (every 2 s) and writes its checkpoint list to storage, which is what a restart (``--max-failures``) or a
``--resume`` starts from. A report that is not picked up (Ctrl-C, a worker or the driver killed in those seconds) is
lost and the epoch is trained again. Logging the epoch's metrics here, right after that registration, instead of in
the worker, gives each epoch in MLflow exactly once, and only epochs a continuation starts after.

The controller runs on the driver's node (Ray Train pins it there), so it hands the driver what to print through a
file of events (:func:`nre_ray.console.append_event`): the workers up, training started, each epoch. Where the driver
is not on a node (a Ray Client ``ray://`` address) there is no such file and the controller prints the epoch lines
itself (Ray forwards them to the driver with its ``(TrainController pid=...)`` prefix).
"""

from __future__ import annotations

import logging
from typing import Any

import ray.train

from nre_ray.cluster.ray_private import worker_group_callback
from nre_ray.console import NOTES_KEY, append_event, format_epoch

log = logging.getLogger(__name__)

# Ray Train's worker-group hooks: the console's "workers up" and "training started". On a Ray without them, the
# console learns of the training from the first epoch only.
WORKER_GROUP_CALLBACK = worker_group_callback()
HAS_WORKER_GROUP_HOOKS = WORKER_GROUP_CALLBACK is not None


class EpochMetricsLogger(ray.train.UserCallback):
    """Logs rank 0's reported metrics at step ``metrics["epoch"]`` into an existing MLflow run (by id), and passes
    them on to the driver's console: appended to ``events`` (a file on the driver's node), else printed."""

    def __init__(self, tracking_uri: str, run_id: str, events: str | None = None, epochs: int = 0,
                 select: str = "macro_f1") -> None:
        self.tracking_uri = tracking_uri
        self.run_id = run_id
        self.events, self.epochs, self.select = events, epochs, select
        self._tracker: Any = None  # an nre_ray.tracking.store.MlflowTracker from the first epoch on

    def after_report(self, run_context: Any, metrics: list[dict[str, Any]], checkpoint: Any) -> None:
        """Called by the controller after the checkpoint manager registered the report (``checkpoint`` persisted)."""
        if metrics and NOTES_KEY in metrics[0]:  # lines for the console (nre_ray.loop.tell_console)
            lines = [str(line) for line in metrics[0][NOTES_KEY]]
            _tell(self.events, {"event": "notes", "lines": lines}, lambda: "\n".join(lines))
            return
        if checkpoint is None or not metrics or "epoch" not in metrics[0]:
            return
        try:
            if self._tracker is None:
                # imported here: the controller starts the workers without waiting for mlflow's import
                from nre_ray.tracking.store import MlflowTracker

                self._tracker = MlflowTracker(self.tracking_uri, self.run_id)
            self._tracker.log_metrics(metrics[0], step=int(metrics[0]["epoch"]))
        except Exception as err:  # tracking trouble must not stop training: the checkpoint holds the metrics too
            log.warning("MLflow: could not log the metrics of epoch %s: %s", metrics[0].get("epoch"), err)
        _tell(self.events, {"event": "epoch", "metrics": dict(metrics[0])},
              lambda: format_epoch(metrics[0], self.epochs, self.select))


class ConsoleEvents(WORKER_GROUP_CALLBACK or object):  # type: ignore[misc]
    """Tells the driver's console when the worker group is up and when the training function started on it."""

    def __init__(self, events: str | None) -> None:
        self.events = events

    def after_worker_group_start(self, worker_group: Any) -> None:
        count = len(worker_group.get_workers()) if hasattr(worker_group, "get_workers") else None
        _tell(self.events, {"event": "workers_started", "count": count}, None)

    def after_worker_group_training_start(self, worker_group: Any) -> None:
        _tell(self.events, {"event": "training_started"}, None)


def _tell(events: str | None, event: dict[str, Any], text: Any) -> None:
    """Append ``event`` to the driver's events file; without one, print ``text()`` (if given)."""
    try:
        if events:
            append_event(events, event)
        elif text is not None:
            print(text(), flush=True)
    except Exception as err:  # the console must not stop training
        log.warning("console: could not pass on %s: %s", event.get("event"), err)

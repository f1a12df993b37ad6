"""Epoch metrics to MLflow from the Ray Train controller, at the moment Ray registers the epoch's checkpoint.

Ray Train keeps an epoch only once its checkpoint is registered: the controller picks up the workers' reports at its
next poll (every 2 s) and writes its checkpoint list to storage, which is what a restart (``--max-failures``) or a
``--resume`` starts from. A report that is not picked up (Ctrl-C, a worker or the driver killed in those seconds) is
lost and the epoch is trained again. Logging the epoch's metrics here, right after that registration, instead of in
the worker, gives each epoch in MLflow exactly once, and only epochs a continuation starts after.
"""

from __future__ import annotations

import logging
from typing import Any

import ray.train

from nre_ray.tracking import MlflowTracker

log = logging.getLogger(__name__)


class EpochMetricsLogger(ray.train.UserCallback):
    """Logs rank 0's reported metrics at step ``metrics["epoch"]`` into an existing MLflow run (by id)."""

    def __init__(self, tracking_uri: str, run_id: str) -> None:
        self.tracking_uri = tracking_uri
        self.run_id = run_id
        self._tracker: MlflowTracker | None = None

    def after_report(self, run_context: Any, metrics: list[dict[str, Any]], checkpoint: Any) -> None:
        """Called by the controller after the checkpoint manager registered the report (``checkpoint`` persisted)."""
        if checkpoint is None or not metrics or "epoch" not in metrics[0]:
            return
        try:
            if self._tracker is None:
                self._tracker = MlflowTracker(self.tracking_uri, self.run_id)
            self._tracker.log_metrics(metrics[0], step=int(metrics[0]["epoch"]))
        except Exception as err:  # tracking trouble must not stop training: the checkpoint holds the metrics too
            log.warning("MLflow: could not log the metrics of epoch %s: %s", metrics[0].get("epoch"), err)

"""A trial's child run after a lost trial process (a real MLflow sqlite store): the epoch whose checkpoint Ray
registered but whose metrics never reached MLflow is logged when the resumed trial ends."""

from __future__ import annotations

from mlflow.tracking import MlflowClient

from nre_ray.tracking import store as tracking
from nre_ray.tune.trial import log_missed_epoch

EPOCH = {"train_loss": 1.5, "valid_loss": 1.2, "valid_macro_f1": 0.5, "valid_accuracy": 0.6, "lr": 1e-3,
         "examples_per_sec": 900.0, "epoch_seconds": 3.0, "epoch_cpu_seconds": 2.5, "best_epoch": 1,
         "selection_rank": 1}


def _child(tmp_path, epochs: int) -> tuple[str, str]:
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    run_id = tracking.start_run(uri, "sweep", "trial_1", {"nre_ray.trial_id": "t1"})
    tracker = tracking.MlflowTracker(uri, run_id)
    for epoch in range(1, epochs + 1):
        tracker.log_metrics({**EPOCH, "epoch": epoch, "valid_macro_f1": 0.5 + epoch / 10}, step=epoch)
    return uri, run_id


def _steps(uri: str, run_id: str) -> list[tuple[int, float]]:
    return sorted((m.step, round(m.value, 4)) for m in MlflowClient(uri).get_metric_history(
        run_id, tracking.mlflow_name("valid_macro_f1")))


def test_the_checkpointed_epoch_missing_from_the_child_run_is_logged_once(tmp_path):
    uri, run_id = _child(tmp_path, 2)
    last = {**EPOCH, "epoch": 3, "valid_macro_f1": 0.93}  # the Train run's latest checkpoint's metrics
    assert log_missed_epoch(uri, run_id, last) == last
    assert _steps(uri, run_id) == [(1, 0.6), (2, 0.7), (3, 0.93)]
    assert log_missed_epoch(uri, run_id, last) is None  # there now: not logged twice
    assert _steps(uri, run_id) == [(1, 0.6), (2, 0.7), (3, 0.93)]


def test_a_trial_whose_epochs_all_reached_mlflow_logs_nothing(tmp_path):
    uri, run_id = _child(tmp_path, 3)
    assert log_missed_epoch(uri, run_id, {**EPOCH, "epoch": 3, "valid_macro_f1": 0.8}) is None
    assert log_missed_epoch(uri, run_id, None) is None  # no checkpoint ever reported
    assert _steps(uri, run_id) == [(1, 0.6), (2, 0.7), (3, 0.8)]


class _Forwarded:
    """Records what a Train callback passes on (the base of Ray's TuneReportCallback needs a live Tune session)."""

    def __init__(self) -> None:
        self.seen: list[dict] = []

    def after_report(self, run_context, metrics, checkpoint) -> None:
        self.seen.append(metrics[0])


def test_a_trial_passes_epochs_to_tune_but_not_the_consoles_notes():
    from nre_ray.core.console import NOTES_KEY
    from nre_ray.tune.trial import _without_notes

    report = _without_notes(_Forwarded)()
    report.after_report(None, [{NOTES_KEY: ["resuming after epoch 2 from /x"]}, {NOTES_KEY: []}], None)
    report.after_report(None, [{**EPOCH, "epoch": 3}], object())
    assert report.seen == [{**EPOCH, "epoch": 3}]  # a result without the sweep's metric would fail the trial

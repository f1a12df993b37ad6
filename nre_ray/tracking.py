"""Experiment tracking behind a small interface: MLflow on rank 0, a no-op everywhere else.

The driver creates the experiment and the run (:func:`start_run`) before training and closes it afterwards
(:func:`end_run`); rank 0 writes into that run by id, so a restarted worker group keeps logging into the same run.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import mlflow
from mlflow.entities import Metric, Param, RunStatus, RunTag
from mlflow.tracking import MlflowClient

_MAX_PARAM_LEN = 6000


class Tracker:
    """No-op tracker: what non-zero ranks get, and what tests use when tracking is off."""

    def log_params(self, params: dict[str, Any]) -> None:
        """Record parameters (once per run)."""

    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        """Record metrics at ``step`` (the epoch)."""

    def log_artifacts(self, folder: Path, artifact_path: str) -> None:
        """Copy a folder into the run's artifacts."""

    def log_artifact(self, path: Path, artifact_path: str | None = None) -> None:
        """Copy one file into the run's artifacts."""

    def set_tags(self, tags: dict[str, str]) -> None:
        """Set run tags."""


class MlflowTracker(Tracker):
    """Writes into an existing MLflow run by id, through the client API (no global active-run state)."""

    def __init__(self, tracking_uri: str, run_id: str) -> None:
        self.client = MlflowClient(tracking_uri)
        self.run_id = run_id

    def log_params(self, params: dict[str, Any]) -> None:
        existing = self.client.get_run(self.run_id).data.params
        fresh = [Param(k, str(v)[:_MAX_PARAM_LEN]) for k, v in params.items() if k not in existing]
        for i in range(0, len(fresh), 100):
            self.client.log_batch(self.run_id, params=fresh[i:i + 100])

    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        now = int(time.time() * 1000)
        batch = [Metric(k, float(v), now, step) for k, v in metrics.items()]
        for i in range(0, len(batch), 500):
            self.client.log_batch(self.run_id, metrics=batch[i:i + 500])

    def log_artifacts(self, folder: Path, artifact_path: str) -> None:
        self.client.log_artifacts(self.run_id, str(folder), artifact_path)

    def log_artifact(self, path: Path, artifact_path: str | None = None) -> None:
        self.client.log_artifact(self.run_id, str(path), artifact_path)

    def set_tags(self, tags: dict[str, str]) -> None:
        self.client.log_batch(self.run_id, tags=[RunTag(k, str(v)) for k, v in tags.items()])


def make_tracker(rank: int, tracking_uri: str | None, run_id: str | None) -> Tracker:
    """MLflow for rank 0 when a run exists, the no-op tracker otherwise."""
    if rank == 0 and tracking_uri and run_id:
        return MlflowTracker(tracking_uri, run_id)
    return Tracker()


def resolve_tracking_uri(uri: str | None) -> str:
    """``--tracking-uri``, else ``MLFLOW_TRACKING_URI``, else ``sqlite:///<cwd>/mlflow.db`` (what ``mlflow ui`` in
    the same folder reads). A relative sqlite path or a bare path is made absolute: workers run in other folders."""
    uri = uri or os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{Path.cwd() / 'mlflow.db'}"
    if uri.startswith("sqlite:///") and not uri.startswith("sqlite:////"):
        uri = f"sqlite:///{Path(uri[len('sqlite:///'):]).absolute()}"
    elif "://" not in uri:
        raise ValueError(f"--tracking-uri {uri!r}: give a URI such as sqlite:///mlflow.db or http://host:5000 "
                         "(plain folders, MLflow's old file store, are refused by MLflow 3)")
    return uri


def default_artifact_location(tracking_uri: str) -> str | None:
    """For a local sqlite store: ``<folder of the db>/mlruns`` (absolute), where ``mlflow ui`` looks by default.
    For a server: None (the server decides)."""
    if tracking_uri.startswith("sqlite:///"):
        return (Path(tracking_uri[len("sqlite:///"):]).parent / "mlruns").absolute().as_uri()
    return None


#: The experiment tag MLflow's UI reads to open an experiment as a model-training one.
EXPERIMENT_KIND = ("mlflow.experimentKind", "custom_model_development")


def start_run(tracking_uri: str, experiment_name: str, run_name: str, tags: dict[str, str]) -> str:
    """Create (or reuse) the experiment and create a run; returns the run id."""
    client = MlflowClient(tracking_uri)
    experiment = client.get_experiment_by_name(experiment_name)
    if experiment is None:
        experiment_id = client.create_experiment(experiment_name,
                                                 artifact_location=default_artifact_location(tracking_uri))
    else:
        experiment_id = experiment.experiment_id
    if experiment is None or EXPERIMENT_KIND[0] not in experiment.tags:
        # MLflow 3's UI opens an experiment without this tag in its GenAI view (traces); this opens its runs
        client.set_experiment_tag(experiment_id, *EXPERIMENT_KIND)
    run = client.create_run(experiment_id, run_name=run_name, tags=tags)
    return run.info.run_id


def find_run(tracking_uri: str, experiment_name: str, run_name: str, storage_path: str) -> Any | None:
    """The newest MLflow run of ``experiment_name`` tagged ``nre_ray.run_name=run_name`` and ``storage_path``
    (the tags :mod:`nre_ray.train` sets), or None. Returns an ``mlflow.entities.Run``."""
    client = MlflowClient(tracking_uri)
    experiment = client.get_experiment_by_name(experiment_name)
    if experiment is None:
        return None
    # MLflow's filter syntax has no escapes: quote with whichever quote the name lacks, check the tags here.
    quote = next((q for q in "'\"" if q not in run_name), None)
    filter_string = f"tags.`nre_ray.run_name` = {quote}{run_name}{quote}" if quote else ""
    page_token = None
    while True:
        runs = client.search_runs([experiment.experiment_id], filter_string=filter_string,
                                  order_by=["attributes.start_time DESC"], page_token=page_token)
        for run in runs:
            tags = run.data.tags
            if tags.get("nre_ray.run_name") == run_name and tags.get("storage_path") == storage_path:
                return run
        page_token = runs.token
        if not page_token:
            return None


def metric_steps(tracking_uri: str, run_id: str, key: str) -> set[int]:
    """The steps at which ``key`` has been logged in the run."""
    return {m.step for m in MlflowClient(tracking_uri).get_metric_history(run_id, key)}


def reopen_run(tracking_uri: str, run_id: str) -> None:
    """Mark a stopped run RUNNING again (what ``mlflow.start_run(run_id=...)`` does), to continue logging into it."""
    MlflowClient(tracking_uri).update_run(run_id, status="RUNNING")


def end_run(tracking_uri: str, run_id: str, status: str) -> None:
    """Mark the run FINISHED, FAILED or KILLED."""
    MlflowClient(tracking_uri).set_terminated(run_id, status=status)


def run_metrics(tracking_uri: str, run_id: str) -> dict[str, float]:
    """The latest value of every metric of a run."""
    return dict(MlflowClient(tracking_uri).get_run(run_id).data.metrics)


__all__ = ["MlflowTracker", "RunStatus", "Tracker", "end_run", "find_run", "make_tracker", "metric_steps", "mlflow",
           "reopen_run", "resolve_tracking_uri", "run_metrics", "start_run"]

"""Settings of a local Ray that both its starters share, the command's own (:mod:`nre_ray.cluster.session`) and the
shared Ray's host (:mod:`nre_ray.cluster.shared_ray`): the quiet environment every command gives itself and the
processes it starts, and the State API's pin to the Ray about to start. A leaf: it imports nothing of ours but the
free-port helper (:mod:`nre_ray.cluster.ports`, a leaf too)."""

from __future__ import annotations

import os

from nre_ray.cluster.ports import free_port

#: MLflow's switch for its telemetry (:data:`QUIET_ENV` turns it off).
TELEMETRY_ENV = "MLFLOW_DISABLE_TELEMETRY"

#: The settings every command gives itself, and the processes it starts, before Ray and MLflow are imported, where the
#: user has not set them (:func:`quiet_environ`).
QUIET_ENV = {
    "RAY_USAGE_STATS_ENABLED": "0",
    "RAY_DATA_DISABLE_PROGRESS_BARS": "1",
    "RAY_TRAIN_ENABLE_PRINT_PATCH": "0",
    "TUNE_DISABLE_AUTO_CALLBACK_LOGGERS": "1",
    "PYTHONWARNINGS": "ignore::DeprecationWarning",
    "MLFLOW_LOGGING_LEVEL": "WARNING",  # read when mlflow is imported: no INFO lines about its store and models
    "MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT": "true",  # no "View run ... at:" lines when a run ends on a server
    # Tune's legacy output engine, which verbose=0 silences; the new one prints its configuration table and
    # "View detailed results here" whatever the verbosity (ray.tune.experimental.output)
    "RAY_AIR_NEW_OUTPUT": "0",
    # MLflow's telemetry: without it, MLflow 3.17 writes an installation id to ~/.config/mlflow/telemetry.json when
    # it is first imported and sends usage events to MLflow's servers (mlflow.telemetry). A user's own setting wins
    # (MLFLOW_DISABLE_TELEMETRY=false turns it back on); DO_NOT_TRACK=true turns it off as well.
    TELEMETRY_ENV: "true",
}


#: The environment of an MLflow server that nre_ray starts (the stand-in's, ``make ui``'s): without MLflow's job
#: execution (MLflow's GenAI jobs, which nre_ray never submits), the server is 2 processes instead of 10. MLflow
#: 3.17's job runner and its 8 Huey consumers take about 6 s of CPU to start and 14% of a core while idle (they
#: poll). A user's own setting wins.
MLFLOW_SERVER_ENV = {"MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}


#: ``NRE_RAY_DASHBOARD=0``: the local Ray a command starts (its own, or the one nre_ray commands share) runs without
#: Ray's dashboard: it starts sooner and takes about 4 s less CPU (docs/training.md). The test suite sets it.
DASHBOARD_ENV = "NRE_RAY_DASHBOARD"
#: The State API's address where the local Ray has no dashboard: the discard port, on which no dashboard listens (a
#: port from :func:`free_port` could be taken later by another Ray's dashboard, whose cluster would then be asked).
NO_STATE_API = "http://127.0.0.1:9"


def env_switch(name: str, default: bool) -> bool:
    """The on/off setting ``name`` of the environment: 1, true, yes, on or 0, false, no, off (any case, spaces
    around); ``default`` when it is unset or anything else."""
    value = os.environ.get(name, "").strip().lower()
    return True if value in ("1", "true", "yes", "on") else False if value in ("0", "false", "no", "off") else default


def with_dashboard() -> bool:
    """Whether a local Ray a command starts has its dashboard (:data:`DASHBOARD_ENV`; yes unless set to a false
    value)."""
    return env_switch(DASHBOARD_ENV, default=True)


def dashboard_args() -> dict[str, int | bool]:
    """The ``ray.init`` arguments for the dashboard of the local Ray about to start: its port, with the State API
    pinned to it (:func:`pin_state_api`); or none (:data:`DASHBOARD_ENV`), with the State API pinned where nothing
    answers, so that it never asks another Ray on this machine."""
    if with_dashboard():
        return pin_state_api()
    if not os.environ.get("RAY_API_SERVER_ADDRESS"):
        os.environ["RAY_API_SERVER_ADDRESS"] = NO_STATE_API
    return {"include_dashboard": False}


#: Ray Train's switch for its preemption watcher (an actor per worker group, asking the GCS every 5 s whether a node
#: is being drained), which ``fit()`` passes on to its controller; and the one for its metrics (callbacks of the
#: controller and the workers that export to the dashboard's agent), read by the driver. Named by value: pinned in
#: nre_ray.cluster.ray_private's table.
PREEMPTION_WATCHER_ENV = "RAY_TRAIN_ENABLE_PREEMPTION_WATCHER"
TRAIN_METRICS_ENV = "RAY_TRAIN_METRICS_ENABLED"


def local_train_settings(dashboard: bool) -> None:
    """Ray Train's settings for runs on a local Ray (this machine alone), where the user has not set them: no
    preemption watcher (no cloud takes back a node of a local Ray; elastic and spot runs are on clusters), and, where
    the local Ray has no dashboard (``dashboard``), no Train metrics (nothing would show them). Together about 4 s of
    CPU less for each run here, of about 50 for a one-epoch run of the sample."""
    os.environ.setdefault(PREEMPTION_WATCHER_ENV, "0")
    if not dashboard:
        os.environ.setdefault(TRAIN_METRICS_ENV, "0")


def pin_state_api() -> dict[str, int]:
    """Point Ray's State API at the dashboard of the local Ray about to start, for every process of it.

    Ray Train's placement-group cleaner (an actor) asks the State API whether the run's controller is alive. Without
    an address it looks for a Ray on this machine, and with another Ray instance running here (another user's, a
    test's) it fails with ``ConnectionError: Found multiple active Ray instances`` and a traceback in the middle of
    a good run, or asks the other cluster and removes a live run's workers. Choosing the dashboard's port now and
    setting ``RAY_API_SERVER_ADDRESS`` before ``ray.init`` (Ray's processes inherit the environment) pins every
    query to this run's own cluster. A user's own ``RAY_API_SERVER_ADDRESS`` is left as it is. Returns the
    ``ray.init`` arguments to pass.
    """
    if os.environ.get("RAY_API_SERVER_ADDRESS"):
        return {}
    port = free_port()  # the dashboard binds it a moment later
    os.environ["RAY_API_SERVER_ADDRESS"] = f"http://127.0.0.1:{port}"
    return {"dashboard_port": port}

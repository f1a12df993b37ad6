"""Experiment tracking behind a small interface: MLflow on rank 0, a no-op everywhere else.

The driver creates the experiment and the run (:func:`start_run`) before training and closes it afterwards
(:func:`end_run`); rank 0 writes into that run by id, so a restarted worker group keeps logging into the same run.

Callers speak the training loop's metric names (``train_loss``, ``valid_macro_f1``, ``test_accuracy``,
``startup_total_s``, ...); this module decides how they are named in MLflow (:func:`mlflow_metrics`), so that the UI's
charts open with the learning curves:

- per-epoch curves under ``epoch/`` (``epoch/train_loss``, ``epoch/train_lr``, ``epoch/valid_macro_f1``): the first
  section of the run's "Model metrics" tab (MLflow 3.17 sorts prefixed sections by name, before unprefixed metrics);
- test scores under ``test/``, at step 0 (one value each: drawn as bars, not as a lone dot), after the curves;
- timings and throughput under ``system/`` (``system/startup_total_s``, ``system/examples_per_sec``): the UI's
  "System metrics" tab;
- bookkeeping that is not a measurement becomes a tag (``best_epoch``, ``rejected_rows``) or is left out
  (``epoch`` is the step; ``selection_rank`` is Ray Train's checkpoint ranking).

:func:`run_metrics` and :func:`metric_steps` read them back under the loop's names.
"""

from __future__ import annotations

import base64
import contextlib
import functools
import getpass
import hashlib
import importlib.metadata
import json
import os
import sqlite3
import ssl
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from nre_ray import storage
from nre_ray.cluster.session import UsageError
from nre_ray.core.redact import redact
from nre_ray.tracking import sqlite_store, uris

if TYPE_CHECKING:
    from mlflow.entities import DatasetInput, Run
    from mlflow.tracking import MlflowClient

_MAX_PARAM_LEN = 6000

#: MLflow name prefixes: per-epoch learning curves, test scores, timings (the UI's "System metrics" tab).
CURVES, TEST, SYSTEM = "epoch/", "test/", "system/"
#: Per-epoch measurements of the machine, not of the model: under ``system/``.
SYSTEM_KEYS = frozenset({"examples_per_sec", "epoch_seconds", "epoch_cpu_seconds"})
#: Bookkeeping kept as run tags (the latest value), not as metrics.
TAG_KEYS = frozenset({"best_epoch", "rejected_rows"})
#: The Unix time of the first training step, which the first epoch reports beside the ``startup_*`` timings: their
#: MLflow timestamp (so that a benchmark can tell when training started), not a metric.
FIRST_STEP_AT = "startup_first_step_at"
#: Not logged: ``epoch`` is the step itself, ``selection_rank`` Ray Train's checkpoint ranking (loop.SELECTION_RANK).
DROPPED_KEYS = frozenset({"epoch", "selection_rank", FIRST_STEP_AT})
#: The per-epoch learning curves besides the validation scores (``valid_*``): under ``epoch/``.
CURVE_KEYS = frozenset({"train_loss", "lr"})
#: Curves renamed so that the charts sort as they read: the learning rate next to the training loss, after it.
RENAMED = {"lr": "train_lr"}


def mlflow_name(key: str) -> str | None:
    """The MLflow name of the loop's metric ``key`` (None: not a metric in MLflow, see :data:`TAG_KEYS`,
    :data:`DROPPED_KEYS`)."""
    if key in DROPPED_KEYS or key in TAG_KEYS:
        return None
    if key.startswith("test_"):
        return TEST + key[len("test_"):]
    if key.startswith("startup_") or key in SYSTEM_KEYS:
        return SYSTEM + key
    if key in CURVE_KEYS or key.startswith("valid_"):
        return CURVES + RENAMED.get(key, key)
    return key  # anything else (a sweep's trial counts, ...) as it is


def loop_name(name: str) -> str:
    """The inverse of :func:`mlflow_name`: ``test/accuracy`` -> ``test_accuracy``, ``epoch/train_lr`` -> ``lr``."""
    if name.startswith(TEST):
        return "test_" + name[len(TEST):]
    if name.startswith(CURVES):
        key = name[len(CURVES):]
        return next((old for old, new in RENAMED.items() if new == key), key)
    return name[len(SYSTEM):] if name.startswith(SYSTEM) else name


def mlflow_metrics(metrics: dict[str, Any], step: int) -> tuple[list[tuple[str, float, int]], dict[str, str]]:
    """The loop's ``metrics`` at ``step`` as MLflow ``(name, value, step)`` triples and run tags. Test scores and
    start-up timings go to step 0: one value each, which MLflow's UI draws as a bar (a lone point at a later step is
    drawn as a dot)."""
    logged, tags = [], {}
    for key, value in metrics.items():
        if key in TAG_KEYS:
            tags[key] = str(int(value)) if float(value).is_integer() else str(value)
            continue
        name = mlflow_name(key)
        if name is not None:
            logged.append((name, float(value), 0 if name.startswith(TEST) or key.startswith("startup_") else step))
    return logged, tags


def _client(tracking_uri: str) -> MlflowClient:
    """An MLflow client. MLflow is imported here, on first use, not with this module: a training worker imports the
    loop (and so this module) at start-up and needs MLflow only when rank 0 first logs (about a second saved). A local
    sqlite store is created or migrated first, once (:func:`nre_ray.tracking.sqlite_store.ready`)."""
    from mlflow.tracking import MlflowClient

    sqlite_store.ready(tracking_uri)
    return MlflowClient(tracking_uri)


def warm_up(tracking_uri: str) -> None:
    """Import MLflow, and open the store when it is a sqlite file that exists: what the driver does in a background
    thread while Ray starts (:func:`nre_ray.run.runner.warm_up`). A new sqlite file is not created here (a run that
    fails before MLflow leaves none), and any error is left for the real call to report."""
    try:
        import mlflow.tracking  # noqa: F401

        path = uris.sqlite_path(tracking_uri)
        if path is not None and path.is_file():  # (a client of a new sqlite path would create the file)
            _client(tracking_uri).get_experiment_by_name("Default")  # the store's engine, its schema checked
    except Exception:  # the run's own MLflow calls report it
        pass


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
        self.tracking_uri, self.run_id = tracking_uri, run_id

    @functools.cached_property
    def client(self) -> MlflowClient:
        return _client(self.tracking_uri)

    def log_params(self, params: dict[str, Any]) -> None:
        from mlflow.entities import Param

        existing = self.client.get_run(self.run_id).data.params
        fresh = [Param(k, redact(str(v))[:_MAX_PARAM_LEN]) for k, v in params.items() if k not in existing]
        for i in range(0, len(fresh), 100):
            self.client.log_batch(self.run_id, params=fresh[i:i + 100])

    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        """``metrics`` under the loop's names; logged under their MLflow names (:func:`mlflow_metrics`)."""
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        first_step = int(float(metrics[FIRST_STEP_AT]) * 1000) if FIRST_STEP_AT in metrics else now
        logged, tags = mlflow_metrics(metrics, step)
        batch = [Metric(name, value, first_step if name.startswith(SYSTEM + "startup_") else now, at)
                 for name, value, at in logged]
        for i in range(0, len(batch), 500):
            self.client.log_batch(self.run_id, metrics=batch[i:i + 500])
        if tags:
            self.set_tags(tags)

    def log_artifacts(self, folder: Path, artifact_path: str) -> None:
        self.client.log_artifacts(self.run_id, str(folder), artifact_path)

    def log_artifact(self, path: Path, artifact_path: str | None = None) -> None:
        self.client.log_artifact(self.run_id, str(path), artifact_path)

    def set_tags(self, tags: dict[str, str]) -> None:
        from mlflow.entities import RunTag

        self.client.log_batch(self.run_id, tags=[RunTag(k, redact(str(v))) for k, v in tags.items()])


def make_tracker(rank: int, tracking_uri: str | None, run_id: str | None) -> Tracker:
    """MLflow for rank 0 when a run exists, the no-op tracker otherwise."""
    if rank == 0 and tracking_uri and run_id:
        return MlflowTracker(tracking_uri, run_id)
    return Tracker()


TRACKING_ENV = "MLFLOW_TRACKING_URI"
#: MLflow's standard variables for a server's user and password (read by MLflow's own REST client too).
USER_ENV, PASSWORD_ENV = "MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD"
#: How long a tracking server has to answer ``GET /health`` before the command gives up on it.
HEALTH_TIMEOUT_S = 5.0
#: Tracking URIs that are a whole word, not ``scheme:...`` (MLflow's names for Databricks and Unity Catalog).
NAMED_STORES = frozenset({"databricks", "databricks-uc", "uc"})
#: The schemes of MLflow's own tracking stores besides file, sqlite and http(s) (a database may name its driver:
#: ``postgresql+psycopg2://``); plugins add theirs as ``mlflow.tracking_store`` entry points.
OTHER_SCHEMES = frozenset({"postgresql", "mysql", "mssql", "databricks", "databricks-uc", "uc"})
_SQLITE_MAGIC = b"SQLite format 3\x00"


def resolve_tracking_uri(uri: str | None) -> str:
    """The tracking URI a command uses, checked: ``--tracking-uri`` (``uri``), else ``MLFLOW_TRACKING_URI``, else
    ``sqlite:///<cwd>/mlflow.db`` (what ``mlflow ui`` in the same folder reads). A relative sqlite path is made
    absolute (workers run in other folders). UsageError, naming the option or variable it came from, for a URI no
    run could use (:func:`tracking_uri_problem`): found here, before Ray starts, not at the first MLflow call."""
    given = uri or os.environ.get(TRACKING_ENV)
    if not given:
        return uris.sqlite_uri(Path.cwd() / "mlflow.db")
    resolved = given
    db = uris.sqlite_path(given)
    if db is not None and not db.is_absolute():
        resolved = uris.sqlite_uri(db.expanduser().absolute())
    problem = tracking_uri_problem(resolved)
    if problem:
        raise UsageError(f"{'--tracking-uri ' if uri else TRACKING_ENV + '='}{given}: {problem}")
    return resolved


def model_store(model: str, tracking_uri: str | None) -> str:
    """The tracking URI to read the MLflow model ``model`` (``runs:/...``, ``models:/...``) from: as
    :func:`resolve_tracking_uri` resolves ``tracking_uri`` (``--tracking-uri``), and a store that exists. A sqlite
    file that is missing (or empty, or without MLflow's tables) holds no run and no registered model, and opening it
    would create it, with MLflow's migrations on the console, only to say the run is not found: UsageError naming
    the store looked in and how to name another; nothing is created. Other stores (a server, a database) are
    MLflow's to answer."""
    uri = resolve_tracking_uri(tracking_uri)
    db = uris.sqlite_path(uri)
    if db is None:
        return uri
    if sqlite_store.schema_version(db) is not None:
        return uri
    if tracking_uri:
        origin = "given by --tracking-uri"
    elif os.environ.get(TRACKING_ENV):
        origin = f"{TRACKING_ENV}"
    else:
        origin = f"the default: no --tracking-uri, and {TRACKING_ENV} is not set"
    what = "does not exist" if not db.exists() else "holds no MLflow store"
    raise UsageError(f"--model {model}: the MLflow tracking store {uri} ({origin}) {what}, so it has no run or "
                     f"registered model to load; pass --tracking-uri with the store the model was logged to (e.g. "
                     f"http://HOST:5000 or sqlite:///PATH/mlflow.db), or set {TRACKING_ENV}")


def tracking_uri_problem(uri: str) -> str | None:
    """What is wrong with the tracking URI ``uri`` (None: nothing found), without creating or changing anything:

    - a folder or ``file:`` URI: MLflow's old file store, which MLflow 3 refuses to write (an existing one is named,
      with the command that copies it into sqlite); a file path: the sqlite URI to give instead;
    - ``sqlite:///PATH``: its folder must exist, PATH must not be a folder, an existing file must be a sqlite
      database, and a database in memory is refused (nothing would be kept, and the workers could not reach it);
    - ``http(s)://``: a server must answer ``GET /health`` within :data:`HEALTH_TIMEOUT_S` (any HTTP answer will
      do: MLflow's own calls say what else is wrong);
    - another scheme: one of MLflow's stores (:data:`OTHER_SCHEMES`) or of an installed plugin.
    """
    if uri in NAMED_STORES:
        return None
    scheme = uris.scheme(uri)
    if scheme in ("", "file"):
        return _path_problem(uri)
    if scheme == "sqlite":
        return _sqlite_problem(uri)
    if scheme in ("http", "https"):
        return _server_problem(uri)
    plugins = {entry.name for entry in importlib.metadata.entry_points(group="mlflow.tracking_store")}
    if scheme.split("+", 1)[0] in OTHER_SCHEMES or scheme in plugins:
        return None
    return (f"MLflow has no tracking store for {scheme}: URIs; give sqlite:///{Path.cwd() / 'mlflow.db'} (the "
            "default), an MLflow server http://HOST:PORT or a database (postgresql://, mysql://, mssql://)")


def _path_problem(uri: str) -> str:
    """Why a path (or ``file:`` URI) is not a tracking URI, and what to give instead."""
    path = Path(uris.file_path(uri)).expanduser().absolute()
    if path.is_file() or path.suffix in (".db", ".sqlite", ".sqlite3"):
        return f"a file is not a tracking URI; give sqlite:///{path}"
    if path.is_dir() and _holds_file_store(path):
        return (f"{path} is an MLflow file store, which MLflow 3 no longer writes; copy its runs into a sqlite store "
                f"with `mlflow migrate-filestore --source {path} --target sqlite:///{path.with_suffix('.db')}` and "
                "give that sqlite:/// URI")
    db = path.parent / "mlflow.db"
    default = " (the default)" if db == Path.cwd() / "mlflow.db" else ""
    return (f"a folder is MLflow's old file store, which MLflow 3 no longer writes; give sqlite:///{db}{default} or an "
            "MLflow server http://HOST:PORT")


def _holds_file_store(folder: Path) -> bool:
    """Whether ``folder`` (or its ``mlruns``) holds an MLflow file store: experiment folders with a ``meta.yaml``
    (the artifact folder of a sqlite store has experiment folders without one)."""
    for root in (folder, folder / "mlruns"):
        if root.is_dir() and any(p.parent.name.isdigit() for p in root.glob("*/meta.yaml")):
            return True
    return False


def _sqlite_problem(uri: str) -> str | None:
    """What is wrong with a ``sqlite:`` URI (its path already absolute), or None."""
    if uri == uris.MEMORY:
        return "a database in memory keeps nothing, and the workers cannot reach it; give a file: sqlite:///PATH"
    path = uris.sqlite_path(uri)
    if path is None:
        return "give a sqlite database as sqlite:///PATH (three slashes, then the path; four for an absolute one)"
    if path.is_dir():
        return f"{path} is a folder; give the database file in it: sqlite:///{path / 'mlflow.db'}"
    if not path.parent.is_dir():
        return f"the folder {path.parent} does not exist; create it, or give a database in a folder that exists"
    if path.is_file() and path.stat().st_size > 0:
        with path.open("rb") as fh:
            if fh.read(len(_SQLITE_MAGIC)) != _SQLITE_MAGIC:
                return f"{path} is not a sqlite database; give another file (a new one is created)"
    return None


def _server_problem(uri: str) -> str | None:
    """None when something answers HTTP at ``uri`` and admits this client (:func:`_login_problem`); else why not
    (refused, no such host, no answer in time, credentials missing or wrong)."""
    url = uri.rstrip("/") + "/health"
    try:
        with urllib.request.urlopen(url, timeout=HEALTH_TIMEOUT_S):
            return _login_problem(uri)
    except urllib.error.HTTPError:  # it answers: MLflow's own calls report what else is wrong
        return None
    except urllib.error.URLError as err:
        if isinstance(err.reason, ssl.SSLError):  # a TLS server: MLflow's own settings decide how to trust it
            return None
        reason = "no answer" if isinstance(err.reason, TimeoutError) else str(err.reason)
    except TimeoutError:
        reason = f"no answer within {HEALTH_TIMEOUT_S:g} s"
    except (ValueError, OSError) as err:
        reason = str(err)
    return (f"no MLflow server answers there ({reason}); start one (mlflow server --backend-store-uri "
            "sqlite:///ABS/mlflow.db --host HOST --port PORT) or give the address of one that runs")


def _login_problem(uri: str) -> str | None:
    """None unless the MLflow server at ``uri`` asks for a password (``mlflow server --app-name basic-auth``) and
    turns down this client's: MLflow's standard variables ``MLFLOW_TRACKING_USERNAME``/``MLFLOW_TRACKING_PASSWORD``
    missing or wrong (MLflow itself would fail at the first call, deep in a run, with its whole answer)."""
    request = urllib.request.Request(uri.rstrip("/") + "/api/2.0/mlflow/experiments/search?max_results=1")
    user, password = os.environ.get(USER_ENV), os.environ.get(PASSWORD_ENV)
    if user and password:
        login = base64.b64encode(f"{user}:{password}".encode()).decode()
        request.add_header("Authorization", f"Basic {login}")
    try:
        with urllib.request.urlopen(request, timeout=HEALTH_TIMEOUT_S):
            return None
    except urllib.error.HTTPError as err:
        if err.code != 401:  # not a login the server turned down: MLflow's own calls report what else is wrong
            return None
    except (urllib.error.URLError, TimeoutError, ValueError, OSError):
        return None
    if user and password:
        return (f"the MLflow server turned down the user {user} ({USER_ENV}) with that {PASSWORD_ENV} (401); "
                "check the password (the stand-in's env.sh reads it from its secrets folder)")
    return (f"the MLflow server asks for a user and password (401); set {USER_ENV} and {PASSWORD_ENV} (the "
            "stand-in's env.sh sets both; docs/cluster.md)")


@contextlib.contextmanager
def store_errors(tracking_uri: str) -> Iterator[None]:
    """A command's first MLflow call in ``tracking_uri``: MLflow's errors about the store itself (an MLflow error, a
    database the store cannot open or migrate, a missing database driver) become one UsageError line."""
    try:
        yield
    except Exception as err:
        from mlflow.exceptions import MlflowException

        kinds: tuple[type[Exception], ...] = (MlflowException, ValueError, ImportError, sqlite3.Error)
        with contextlib.suppress(ImportError):
            from sqlalchemy.exc import SQLAlchemyError

            kinds += (SQLAlchemyError,)
        if not isinstance(err, kinds):
            raise
        text = str(getattr(err, "message", "") or err).strip()
        first = text.splitlines()[0] if text else type(err).__name__
        raise UsageError(f"tracking URI {tracking_uri}: MLflow cannot use it ({first}); check --tracking-uri or "
                         f"{TRACKING_ENV}") from None


@contextlib.contextmanager
def mlflow_settings(tracking_uri: str) -> Iterator[None]:
    """MLflow's global tracking URI set to ``tracking_uri`` (a local sqlite store made ready first, as by
    :func:`_client`) and its artifact progress bars off, then restored: for the MLflow calls that read the global URI
    (``mlflow.pyfunc.log_model``, ``runs:/`` downloads)."""
    import mlflow

    bars_env = "MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR"
    previous, bars = mlflow.get_tracking_uri(), os.environ.get(bars_env)
    previous_env = os.environ.get(TRACKING_ENV)
    sqlite_store.ready(tracking_uri)
    mlflow.set_tracking_uri(tracking_uri)
    os.environ[bars_env] = "false"
    try:
        yield
    finally:
        # set_tracking_uri also writes MLFLOW_TRACKING_URI into the environment: put that back as it was too, or
        # every later run in this process would silently track into this store.
        mlflow.set_tracking_uri(previous)
        for key, value in ((TRACKING_ENV, previous_env), (bars_env, bars)):
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def download_model(model_uri: str, tracking_uri: str | None, folder: str) -> str:
    """Download the MLflow model ``model_uri`` (``runs:/...``, ``models:/...``) from the store of ``tracking_uri``
    (resolved and checked: :func:`model_store`) into ``folder``; returns the local path. MLflow's errors
    about the model (it is not there) are left to the caller."""
    import mlflow.artifacts

    uri = model_store(model_uri, tracking_uri)  # a store that exists: never one made here
    # MLflow 3.17 resolves runs:/ through the logged model with the *global* tracking URI (the tracking_uri argument
    # does not reach that lookup), so the global one is set for the download.
    with mlflow_settings(uri):
        return mlflow.artifacts.download_artifacts(artifact_uri=model_uri, dst_path=folder, tracking_uri=uri)


#: The experiment tag MLflow's UI reads to open an experiment as a model-training one.
EXPERIMENT_KIND = ("mlflow.experimentKind", "custom_model_development")


def start_run(tracking_uri: str, experiment_name: str, run_name: str, tags: dict[str, str]) -> str:
    """Create (or reuse) the experiment and create a run; returns the run id."""
    client = _client(tracking_uri)
    run = client.create_run(_experiment(client, experiment_name, tracking_uri), run_name=run_name,
                            tags={**source_tags(), **tags})
    return run.info.run_id


def _experiment(client: MlflowClient, name: str, tracking_uri: str) -> str:
    """The id of the experiment ``name``, created when there is none; runs that create it at once all get the one
    that was created (MLflow's RESOURCE_ALREADY_EXISTS for the others). It is tagged as a model-training experiment:
    MLflow 3's UI treats one without :data:`EXPERIMENT_KIND` as a GenAI one (traces); the view a browser opens in is
    its own choice, which the address that :func:`run_page` gives sets."""
    from mlflow.exceptions import MlflowException

    experiment = client.get_experiment_by_name(name)
    if experiment is None:
        try:
            location = sqlite_store.default_artifact_location(tracking_uri)
            return client.create_experiment(name, artifact_location=location,
                                            tags=dict([EXPERIMENT_KIND]))
        except MlflowException as err:
            if err.error_code != "RESOURCE_ALREADY_EXISTS":
                raise
        experiment = client.get_experiment_by_name(name)  # another run's, created since
    if EXPERIMENT_KIND[0] not in experiment.tags:
        client.set_experiment_tag(experiment.experiment_id, *EXPERIMENT_KIND)
    return experiment.experiment_id


def source_tags() -> dict[str, str]:
    """What the UI shows as a run's "Source" and "Created by": the command (``mlflow.source.name``, as MLflow's own
    ``start_run`` sets it, with ``mlflow.source.type``) and the user (``mlflow.user``)."""
    command = Path(sys.argv[0]).name if sys.argv and sys.argv[0] else "python"
    module = "nre_ray." + command[:-3] if command.endswith(".py") and Path(sys.argv[0]).parent.name == "nre_ray" \
        else None
    try:
        user = getpass.getuser()
    except (KeyError, OSError):  # no user name for this uid (some containers)
        user = str(os.getuid())
    return {"mlflow.source.name": f"python -m {module}" if module else command, "mlflow.source.type": "LOCAL",
            "mlflow.user": user}


def find_run(tracking_uri: str, experiment_name: str, run_name: str, storage_path: str) -> Run | None:
    """The newest MLflow run of ``experiment_name`` tagged ``nre_ray.run_name=run_name`` and ``storage_path``
    (the tags :mod:`nre_ray.run.runner` sets), or None."""
    experiment = _client(tracking_uri).get_experiment_by_name(experiment_name)
    if experiment is None:
        return None
    # MLflow's filter syntax has no escapes: quote with whichever quote the name lacks, check the tags here.
    quote = next((q for q in "'\"" if q not in run_name), None)
    filter_string = f"tags.`nre_ray.run_name` = {quote}{run_name}{quote}" if quote else ""
    for run in search_runs(tracking_uri, experiment.experiment_id, filter_string):
        tags = run.data.tags
        if tags.get("nre_ray.run_name") == run_name and tags.get("storage_path") == storage_path:
            return run
    return None


def search_runs(tracking_uri: str, experiment_id: str, filter_string: str) -> Iterator[Run]:
    """The runs of the experiment that match MLflow's ``filter_string``, newest first, page after page."""
    client = _client(tracking_uri)
    page_token = None
    while True:
        runs = client.search_runs([experiment_id], filter_string=filter_string,
                                  order_by=["attributes.start_time DESC"], page_token=page_token)
        yield from runs
        page_token = runs.token
        if not page_token:
            return


def metric_history(tracking_uri: str, run_id: str, key: str) -> list[tuple[int, float]]:
    """``(step, value)`` of every point of the loop's metric ``key`` (e.g. ``valid_macro_f1``) in the run, by step."""
    name = mlflow_name(key)
    return sorted((m.step, m.value) for m in _client(tracking_uri).get_metric_history(run_id, name)) if name else []


def metric_steps(tracking_uri: str, run_id: str, key: str) -> set[int]:
    """The steps at which the loop's metric ``key`` has been logged in the run (``"epoch"``: the epochs of which any
    learning-curve metric was logged)."""
    if key != "epoch":
        return {step for step, _ in metric_history(tracking_uri, run_id, key)}
    client = _client(tracking_uri)
    names = [name for name in client.get_run(run_id).data.metrics if name.startswith(CURVES)]
    return {m.step for name in names for m in client.get_metric_history(run_id, name)}


def run_status(tracking_uri: str, run_id: str) -> str:
    """The run's status: RUNNING, FINISHED, FAILED or KILLED."""
    return _client(tracking_uri).get_run(run_id).info.status


def run_params(tracking_uri: str, run_id: str) -> dict[str, str]:
    """The run's parameters."""
    return dict(_client(tracking_uri).get_run(run_id).data.params)


def reopen_run(tracking_uri: str, run_id: str) -> None:
    """Mark a stopped run RUNNING again (what ``mlflow.start_run(run_id=...)`` does), to continue logging into it."""
    _client(tracking_uri).update_run(run_id, status="RUNNING")


def end_run(tracking_uri: str, run_id: str, status: str) -> None:
    """Mark the run FINISHED, FAILED or KILLED."""
    _client(tracking_uri).set_terminated(run_id, status=status)


def set_run_tags(tracking_uri: str, run_id: str, tags: dict[str, str]) -> None:
    """Set tags on a run (also on one that has ended)."""
    client = _client(tracking_uri)
    for key, value in tags.items():
        client.set_tag(run_id, key, value)


def experiment_id(tracking_uri: str, run_id: str) -> str:
    """The id of the experiment the run is in."""
    return _client(tracking_uri).get_run(run_id).info.experiment_id


def run_page(ui: str, experiment: str | None, run_id: str) -> str:
    """The address of the run's page in the MLflow UI at ``ui``, in its "Model training" view: MLflow 3's UI opens
    in its GenAI view (traces) until a browser has chosen otherwise, whatever the experiment's kind."""
    where = f"#/experiments/{experiment}/runs/{run_id}" if experiment else "#/experiments"
    return f"{ui.rstrip('/')}/{where}?workflowType=machine_learning"


def run_metrics(tracking_uri: str, run_id: str) -> dict[str, float]:
    """The latest value of every metric of a run, under the loop's names (``test_accuracy``, ``valid_macro_f1``)."""
    return {loop_name(k): v for k, v in _client(tracking_uri).get_run(run_id).data.metrics.items()}


def data_params(data: dict[str, Any]) -> dict[str, Any]:
    """The run parameters that describe the data the loop trains on (``data``: :func:`nre_ray.run.runner.trainer_data`):
    vocabulary size, number of classes and rows per split."""
    vocab = data["vocab"]
    return {"data.vocab_size": len(vocab["tokens"] if isinstance(vocab, dict) else vocab),
            "data.num_classes": len(data["labels"]), **{f"data.{name}_rows": n for name, n in data["rows"].items()}}


#: The columns of a record of the sentence task, (MLflow type, name): the schema its dataset inputs show.
SENTENCE_COLUMNS = (("string", "sentence"), ("string", "head"), ("long", "head_offset"), ("string", "tail"),
                    ("long", "tail_offset"), ("string", "relation"))


def split_datasets(prepared: Any, columns: tuple[tuple[str, str], ...] = SENTENCE_COLUMNS) -> list[DatasetInput]:
    """The splits as MLflow dataset inputs (what the runs table's Dataset column shows): name ``<folder>/<split>``,
    source (the file's path or URI), digest, rows and the schema of a record (``columns``: (MLflow type, name), the
    task's :attr:`~nre_ray.tasks.base.Task.record_columns`). The digest identifies the split as training saw it:
    the input files' bytes and the preprocessing settings (the cache key) and the split's name."""
    from mlflow.entities import Dataset, DatasetInput, InputTag
    from mlflow.types import ColSpec, Schema

    schema = Schema([ColSpec(kind, name) for kind, name in columns])
    key = Path(prepared.cache_dir).name if prepared.cache_dir else ""
    inputs = []
    for split, rows in prepared.splits.items():
        source = prepared.sources.get(split) or prepared.sources.get("train", "")
        uri = str(source)
        folder = uri.rstrip("/").rsplit("/", 2)[-2] if "/" in uri else "data"
        digest = hashlib.sha256(f"{key}:{split}".encode()).hexdigest()[:8]
        scheme = storage.scheme(uri) or "local"
        dataset = Dataset(name=f"{folder}/{split}", digest=digest, source_type=scheme,
                          source=json.dumps({"uri": uri}), schema=json.dumps({"mlflow_colspec": schema.to_dict()}),
                          profile=json.dumps({"num_rows": len(rows)}))
        inputs.append(DatasetInput(dataset, tags=[InputTag("mlflow.data.context", split)]))
    return inputs


_LOG_INPUTS_TRIES = 3


def log_datasets(tracking_uri: str, run_id: str, prepared: Any,
                 columns: tuple[tuple[str, str], ...] = SENTENCE_COLUMNS) -> None:
    """Log the splits (:func:`split_datasets`, records of ``columns``) as the run's dataset inputs, those it does not
    have yet.

    A dataset is the experiment's, shared by its runs: when another run on the same inputs logs it at the same moment,
    MLflow's insert of it can fail (sqlite: ``UNIQUE constraint failed``; the whole call is undone), and the next try
    links the dataset that run logged."""
    from mlflow.exceptions import MlflowException

    client = _client(tracking_uri)
    for attempt in range(_LOG_INPUTS_TRIES):
        have = {(d.dataset.name, d.dataset.digest) for d in client.get_run(run_id).inputs.dataset_inputs}
        fresh = [d for d in split_datasets(prepared, columns) if (d.dataset.name, d.dataset.digest) not in have]
        if not fresh:
            return
        try:
            client.log_inputs(run_id, datasets=fresh)
            return
        except MlflowException:
            if attempt == _LOG_INPUTS_TRIES - 1:  # not that race: the same error each time
                raise


def link_model_metrics(tracking_uri: str, run_id: str, model_id: str, epoch: int) -> int:
    """Link the scores of the logged model (the checkpoint of ``epoch``) to it, each with the split it was measured
    on: the test scores and the validation scores of that epoch. MLflow's model page lists them. The run's own
    metric history is unchanged (the same points, now also linked). Returns how many were linked."""
    from mlflow.entities import Metric

    client = _client(tracking_uri)
    run = client.get_run(run_id)
    splits = {next((t.value for t in d.tags if t.key == "mlflow.data.context"), None): d.dataset
              for d in run.inputs.dataset_inputs}
    linked = []
    for name in sorted(run.data.metrics):
        if name.startswith(TEST):
            split, step = "test", 0
        elif name.startswith(CURVES + "valid_"):
            split, step = "valid", epoch
        else:
            continue
        dataset = splits.get(split)
        for m in client.get_metric_history(run_id, name):
            if m.step == step:
                linked.append(Metric(name, m.value, m.timestamp, m.step, model_id=model_id,
                                     dataset_name=dataset.name if dataset else None,
                                     dataset_digest=dataset.digest if dataset else None))
    if linked:
        client.log_batch(run_id, metrics=linked)
    return len(linked)


def discard_unfinished_models(tracking_uri: str, run_id: str, model_id: str | None = None) -> int:
    """Delete the run's logged models that never became READY: a model whose logging was cut short (Ctrl-C, a killed
    driver) is left PENDING by MLflow and would show next to the run's real model. ``model_id``: only that one (the
    model being logged). Returns how many were deleted."""
    from mlflow.entities import LoggedModelStatus

    client = _client(tracking_uri)
    if model_id is not None:
        unfinished = [client.get_logged_model(model_id)]
    else:
        unfinished = client.search_logged_models([experiment_id(tracking_uri, run_id)],
                                                 filter_string=f"source_run_id = '{run_id}'")
    unfinished = [m for m in unfinished if m.status != LoggedModelStatus.READY]
    for model in unfinished:
        client.delete_logged_model(model.model_id)
    return len(unfinished)


def attach_model(tracking_uri: str, run_id: str, model_id: str, epoch: int) -> int:
    """Record the logged model ``model_id`` (the checkpoint of ``epoch``) as the run's output (the runs table's
    Models column) and link its scores to it (:func:`link_model_metrics`). Returns how many scores were linked."""
    from mlflow.entities import LoggedModelOutput

    _client(tracking_uri).log_outputs(run_id, [LoggedModelOutput(model_id, step=epoch)])
    return link_model_metrics(tracking_uri, run_id, model_id, epoch)


__all__ = [
    "MlflowTracker",
    "Tracker",
    "attach_model",
    "data_params",
    "discard_unfinished_models",
    "download_model",
    "end_run",
    "experiment_id",
    "find_run",
    "link_model_metrics",
    "log_datasets",
    "loop_name",
    "make_tracker",
    "metric_history",
    "metric_steps",
    "mlflow_metrics",
    "mlflow_name",
    "mlflow_settings",
    "reopen_run",
    "resolve_tracking_uri",
    "run_metrics",
    "run_page",
    "run_params",
    "run_status",
    "search_runs",
    "set_run_tags",
    "source_tags",
    "split_datasets",
    "start_run",
    "store_errors",
    "tracking_uri_problem",
    "warm_up",
]


def registered_version(name: str, version_or_alias: str, tracking_uri: str) -> tuple[str, str | None]:
    """The version number and source run id of the registered model ``name`` at ``version_or_alias`` (a version
    number, or an alias). MLflow's error is left to the caller when there is none."""
    client = _client(tracking_uri)
    if version_or_alias.isdigit():
        found = client.get_model_version(name, version_or_alias)
    else:
        found = client.get_model_version_by_alias(name, version_or_alias)
    return str(found.version), found.run_id

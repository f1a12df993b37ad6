"""The steps of a training run: check the settings, start or join Ray, preprocess, open the MLflow run, fit with
TorchTrainer, log the model, summarise (``python -m nre_ray.train`` runs them; a sweep's trials reuse them).

The driver holds no tensor code: preprocessing runs in Ray Data (``nre_ray.data.pipeline``), the loop in the workers
(``nre_ray.run.loop``), tracking goes to MLflow (``nre_ray.tracking``).
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import functools
import hashlib
import json
import logging
import os
import secrets
import shutil
import signal
import subprocess
import tempfile
import threading
import time
import traceback
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nre_ray import storage as fs
from nre_ray.cluster.ray_private import elastic_trainer, ray_output_to
from nre_ray.cluster.session import (
    Resources,
    UsageError,
    check_address,
    check_shared_paths,
    cluster,
    local_cluster,
    placement_failed,
    quiet_env_for_workers,
    ray_phase,
    resolve_address,
    restore_cwd,
    root_cause,
    set_placement_timeout,
    size_workers,
    start_ray,
    torch_config,
)
from nre_ray.config import Config
from nre_ray.core import buildonce, console, tempfiles
from nre_ray.core.redact import redact
from nre_ray.data.errors import DataError, Problem
from nre_ray.tracking import store as tracking

log = logging.getLogger("nre_ray")


def _git_commit() -> str | None:
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5,
                             cwd=Path(__file__).parent)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def _existing_checkpoints(storage: str, run_name: str) -> list[str]:
    """Checkpoint folders of the run: all of them on a local path; the latest registered one for a URI (s3://,
    gs://, ... and file://), from Ray Train's record of the run."""
    if fs.scheme(storage):
        latest = _latest_checkpoint(storage, run_name)
        return [latest.path.rstrip("/").rsplit("/", 1)[-1]] if latest is not None else []
    folder = Path(storage) / run_name
    return sorted(p.name for p in folder.glob("checkpoint_*")) if folder.is_dir() else []


def _run_to_resume(cfg: Config, run_name: str, storage: str, tracking_uri: str, existing: list[str]) -> Any:
    """The MLflow run that ``--resume`` continues (an ``mlflow.entities.Run``); UsageError if there is none."""
    with tracking.store_errors(tracking_uri):  # the command's first MLflow call
        found = tracking.find_run(tracking_uri, cfg.run.experiment_name, run_name, storage)
    if found is None:
        has = f"{storage.rstrip('/')}/{run_name} has checkpoints ({', '.join(existing[:3])}) but " if existing else ""
        raise UsageError(f"--resume: {has}no MLflow run named {run_name!r} with storage {storage} is in experiment "
                         f"{cfg.run.experiment_name!r} at {tracking_uri}. Give the --run-name, --storage-path, "
                         "--experiment-name and --tracking-uri the run was started with, or start a new run "
                         "without --resume.")
    if found.info.status == "FINISHED":
        raise UsageError(f"--resume: run {run_name!r} (MLflow run {found.info.run_id}) has already finished; there "
                         "is nothing to continue. Start a new run with another --run-name.")
    return found


def _latest_result(storage: str, run_name: str) -> Any:
    """Ray Train's record of the run (``ray.train.Result``: ``.checkpoint`` is the latest registered checkpoint, the
    one a restart or ``--resume`` starts from, and ``.metrics`` its metrics), or None when there is none yet."""
    import ray.train

    try:
        return ray.train.Result.from_path(f"{storage.rstrip('/')}/{run_name}")
    except RuntimeError:  # no run folder, or no checkpoint registered yet: Ray Train starts from scratch
        return None


def _latest_checkpoint(storage: str, run_name: str) -> Any:
    """The checkpoint Ray Train restores when the run starts again (the latest one it registered), or None."""
    result = _latest_result(storage, run_name)
    return result.checkpoint if result is not None else None


def check_inputs(cfg: Config, task: Any = None) -> None:
    """Before Ray starts: the data folder has a training file of ``task`` (default: the data folder's,
    :func:`nre_ray.tasks.lookup.task_for`), each explicit local input file exists, and the folder of
    ``--summary-json`` exists (DataError / UsageError naming the path; URIs are checked by the preprocessing, in
    their store)."""
    # deferred: importing it loads torch, pandas, numpy
    from nre_ray.tasks.lookup import task_for

    if cfg.data.data_dir:
        (task or task_for(cfg.data.data_dir, bags=cfg.model.bag_aggregator is not None)).check_data(cfg.data)
    missing = [Problem(value, None, None, f"--{key}: file not found")
               for key in ("train", "valid", "test", "labels")
               if (value := getattr(cfg.data, key)) and not fs.is_uri(value) and not Path(value).is_file()]
    if missing:
        raise DataError(missing, hint="Check the path (relative paths start from the working directory "
                                      f"{os.getcwd()}).")
    if cfg.run.summary_json and not fs.is_uri(cfg.run.summary_json) \
            and not Path(cfg.run.summary_json).absolute().parent.is_dir():
        raise UsageError(f"--summary-json {cfg.run.summary_json}: the folder "
                         f"{Path(cfg.run.summary_json).absolute().parent} does not exist")


@dataclass
class Target:
    """Where a run goes: its name, checkpoint storage, MLflow store, the MLflow run ``--resume`` continues, and what
    it trains: the task of its data (:func:`nre_ray.tasks.lookup.task_for`), by name."""

    run_name: str
    storage: str
    tracking_uri: str
    resumed: Any = None  # an mlflow.entities.Run with --resume
    task: str = "sentence"  # nre_ray.tasks.lookup.DEFAULT_TASK (spelled out: importing it here would load torch)


@contextlib.contextmanager
def claim_run(cfg: Config, what: str = "run") -> Iterator[None]:
    """Hold the run's name for as long as the command runs: a second command on this machine that names the same
    ``--run-name`` on the same ``--storage-path`` meanwhile is refused (UsageError) before it touches anything, as
    both would write into one folder. Default names are new for every run (:func:`default_run_name`); so nothing
    to hold."""
    if not cfg.run.run_name:
        yield
        return
    folder = fs.join(fs.absolute(cfg.run.storage_path or "ray_results"), cfg.run.run_name)
    try:
        with buildonce.turn(folder, wait=False):
            yield
    except buildonce.Busy:
        raise UsageError(f"{what} {cfg.run.run_name!r} is running now in another command on this machine ({folder}); "
                         "nothing was touched. Wait for it to end (then --resume continues it), or choose another "
                         "--run-name.") from None


def run(cfg: Config, started: float | None = None) -> dict[str, Any]:
    """Train once; returns the summary dict (also written to ``--summary-json``).

    ``started``: Unix time the command started (default: now); start-up times logged to MLflow count from it.
    """
    with claim_run(cfg):
        return _run(cfg, started)


def _run(cfg: Config, started: float | None) -> dict[str, Any]:
    """:func:`run`, its name held."""
    started = started or time.time()
    imported = time.time() - started  # imports and config
    out = console.get()
    with out.phase("setup", "checking the settings, the inputs and the run's storage") as step:
        check_scale(cfg)
        target = resolve_target(cfg)  # checks first: nothing has started yet if one fails
        log_path = run_log_path(cfg, target)
        if log_path:
            step.note(f"Ray's own messages (its processes' output, tracebacks) go to {log_path}, and to the MLflow "
                      f"run (logs/{RUN_LOG}) when it ends")
        step.done(f"run {target.run_name!r}; checkpoints in {target.storage}")
    with _ray_output_logged(log_path) as run_log:
        return _train(cfg, target, started, imported, run_log)


def _train(cfg: Config, target: Target, started: float, imported: float, run_log: console.RunLog | None
           ) -> dict[str, Any]:
    """The steps of :func:`run` after the setup."""
    out = console.get()
    warm = warm_up(target.tracking_uri)  # MLflow and torch imported while Ray starts
    marks = [time.perf_counter()]  # start-up marks: Ray start, preprocessing (logged as startup_*_s)
    run_id = target.resumed.info.run_id if target.resumed is not None else None
    try:
        with out.phase("ray", ray_phase(cfg.run.address)) as step:
            resources = connect(cfg, target, step)
        marks.append(time.perf_counter())
        with out.phase("preprocess", "reading, checking and encoding the data (Ray Data)") as step:
            prepared = prepare_data(cfg, target, step)
        marks.append(time.perf_counter())
        data = trainer_data(prepared)
        with out.phase("mlflow", f"creating the run in {redact(target.tracking_uri)}") as step:
            warm.join()
            run_id, tracker = open_tracking(cfg, target, prepared, resources.threads)
            # What was used, not what was typed, and the loop's data (the workers log nothing before their first
            # step)
            tracker.log_params({**resolved_params(cfg, target, resources), **tracking.data_params(data)})
            tracker.log_metrics({"startup_imports_s": imported, "startup_ray_s": marks[1] - marks[0],
                                 "startup_preprocess_s": marks[2] - marks[1]}, step=0)
            step.done(f"run {run_id} in experiment {cfg.run.experiment_name!r}")
    except KeyboardInterrupt:
        if run_id is not None:
            _killed_before_training(target.tracking_uri, run_id)
        raise
    events = _events_file(cfg)
    try:
        trainer = build_trainer(cfg, target, data, resources, run_id, started, events=events)
        return fit(trainer, cfg, target, run_id, events, resources, run_log)
    finally:
        if events:
            Path(events).unlink(missing_ok=True)


#: The run's log file: in its folder under a local storage path (``STORAGE/RUN/ray_output.log``), and in MLflow
#: (``logs/ray_output.log``) once the run ends.
RUN_LOG = "ray_output.log"


def run_log_path(cfg: Config, target: Target) -> str | None:
    """Where the run's log file goes (:class:`nre_ray.core.console.RunLog`): the run's folder under a local storage
    path; under a URI, a folder of this machine's temporary directory (the file reaches MLflow when the run ends). None
    under a Ray Client address (``ray://``: Ray streams its processes' output to this process another way)."""
    if resolve_address(cfg.run.address).kind == "client":
        return None
    if not fs.scheme(target.storage):
        return str(Path(target.storage) / target.run_name / RUN_LOG)
    where = hashlib.sha1(fs.join(target.storage, target.run_name).encode()).hexdigest()[:10]
    return str(Path(tempfile.gettempdir()) / f"nre_ray-{os.getuid()}" / "logs" / f"{target.run_name}-{where}.log")


@contextlib.contextmanager
def _ray_output_logged(path: str | None) -> Iterator[console.RunLog | None]:
    """The run's log file, open for the block, with what Ray forwards from its processes going there and not to the
    console (:func:`nre_ray.cluster.ray_private.ray_output_to`); None (and Ray's output on the console) without a
    path."""
    if path is None:
        yield None
        return

    run_log = console.RunLog(path)
    run_log.write("python -m nre_ray.train: Ray's messages from here on")
    try:
        with ray_output_to(run_log):
            yield run_log
    finally:
        run_log.close()


def _killed_before_training(tracking_uri: str, run_id: str) -> None:
    """Ctrl-C before the workers started: the run this command holds (the one --resume continues, which a killed
    command left RUNNING, or the one it has just created) is marked KILLED, as a Ctrl-C during training marks it, and
    not left RUNNING for a command that no longer runs. Best effort: the interrupt is what the user sees."""
    with contextlib.suppress(Exception):
        if tracking.run_status(tracking_uri, run_id) == "RUNNING":
            tracking.end_run(tracking_uri, run_id, "KILLED")


def _events_file(cfg: Config) -> str | None:
    """A new file for the Ray Train controller's events to the console (:mod:`nre_ray.tracking.callback`), or None
    under a Ray Client address (``ray://``: the controller's node is not this machine). Temporaries that killed
    commands left in the temporary folder are removed first (:mod:`nre_ray.core.tempfiles`)."""
    if resolve_address(cfg.run.address).kind == "client":
        return None
    tempfiles.remove_stale()
    handle, path = tempfile.mkstemp(prefix=tempfiles.prefix("events"), suffix=".jsonl")
    os.close(handle)
    return path


def default_run_name(prefix: str) -> str:
    """A new run name, ``<prefix>-<date>-<time>-<6 random hex digits>`` (``cnn-20261201-120638-402817``): runs started
    in the same second, in one folder or on one storage path, still get names (and checkpoint folders) of their
    own."""
    return f"{prefix}-{_dt.datetime.now():%Y%m%d-%H%M%S}-{secrets.token_hex(3)}"


def resolve_target(cfg: Config) -> Target:
    """Name the run, resolve the storage path and tracking URI, and find the MLflow run ``--resume`` continues.
    Refuses to overwrite an existing run's checkpoints and an address Ray cannot join. Makes local input paths
    absolute (workers change directory); URIs stay as they are."""
    # deferred: importing it loads pandas, pyarrow, numpy
    from nre_ray.data.pipeline import DEFAULT_STORAGE, cache_places

    # deferred: importing it loads torch, pandas, numpy
    from nre_ray.tasks.lookup import task_for

    check_address(cfg.run.address)  # before anything is created: the run's log, its folder, the MLflow run
    task = task_for(cfg.data.data_dir, bags=cfg.model.bag_aggregator is not None)  # the spine asks it from here on
    task.check_settings(cfg)
    check_inputs(cfg, task)
    default = task.default_metric(cfg.data.negative_label)
    if cfg.train.select_metric is None and default != cfg.select_metric:
        cfg.train.select_metric = default  # the task's own (the sentence task's is Config's default)
    run_name = cfg.run.run_name or default_run_name(cfg.model.model)
    storage = fs.absolute(cfg.run.storage_path or DEFAULT_STORAGE)
    try:
        fs.check_bucket(storage)  # before any MLflow run or Ray: else the workers' first checkpoint fails on it
    except fs.StorageError as err:
        raise UsageError(f"--storage-path {err}") from None
    existing = _existing_checkpoints(storage, run_name)
    if existing and not cfg.run.resume:
        raise UsageError(f"run {run_name!r} already has checkpoints in {fs.join(storage, run_name)} "
                         f"({', '.join(existing[:3])}); nothing was overwritten. Continue that run with --resume, "
                         "or choose another --run-name.")
    tracking_uri = tracking.resolve_tracking_uri(cfg.run.tracking_uri)
    resumed = _run_to_resume(cfg, run_name, storage, tracking_uri, existing) if cfg.run.resume else None
    if cfg.model.embeddings:
        # deferred: importing it loads torch, numpy
        from nre_ray.models.pretrained import check_dim

        cfg.model.embeddings = fs.absolute(cfg.model.embeddings)
        try:
            check_dim(cfg.model.embeddings, cfg.model.word_dim)
        except ValueError as err:
            raise UsageError(str(err)) from None
    if cfg.model.model == "bert":
        cfg.model.pretrained = cfg.model.pretrained_source()
    # The one rule of every command that preprocesses (data inspect too): under an s3:// storage path, published
    # there; under a local one mounted on every node, there itself (every node reads it, any node can build it).
    cfg.data.cache_dir, _ = cache_places(cfg.data.cache_dir, storage, cfg.run.allow_local_storage)
    return Target(run_name, storage, tracking_uri, resumed, task.name)


def warm_up(tracking_uri: str) -> threading.Thread:
    """Start a thread that imports MLflow (and opens its store: :func:`nre_ray.tracking.store.warm_up`), then torch,
    which the driver needs after Ray has started: starting Ray mostly waits on Ray's own processes. Join it before using
    MLflow. (Neither imports Ray, nor Ray them: the two threads' imports never wait on each other in a cycle.)"""
    def work() -> None:
        tracking.warm_up(tracking_uri)
        try:
            import torch  # noqa: F401
        except ImportError:  # reported where it is needed
            pass

    thread = threading.Thread(target=work, name="nre_ray-warm-up", daemon=True)
    thread.start()
    return thread


def check_scale(cfg: Config) -> None:
    """Before Ray starts: UsageError for workers the local Ray this command would start can never hold (too many
    for the machine's CPUs, ``--use-gpu`` without a GPU), by the sizing of :func:`connect` over
    :func:`nre_ray.cluster.session.local_cluster`. Joining a cluster, :func:`connect` refuses them once joined."""
    ahead = local_cluster(cfg.run.address, cfg.train.use_gpu)
    if ahead is not None:
        size_run_workers(ahead, cfg)


def size_run_workers(info: Any, cfg: Config) -> Resources:
    """:func:`nre_ray.cluster.session.size_workers` for the run's workers: ``--num-workers N``'s N; for an elastic
    run, sized for MAX where the cluster (with what its autoscaler may add) can ever hold MAX, else for MIN, with
    MIN's refusal when even MIN cannot be held."""
    size = functools.partial(size_workers, info, use_gpu=cfg.train.use_gpu, cpus_per_worker=cfg.train.cpus_per_worker,
                             wait=cfg.train.placement_timeout)
    try:
        return size(num_workers=cfg.train.num_workers)
    except UsageError:
        if not cfg.elastic:
            raise
        return size(num_workers=cfg.train.min_workers)


def connect(cfg: Config, target: Target, step: console.Phase | None = None) -> Resources:
    """Start or join Ray and size the workers from what the cluster has or its autoscaler can add; check that the
    storage path and tracking URI reach every node; work out how long the worker group may wait to be placed.
    ``step``: the console phase that says so."""
    step = step or console.Phase(console.get(), "ray", "connecting")
    start_ray(cfg.run.address)
    info = cluster()
    resources = size_run_workers(info, cfg)
    for warning in check_shared_paths(info, target.storage, target.tracking_uri, cfg.run.allow_local_storage):
        step.note(f"warning: {warning}")
    step.done(f"{info.describe()}; {worker_count(cfg)} worker(s), {resources.per_worker} each")
    return resources


def cache_on_every_node(cfg: Config, storage: str) -> bool:
    """The preprocessing cache is on every node: under a local ``--storage-path`` that ``--allow-local-storage``
    says is mounted at the same path on every node."""
    if not cfg.run.allow_local_storage or fs.is_uri(storage) or not cfg.data.cache_dir:
        return False
    return Path(cfg.data.cache_dir).absolute().is_relative_to(Path(storage).absolute())


def prepare_data(cfg: Config, target: Target, step: console.Phase | None = None) -> Any:
    """Preprocess with Ray Data (cached; under the storage path too when that is remote) and say what came out
    (``step``: the console phase that says so). Checks that ``--select-metric`` exists for these labels."""
    # deferred: importing it loads pandas, pyarrow, numpy
    from nre_ray.data.pipeline import cache_places

    # deferred: importing it loads torch, pandas, numpy
    from nre_ray.tasks.lookup import task_named

    step = step or console.Phase(console.get(), "preprocess", "preprocessing")
    task = task_named(target.task)
    pretrained = cfg.model.pretrained if cfg.model.model == "bert" else None
    _, shared = cache_places(cfg.data.cache_dir, target.storage, cfg.run.allow_local_storage)
    # several nodes, or an autoscaler that may add some (tasks may land there): with a shared cache in an object
    # store the preprocessing tasks run on any node and build in the store, else on the driver's node
    prepared = task.prepare(cfg.data, cfg.train.seed, pretrained, shared_cache=shared,
                            on_every_node=cache_on_every_node(cfg, target.storage), multi_node=cluster().multi_node)
    rows = ", ".join(f"{name} {len(split)}" for name, split in prepared.splits.items())
    step.done(f"{rows} {task.unit}; {len(prepared.labels)} labels; vocabulary {len(prepared.vocab)}"
              + ("; reused from the cache" if prepared.cache_hit else "")
              + ("; valid split drawn from train" if prepared.valid_from_train else ""))
    for warning in prepared.audit.get("warnings", []):
        step.note(f"data warning: {warning}")
    if "valid" not in prepared.splits:
        raise UsageError("no validation rows: add a valid file or more training rows per class.")
    check_select_metric(cfg, prepared.labels, task)
    return prepared


def check_select_metric(cfg: Config, labels: list[str], task: Any) -> None:
    """UsageError unless the selection metric is one ``task`` reports on these labels, saying why not
    (:meth:`~nre_ray.tasks.base.Task.metric_names`, :meth:`~nre_ray.tasks.base.Task.why_no_metric`)."""
    available = task.metric_names(labels, cfg.data.negative_label)
    if cfg.select_metric not in available:
        why = task.why_no_metric(cfg.select_metric, labels, cfg.data.negative_label)
        raise UsageError(f"--select-metric {cfg.select_metric}: this data has no such score ({why}); choose one "
                         f"of {', '.join(available)}")


def worker_count(cfg: Config) -> str:
    """``--num-workers`` as given: ``N``, or ``MIN-MAX`` for an elastic run."""
    return f"{cfg.train.min_workers}-{cfg.train.num_workers}" if cfg.elastic else str(cfg.train.num_workers)


def placement_tags(cfg: Config, threads: int) -> dict[str, str]:
    """The run tags that say where it trained: workers, device, torch threads per worker (a run's, a trial's)."""
    return {"workers": worker_count(cfg), "device": "gpu" if cfg.train.use_gpu else "cpu",
            "threads_per_worker": str(threads)}


def resolved_params(cfg: Config, target: Target, resources: Resources | None = None) -> dict[str, Any]:
    """``cfg.flat()`` with what the run used where the command left a value to be worked out: the run name, storage
    path, tracking URI, data folder and format, cache folder, selection metric, layers and heads of the model, CPUs per
    worker and placement timeout. :func:`open_tracking` logs them before the loop logs the rest (MLflow params are
    written once)."""
    params = cfg.flat()
    params.update({"run.run_name": target.run_name, "run.storage_path": target.storage,
                   "run.tracking_uri": target.tracking_uri, "train.select_metric": cfg.select_metric,
                   "data.cache_dir": str(Path(cfg.data.cache_dir or ".nre_ray_cache").absolute())})
    if not cfg.run.address:
        params["run.address"] = resolve_address(None).given or "local (a Ray started by the command)"
    from nre_ray.data.pipeline import sample_dir  # pandas and pyarrow: when a run starts, not for --help

    if not cfg.data.data_dir and not cfg.data.train:
        params["data.data_dir"] = str(sample_dir())
    if not cfg.data.format:
        from nre_ray.tasks.lookup import task_named  # torch: when a run starts, not for --help

        try:
            params["data.format"] = task_named(target.task).format_of(cfg.data)
        except (DataError, fs.StorageError, OSError):  # the run has read it; a param is not worth a failure
            pass
    model = cfg.model.model
    if model in ("bilstm", "transformer") and cfg.model.num_layers is None:
        params["model.num_layers"] = 1 if model == "bilstm" else 2  # models.registry's defaults
    if model == "transformer" and cfg.model.num_heads is None:
        from nre_ray.models.transformer import default_num_heads  # torch: when a run starts, not for --help

        params["model.num_heads"] = default_num_heads(cfg.model.hidden_size)
    if resources is not None and cfg.train.cpus_per_worker is None:
        params["train.cpus_per_worker"] = resources.per_worker.get("CPU")
    if cfg.train.placement_timeout is None and resources is not None and resources.placement_timeout is not None:
        params["train.placement_timeout"] = resources.placement_timeout  # by the cluster's kind (session.size_workers)
    return params


def open_tracking(cfg: Config, target: Target, prepared: Any, threads: int) -> tuple[str, Any]:
    """Create the MLflow run (or reopen the one ``--resume`` continues, after checking the checkpoint fits) and log
    the data's sources, audit and rejected rows. ``threads``: torch threads per worker (a tag). Returns the run id
    and a tracker for it."""
    # deferred: importing it loads pandas, pyarrow, numpy
    from nre_ray.data.audit import write_audit

    resumed = target.resumed
    resume_tags, missing_metrics = (_check_resume(cfg, target.storage, target.run_name, prepared, resumed,
                                                  target.tracking_uri) if resumed is not None else ({}, {}))
    tags = {"nre_ray.run_name": target.run_name, **placement_tags(cfg, threads), "storage_path": target.storage}
    commit = _git_commit()
    if commit:
        tags["mlflow.source.git.commit"] = commit
    if resumed is None:
        with tracking.store_errors(target.tracking_uri):  # the run's first MLflow call
            run_id = tracking.start_run(target.tracking_uri, cfg.run.experiment_name, target.run_name, tags)
    else:  # the same MLflow run: the loop logs from the checkpoint's epoch on and does not log params again
        run_id = resumed.info.run_id
        tracking.reopen_run(target.tracking_uri, run_id)
        tracking.discard_unfinished_models(target.tracking_uri, run_id)  # a model logging the stop cut short
        tags.update(resume_tags, **{"nre_ray.resumes": str(int(resumed.data.tags.get("nre_ray.resumes", 0)) + 1)})
    tracker = tracking.MlflowTracker(target.tracking_uri, run_id)
    if resumed is not None:
        tracker.set_tags(tags)
        if missing_metrics:
            tracker.log_metrics(missing_metrics, step=int(missing_metrics["epoch"]))
    tracker.log_params({f"data.source.{k}": v for k, v in prepared.sources.items()})
    # deferred: importing it loads torch, pandas, numpy
    from nre_ray.tasks.lookup import task_named

    task = task_named(target.task)
    # the UI's Dataset column
    tracking.log_datasets(target.tracking_uri, run_id, prepared, task.record_columns)
    with tempfile.TemporaryDirectory(prefix=tempfiles.prefix("audit")) as folder:  # data/audit.md, data/audit.json
        for path in write_audit(prepared.audit, Path(folder), task.audit_markdown(prepared.audit)):
            tracker.log_artifact(path, "data")
    if prepared.rejected_count:
        _log_rejected(prepared, target, tracker)
    return run_id, tracker


def _log_rejected(prepared: Any, target: Target, tracker: Any) -> None:
    """``--on-bad-rows skip``: the rejected rows, with their reasons, in the run's folder of the storage path
    (``<storage>/<run name>/rejected_rows.csv``, local or in an object store) and in MLflow
    (``data/rejected_rows.csv``): written in a private temporary folder, nothing in the working directory, so runs at
    once never write over each other's."""
    rejected_path = fs.join(target.storage, target.run_name, "rejected_rows.csv")
    with tempfile.TemporaryDirectory(prefix=tempfiles.prefix("rejected")) as folder:
        local = Path(folder) / "rejected_rows.csv"
        if prepared.rejected_csv:  # every rejected row (prepared.rejected holds the first ones)
            shutil.copyfile(prepared.rejected_csv, local)
        else:
            prepared.rejected.to_csv(local, index=False)
        tracker.log_artifact(local, "data")
        fs.upload(local, rejected_path)
    tracker.log_metrics({"rejected_rows": prepared.rejected_count}, step=0)
    console.get().line(f"data: skipped {prepared.rejected_count} bad rows, listed in {rejected_path}")


def trainer_data(prepared: Any, splits: tuple[str, ...] | None = None) -> dict[str, Any]:
    """What the loop needs of the preprocessed data (its ``data``): where the splits' files are (``splits``: which
    of them, default all), the vocabulary, labels, positions and pretrained assets. Small: no arrays."""
    # deferred: importing it loads torch, numpy
    from nre_ray.run.checkpoint import pretrained_assets

    # Where the splits are, not their arrays: each worker memory-maps the cache folder's files (or a per-node copy of
    # the shared cache) and reads only its shard's rows. Only small things go through the object store.
    return {
        "cache": {"dir": str(Path(prepared.cache_dir).absolute()), "shared": prepared.shared_cache_dir,
                  "splits": [s for s in prepared.splits if splits is None or s in splits]},
        "rows": {s: len(rows) for s, rows in prepared.splits.items() if splits is None or s in splits},
        "vocab": prepared.vocab.as_json(), "labels": prepared.labels, "num_positions": prepared.num_positions,
        # the tokenizer and config, and the task's own files, that every checkpoint carries
        "assets": {**(pretrained_assets(prepared.pretrained_dir) or {}), **prepared.assets} or None,
    }


#: How often an elastic run looks for room to grow (Ray's default is 60 s); a grow restarts the worker group from
#: the latest checkpoint, so growing more often than this would redo work for little gain.
ELASTIC_RESIZE_INTERVAL_S = float(os.environ.get("NRE_RAY_ELASTIC_RESIZE_INTERVAL_S", "60"))
#: Seconds past a preemption notice's deadline before Ray restarts the run (FailureConfig.preemption_grace_s) when the
#: node outlives its deadline (once it is gone, the workers left fail at their next all-reduce and Ray restarts at
#: once); the restart sizes the worker group without the node either way (ray_private.elastic_trainer).
PREEMPTION_GRACE_S = 10.0
#: Times an elastic run tries again to place its worker group (each waits --placement-timeout), sized anew each time
#: (a node lost between the sizing and the placement).
ELASTIC_PLACEMENT_RETRIES = 3


def failure_config(cfg: Config) -> Any:
    """Ray Train's FailureConfig of a run (see :func:`build_trainer`). The grace past a preemption's deadline
    (:data:`PREEMPTION_GRACE_S`) where the installed Ray has it: Ray 2.59's FailureConfig takes no
    ``preemption_grace_s`` (a TypeError there), and tears the survivors down at the deadline."""
    import inspect

    import ray.train

    grace = ({"preemption_grace_s": PREEMPTION_GRACE_S}
             if "preemption_grace_s" in inspect.signature(ray.train.FailureConfig).parameters else {})
    return ray.train.FailureConfig(
        max_failures=cfg.train.max_failures,
        controller_failure_limit=ELASTIC_PLACEMENT_RETRIES if cfg.elastic else 0,
        max_preemption_failures=-1 if cfg.train.max_preemptions is None else cfg.train.max_preemptions,
        **grace)


def build_trainer(cfg: Config, target: Target, prepared: Any, resources: Resources, run_id: str,
                  started: float, extra_callbacks: tuple[Any, ...] = (), events: str | None = None) -> Any:
    """The TorchTrainer: the loop, its data and task (the one the data folder is in: :func:`nre_ray.tasks.lookup.
    task_for`), the workers' resources, checkpoints kept by the loop's selection rank,
    and the per-epoch MLflow logging from the controller. ``prepared``: the preprocessing result, or the dict of
    :func:`trainer_data` (a sweep's trial); ``resources``: the workers' resources and placement timeout;
    ``extra_callbacks``: more Ray Train callbacks (a sweep's report to Tune); ``events``: the file the controller
    tells the driver's console about the workers and epochs in (None: the controller prints the epoch lines
    itself)."""
    import ray
    import ray.train
    from ray.train.torch import TorchTrainer

    # deferred: importing it loads ray, torch, pandas, pyarrow, numpy
    from nre_ray.run.loop import SELECTION_RANK, train_loop_per_worker

    # deferred: importing it loads torch, pandas, numpy
    from nre_ray.tasks.lookup import task_named

    # deferred: importing it loads ray, pandas, pyarrow, numpy
    from nre_ray.tracking.callback import HAS_WORKER_GROUP_HOOKS, ConsoleEvents, EpochMetricsLogger

    set_placement_timeout(resources.placement_timeout)
    data_ref = ray.put(prepared if isinstance(prepared, dict) else trainer_data(prepared))
    # An elastic run sizes each worker group on the nodes that can take it (not one being drained: elastic_trainer)
    trainer_cls = elastic_trainer(TorchTrainer) if cfg.elastic else TorchTrainer
    return trainer_cls(
        train_loop_per_worker,
        torch_config=torch_config(),  # on a local Ray, PyTorch's rendezvous listens on 127.0.0.1 alone
        train_loop_config={"config": cfg.to_dict(), "data": data_ref, "tracking_uri": target.tracking_uri,
                           "run_id": run_id, "threads": resources.threads,
                           "task": target.task,  # what the data is (resolve_target): the loop asks it
                           "startup": {"command": started, "fit": time.time()}},  # the loop logs startup_workers_s
        scaling_config=ray.train.ScalingConfig(
            num_workers=(cfg.train.min_workers, cfg.train.num_workers) if cfg.elastic else cfg.train.num_workers,
            use_gpu=cfg.train.use_gpu, resources_per_worker=resources.per_worker,
            **({"elastic_resize_monitor_interval_s": ELASTIC_RESIZE_INTERVAL_S} if cfg.elastic else {})),
        run_config=ray.train.RunConfig(
            name=target.run_name, storage_path=target.storage,
            checkpoint_config=ray.train.CheckpointConfig(num_to_keep=cfg.train.keep_checkpoints,
                                                         checkpoint_score_attribute=SELECTION_RANK,
                                                         checkpoint_score_order="max"),
            # A worker group not placed within --placement-timeout (set_placement_timeout) fails a fixed-size run:
            # controller_failure_limit=0 instead of Ray's default of retrying forever. An elastic run tries again
            # (ELASTIC_PLACEMENT_RETRIES), sized anew: its groups are sized on the nodes alive and not drained
            # (elastic_trainer), but a node can still go between the sizing and the placement.
            # A preemption is counted apart (--max-preemptions, -1: no limit); the grace keeps the survivors going a
            # little past the notice's deadline, so that Ray restarts once the preempted node is gone, not onto it.
            failure_config=failure_config(cfg),
            logging_config=ray.train.LoggingConfig(log_level="WARNING"),
            # each epoch once, when its checkpoint is kept
            callbacks=[EpochMetricsLogger(target.tracking_uri, run_id, events, cfg.train.epochs, cfg.select_metric,
                                          task_named(target.task).epoch_metric),
                       *([ConsoleEvents(events, cfg.train.max_failures, target.storage, _start_of(target))]
                         if events and HAS_WORKER_GROUP_HOOKS else []),
                       *extra_callbacks],
            worker_runtime_env={"env_vars": quiet_env_for_workers()},
        ),
    )


def _start_of(target: Target) -> tuple[int, int, str] | None:
    """Where a ``--resume`` starts from: epochs done, steps done of the next epoch (a mid-epoch checkpoint) and the
    checkpoint's path (None for a new run, or one without a checkpoint)."""
    # deferred: importing it loads ray, pandas, pyarrow, numpy
    from nre_ray.tracking.callback import resume_point

    result = _latest_result(target.storage, target.run_name) if target.resumed is not None else None
    if result is None or result.checkpoint is None:
        return None
    return *(resume_point(result.metrics or {}) or (0, 0)), fs.with_scheme(result.checkpoint.path, target.storage)


def fit(trainer: Any, cfg: Config, target: Target, run_id: str, events: str | None = None,
        resources: Resources | None = None, run_log: console.RunLog | None = None) -> dict[str, Any]:
    """Run the trainer (showing the workers and epochs on the console from the controller's ``events``), log the
    selected checkpoint as the MLflow model, close the MLflow run with its status, and return the summary. A
    failure's full text goes to ``run_log`` (the run's log file), which is logged to the MLflow run at the end."""
    import ray.train

    # deferred: importing it loads ray, torch, pandas, pyarrow, numpy
    from nre_ray.run.loop import SELECTION_RANK
    from nre_ray.tasks.lookup import task_named

    out = console.get()
    task = task_named(target.task)
    workers = f"{worker_count(cfg)} worker(s)" + (f", {resources.per_worker} each" if resources else "")
    if resources is not None and resources.waits:  # the workers phase ends when the nodes have come
        workers += (f"; the alive nodes cannot hold them yet: waiting up to {resources.placement_timeout:g} s "
                    "(--placement-timeout) for the autoscaler to add nodes")
    view = console.TrainingView(out, workers, cfg.train.epochs, cfg.select_metric, cfg.train.patience,
                                also=task.epoch_metric) if events else None
    status, cwd = "FAILED", os.getcwd()
    try:
        with console.EventFollower(events, view.handle) if view else contextlib.nullcontext():
            with _sigint_restored():
                result = trainer.fit()
        restore_cwd(cwd)
        if view:
            view.close()
        # the loop's own choice: the first epoch with the best validation score (see loop.SELECTION_RANK)
        best = result.get_best_checkpoint(metric=SELECTION_RANK, mode="max") if result.best_checkpoints else None
        model = {}
        no_model = task.unsupported("pyfunc")
        if best is not None and cfg.run.log_model and no_model:
            out.line(f"model: {no_model}; the best checkpoint is {fs.with_scheme(best.path, target.storage)}")
        elif best is not None and cfg.run.log_model:
            with out.phase("model", "logging the best checkpoint as the run's MLflow model") as step:
                model = _log_model(best, cfg, target.tracking_uri, run_id)
                step.done(model["model_uri"] or "done")
        status = "FINISHED"
    except (KeyboardInterrupt, SystemExit):
        # fit() installs Ray Train's SIGINT handler: it aborts the controller (which stops the workers) and leaves
        # fit with SystemExit. A SIGTERM to the driver also arrives as SystemExit (Ray's driver handler).
        status = "KILLED"
        raise KeyboardInterrupt from None
    except ray.train.TrainingFailedError as err:
        if run_log is not None:
            run_log.write("".join(traceback.format_exception(err)))
        if placement_failed(err):
            within = f"{resources.placement_timeout:g} s" if resources and resources.placement_timeout else "the time"
            raise UsageError(f"the {cfg.train.num_workers} workers ({cfg.train.num_workers} x "
                             f"{trainer.scaling_config.resources_per_worker}) could not be placed within "
                             f"{within} (--placement-timeout): the cluster did not get the nodes in time. Check "
                             "`ray status` (pending or failed nodes), raise --placement-timeout, or ask for fewer "
                             "workers.") from None
        said = "training failed (the line above says what was lost)" if view and view.stopped \
            else f"training failed: {root_cause(err)}"
        raise UsageError(said + (f"; the full error is in {run_log.path}" if run_log else "")) from None
    finally:
        if view:
            view.close(failed=True)  # (nothing if closed above)
        if run_log is not None:
            _log_run_log(run_log, target.tracking_uri, run_id)
        tracking.end_run(target.tracking_uri, run_id, status)

    metric = f"valid_{cfg.select_metric}"
    best_metrics = next((m for c, m in result.best_checkpoints if best and c.path == best.path), {})
    logged = tracking.run_metrics(target.tracking_uri, run_id)
    last = result.metrics or {}
    epochs_run = int(last.get("epoch", 0))
    stopped = console.stop_reason(epochs_run, int(last.get("best_epoch", 0)), cfg.train.epochs, cfg.train.patience,
                                  cfg.select_metric) if last else None
    if stopped:
        tracking.set_run_tags(target.tracking_uri, run_id, {"nre_ray.stop_reason": stopped})
    return {
        "run_id": run_id, "run_name": target.run_name, "task": target.task, "experiment": cfg.run.experiment_name,
        "experiment_id": tracking.experiment_id(target.tracking_uri, run_id),
        "tracking_uri": target.tracking_uri, "storage_path": target.storage,
        "best_checkpoint": fs.with_scheme(best.path, target.storage) if best else None,
        "best_epoch": int(best_metrics.get("epoch", 0)) if best_metrics else None,
        "epochs_run": epochs_run, "stop_reason": stopped,
        "select_metric": metric,
        "valid": {k[len("valid_"):]: v for k, v in best_metrics.items() if k.startswith("valid_")},
        "test": {k[len("test_"):]: v for k, v in logged.items() if k.startswith("test_")},
        "model_uri": model.get("model_uri"), "registered_model_uri": model.get("registered_model_uri"),
    }


def _log_run_log(run_log: console.RunLog, tracking_uri: str, run_id: str) -> None:
    """The run's log file into the MLflow run, as ``logs/ray_output.log`` (a warning if MLflow cannot take it)."""
    try:
        with tempfile.TemporaryDirectory() as folder:  # under its MLflow name whatever the file is called here
            copy = Path(folder) / RUN_LOG
            shutil.copyfile(run_log.path, copy)
            tracking.MlflowTracker(tracking_uri, run_id).log_artifact(copy, "logs")
    except Exception as err:  # the run's result matters more than its log
        log.warning("MLflow: could not log the run's log file %s: %s", run_log.path, err)


@contextlib.contextmanager
def _sigint_restored() -> Iterator[None]:
    """Around ``trainer.fit()``: Ray Train installs its own SIGINT handler (abort the run) and leaves it in place
    when fit returns, so a Ctrl-C while the model is logged did nothing. Put back the handler from before (Python's
    KeyboardInterrupt). Only the main thread sets handlers (a sweep's trials fit in others)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.getsignal(signal.SIGINT)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def _log_model(best: Any, cfg: Config, tracking_uri: str, run_id: str) -> dict[str, str | None]:
    """Log the selected checkpoint as the run's MLflow pyfunc model (registered too with --register-model)."""
    # deferred: importing it loads starlette, pandas, pyarrow, numpy
    from nre_ray.inference.pyfunc import log_model

    with best.as_directory() as folder:
        logged = log_model(folder, tracking_uri, run_id, cfg.run.register_model)
    return {"model_uri": logged.model_uri, "registered_model_uri": logged.registered_uri}


def _check_resume(cfg: Config, storage: str, run_name: str, prepared: Any, resumed: Any,
                  tracking_uri: str) -> tuple[dict[str, str], dict[str, float]]:
    """Before ``--resume`` reopens the run: the latest checkpoint must fit this data and these settings
    (CheckpointError otherwise). Returns tags recording settings that changed (MLflow params keep the first run's),
    and the latest checkpoint's metrics when MLflow lacks them (a stop between Ray registering the checkpoint and
    the controller logging its metrics: :mod:`nre_ray.tracking.callback`), to log now."""
    # deferred: importing it loads torch, numpy
    from nre_ray.run.checkpoint import changed_settings, check_compatible, load_checkpoint

    result = _latest_result(storage, run_name)
    latest = result.checkpoint if result is not None else None
    epoch, changed, missing = 0, {}, {}
    if latest is not None:
        with latest.as_directory() as folder:
            loaded = load_checkpoint(Path(folder), weights=False)
        check_compatible(loaded, cfg.model.model, prepared.vocab, prepared.labels, cfg)
        epoch = int(loaded.meta.get("epoch", 0))
        changed = {k: f"{old!r} -> {new!r}" for k, (old, new) in changed_settings(loaded.config, cfg).items()}
        if result.metrics and epoch not in tracking.metric_steps(tracking_uri, resumed.info.run_id, "epoch"):
            missing = dict(result.metrics)
    console.get().line(
        f"resuming run {run_name!r} (MLflow run {resumed.info.run_id}) "
        + (f"after epoch {epoch}" if latest is not None else "from the start: it has no checkpoint yet")
        + (f"; logging epoch {epoch}'s metrics, which the stop kept from MLflow" if missing else "")
        + "".join(f"; {k} {v}" for k, v in changed.items()))
    return ({"nre_ray.resume_changes": json.dumps(changed)} if changed else {}), missing

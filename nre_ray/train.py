"""``python -m nre_ray.train``: parse the config, start or join Ray, preprocess, fit with TorchTrainer, summarise.

The driver holds no tensor code: preprocessing runs in Ray Data (``nre_ray.data.pipeline``), the loop in the workers
(``nre_ray.loop``), tracking goes to MLflow (``nre_ray.tracking``).
"""

from __future__ import annotations

import datetime as _dt
import json
import logging
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nre_ray.config import Config, ConfigError, build_parser, config_from_args

log = logging.getLogger("nre_ray")

QUIET_ENV = {
    "RAY_USAGE_STATS_ENABLED": "0",
    "RAY_TRAIN_ENABLE_PREEMPTION_WATCHER": "0",
    "RAY_DATA_DISABLE_PROGRESS_BARS": "1",
    "RAY_TRAIN_ENABLE_PRINT_PATCH": "0",
    "TUNE_DISABLE_AUTO_CALLBACK_LOGGERS": "1",
    "PYTHONWARNINGS": "ignore::DeprecationWarning",
    "MLFLOW_LOGGING_LEVEL": "WARNING",  # read when mlflow is imported: no INFO lines about its store and models
}


class UsageError(Exception):
    """A problem the user can fix (resources, paths, existing runs); printed without a traceback."""


@dataclass
class Resources:
    """How each worker is placed."""

    per_worker: dict[str, float]
    threads: int


def plan_resources(num_workers: int, use_gpu: bool, nodes: list[dict[str, float]],
                   cpus_per_worker: float | None = None) -> Resources:
    """Size each worker from what the cluster's alive nodes have, or raise UsageError if it cannot be placed.

    ``nodes``: the ``Resources`` dict of each alive node. CPU workers share the CPUs evenly (fractions allowed, so 4
    workers run on 2 cores), at most one each; GPU workers take one GPU each and a share of that node's CPUs (at most
    4). ``cpus_per_worker`` (``--cpus-per-worker``) sets the CPUs instead. A worker runs as many torch threads as it
    has whole CPUs (at least 1).
    """
    if use_gpu:
        gpus = [int(n.get("GPU", 0)) for n in nodes]
        if sum(gpus) == 0:
            raise UsageError("--use-gpu: this Ray cluster has no GPU. Drop --use-gpu to train on CPUs, or join a "
                             "cluster with GPUs (--address).")
        if sum(gpus) < num_workers:
            raise UsageError(f"--num-workers {num_workers} with --use-gpu needs {num_workers} GPUs, but the cluster "
                             f"has {sum(gpus)}. Use --num-workers {sum(gpus)} or add GPU nodes.")
        if cpus_per_worker is None:
            cpu = min(n.get("CPU", 0) / max(int(n.get("GPU", 0)), 1) for n in nodes if n.get("GPU", 0) >= 1)
            cpu = max(min(math.floor(cpu * 100) / 100, 4.0), 0.01)
        else:
            cpu = cpus_per_worker
            _check_fits(num_workers, cpu, [min(int(n.get("GPU", 0)), _slots(n.get("CPU", 0), cpu)) for n in nodes],
                        "one GPU and ")
        return Resources({"CPU": cpu, "GPU": 1}, max(1, int(cpu)))
    cpus = [n.get("CPU", 0.0) for n in nodes]
    if sum(cpus) <= 0:
        raise UsageError("this Ray cluster has no CPUs to run workers on.")
    if cpus_per_worker is not None:
        _check_fits(num_workers, cpus_per_worker, [_slots(c, cpus_per_worker) for c in cpus], "")
        return Resources({"CPU": cpus_per_worker}, max(1, int(cpus_per_worker)))
    per = min(1.0, sum(cpus) / num_workers)
    per = math.floor(per * 100) / 100
    while per >= 0.01 and sum(_slots(c, per) for c in cpus) < num_workers:
        per = math.floor(per * 90) / 100
    if per < 0.01:
        raise UsageError(f"--num-workers {num_workers} cannot be placed on this cluster ({sum(cpus):g} CPUs).")
    return Resources({"CPU": per}, max(1, int(per)))


def _slots(cpus: float, per_worker: float) -> int:
    """How many workers of ``per_worker`` CPUs a node with ``cpus`` CPUs holds (tolerant of float rounding)."""
    return math.floor(cpus / per_worker + 1e-9)


def _check_fits(num_workers: int, cpus_per_worker: float, fits_per_node: list[int], what: str) -> None:
    """UsageError unless the nodes hold ``num_workers`` workers (``fits_per_node``: how many each node holds)."""
    if sum(fits_per_node) < num_workers:
        raise UsageError(f"--num-workers {num_workers} with --cpus-per-worker {cpus_per_worker:g}: the cluster's "
                         f"nodes have room for {sum(fits_per_node)} workers of {what}{cpus_per_worker:g} CPUs. Lower "
                         "--cpus-per-worker or --num-workers, or leave --cpus-per-worker out to share the CPUs "
                         "evenly.")


def _git_commit() -> str | None:
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5,
                             cwd=Path(__file__).parent)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def _existing_checkpoints(storage: str, run_name: str) -> list[str]:
    """Checkpoint folders of the run: all of them on a local path; the latest registered one on s3://, gs://, ..."""
    if "://" in storage:
        latest = _latest_checkpoint(storage, run_name)
        return [latest.path.rstrip("/").rsplit("/", 1)[-1]] if latest is not None else []
    folder = Path(storage) / run_name
    return sorted(p.name for p in folder.glob("checkpoint_*")) if folder.is_dir() else []


def _run_to_resume(cfg: Config, run_name: str, storage: str, tracking_uri: str, existing: list[str]) -> Any:
    """The MLflow run that ``--resume`` continues (an ``mlflow.entities.Run``); UsageError if there is none."""
    from nre_ray import tracking

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


def start_ray(address: str | None, num_workers: int, log_to_driver: bool = True) -> None:
    """Join ``address`` (or RAY_ADDRESS), else start a local Ray sized to this machine. ``log_to_driver=False``:
    the workers' output stays in Ray's log files (for commands whose own output is the point)."""
    import ray

    for key, value in QUIET_ENV.items():
        os.environ.setdefault(key, value)
    address = address or os.environ.get("RAY_ADDRESS")
    if ray.is_initialized():
        return
    if address:
        ray.init(address=address, logging_level=logging.WARNING, log_to_driver=log_to_driver)
    else:
        os.environ.setdefault("RAY_AUTH_MODE", "disabled")  # a private local cluster, reachable from this host only
        try:
            ray.init(num_cpus=os.cpu_count() or 1, logging_level=logging.WARNING, log_to_driver=log_to_driver)
        except Exception as err:  # Ray raises a bare Exception when its raylet does not register within 30 s
            if "timed out during startup" not in str(err):
                raise
            raise UsageError(f"the local Ray did not start: its node did not register within Ray's fixed 30 s "
                             f"(1-minute load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs). The "
                             "machine is too busy; try again when it is quieter, or start Ray once with "
                             "`ray start --head` and pass --address auto.") from None


def alive_nodes() -> list[dict[str, float]]:
    """Resources of the cluster's alive nodes."""
    import ray

    return [n["Resources"] for n in ray.nodes() if n.get("Alive")]


def run(cfg: Config, started: float | None = None) -> dict[str, Any]:
    """Train once; returns the summary dict (also written to ``--summary-json``).

    ``started``: Unix time the command started (default: now); start-up times logged to MLflow count from it.
    """
    import ray
    import ray.train
    from ray.train.torch import TorchTrainer
    from ray.train.v2.api.config import LoggingConfig

    from nre_ray import tracking
    from nre_ray.checkpoint import pretrained_assets
    from nre_ray.data.audit import write_audit
    from nre_ray.data.pipeline import prepare
    from nre_ray.loop import SELECTION_RANK, train_loop_per_worker
    from nre_ray.tracking_callback import EpochMetricsLogger

    run_name = cfg.run.run_name or f"{cfg.model.model}-{_dt.datetime.now():%Y%m%d-%H%M%S}"
    storage = cfg.run.storage_path or str(Path("ray_results").absolute())
    if "://" not in storage:
        storage = str(Path(storage).expanduser().absolute())
    existing = _existing_checkpoints(storage, run_name)
    if existing and not cfg.run.resume:
        raise UsageError(f"run {run_name!r} already has checkpoints in {Path(storage) / run_name} "
                         f"({', '.join(existing[:3])}); nothing was overwritten. Continue that run with --resume, "
                         "or choose another --run-name.")
    tracking_uri = tracking.resolve_tracking_uri(cfg.run.tracking_uri)
    resumed = _run_to_resume(cfg, run_name, storage, tracking_uri, existing) if cfg.run.resume else None
    if cfg.model.embeddings:  # workers chdir into Ray's session folder: they need an absolute path
        from nre_ray.models.pretrained import check_dim

        cfg.model.embeddings = str(Path(cfg.model.embeddings).expanduser().absolute())
        try:
            check_dim(cfg.model.embeddings, cfg.model.word_dim)
        except ValueError as err:
            raise UsageError(str(err)) from None
    pretrained = cfg.model.pretrained if cfg.model.model == "bert" else None
    if pretrained and Path(pretrained).expanduser().exists():  # a local folder: absolute, for the workers
        pretrained = cfg.model.pretrained = str(Path(pretrained).expanduser().absolute())

    started = started or time.time()
    imported = time.time() - started  # imports and config
    marks = [time.perf_counter()]  # start-up marks: Ray start, preprocessing (logged as startup_*_s)
    start_ray(cfg.run.address, cfg.train.num_workers)
    resources = plan_resources(cfg.train.num_workers, cfg.train.use_gpu, alive_nodes(), cfg.train.cpus_per_worker)
    marks.append(time.perf_counter())
    print(f"nre_ray: {cfg.train.num_workers} worker(s), {resources.per_worker} each", flush=True)

    prepared = prepare(cfg.data, cfg.train.seed, pretrained)
    marks.append(time.perf_counter())
    rows = ", ".join(f"{name} {len(split)}" for name, split in prepared.splits.items())
    print(f"data: {rows} rows; {len(prepared.labels)} labels; vocabulary {len(prepared.vocab)}"
          + ("; preprocessing reused from the cache" if prepared.cache_hit else "")
          + ("; valid split drawn from train" if prepared.valid_from_train else ""), flush=True)
    for warning in prepared.audit.get("warnings", []):
        print(f"data warning: {warning}", flush=True)
    if "valid" not in prepared.splits:
        raise UsageError("no validation rows: add a valid file or more training rows per class.")
    resume_tags, missing_metrics = (_check_resume(cfg, storage, run_name, prepared, resumed, tracking_uri)
                                    if resumed is not None else ({}, {}))

    tags = {"nre_ray.run_name": run_name, "workers": str(cfg.train.num_workers),
            "device": "gpu" if cfg.train.use_gpu else "cpu", "storage_path": storage}
    commit = _git_commit()
    if commit:
        tags["mlflow.source.git.commit"] = commit
    if resumed is None:
        run_id = tracking.start_run(tracking_uri, cfg.run.experiment_name, run_name, tags)
    else:  # the same MLflow run: the loop logs from the checkpoint's epoch on and does not log params again
        run_id = resumed.info.run_id
        tracking.reopen_run(tracking_uri, run_id)
        tags.update(resume_tags, **{"nre_ray.resumes": str(int(resumed.data.tags.get("nre_ray.resumes", 0)) + 1)})
    tracker = tracking.MlflowTracker(tracking_uri, run_id)
    if resumed is not None:
        tracker.set_tags(tags)
        if missing_metrics:
            tracker.log_metrics(missing_metrics, step=int(missing_metrics["epoch"]))
    tracker.log_params({f"data.source.{k}": v for k, v in prepared.sources.items()})
    tracker.log_metrics({"startup_imports_s": imported, "startup_ray_s": marks[1] - marks[0],
                         "startup_preprocess_s": marks[2] - marks[1]}, step=0)
    with tempfile.TemporaryDirectory() as folder:  # the data audit: data/audit.md, data/audit.json
        for path in write_audit(prepared.audit, Path(folder)):
            tracker.log_artifact(path, "data")
    if prepared.rejected_count:
        rejected_path = Path(storage) / run_name / "rejected_rows.csv" if "://" not in storage else \
            Path("rejected_rows.csv").absolute()
        rejected_path.parent.mkdir(parents=True, exist_ok=True)
        if prepared.rejected_csv:  # every rejected row (prepared.rejected holds the first ones)
            shutil.copyfile(prepared.rejected_csv, rejected_path)
        else:
            prepared.rejected.to_csv(rejected_path, index=False)
        tracker.log_artifact(rejected_path, "data")
        tracker.log_metrics({"rejected_rows": prepared.rejected_count}, step=0)
        print(f"data: skipped {prepared.rejected_count} bad rows, listed in {rejected_path}", flush=True)

    data_ref = ray.put({
        "splits": {name: split.arrays for name, split in prepared.splits.items()},
        "vocab": prepared.vocab.as_json(), "labels": prepared.labels, "num_positions": prepared.num_positions,
        "assets": pretrained_assets(prepared.pretrained_dir),  # the tokenizer and config every checkpoint carries
    })
    metric = f"valid_{cfg.select_metric}"
    trainer = TorchTrainer(
        train_loop_per_worker,
        train_loop_config={"config": cfg.to_dict(), "data": data_ref, "tracking_uri": tracking_uri,
                           "run_id": run_id, "threads": resources.threads,
                           "startup": {"command": started, "fit": time.time()}},  # the loop logs startup_workers_s
        scaling_config=ray.train.ScalingConfig(num_workers=cfg.train.num_workers, use_gpu=cfg.train.use_gpu,
                                               resources_per_worker=resources.per_worker),
        run_config=ray.train.RunConfig(
            name=run_name, storage_path=storage,
            checkpoint_config=ray.train.CheckpointConfig(num_to_keep=cfg.train.keep_checkpoints,
                                                         checkpoint_score_attribute=SELECTION_RANK,
                                                         checkpoint_score_order="max"),
            # A worker group that cannot be placed times out after 60 s; controller_failure_limit=0 turns that
            # into an error instead of Ray's default of retrying forever.
            failure_config=ray.train.FailureConfig(max_failures=cfg.train.max_failures, controller_failure_limit=0),
            logging_config=LoggingConfig(log_level="WARNING"),
            callbacks=[EpochMetricsLogger(tracking_uri, run_id)],  # each epoch once, when its checkpoint is kept
            # Ray starts workers at nice 15; the training workers are the job, so they run at normal priority (as
            # Ray's own job drivers do): at nice 15 any other process on the machine starves them.
            worker_runtime_env={"env_vars": {**{k: v for k, v in QUIET_ENV.items() if k.startswith("RAY_")},
                                             "RAY_worker_niceness": "0"}},
        ),
    )
    status = "FAILED"
    try:
        result = trainer.fit()
        # the loop's own choice: the first epoch with the best validation score (see loop.SELECTION_RANK)
        best = result.get_best_checkpoint(metric=SELECTION_RANK, mode="max") if result.best_checkpoints else None
        model = _log_model(best, cfg, tracking_uri, run_id) if best is not None and cfg.run.log_model else {}
        status = "FINISHED"
    except (KeyboardInterrupt, SystemExit):
        # fit() installs Ray Train's SIGINT handler: it aborts the controller (which stops the workers) and leaves
        # fit with SystemExit. A SIGTERM to the driver also arrives as SystemExit (Ray's driver handler).
        status = "KILLED"
        raise KeyboardInterrupt from None
    except ray.train.TrainingFailedError as err:
        raise UsageError(f"training failed: {_root_cause(err)}") from None
    finally:
        tracking.end_run(tracking_uri, run_id, status)

    best_metrics = next((m for c, m in result.best_checkpoints if best and c.path == best.path), {})
    logged = tracking.run_metrics(tracking_uri, run_id)
    summary = {
        "run_id": run_id, "run_name": run_name, "experiment": cfg.run.experiment_name,
        "tracking_uri": tracking_uri, "storage_path": storage,
        "best_checkpoint": best.path if best else None,
        "best_epoch": int(best_metrics.get("epoch", 0)) if best_metrics else None,
        "select_metric": metric,
        "valid": {k[len("valid_"):]: v for k, v in best_metrics.items() if k.startswith("valid_")},
        "test": {k[len("test_"):]: v for k, v in logged.items() if k.startswith("test_")},
        "model_uri": model.get("model_uri"), "registered_model_uri": model.get("registered_model_uri"),
    }
    return summary


def _log_model(best: Any, cfg: Config, tracking_uri: str, run_id: str) -> dict[str, str | None]:
    """Log the selected checkpoint as the run's MLflow pyfunc model (registered too with --register-model)."""
    from nre_ray.serving import log_model

    with best.as_directory() as folder:
        logged = log_model(folder, tracking_uri, run_id, cfg.run.register_model)
    return {"model_uri": logged.model_uri, "registered_model_uri": logged.registered_uri}


def _check_resume(cfg: Config, storage: str, run_name: str, prepared: Any, resumed: Any,
                  tracking_uri: str) -> tuple[dict[str, str], dict[str, float]]:
    """Before ``--resume`` reopens the run: the latest checkpoint must fit this data and these settings
    (CheckpointError otherwise). Returns tags recording settings that changed (MLflow params keep the first run's),
    and the latest checkpoint's metrics when MLflow lacks them (a stop between Ray registering the checkpoint and
    the controller logging its metrics: :mod:`nre_ray.tracking_callback`), to log now."""
    from nre_ray import tracking
    from nre_ray.checkpoint import changed_settings, check_compatible, load_checkpoint

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
    print(f"resuming run {run_name!r} (MLflow run {resumed.info.run_id}) "
          + (f"after epoch {epoch}" if latest is not None else "from the start: it has no checkpoint yet")
          + (f"; logging epoch {epoch}'s metrics, which the stop kept from MLflow" if missing else "")
          + "".join(f"; {k} {v}" for k, v in changed.items()), flush=True)
    return ({"nre_ray.resume_changes": json.dumps(changed)} if changed else {}), missing


def _root_cause(err: BaseException) -> str:
    """The innermost error message of a Ray training failure."""
    text = str(err)
    for line in reversed(text.strip().splitlines()):
        if line.strip() and not line.startswith(" "):
            return line.strip()
    return text


def print_summary(summary: dict[str, Any]) -> None:
    """The final lines a person reads."""
    valid, test = summary["valid"], summary["test"]
    print(f"\nrun {summary['run_name']} (MLflow run {summary['run_id']}, experiment {summary['experiment']})")
    print(f"best epoch {summary['best_epoch']} by {summary['select_metric']}; checkpoint {summary['best_checkpoint']}")
    keys = ("accuracy", "macro_f1", "micro_f1", "pos_macro_f1", "pos_micro_f1", "semeval_macro_f1")
    for name, scores in (("valid", valid), ("test", test)):
        if scores:
            print(f"  {name:5s} " + "  ".join(f"{k} {scores[k]:.4f}" for k in keys if k in scores))
    if summary.get("model_uri"):
        print(f"model: {summary['model_uri']}" + (f" (registered as {summary['registered_model_uri']})"
                                                  if summary.get("registered_model_uri") else ""))
    print(f"look at it: mlflow ui --backend-store-uri {summary['tracking_uri']}", flush=True)


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns the exit status."""
    started = time.time()
    parser = build_parser(description="Train a sentence-level relation classifier with Ray Train, Ray Data and "
                                      "MLflow. Without --data-dir it trains on the bundled English sample.")
    args = parser.parse_args(argv)
    for key, value in QUIET_ENV.items():  # before Ray and MLflow are imported (a user's own setting wins)
        os.environ.setdefault(key, value)
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    logging.getLogger("nre_ray").setLevel(logging.INFO)
    for noisy in ("ray.data", "mlflow"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    from nre_ray.checkpoint import CheckpointError
    from nre_ray.data.errors import DataError

    try:
        cfg = config_from_args(args)
        summary = run(cfg, started)
    except (ConfigError, UsageError, CheckpointError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except DataError as err:
        print(f"error: bad input data\n{err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted: the MLflow run is marked KILLED", file=sys.stderr)
        return 130
    print_summary(summary)
    if cfg.run.summary_json:
        Path(cfg.run.summary_json).write_text(json.dumps(summary, indent=2, ensure_ascii=False), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())

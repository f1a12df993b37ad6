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
import subprocess
import sys
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
}


class UsageError(Exception):
    """A problem the user can fix (resources, paths, existing runs); printed without a traceback."""


@dataclass
class Resources:
    """How each worker is placed."""

    per_worker: dict[str, float]
    threads: int


def plan_resources(num_workers: int, use_gpu: bool, nodes: list[dict[str, float]]) -> Resources:
    """Size each worker from what the cluster's alive nodes have, or raise UsageError if it cannot be placed.

    ``nodes``: the ``Resources`` dict of each alive node. CPU workers share the CPUs evenly (fractions allowed, so 4
    workers run on 2 cores); GPU workers take one GPU each and a share of that node's CPUs.
    """
    if use_gpu:
        gpus = [int(n.get("GPU", 0)) for n in nodes]
        if sum(gpus) == 0:
            raise UsageError("--use-gpu: this Ray cluster has no GPU. Drop --use-gpu to train on CPUs, or join a "
                             "cluster with GPUs (--address).")
        if sum(gpus) < num_workers:
            raise UsageError(f"--num-workers {num_workers} with --use-gpu needs {num_workers} GPUs, but the cluster "
                             f"has {sum(gpus)}. Use --num-workers {sum(gpus)} or add GPU nodes.")
        cpu = min(n.get("CPU", 0) / max(int(n.get("GPU", 0)), 1) for n in nodes if n.get("GPU", 0) >= 1)
        cpu = max(min(math.floor(cpu * 100) / 100, 4.0), 0.01)
        return Resources({"CPU": cpu, "GPU": 1}, max(1, int(cpu)))
    cpus = [n.get("CPU", 0.0) for n in nodes]
    if sum(cpus) <= 0:
        raise UsageError("this Ray cluster has no CPUs to run workers on.")
    per = min(1.0, sum(cpus) / num_workers)
    per = math.floor(per * 100) / 100
    while per >= 0.01 and sum(math.floor(c / per + 1e-9) for c in cpus) < num_workers:
        per = math.floor(per * 90) / 100
    if per < 0.01:
        raise UsageError(f"--num-workers {num_workers} cannot be placed on this cluster ({sum(cpus):g} CPUs).")
    return Resources({"CPU": per}, max(1, int(per)))


def _git_commit() -> str | None:
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5,
                             cwd=Path(__file__).parent)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def _existing_checkpoints(storage: str, run_name: str) -> list[str]:
    if "://" in storage:
        return []
    folder = Path(storage) / run_name
    return sorted(p.name for p in folder.glob("checkpoint_*")) if folder.is_dir() else []


def start_ray(address: str | None, num_workers: int) -> None:
    """Join ``address`` (or RAY_ADDRESS), else start a local Ray sized to this machine."""
    import ray

    for key, value in QUIET_ENV.items():
        os.environ.setdefault(key, value)
    address = address or os.environ.get("RAY_ADDRESS")
    if ray.is_initialized():
        return
    if address:
        ray.init(address=address, logging_level=logging.WARNING, log_to_driver=True)
    else:
        os.environ.setdefault("RAY_AUTH_MODE", "disabled")  # a private local cluster, reachable from this host only
        ray.init(num_cpus=os.cpu_count() or 1, logging_level=logging.WARNING, log_to_driver=True)


def alive_nodes() -> list[dict[str, float]]:
    """Resources of the cluster's alive nodes."""
    import ray

    return [n["Resources"] for n in ray.nodes() if n.get("Alive")]


def run(cfg: Config) -> dict[str, Any]:
    """Train once; returns the summary dict (also written to ``--summary-json``)."""
    import ray
    import ray.train
    from ray.train.torch import TorchTrainer
    from ray.train.v2.api.config import LoggingConfig

    from nre_ray import tracking
    from nre_ray.data.pipeline import prepare
    from nre_ray.loop import train_loop_per_worker

    run_name = cfg.run.run_name or f"{cfg.model.model}-{_dt.datetime.now():%Y%m%d-%H%M%S}"
    storage = cfg.run.storage_path or str(Path("ray_results").absolute())
    if "://" not in storage:
        storage = str(Path(storage).expanduser().absolute())
    existing = _existing_checkpoints(storage, run_name)
    if existing:
        raise UsageError(f"run {run_name!r} already has checkpoints in {Path(storage) / run_name} "
                         f"({', '.join(existing[:3])}); nothing was overwritten. Choose another --run-name.")
    tracking_uri = tracking.resolve_tracking_uri(cfg.run.tracking_uri)
    if cfg.model.embeddings:  # workers chdir into Ray's session folder: they need an absolute path
        from nre_ray.models.pretrained import check_dim

        cfg.model.embeddings = str(Path(cfg.model.embeddings).expanduser().absolute())
        try:
            check_dim(cfg.model.embeddings, cfg.model.word_dim)
        except ValueError as err:
            raise UsageError(str(err)) from None

    start_ray(cfg.run.address, cfg.train.num_workers)
    resources = plan_resources(cfg.train.num_workers, cfg.train.use_gpu, alive_nodes())
    print(f"nre_ray: {cfg.train.num_workers} worker(s), {resources.per_worker} each", flush=True)

    prepared = prepare(cfg.data, cfg.train.seed)
    rows = ", ".join(f"{name} {len(split)}" for name, split in prepared.splits.items())
    print(f"data: {rows} rows; {len(prepared.labels)} labels; vocabulary {len(prepared.vocab)}"
          + ("; preprocessing reused from the cache" if prepared.cache_hit else "")
          + ("; valid split drawn from train" if prepared.valid_from_train else ""), flush=True)
    if "valid" not in prepared.splits:
        raise UsageError("no validation rows: add a valid file or more training rows per class.")

    tags = {"nre_ray.run_name": run_name, "workers": str(cfg.train.num_workers),
            "device": "gpu" if cfg.train.use_gpu else "cpu", "storage_path": storage}
    commit = _git_commit()
    if commit:
        tags["mlflow.source.git.commit"] = commit
    run_id = tracking.start_run(tracking_uri, cfg.run.experiment_name, run_name, tags)
    tracker = tracking.MlflowTracker(tracking_uri, run_id)
    tracker.log_params({f"data.source.{k}": v for k, v in prepared.sources.items()})
    if len(prepared.rejected):
        rejected_path = Path(storage) / run_name / "rejected_rows.csv" if "://" not in storage else \
            Path("rejected_rows.csv").absolute()
        rejected_path.parent.mkdir(parents=True, exist_ok=True)
        prepared.rejected.to_csv(rejected_path, index=False)
        tracker.log_artifact(rejected_path, "data")
        tracker.log_metrics({"rejected_rows": len(prepared.rejected)}, step=0)
        print(f"data: skipped {len(prepared.rejected)} bad rows, listed in {rejected_path}", flush=True)

    data_ref = ray.put({
        "splits": {name: split.arrays for name, split in prepared.splits.items()},
        "vocab": prepared.vocab.tokens, "labels": prepared.labels, "num_positions": prepared.num_positions,
    })
    metric = f"valid_{cfg.select_metric}"
    trainer = TorchTrainer(
        train_loop_per_worker,
        train_loop_config={"config": cfg.to_dict(), "data": data_ref, "tracking_uri": tracking_uri,
                           "run_id": run_id, "threads": resources.threads},
        scaling_config=ray.train.ScalingConfig(num_workers=cfg.train.num_workers, use_gpu=cfg.train.use_gpu,
                                               resources_per_worker=resources.per_worker),
        run_config=ray.train.RunConfig(
            name=run_name, storage_path=storage,
            checkpoint_config=ray.train.CheckpointConfig(num_to_keep=cfg.train.keep_checkpoints,
                                                         checkpoint_score_attribute=metric,
                                                         checkpoint_score_order="max"),
            # A worker group that cannot be placed times out after 60 s; controller_failure_limit=0 turns that
            # into an error instead of Ray's default of retrying forever.
            failure_config=ray.train.FailureConfig(max_failures=cfg.train.max_failures, controller_failure_limit=0),
            logging_config=LoggingConfig(log_level="WARNING"),
            worker_runtime_env={"env_vars": {k: v for k, v in QUIET_ENV.items() if k.startswith("RAY_")}},
        ),
    )
    status = "FAILED"
    try:
        result = trainer.fit()
        status = "FINISHED"
    except KeyboardInterrupt:
        status = "KILLED"
        raise
    except ray.train.TrainingFailedError as err:
        raise UsageError(f"training failed: {_root_cause(err)}") from None
    finally:
        tracking.end_run(tracking_uri, run_id, status)

    best = result.get_best_checkpoint(metric=metric, mode="max") if result.best_checkpoints else None
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
    }
    return summary


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
    print(f"look at it: mlflow ui --backend-store-uri {summary['tracking_uri']}", flush=True)


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns the exit status."""
    parser = build_parser(description="Train a sentence-level relation classifier with Ray Train, Ray Data and "
                                      "MLflow. Without --data-dir it trains on the bundled English sample.")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    logging.getLogger("nre_ray").setLevel(logging.INFO)
    for noisy in ("ray.data", "mlflow"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    from nre_ray.checkpoint import CheckpointError
    from nre_ray.data.errors import DataError

    try:
        cfg = config_from_args(args)
        summary = run(cfg)
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

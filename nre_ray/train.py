"""``python -m nre_ray.train``: parse the config, run the steps of :mod:`nre_ray.runner`, print the summary."""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
from typing import Any

from nre_ray import console
from nre_ray.cluster.session import QUIET_ENV, UsageError
from nre_ray.config import ConfigError, build_parser, config_from_args
from nre_ray.runner import run


def print_summary(summary: dict[str, Any]) -> None:
    """The final lines a person reads."""
    valid, test = summary["valid"], summary["test"]
    print(f"\nrun {summary['run_name']} (MLflow run {summary['run_id']}, experiment {summary['experiment']})")
    if summary.get("stop_reason"):
        print(f"trained {summary['epochs_run']} epochs; {summary['stop_reason']}")
    print(f"best epoch {summary['best_epoch']} by {summary['select_metric']}; checkpoint {summary['best_checkpoint']}")
    keys = ("accuracy", "macro_f1", "micro_f1", "pos_macro_f1", "pos_micro_f1", "semeval_macro_f1")
    for name, scores in (("valid", valid), ("test", test)):
        if scores:
            print(f"  {name:5s} " + "  ".join(f"{k} {scores[k]:.4f}" for k in keys if k in scores))
    print_model_and_ui(summary)


#: Where ``mlflow ui`` (and ``make ui``) serves by default.
UI_ADDRESS = "http://127.0.0.1:5000"


def print_model_and_ui(summary: dict[str, Any]) -> None:
    """The summary's last lines (a run's and a sweep's): the logged model, and how to look at the runs."""
    if summary.get("model_uri"):
        print(f"model: {summary['model_uri']}" + (f" (registered as {summary['registered_model_uri']})"
                                                  if summary.get("registered_model_uri") else ""))
    from nre_ray.tracking.store import run_page

    uri = summary["tracking_uri"]
    server = uri.startswith(("http://", "https://"))
    page = run_page(uri if server else UI_ADDRESS, summary.get("experiment_id"), summary["run_id"])
    print(f"look at it: open {page}" if server
          else f"look at it: mlflow ui --backend-store-uri {uri} (or make ui), then open {page}", flush=True)


EXAMPLES = """\
output: a line as each phase starts and ends ([seconds since the start] ray, preprocess, mlflow, workers,
training, model), one line per epoch (* marks an epoch that improved the selection metric: the best so far), and
a summary; on a terminal a bar shows the running phase.

examples:
  python -m nre_ray.train                                  # the bundled sample, 2 local workers, early stopping
  python -m nre_ray.train --data-dir DATA --model pcnn --epochs 20 --patience 5
  python -m nre_ray.train --data-dir DATA --model bert --pretrained MODEL_DIR      # fine-tune a pretrained encoder
  python -m nre_ray.train --data-dir DATA --negative-label Other --select-metric semeval_macro_f1
  python -m nre_ray.train --config run.toml --num-workers 4 --use-gpu
  python -m nre_ray.train --run-name r1 --resume           # continue the interrupted run r1
  python -m nre_ray.train --address ray://HEAD:10001 --storage-path s3://BUCKET/runs \\
      --tracking-uri http://HEAD:5000                      # an existing cluster
"""


def cli_parser() -> argparse.ArgumentParser:
    """The ``python -m nre_ray.train`` parser: one flag per config field, then the examples."""
    parser = build_parser(description="Train a sentence-level relation classifier with Ray Train, Ray Data and "
                                      "MLflow. Without --data-dir it trains on the bundled English sample.")
    parser.epilog, parser.formatter_class = EXAMPLES, argparse.RawDescriptionHelpFormatter
    return parser


def _checkpoint_error() -> tuple[type[Exception], ...]:
    """``(CheckpointError,)``, imported only when an error reaches ``main``: its module imports torch, which a run
    needs only once Ray is up, so the first console line comes sooner."""
    from nre_ray.checkpoint import CheckpointError

    return (CheckpointError,)


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns the exit status."""
    started = time.time()
    args = cli_parser().parse_args(argv)
    for key, value in QUIET_ENV.items():  # before Ray and MLflow are imported (a user's own setting wins)
        os.environ.setdefault(key, value)
    console.use(console.Console(started=started))
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    logging.getLogger("nre_ray").setLevel(logging.INFO)
    for noisy in ("ray.data", "mlflow"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    from nre_ray.data.errors import DataError

    try:
        cfg = config_from_args(args)
        with console.logs_on_console("nre_ray"):
            summary = run(cfg, started)
    except (ConfigError, UsageError, *_checkpoint_error()) as err:
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
        from nre_ray.storage import StorageError, write_text

        try:
            write_text(cfg.run.summary_json, json.dumps(summary, indent=2, ensure_ascii=False))
        except StorageError as err:
            print(f"error: --summary-json: {err}", file=sys.stderr)
            return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())

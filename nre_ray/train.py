"""``python -m nre_ray.train``: parse the config, run the steps of :mod:`nre_ray.run.runner`, print the summary."""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

from nre_ray.config import build_parser, config_from_args
from nre_ray.run.frontdoor import print_model_and_ui, run_command, summary_scores, task_model
from nre_ray.run.runner import run


def print_summary(summary: dict[str, Any]) -> None:
    """The final lines a person reads."""
    valid, test = summary["valid"], summary["test"]
    print(f"\nrun {summary['run_name']} (MLflow run {summary['run_id']}, experiment {summary['experiment']})")
    if summary.get("stop_reason"):
        epochs = summary["epochs_run"]
        print(f"trained {epochs} epoch{'' if epochs == 1 else 's'}; {summary['stop_reason']}")
    print(f"best epoch {summary['best_epoch']} by {summary['select_metric']}; checkpoint {summary['best_checkpoint']}")
    for name, scores in (("valid", valid), ("test", test)):
        if scores:
            print(f"  {name:5s} " + summary_scores(summary, name))
    print_model_and_ui(summary)


#: Where ``mlflow ui`` (and ``make ui``) serves by default.


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
    parser = build_parser(description="Train a relation extraction model with Ray Train, Ray Data and MLflow: "
                                      "sentence-level, or document-level when --data-dir holds DocRED JSON or "
                                      "PubTator files (then --model transformer, the default there, or --model "
                                      "bert --pretrained). Without --data-dir it trains on the bundled English "
                                      "sample.")
    parser.epilog, parser.formatter_class = EXAMPLES, argparse.RawDescriptionHelpFormatter
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns the exit status (0, 2 for bad input or usage, 130 when interrupted)."""
    started = time.time()
    args = cli_parser().parse_args(argv)

    def work() -> tuple[dict[str, Any], str | None]:
        cfg = config_from_args(args, default_model=task_model)  # the data's task's model unless --model is given
        return run(cfg, started), cfg.run.summary_json

    return run_command(work, print_summary, "interrupted: the MLflow run is marked KILLED", started=started)


if __name__ == "__main__":
    from nre_ray.core.console import exit_status

    sys.exit(exit_status(main))

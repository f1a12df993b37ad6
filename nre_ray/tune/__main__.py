"""``python -m nre_ray.tune``: the command line of a hyperparameter sweep (:mod:`nre_ray.tune.sweep`)."""

from __future__ import annotations

import argparse
import logging
import math
import sys
import time
from typing import Any

from nre_ray.config import Config, ConfigError, add_options, build_parser, config_from_args, options_from
from nre_ray.run.frontdoor import print_model_and_ui, run_command, summary_scores, task_model
from nre_ray.tune.sweep import SweepOptions, run

#: A trial's epoch budget when --epochs is not given, whatever the --model (a single run's default is larger: early
#: stopping ends it; in a sweep ASHA stops the weak trials instead).
SWEEP_EPOCHS = 20

#: The training flags that mean something else in a sweep, by dest (argparse.SUPPRESS: not in the help).
HELPS = {"train.epochs": "The most epochs a trial trains; ASHA stops the weak trials sooner "
                         f"(default: {SWEEP_EPOCHS}, whatever the --model).",
         "train.patience": argparse.SUPPRESS}

EXAMPLES = """\
output: a line as each phase starts and ends ([seconds since the start] setup, ray, preprocess, mlflow, training,
model), a line when a trial starts, for each epoch it reports and when it ends, then the best trial's test scores
and a summary of every trial; on a terminal a bar counts the trials that ended. Ray's and Tune's own messages stay
in Ray's logs (by default /tmp/ray/session_latest/logs on the head node).

examples:
  python -m nre_ray.tune --num-samples 4 --epochs 3        # the bundled sample, the default space of --model cnn
  python -m nre_ray.tune --data-dir DATA --model cnn --epochs 20 --num-samples 12
  python -m nre_ray.tune --data-dir DATA --search-space space.toml --num-samples 24 --max-concurrent-trials 4
  python -m nre_ray.tune --data-dir DATA --model pcnn --searcher random --register-model best-pcnn
  python -m nre_ray.tune --data-dir DOCRED_DIR --num-samples 8      # documents: --model transformer, on micro_f1
  python -m nre_ray.tune --bag-aggregator att --model pcnn --num-samples 8  # bags (the bag sample): on auc
  python -m nre_ray.tune --data-dir DATA --run-name cnn-sweep --epochs 20 --num-samples 12 --resume   # continue
"""


def sweep_parser() -> argparse.ArgumentParser:
    """The training options (fixed values for every trial, but --patience: ASHA stops trials) plus the sweep's
    own, then the examples."""
    parser = build_parser(prog="python -m nre_ray.tune",
                          description="Search hyperparameters with Ray Tune: each trial trains with Ray Train "
                                      "(the options below are the fixed values of every trial), ASHA stops weak "
                                      "trials early on the validation metric (the task's own unless "
                                      "--select-metric: sentences macro_f1 or pos_macro_f1, documents micro_f1, "
                                      "bags auc), MLflow records a parent run for the "
                                      "sweep and a child run per trial, and the best trial's checkpoint is scored "
                                      "on test once and logged as the sweep's model. --run-name names the sweep, "
                                      f"--epochs is the most a trial trains (default here: {SWEEP_EPOCHS}).",
                          helps=HELPS)
    parser.epilog, parser.formatter_class = EXAMPLES, argparse.RawDescriptionHelpFormatter
    add_options(parser, SweepOptions, group="sweep options")
    return parser


def sweep_config(args: argparse.Namespace) -> Config:
    """The trials' fixed config: the training options as given, the data's task's ``--model`` unless given (documents:
    transformer), ``--epochs`` :data:`SWEEP_EPOCHS` unless given and no early stopping (ASHA stops trials; a
    ``--patience`` given is refused)."""
    if getattr(args, "train.patience", None):
        raise ConfigError("--patience: ASHA stops weak trials in a sweep; leave --patience out")
    setattr(args, "train.patience", 0)
    if getattr(args, "train.epochs", None) is None:
        setattr(args, "train.epochs", SWEEP_EPOCHS)
    return config_from_args(args, default_model=task_model)


def options_from_args(args: argparse.Namespace, cfg: Config) -> SweepOptions:
    """The sweep options, checked against the training config."""
    opts = options_from(args, SweepOptions)
    checks = [
        (opts.num_samples >= 1, "--num-samples must be >= 1"),
        (opts.max_concurrent_trials is None or opts.max_concurrent_trials >= 1, "--max-concurrent-trials must be >= 1"),
        (1 <= opts.grace_period <= cfg.train.epochs,
         f"--grace-period must be between 1 and --epochs ({cfg.train.epochs})"),
        (opts.reduction_factor >= 2, "--reduction-factor must be >= 2"),
    ]
    for ok, message in checks:
        if not ok:
            raise ConfigError(message)
    return opts


def print_summary(summary: dict[str, Any]) -> None:
    """The trials, best first, then the best trial and its test scores."""
    metric = summary["select_metric"]
    print(f"\nsweep {summary['sweep']} (MLflow run {summary['run_id']}, experiment {summary['experiment']})")
    for t in sorted(summary["trials"], key=lambda t: -t[f"best_{metric}"] if not math.isnan(t[f"best_{metric}"])
                    else math.inf):
        shown = ", ".join(f"{k.split('.', 1)[1]}={_short(t[k])}" for k in summary["best_params"])
        score = "" if math.isnan(t[f"best_{metric}"]) else f"{t[f'best_{metric}']:.4f}"
        print(f"  {t['trial_id']}  {t['outcome']:<20s} {t['epochs']:>3d} epoch(s)  {metric} {score:>6s}  {shown}")
    print(f"best trial {summary['best_trial']} (epoch {summary['best_epoch']}): {metric} {summary['best_valid']:.4f}")
    if summary["test"]:
        print("  test  " + summary_scores(summary, "test"))
    print_model_and_ui(summary)


def _short(value: Any) -> str:
    return f"{value:.3g}" if isinstance(value, float) else str(value)


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns the exit status (0, 2 for bad input or usage, 130 when interrupted)."""
    started = time.time()
    args = sweep_parser().parse_args(argv)

    def work() -> tuple[dict[str, Any], str | None]:
        cfg = sweep_config(args)
        return run(cfg, options_from_args(args, cfg)), cfg.run.summary_json

    return run_command(work, print_summary, "interrupted: the sweep's MLflow runs are marked KILLED; continue it with "
                       "the same command and --resume", quiet={"ray.tune": logging.ERROR}, started=started)


if __name__ == "__main__":
    from nre_ray.core.console import exit_status

    sys.exit(exit_status(main))

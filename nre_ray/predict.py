"""``python -m nre_ray.predict``: label a file of raw rows with a trained model (:mod:`nre_ray.serving.prediction`)."""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass

from nre_ray import storage
from nre_ray.cluster.session import UsageError, quiet_environ
from nre_ray.config import REQUIRED, choices, command_parser, option, shared
from nre_ray.core.user_error import ConfigError
from nre_ray.data.errors import DataError
from nre_ray.data.sizes import DEFAULT_CHUNK_ROWS, LOCAL_MAX_ROWS

EXAMPLES = """\
examples:
  python -m nre_ray.predict --model runs:/RUN_ID/model --input new.csv --output labelled.csv
  python -m nre_ray.predict --model models:/NAME/1 --input big.parquet --output labelled.parquet --num-workers 4
  python -m nre_ray.predict --model ray_results/RUN/checkpoint_DIR --input rows.jsonl --output out.jsonl --top-k 3
  python -m nre_ray.predict --model runs:/RUN_ID/model --input messy.csv --output out.csv --on-bad-rows skip
"""


@dataclass
class PredictOptions:
    """The options of ``python -m nre_ray.predict``, one flag each."""

    model: str = shared("trained_model")
    input: str = option(REQUIRED, "Rows to label, a local path or a URI (s3://BUCKET/rows.csv): any format training "
                                  "reads (CSV, TSV, JSON Lines, Parquet, DeepKE, OpenNRE, SemEval); a relation column "
                                  "is not needed and is ignored.")
    output: str = option(REQUIRED, "Where to write, a local path or a URI: .csv, .tsv, .jsonl or .parquet. It "
                                   "appears when complete; nothing is written when the run fails.")
    batch_size: int = option(256, "Rows per forward pass (default: 256).")
    num_workers: int = option(1, "Ray actors, each holding the model once (default: 1).")
    cpus_per_worker: float | None = shared("cpus_per_worker")
    top_k: int = option(0, "Also write the K most likely labels and their probabilities (top_k_labels, "
                           "top_k_scores as JSON lists in CSV).")
    format: str | None = shared("format")
    columns: str | None = shared("columns")
    on_bad_rows: str = option("error", "'error' (default): write nothing and list the bad rows; 'skip': label the "
                                       "good rows and list the bad ones in OUTPUT.rejected.csv.",
                              choices=choices("data.on_bad_rows"))
    tracking_uri: str | None = shared("tracking_uri")
    address: str | None = shared("address")
    chunk_rows: int = option(DEFAULT_CHUNK_ROWS, f"Rows read at a time (memory per chunk in flight; default "
                                                 f"{DEFAULT_CHUNK_ROWS}).")
    local_max_rows: int = option(LOCAL_MAX_ROWS, "Inputs of at most this many rows are labelled in this process, "
                                                 "without starting Ray (faster for small files; --num-workers and "
                                                 "--address then do not apply); larger ones stream through Ray Data. "
                                                 f"0: always Ray (default: {LOCAL_MAX_ROWS}).")
    use_gpu: bool = option(False, "One GPU per worker.")
    no_progress: bool = option(False, "No progress lines.")


def build_parser() -> argparse.ArgumentParser:
    """The ``python -m nre_ray.predict`` options: the fields of :class:`PredictOptions`."""
    return command_parser(
        "python -m nre_ray.predict", PredictOptions, epilog=EXAMPLES,
        description="Label the rows of a file with a trained relation classifier. The output keeps the input's "
                    "columns, in order, and adds predicted_relation and score. A small file is labelled in this "
                    "process; a large one streams through Ray Data.")


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns the exit status (0 ok, 2 bad input or usage, 130 interrupted)."""
    args = PredictOptions(**vars(build_parser().parse_args(argv)))
    # torch, pandas and Ray only now: --help and a usage error answer at once

    quiet_environ()  # before Ray and MLflow are imported
    # deferred: importing it loads torch, numpy
    from nre_ray.run.checkpoint import CheckpointError

    # deferred: importing it loads torch, pandas, pyarrow, numpy
    from nre_ray.serving.prediction import cause, predict_file, worker_died

    try:
        summary = predict_file(args.model, args.input, args.output, batch_size=args.batch_size,
                               num_workers=args.num_workers, top_k=args.top_k, fmt=args.format, columns=args.columns,
                               on_bad_rows=args.on_bad_rows, tracking_uri=args.tracking_uri, address=args.address,
                               chunk_rows=args.chunk_rows, use_gpu=args.use_gpu, progress=not args.no_progress,
                               local_max_rows=args.local_max_rows, cpus_per_worker=args.cpus_per_worker)
    except (UsageError, CheckpointError, ConfigError) as err:  # ConfigError: e.g. an MLflow store it cannot open
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
    from nre_ray.core.console import exit_status

    sys.exit(exit_status(main))

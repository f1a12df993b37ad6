"""``python -m nre_ray.predict``: label a file of raw rows with a trained model
(:mod:`nre_ray.inference.prediction`)."""

from __future__ import annotations

import argparse
import sys

from nre_ray import storage
from nre_ray.cluster.session import UsageError, quiet_environ
from nre_ray.config import command_parser
from nre_ray.core.user_error import ConfigError
from nre_ray.data.errors import DataError
from nre_ray.inference.predict_options import PredictOptions

EXAMPLES = """\
examples:
  python -m nre_ray.predict --model runs:/RUN_ID/model --input new.csv --output labelled.csv
  python -m nre_ray.predict --model models:/NAME/1 --input big.parquet --output labelled.parquet --num-workers 4
  python -m nre_ray.predict --model ray_results/RUN/checkpoint_DIR --input rows.jsonl --output out.jsonl --top-k 3
  python -m nre_ray.predict --model runs:/RUN_ID/model --input messy.csv --output out.csv --on-bad-rows skip
"""


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
    # deferred: importing it loads torch, pandas, pyarrow, numpy
    from nre_ray.inference.prediction import cause, predict_file, worker_died
    from nre_ray.run.checkpoint import CheckpointError

    try:
        summary = predict_file(args)
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
    unit = summary.unit
    print(f"predicted {summary.rows} {unit} in {summary.seconds:.1f} s ({summary.rows_per_second:.0f} {unit}/s, "
          f"{where}) -> {summary.output}" + (f" ({summary.written} rows)" if unit != "rows" else ""), flush=True)
    if summary.skipped:
        print(f"skipped {summary.skipped} bad {summary.bad_unit}, listed in {summary.rejected}", flush=True)
    return 0


if __name__ == "__main__":
    from nre_ray.core.console import exit_status

    sys.exit(exit_status(main))

"""``python -m nre_ray.evaluate``: score a checkpoint on a labelled file (:mod:`nre_ray.inference.evaluation`)."""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from typing import Any

from nre_ray.cluster.session import UsageError, quiet_environ
from nre_ray.config import REQUIRED, choices, command_parser, option, shared
from nre_ray.core.user_error import ConfigError
from nre_ray.data.errors import DataError
from nre_ray.storage import StorageError, write_text


def print_report(report: dict[str, Any]) -> None:
    """The scores the task shows (``report["shown"]``), then the per-label table (its columns: the task's)."""
    metrics = report["metrics"]
    unit = report.get("unit", "rows")
    print(f"{report['data']}: {report['rows']} {unit}" + (f" ({report['skipped']} bad {unit} skipped)"
                                                          if report["skipped"] else "")
          + f", {report['workers']} worker(s), model {report['model']}")
    print("  " + "  ".join(f"{k} {metrics[k]:.4f}" for k in report.get("shown", metrics) if k in metrics))
    rows = report["per_class"]
    if not rows:
        return
    columns = [c for c in rows[0] if c != "label"]
    width = max(len("label"), *(len(r["label"]) for r in rows))
    widths = {c: max(len(c), 6) for c in columns}
    print(f"\n  {'label':<{width}}  " + "  ".join(f"{c:>{widths[c]}}" for c in columns))
    for r in rows:
        cells = [f"{r[c]:{widths[c]}.4f}" if isinstance(r[c], float) else f"{r[c]:{widths[c]}}" for c in columns]
        print(f"  {r['label']:<{width}}  " + "  ".join(cells))


@dataclass
class EvaluateOptions:
    """The options of ``python -m nre_ray.evaluate``, one flag each."""

    model: str = shared("trained_model")
    data: str = option(REQUIRED, "A labelled file in any format training reads.")
    num_workers: int = option(1, "Ray Train workers (default: 1).")
    cpus_per_worker: float | None = shared("cpus_per_worker")
    negative_label: str | None = option(None, "The 'no relation' label for the positive-class scores (default: the "
                                              "one the model was trained with, if any).")
    output: str | None = option(None, "Write the scores, the per-class table and the confusion matrix here as JSON.")
    format: str | None = shared("format")
    columns: str | None = shared("columns")
    on_bad_rows: str = option("error", "'error' (default): list the bad rows and stop; 'skip': evaluate on the other "
                                       "rows.", choices=choices("data.on_bad_rows"))
    tracking_uri: str | None = shared("tracking_uri")
    address: str | None = shared("address")


EXAMPLES = ("examples:\n"
            "  python -m nre_ray.evaluate --model runs:/RUN_ID/model --data test.csv\n"
            "  python -m nre_ray.evaluate --model ray_results/RUN/checkpoint_DIR --data test.jsonl "
            "--negative-label Other --output scores.json\n"
            "  python -m nre_ray.evaluate --model models:/NAME/1 --data big.parquet --num-workers 4\n")


def build_parser() -> argparse.ArgumentParser:
    """The ``python -m nre_ray.evaluate`` options: the fields of :class:`EvaluateOptions`."""
    return command_parser(
        "python -m nre_ray.evaluate", EvaluateOptions, epilog=EXAMPLES,
        description="Evaluate a trained checkpoint on a labelled file with the evaluation code of training "
                    "(every row counted once, whatever the number of workers).")


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns the exit status (0 ok, 2 bad input or usage)."""
    args = EvaluateOptions(**vars(build_parser().parse_args(argv)))
    # torch, pandas and Ray only now: --help and a usage error answer at once

    quiet_environ()  # before Ray and MLflow are imported
    # deferred: importing it loads torch, numpy
    # deferred: importing it loads ray, torch, pandas, pyarrow, numpy
    from nre_ray.inference.evaluation import evaluate_file
    from nre_ray.run.checkpoint import CheckpointError

    try:
        report = evaluate_file(args.model, args.data, num_workers=args.num_workers,
                               negative_label=args.negative_label, fmt=args.format, columns=args.columns,
                               on_bad_rows=args.on_bad_rows, tracking_uri=args.tracking_uri, address=args.address,
                               cpus_per_worker=args.cpus_per_worker)
    except (UsageError, CheckpointError, ConfigError) as err:  # ConfigError: e.g. an MLflow store it cannot open
        print(f"error: {err}", file=sys.stderr)
        return 2
    except DataError as err:
        print(f"error: bad input data\n{err}", file=sys.stderr)
        return 2
    print()
    print_report(report)
    if args.output:
        try:
            write_text(args.output, json.dumps({**report, "confusion_matrix": report["confusion_matrix"].tolist()},
                                               indent=2, ensure_ascii=False))
        except StorageError as err:
            print(f"error: --output: {err}", file=sys.stderr)
            return 2
        print(f"\nwrote {args.output}")
    return 0


if __name__ == "__main__":
    from nre_ray.core.console import exit_status

    sys.exit(exit_status(main))

"""``python -m nre_ray.data``: look at a dataset before training on it, or rewrite it in the canonical schema.

* ``inspect`` preprocesses the data exactly as a training run would (same flags, same cache: a later run with the same
  settings reuses it) and prints the data audit (:mod:`nre_ray.data.audit`; the task's for documents and, with
  ``--bag-aggregator``, bags); ``--json`` / ``--report`` write it.
* ``convert INPUT OUTPUT`` reads any supported format (``--format`` to force one, ``--columns`` to map column names)
  and writes the canonical columns as CSV, TSV, JSON Lines or Parquet, by OUTPUT's extension. It streams, checks every
  row, and never overwrites an existing OUTPUT unless ``--force``.

Bad input ends with the problems listed (``FILE:LINE: field: ...``, the first 20 and a count) and exit status 2,
never a traceback.
"""

from __future__ import annotations

import argparse
import json
import logging
import shutil
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from nre_ray import storage as fs
from nre_ray.cluster.session import UsageError, quiet_environ, start_ray
from nre_ray.config import (
    REQUIRED,
    CommandParser,
    ConfigError,
    add_options,
    build_parser,
    choices,
    config_from_args,
    option,
    options_from,
    shared,
)
from nre_ray.data.errors import MAX_SHOWN, DataError, Problem

if TYPE_CHECKING:  # pandas and the readers are imported by the commands, not by --help
    import pandas as pd

log = logging.getLogger("nre_ray")
OUTPUT_FORMATS = {".csv": "csv", ".tsv": "tsv", ".jsonl": "jsonl", ".ndjson": "jsonl", ".parquet": "parquet",
                  ".pq": "parquet"}
CONVERT_ROWS_PER_CHUNK = 10_000
#: inspect's flags that mean less than train's: they say where train's cache is, nothing more.
INSPECT_HELPS = {
    "run.storage_path": "The training run's --storage-path, whose cache inspect reads and fills as that run would: "
                        "with an s3://... path, <storage-path>/.nre_ray_cache (default: ./ray_results, whose cache "
                        "is ./.nre_ray_cache).",
    "run.allow_local_storage": "As for the training run: the cache is then <storage-path>/.nre_ray_cache.",
    "model.bag_aggregator": "Describe the data as a bag run (train's --bag-aggregator) sees it: every sentence of "
                            "one entity pair (head_id/tail_id, else the head and tail texts) is one bag. Any of "
                            "the choices gives the same audit.",
    "model.model": "bert (with --pretrained): describe the data as a --model bert run encodes it, lengths in the "
                   "pretrained tokenizer's subwords against the model's positions (the run's own cache). The other "
                   "models give the same audit (in words).",
    "model.pretrained": "--model bert: the pretrained model (a local folder or a hub name) whose tokenizer encodes "
                        "the data, as train's --pretrained.",
}
#: The training flags inspect takes (the sections of train's config and, per section, the fields; None: all).
INSPECT_SECTIONS: dict[str, tuple[str, ...] | None] = {
    "data": None, "model": ("bag_aggregator", "model", "pretrained"), "train": ("seed",),
    "run": ("address", "storage_path", "allow_local_storage")}
CONVERT_HINT = "Fix these rows, or pass --on-bad-rows skip to convert the good rows only."


# --------------------------------------------------------------------------------------------------------------------
# inspect


@dataclass
class InspectOptions:
    """inspect's own options, one flag each (its others are training's: :data:`INSPECT_SECTIONS`)."""

    json: str | None = option(None, "Also write the audit as JSON.", metavar="FILE")
    report: str | None = option(None, "Also write the audit as Markdown.", metavar="FILE.md")


def inspect(args: argparse.Namespace) -> int:
    """Preprocess (or reuse the cache), print the audit; write it with ``--json`` / ``--report``."""
    # deferred: importing it loads pandas, pyarrow, numpy
    from nre_ray.data import pipeline

    # deferred: importing it loads torch, pandas, numpy
    from nre_ray.tasks.lookup import task_for

    cfg, opts = config_from_args(args), options_from(args, InspectOptions)
    # what the data is (bags with --bag-aggregator): its task preprocesses and describes it, as train's does
    task = task_for(cfg.data.data_dir, bags=cfg.model.bag_aggregator is not None)
    refused = task.unsupported("inspect")  # a task whose data inspect does not describe yet
    if refused:
        raise UsageError(refused)
    # train's cache: the same --cache-dir, --storage-path and --allow-local-storage find the same folders
    cfg.data.cache_dir, shared = pipeline.cache_places(cfg.data.cache_dir, cfg.run.storage_path,
                                                       cfg.run.allow_local_storage)
    pretrained = cfg.model.pretrained_source()  # --model bert: its subwords (train's cache for such a run)
    if not task.is_cached(cfg.data, cfg.train.seed, shared_cache=shared, pretrained=pretrained):
        task.check_inputs(cfg.data)  # bad folders, files, headers and columns fail here, before Ray starts
        start_ray(cfg.run.address, log_to_driver=False)
    prepared = task.prepare(cfg.data, cfg.train.seed, pretrained, shared_cache=shared)
    sys.stdout.write(task.audit_markdown(prepared.audit))
    if prepared.rejected_count:
        where = f", listed in {prepared.rejected_csv}" if prepared.rejected_csv else ""
        print(f"\n{prepared.rejected_count} bad {task.bad_unit or task.unit} were left out (--on-bad-rows "
              f"skip){where}")
    try:
        if opts.json:
            fs.write_text(opts.json, json.dumps(prepared.audit, indent=2, ensure_ascii=False))
        if opts.report:
            fs.write_text(opts.report, task.audit_markdown(prepared.audit))
    except fs.StorageError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0


# --------------------------------------------------------------------------------------------------------------------
# convert


class _Writer:
    """Appends canonical frames to a CSV / TSV / JSON Lines / Parquet file."""

    def __init__(self, path: Path, kind: str) -> None:
        self.path, self.kind = path, kind
        self.rows = 0
        self._parquet = None

    def write(self, frame: pd.DataFrame) -> None:
        first = self.rows == 0
        if self.kind in ("csv", "tsv"):
            frame.to_csv(self.path, mode="w" if first else "a", header=first, index=False,
                         sep="\t" if self.kind == "tsv" else ",")
        elif self.kind == "jsonl":
            with open(self.path, "w" if first else "a", encoding="utf-8") as fh:
                for record in frame.to_dict(orient="records"):
                    fh.write(json.dumps(record, ensure_ascii=False) + "\n")
        else:
            import pyarrow as pa
            import pyarrow.parquet as pq

            table = pa.Table.from_pandas(frame, preserve_index=False)
            if self._parquet is None:
                self._parquet = pq.ParquetWriter(self.path, table.schema)
            self._parquet.write_table(table.cast(self._parquet.schema))
        self.rows += len(frame)

    def close(self) -> None:
        """Finish the file."""
        if self._parquet is not None:
            self._parquet.close()
            self._parquet = None

    def discard(self) -> None:
        """Close and remove the file (nothing of a failed conversion is left behind)."""
        self.close()
        self.path.unlink(missing_ok=True)


def _canonical(checked: pd.DataFrame, columns: list[str]) -> pd.DataFrame:
    """The canonical columns of checked good rows: offsets as integers, text as str."""
    import numpy as np
    import pandas as pd

    out = pd.DataFrame(index=checked.index)
    for column in columns:
        if column in ("head_offset", "tail_offset"):
            out[column] = checked[column].to_numpy(dtype=np.int64)
        else:
            out[column] = checked[column].astype(object).where(checked[column].notna(), "").astype(str)
    return out.reset_index(drop=True)


@dataclass
class ConvertOptions:
    """The arguments and options of convert, one each."""

    input: str = option(REQUIRED, "The file to read (a local path or a URI such as s3://...).", flag="INPUT")
    output: str = option(REQUIRED, "The file to write, a local path or a URI (must not exist, unless --force).",
                         flag="OUTPUT")
    format: str | None = shared("format")
    columns: str | None = shared("columns")
    on_bad_rows: str = option("error", "'error' (default): write nothing and list the bad rows; 'skip': write the "
                                       "good rows and count the bad ones.", choices=choices("data.on_bad_rows"))
    force: bool = option(False, "Replace OUTPUT if it exists.")


def convert(args: ConvertOptions) -> int:
    """Stream INPUT into OUTPUT in the canonical schema (see the module docstring)."""
    # deferred: importing it loads pandas, pyarrow, numpy
    from nre_ray.data.read import (
        OPTIONAL,
        check_rows,
        parse_column_map,
        problems_of,
        read_chunks,
        split_problem,
    )
    from nre_ray.data.read import REQUIRED as REQUIRED_COLUMNS  # (config's REQUIRED is "no default")

    source, target = args.input, args.output  # local paths or URIs
    suffix = Path(fs.name_of(target)).suffix
    kind = OUTPUT_FORMATS.get(suffix.lower())
    if kind is None:
        raise UsageError(f"{target}: cannot tell the output format from the extension {suffix!r} (expected "
                         f"{', '.join(OUTPUT_FORMATS)})")
    if fs.is_dir(target):
        raise UsageError(f"{target} is a directory; give the output file's name.")
    if not fs.is_uri(target) and not Path(fs.parent(target)).is_dir():
        raise UsageError(f"{target}: the folder {fs.parent(target)} does not exist; create it first.")
    if fs.exists(target) and not args.force:
        raise UsageError(f"{target} already exists; nothing was written. Pass --force to replace it.")
    column_map = parse_column_map(args.columns) if args.columns else None
    # Written whole under a temporary name, then renamed (a local OUTPUT: in its folder) or uploaded (a URI).
    staging = Path(tempfile.mkdtemp(prefix=".nre_ray_convert_", dir=None if fs.is_uri(target) else fs.parent(target)))
    writer = _Writer(staging / fs.name_of(target), kind)
    shown: list[Problem] = []
    total = bad_rows = 0
    columns: list[str] | None = None
    try:
        for chunk in read_chunks(source, args.format, column_map, CONVERT_ROWS_PER_CHUNK, require_relation=False):
            checked = check_rows(chunk)
            bad = (checked["problem"] != "").to_numpy()
            if bad.any():
                bad_rows += int(bad.sum())
                flagged = checked[bad]
                total += sum(len(split_problem(p)) for p in flagged["problem"])
                if len(shown) < MAX_SHOWN:
                    shown.extend(problems_of(flagged.head(MAX_SHOWN)))
            if columns is None:
                columns = [c for c in REQUIRED_COLUMNS if c in checked.columns] + [
                    c for c in OPTIONAL if c in checked.columns and (checked[c].astype(str) != "").any()]
            if (args.on_bad_rows == "error" and total) or not (~bad).any():
                continue
            writer.write(_canonical(checked[~bad], columns))
        if total and args.on_bad_rows == "error":
            raise DataError(shown[:MAX_SHOWN], hint=CONVERT_HINT, total=total)
        writer.close()
        if writer.rows == 0:
            raise DataError([Problem(str(source), None, None, "no good rows to write")], hint=CONVERT_HINT)
        fs.move_file(writer.path, target)
    finally:
        writer.discard()
        shutil.rmtree(staging, ignore_errors=True)
    skipped = f"; left out {bad_rows} bad row{'s' if bad_rows != 1 else ''}" if bad_rows else ""
    print(f"wrote {writer.rows} rows to {target} ({kind}){skipped}")
    return 0


# --------------------------------------------------------------------------------------------------------------------
# command line


def build_cli() -> argparse.ArgumentParser:
    """The ``python -m nre_ray.data`` parser."""
    parser = CommandParser(prog="python -m nre_ray.data",
                                     description="Inspect a relation-classification dataset, or convert it.",
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog="examples:\n"
                                            "  python -m nre_ray.data inspect --data-dir DATA\n"
                                            "  python -m nre_ray.data inspect --train train.jsonl --format jsonl "
                                            "--report audit.md\n"
                                            "  python -m nre_ray.data convert semeval_train.txt train.csv\n")
    commands = parser.add_subparsers(dest="command", required=True, metavar="{inspect,convert}")
    inspect_parser = commands.add_parser(
        "inspect", help="preprocess as training would and print the data audit",
        description="Read, check, tokenize and encode the data exactly as `python -m nre_ray.train` with the same "
                    "flags would (and cache it for that run), then print the data audit: rows and labels per split, "
                    "duplicates, rows shared with train, lengths, truncation, out-of-vocabulary rate, warnings. "
                    "Document folders get the document audit; with --bag-aggregator, the bag audit (bags per split, "
                    "bag sizes and --max-bag-size, multi-label and NA bags, pairs shared with train).",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="examples:\n"
               "  python -m nre_ray.data inspect                          # the bundled sample\n"
               "  python -m nre_ray.data inspect --data-dir DATA --json audit.json --report audit.md\n"
               "  python -m nre_ray.data inspect --train train.tsv --format tsv --columns "
               "'entity1=head,offset1=head_offset,entity2=tail,offset2=tail_offset'\n"
               "  python -m nre_ray.data inspect --data-dir DATA --on-bad-rows skip --tokenizer jieba\n"
               "  python -m nre_ray.data inspect --data-dir NYT10 --bag-aggregator att --max-bag-size 50"
               "   # as bags\n"
               "  python -m nre_ray.data inspect --data-dir s3://BUCKET/data --storage-path s3://BUCKET/checkpoints"
               "   # that run's cache\n")
    build_parser(only=INSPECT_SECTIONS, parser=inspect_parser, helps=INSPECT_HELPS)
    add_options(inspect_parser, InspectOptions)
    convert_parser = commands.add_parser(
        "convert", help="write a dataset in the canonical schema (CSV, TSV, JSON Lines or Parquet)",
        description="Read INPUT in any supported format and write its rows in the canonical schema "
                    "(sentence, head, head_offset, tail, tail_offset, relation, and id, head_type, tail_type when "
                    "the input has them) to OUTPUT; the format follows OUTPUT's extension "
                    f"({', '.join(OUTPUT_FORMATS)}).",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="examples:\n"
               "  python -m nre_ray.data convert semeval_train.txt train.csv       # SemEval-2010 Task 8 -> CSV\n"
               "  python -m nre_ray.data convert train.json train.parquet --format opennre\n"
               "  python -m nre_ray.data convert raw.csv clean.jsonl --on-bad-rows skip --force\n")
    add_options(convert_parser, ConvertOptions)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns the exit status (0 fine, 2 bad input or usage)."""
    args = build_cli().parse_args(argv)
    quiet_environ()  # before Ray and MLflow are imported
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    logging.getLogger("nre_ray").setLevel(logging.INFO)
    for noisy in ("ray", "ray.data"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    try:
        return inspect(args) if args.command == "inspect" else convert(options_from(args, ConvertOptions))
    except DataError as err:
        print(f"error: bad input data\n{err}", file=sys.stderr)
    except (ConfigError, UsageError) as err:
        print(f"error: {err}", file=sys.stderr)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    return 2


if __name__ == "__main__":
    from nre_ray.core.console import exit_status

    sys.exit(exit_status(main))

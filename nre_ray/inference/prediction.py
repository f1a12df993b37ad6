"""Label a file of raw rows with a trained model (``python -m nre_ray.predict``); a large file streams through Ray
Data.

The input is read in chunks (:mod:`nre_ray.data.chunks`). A small input (at most ``--local-max-rows`` rows, default
:data:`nre_ray.data.sizes.LOCAL_MAX_ROWS`) is labelled chunk by chunk in this process, without starting Ray: starting
Ray and an actor would take longer than the whole job. A larger one is read by Ray tasks and labelled by an actor
pool of ``--num-workers`` actors, each holding the model once; the driver writes the chunks in input order as they
come back, and memory stays bounded by a few chunks whatever the size of the input. Both ways label each chunk with
:class:`nre_ray.inference.predictor.Predictor` (the preprocessing of training) and :func:`_with_predictions`, so they
write the same file. The output keeps the input's columns, in order, and adds ``predicted_relation`` and ``score`` (and
``top_k_labels`` / ``top_k_scores`` with ``--top-k``).

The input, the output and the model may be local paths or URIs (``s3://...``, see :mod:`nre_ray.storage`). The
output and its ``.rejected.csv`` are written to a staging folder (beside a local output, else a temporary one) and
put in place when complete, so a failed run leaves no partial file.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import shutil
import sys
import tempfile
import time
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path, PurePosixPath
from typing import Any

import numpy as np
import pandas as pd

from nre_ray import storage
from nre_ray.cluster.session import (
    Cluster,
    Resources,
    UsageError,
    cluster,
    local_cluster,
    local_node,
    size_workers,
    start_ray,
)
from nre_ray.core import console
from nre_ray.data.chunks import PREFIX, Chunk, InputPlan, canonical_part, input_part
from nre_ray.data.errors import DataError, Problem
from nre_ray.data.pipeline import quiet_ray_data
from nre_ray.data.read import problems_of
from nre_ray.inference.predict_options import PredictOptions
from nre_ray.inference.predictor import ON_BAD_ROWS, Predictor, resolve_checkpoint
from nre_ray.run.checkpoint import load_checkpoint
from nre_ray.tasks.lookup import check_checkpoint_folder, task_of

# the writer joins each input row with its prediction row: the sentence task's rows (one per input row)
from nre_ray.tasks.sentence.rows import OUTPUT_COLUMNS, TOP_K_COLUMNS

OUTPUT_FORMATS = {".csv": "csv", ".tsv": "tsv", ".jsonl": "jsonl", ".ndjson": "jsonl", ".json": "jsonl",
                  ".parquet": "parquet", ".pq": "parquet"}
MAX_PROBLEMS = 1000
"""With ``--on-bad-rows error``, reading stops after this many bad rows."""


@dataclasses.dataclass
class PredictSummary:
    """What a prediction run did."""

    rows: int
    written: int
    skipped: int
    seconds: float
    output: str
    rejected: str | None
    workers: int
    in_process: bool = False
    unit: str = "rows"
    """What the input's rows are (the task's :attr:`~nre_ray.tasks.base.Task.unit`: ``rows``, ``documents``)."""
    bad_unit: str = "rows"
    """What the skipped entries are (the task's :attr:`~nre_ray.tasks.base.Task.bad_unit`)."""

    @property
    def rows_per_second(self) -> float:
        """Input rows per second, end to end (reading, predicting, writing; not Ray's start)."""
        return self.rows / max(self.seconds, 1e-9)


# --------------------------------------------------------------------------------------------------------------------
# Ray Data stages


def read_chunks(batch: pd.DataFrame, plan: Any) -> pd.DataFrame:
    """Ray Data stage: each row of ``batch`` names a chunk (start, end, first_line, rows); returns its records."""
    import ray

    plan = ray.get(plan) if isinstance(plan, ray.ObjectRef) else plan
    frames = [plan.read_chunk(Chunk(int(r.start), int(r.end), int(r.first_line), int(r.rows)))
              for r in batch.itertuples()]
    return pd.concat(frames, ignore_index=True) if len(frames) > 1 else frames[0]


class PredictChunks:
    """Ray Data actor: loads the model once, then labels each chunk (a whole block: the batches inside depend on the
    chunk only, so any number of actors gives the same numbers)."""

    def __init__(self, checkpoint: Any, batch_size: int, top_k: int, threads: int, device: str) -> None:
        import ray
        import torch

        torch.set_num_threads(max(1, threads))
        if isinstance(checkpoint, list):  # [ObjectRef]: nested, so the actor fetches it itself
            checkpoint = checkpoint[0]
        loaded = ray.get(checkpoint) if isinstance(checkpoint, ray.ObjectRef) else checkpoint
        self.predictor = Predictor.from_loaded(loaded, device, batch_size)
        self.top_k = top_k

    def __call__(self, frame: pd.DataFrame) -> pd.DataFrame:
        preds = self.predictor.predict_rows(canonical_part(frame), self.top_k)
        return _with_predictions(frame, preds, self.predictor.task.output_columns(top_k=1))


def _with_predictions(frame: pd.DataFrame, preds: pd.DataFrame, outputs: list[str]) -> pd.DataFrame:
    """The input columns (old prediction columns, ``outputs`` (the task's), dropped), the predictions, and
    ``_nre_file/line/problem``."""
    out = input_part(frame).drop(columns=[c for c in outputs if c in frame.columns])
    out = out.reset_index(drop=True).copy()
    for column in preds.columns:
        if column != "problem":
            out[column] = preds[column].to_numpy()
    out[PREFIX + "file"] = frame[PREFIX + "file"].to_numpy()
    out[PREFIX + "line"] = frame[PREFIX + "line"].to_numpy()
    out[PREFIX + "problem"] = preds["problem"].to_numpy()
    return out


# --------------------------------------------------------------------------------------------------------------------
# writers


def _jsonable(value: Any) -> Any:
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, np.ndarray):
        return [_jsonable(v) for v in value.tolist()]
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    return value


def _as_text(value: Any) -> Any:
    """Non-text values of an object column as text (JSON syntax), so a Parquet column keeps one type."""
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, float) and math.isnan(value):
        return None
    return json.dumps(_jsonable(value), ensure_ascii=False)


class Writer:
    """Writes frames one after another to a local CSV, TSV, JSON Lines or Parquet file (the first frame fixes the
    columns). ``integers``: columns that Parquet stores as int64 (the entity offsets, which a CSV input gives as
    text); the text formats write every value as it came."""

    def __init__(self, path: Path, fmt: str, integers: tuple[str, ...] = ()) -> None:
        self.path, self.fmt, self.integers = path, fmt, integers
        self.rows = 0
        self._schema = None
        self._parquet = None
        self._fh = None if fmt == "parquet" else open(path, "w", encoding="utf-8", newline="")

    def write(self, frame: pd.DataFrame) -> None:
        """Append ``frame`` (list cells are written as JSON arrays in CSV/TSV)."""
        if self.fmt in ("csv", "tsv"):
            frame = frame.copy()
            for column in TOP_K_COLUMNS:
                if column in frame.columns:
                    frame[column] = [json.dumps(_jsonable(v), ensure_ascii=False) if v is not None else None
                                     for v in frame[column]]
            frame.to_csv(self._fh, index=False, header=self.rows == 0, sep="\t" if self.fmt == "tsv" else ",")
        elif self.fmt == "jsonl":
            columns = list(frame.columns)
            for values in frame.itertuples(index=False, name=None):
                record = {c: _jsonable(v) for c, v in zip(columns, values, strict=True)}
                self._fh.write(json.dumps(record, ensure_ascii=False) + "\n")
        else:
            self._write_parquet(frame)
        self.rows += len(frame)

    def _write_parquet(self, frame: pd.DataFrame) -> None:
        import pyarrow as pa
        import pyarrow.parquet as pq

        frame = frame.copy()
        for column in frame.columns:
            if column in self.integers:  # checked offsets: integers, or their text ("3", "3.0")
                frame[column] = pd.to_numeric(frame[column]).astype("int64")
            elif frame[column].dtype == object and column not in TOP_K_COLUMNS:
                frame[column] = [_as_text(v) for v in frame[column]]
        if self._schema is None:
            table = pa.Table.from_pandas(frame, preserve_index=False)
            self._schema = table.schema.remove_metadata()
            self._parquet = pq.ParquetWriter(self.path, self._schema)
        else:
            table = pa.Table.from_pandas(frame, schema=self._schema, preserve_index=False)
        self._parquet.write_table(table)

    def close(self) -> None:
        """Finish the file (a Parquet file with no rows still gets written, empty)."""
        if self._fh is not None:
            self._fh.close()
        if self._parquet is not None:
            self._parquet.close()
        elif self.fmt == "parquet":
            import pyarrow as pa
            import pyarrow.parquet as pq

            pq.write_table(pa.table({}), self.path)


def output_format(path: str | Path) -> str:
    """The output format from the extension; UsageError for others."""
    ext = PurePosixPath(storage.name_of(path)).suffix.lower()
    if ext not in OUTPUT_FORMATS:
        raise UsageError(f"--output {path}: cannot tell the format from {ext or 'no extension'!r}; use one of "
                         f"{', '.join(OUTPUT_FORMATS)}")
    return OUTPUT_FORMATS[ext]


# --------------------------------------------------------------------------------------------------------------------
# the run


def predict_file(options: PredictOptions) -> PredictSummary:
    """Label ``options.input`` with ``options.model`` and write ``options.output``; see the module docstring and
    ``--help``. Inputs of at most ``local_max_rows`` rows are labelled in this process, without Ray (0: always Ray);
    ``cpus_per_worker``: the CPUs of each actor (default: sized as training sizes them)."""
    if options.num_workers < 1 or options.batch_size < 1 or options.top_k < 0 or options.chunk_rows < 1 \
            or options.local_max_rows < 0:
        raise UsageError("--num-workers, --batch-size and --chunk-rows must be >= 1, --top-k and --local-max-rows "
                         ">= 0")
    if options.cpus_per_worker is not None and options.cpus_per_worker < 0.01:
        raise UsageError("--cpus-per-worker must be >= 0.01")
    if options.on_bad_rows not in ON_BAD_ROWS:
        raise UsageError(f"--on-bad-rows must be one of {', '.join(ON_BAD_ROWS)}")
    out_fmt = output_format(options.output)
    if not storage.is_uri(options.output) and not storage.is_dir(storage.parent(options.output)):
        raise UsageError(f"--output {options.output}: the folder {storage.parent(options.output)} does not exist")
    if not storage.is_uri(options.model) and Path(options.model).is_dir():  # before its input is read as rows
        check_checkpoint_folder(options.model, "predict")
    resolved = resolve_checkpoint(options.model, options.tracking_uri)
    try:
        loaded = load_checkpoint(resolved.checkpoint)
    finally:
        resolved.cleanup()
    task = task_of(loaded.meta, "predict")  # a task whose models predict does not take yet: one line
    # the task reads its input (the sentence task's rows of any format training reads; documents)
    plan = task.plan_input(options.input, options.format, options.columns, options.chunk_rows)
    in_process = plan.total_rows <= options.local_max_rows
    if in_process and options.use_gpu and not local_node().get("GPU"):
        raise UsageError(f"--use-gpu: this machine has no GPU, and {options.input} ({plan.total_rows} rows, at most "
                         f"--local-max-rows {options.local_max_rows}) is labelled here, without Ray. Drop --use-gpu, "
                         "or pass --local-max-rows 0 to label it on a Ray cluster with GPUs (--address).")
    # an address Ray cannot join is refused here
    ahead = None if in_process else local_cluster(options.address, options.use_gpu)
    if ahead is not None:  # and actors the local Ray can never hold, before it starts and the model is loaded
        _size_actors(ahead, options.num_workers, options.use_gpu, options.cpus_per_worker)

    # the optimizer's state is not needed to predict; training's metrics may be (the bag task's threshold)
    loaded.state = {"model": loaded.state["model"], "metrics": loaded.state.get("metrics") or {}}
    device = "cuda" if options.use_gpu else "cpu"
    # fails here, clearly, if the weights do not fit
    predictor = Predictor.from_loaded(loaded, device, options.batch_size)

    if in_process:
        start = time.perf_counter()
        batches = _run_here(plan, predictor, options.top_k)
    else:
        # Ray's messages (the controller's retries under load) stay in its log files; failures come back as errors
        start_ray(options.address, log_to_driver=False)
        start = time.perf_counter()
        batches = _run_ray(plan, loaded, options.batch_size, options.num_workers, options.top_k, options.use_gpu,
                           options.cpus_per_worker)
    summary = _write(batches, plan, options.output, out_fmt, options.on_bad_rows, not options.no_progress,
                     task.answer, task.unit, task.output_columns(top_k=1), task.bad_unit or task.unit)
    summary.seconds = time.perf_counter() - start
    summary.workers = 0 if in_process else options.num_workers
    summary.in_process = in_process
    summary.unit, summary.bad_unit = task.unit, task.bad_unit or task.unit
    return summary


def _run_here(plan: InputPlan, predictor: Predictor, top_k: int) -> Iterator[pd.DataFrame]:
    """The chunks labelled one after another in this process (a small input: no Ray)."""
    for index in range(len(plan.chunks)):
        frame = plan.read(index)
        yield _with_predictions(frame, predictor.predict_rows(canonical_part(frame), top_k),
                                predictor.task.output_columns(top_k=1))


def _size_actors(info: Cluster, num_workers: int, use_gpu: bool, cpus_per_worker: float | None) -> Resources:
    """The actors' resources on the cluster ``info``, sized as train sizes workers (the alive nodes and the node
    types the autoscaler may add): one CPU share per actor and one for the reading tasks; with ``use_gpu`` also one
    GPU per actor. UsageError when the cluster can never hold them."""
    resources = size_workers(info, num_workers, cpus_per_worker=cpus_per_worker, plus=1)
    if use_gpu:
        size_workers(info, num_workers, use_gpu=True)
    return resources


def _run_ray(plan: InputPlan, loaded: Any, batch_size: int, num_workers: int, top_k: int,
             use_gpu: bool, cpus_per_worker: float | None) -> Iterator[pd.DataFrame]:
    import ray
    import ray.data
    from ray.util.annotations import RayDeprecationWarning

    resources = _size_actors(cluster(), num_workers, use_gpu, cpus_per_worker)
    cpu = resources.per_worker["CPU"]
    quiet_ray_data(_ActorDeathFilter())
    ctx = ray.data.DataContext.get_current()
    ctx.execution_options.preserve_order = True

    items = [dataclasses.asdict(c) for c in plan.chunks]
    shipped = ray.put(dataclasses.replace(plan, chunks=[]))
    ds = ray.data.from_items(items, override_num_blocks=len(items))
    ds = ds.map_batches(read_chunks, batch_size=1, batch_format="pandas", fn_kwargs={"plan": shipped}, num_cpus=cpu)
    # No actor restarts: Ray cannot promise one for an actor whose constructor arguments sit in the object store,
    # as Ray Data's always do (ray-project/ray#53727; with restarts on, the driver prints a core_worker.cc warning
    # saying so). An actor that dies ends the command with a clear error (nre_ray.predict.main), and nothing is
    # written. Ray 2.60 (pinned) takes max_restarts only through the deprecated **ray_remote_args, hence the filter.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RayDeprecationWarning)
        ds = ds.map_batches(
            PredictChunks, batch_size=None, batch_format="pandas",
            compute=ray.data.ActorPoolStrategy(size=min(num_workers, len(items))),  # no idle actor (and no warning)
            fn_constructor_kwargs={"checkpoint": [ray.put(loaded)], "batch_size": batch_size, "top_k": top_k,
                                   "threads": resources.threads, "device": "cuda" if use_gpu else "cpu"},
            num_cpus=cpu, num_gpus=1 if use_gpu else 0, max_restarts=0,
        )
    return ds.iter_batches(batch_size=None, batch_format="pandas")


class _ActorDeathFilter(logging.Filter):
    """Drops Ray Data's reports of an actor's death (stack traces, "Exception occurred in Ray Data or Ray Core
    internal code ..."): :func:`nre_ray.predict.main` says what happened in one line. Ray Data logs them while it
    handles the error, so the record's exception, or else the one being handled, is the one reported."""

    def filter(self, record: logging.LogRecord) -> bool:
        err = record.exc_info[1] if record.exc_info else sys.exc_info()[1]
        return err is None or not worker_died(err)


def worker_died(err: BaseException) -> bool:
    """True when ``err`` (or an error it wraps) is a Ray actor's or worker's death."""
    while err is not None:
        if type(err).__name__ in ("ActorDiedError", "RayActorError", "WorkerCrashedError", "OutOfMemoryError",
                                  "ActorUnavailableError"):
            return True
        err = err.__cause__ or err.__context__
    return False


def _rejected_path(output: storage.PathLike) -> str:
    """``<output without its extension>.rejected.csv``, beside the output."""
    name = PurePosixPath(storage.name_of(output))
    return storage.join(storage.parent(output), name.stem + ".rejected.csv")


def _write(batches: Iterator[pd.DataFrame], plan: InputPlan, output: storage.PathLike, out_fmt: str,
           on_bad_rows: str, progress: bool, answer: Callable[[pd.DataFrame], pd.DataFrame] = lambda f: f,
           unit: str = "rows", outputs: tuple[str, ...] | list[str] = (), bad_unit: str = "rows") -> PredictSummary:
    """Write the answers of the good rows (in order; ``answer``: the task's, :meth:`nre_ray.tasks.base.Task.answer`;
    ``unit``: what a row of the input is, the task's :attr:`~nre_ray.tasks.base.Task.unit`; ``outputs``: the task's
    prediction columns, which its ``.rejected.csv`` leaves out; ``bad_unit``: what its bad entries are)
    to ``output`` (a local path or a URI); bad rows are collected (error) or written to ``<output>.rejected.csv``
    (skip). Both are written in a staging folder and put in place at the end, or not at all."""
    output = str(output)
    staging = Path(tempfile.mkdtemp(prefix=".nre_ray_predict_",
                                    dir=None if storage.is_uri(output) else storage.parent(output)))
    rejected_path = _rejected_path(output)
    writer = Writer(staging / storage.name_of(output), out_fmt, tuple(plan.offset_columns))
    rejected: Writer | None = None
    problems: list[Problem] = []
    bad_rows = rows = 0
    internal = [PREFIX + c for c in ("file", "line", "problem")]
    done = False
    try:
        # a tqdm bar on a terminal, a line every few seconds in a log file (on stderr: stdout may be piped on)
        out = console.Console(sys.stderr) if progress else console.Console(_Discard(), tty=False)
        known_bad = plan.bad_rows  # a task's input read whole knows its bad rows ahead; a streamed file does not
        more = f" (and {known_bad} bad {bad_unit})" if known_bad else ""
        with out.phase("predict", f"labelling {plan.total_rows - known_bad} {unit} of {plan.path}{more}") as step:
            bar = step.progress(total=plan.total_rows, unit=unit)
            for batch in batches:
                rows += len(batch)
                bar.update(len(batch))
                bad = (batch[PREFIX + "problem"] != "").to_numpy()
                if bad.any():
                    bad_rows += int(bad.sum())
                    flagged = batch[bad]
                    if on_bad_rows == "error":
                        problems.extend(problems_of(canonical_part(flagged[internal])))
                        if bad_rows >= MAX_PROBLEMS:
                            break
                    else:
                        if rejected is None:
                            rejected = Writer(staging / storage.name_of(rejected_path), "csv")
                        rejected.write(_rejected_frame(flagged, outputs))
                if on_bad_rows == "skip" or not problems:
                    writer.write(answer(batch.loc[~bad].drop(columns=internal)))
        done = True
    finally:
        writer.close()
        if rejected is not None:
            rejected.close()
        if not done or problems:
            shutil.rmtree(staging, ignore_errors=True)
    if problems:
        more = " (stopped reading there)" if bad_rows >= MAX_PROBLEMS else ""
        raise DataError(problems, hint=f"{bad_rows} bad rows{more}. Fix them, or pass --on-bad-rows skip to predict "
                                       "the good rows only (the others are listed in a .rejected.csv file).")
    try:
        storage.move_file(writer.path, output)
        if rejected is not None:
            storage.move_file(rejected.path, rejected_path)
        else:
            storage.remove(rejected_path)  # a stale list from an earlier run would mislead
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return PredictSummary(rows=rows - known_bad, written=writer.rows, skipped=bad_rows, seconds=0.0, output=output,
                          rejected=rejected_path if rejected is not None else None, workers=0)


class _Discard:
    """A stream that drops what is written (``--no-progress``)."""

    def write(self, text: str) -> int:
        return len(text)

    def flush(self) -> None:
        pass


def _rejected_frame(flagged: pd.DataFrame, outputs: tuple[str, ...] | list[str] = ()) -> pd.DataFrame:
    """The bad rows as ``.rejected.csv`` lists them: file, line, problem, then their input columns (not the task's
    prediction columns ``outputs``, empty for a bad row)."""
    out = pd.DataFrame({"file": flagged[PREFIX + "file"].to_numpy(), "line": flagged[PREFIX + "line"].to_numpy(),
                        "problem": flagged[PREFIX + "problem"].to_numpy()})
    for column in input_part(flagged).columns:
        if column not in (*outputs, *OUTPUT_COLUMNS, *TOP_K_COLUMNS, "file", "line", "problem"):
            out[column] = flagged[column].to_numpy()
    return out


def cause(err: BaseException, kind: type[Exception]) -> Exception | None:
    """The error of type ``kind`` behind an error raised through Ray (a task's exception arrives wrapped, as an
    instance of a subclass that Ray makes: hence the exact type)."""
    seen = set()
    while err is not None and id(err) not in seen:
        if type(err) is kind:
            return err
        seen.add(id(err))
        err = getattr(err, "cause", None) or err.__cause__ or err.__context__
    return None

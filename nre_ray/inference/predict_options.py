"""The options of ``python -m nre_ray.predict`` (:class:`PredictOptions`): what :func:`nre_ray.inference.prediction.
predict_file` takes, one flag each (kept apart from it: ``--help`` loads no torch)."""

from __future__ import annotations

from dataclasses import dataclass

from nre_ray.config import REQUIRED, choices, option, shared
from nre_ray.data.sizes import DEFAULT_CHUNK_ROWS, LOCAL_MAX_ROWS


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

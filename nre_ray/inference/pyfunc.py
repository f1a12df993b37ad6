"""The trained model as a self-contained MLflow pyfunc model: raw rows in, relation labels out.

:func:`log_model` logs a checkpoint folder (weights, vocabulary, labels, tokenizer settings) as the artifact
``checkpoint`` of a pyfunc model named ``model`` in an existing MLflow run, together with the ``nre_ray`` package
itself (``code_paths``), an explicit signature, an input example and pinned requirements. In a fresh process
``mlflow.pyfunc.load_model("runs:/<run_id>/model").predict(frame)`` labels raw rows, and
``mlflow models serve -m runs:/<run_id>/model --env-manager local`` serves them over HTTP.
"""

from __future__ import annotations

import importlib.metadata
import json
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import mlflow
import mlflow.pyfunc
import pandas as pd

import nre_ray
from nre_ray.core import tempfiles
from nre_ray.data.errors import DataError
from nre_ray.data.vocab import Vocab
from nre_ray.tasks.lookup import task_of
from nre_ray.tracking import store as tracking

MODEL_NAME = "model"
#: Distributions the pyfunc model imports (pinned to the versions installed when it was logged).
REQUIREMENTS = ("torch", "mlflow", "pandas", "numpy", "pyarrow", "jieba")
#: What a --model bert checkpoint (a pretrained encoder and its tokenizer) imports besides.
BERT_REQUIREMENTS = ("transformers", "tokenizers", "safetensors")

MODEL_SCRIPT = """\
import mlflow

from nre_ray.inference.pyfunc import RelationModel

mlflow.models.set_model(RelationModel())
"""


class RelationModel(mlflow.pyfunc.PythonModel):
    """pyfunc wrapper around :class:`nre_ray.inference.predictor.Predictor`.

    ``predict`` takes a DataFrame with ``sentence, head, head_offset, tail, tail_offset`` (offsets: 0-based character
    offsets) and returns ``predicted_relation`` and ``score``; ``params={"top_k": K}`` adds ``top_k_labels`` and
    ``top_k_scores``. A bad row is an error (MLflow's server answers 400 with the rows' problems).
    """

    def load_context(self, context: Any) -> None:
        """Build the predictor from the logged checkpoint folder."""
        # deferred: importing it loads torch
        from nre_ray.inference.predictor import Predictor

        self.predictor = Predictor.from_checkpoint(context.artifacts["checkpoint"])

    def predict(self, context: Any, model_input: pd.DataFrame, params: dict[str, Any] | None = None) -> pd.DataFrame:
        """Label the rows of ``model_input``."""
        top_k = int((params or {}).get("top_k") or 0)
        frame = model_input if isinstance(model_input, pd.DataFrame) else pd.DataFrame(model_input)
        try:
            out = self.predictor.predict_frame(frame, top_k=top_k)
        except DataError as err:
            raise rows_error(err.problems, self.predictor.task.request_hint) from None
        task = self.predictor.task  # its answer: the sentence task's one row per input row, the document task's
        # one row per predicted fact
        return task.answer(out[task.output_columns(top_k)].reset_index(drop=True))[task.answer_columns(top_k)]


def rows_error(problems: list[Any], hint: str) -> Exception:
    """The error a client gets for bad rows (``problems``: :class:`nre_ray.data.errors.Problem`, ``row N: field:
    what``; ``hint``: the task's :attr:`~nre_ray.tasks.base.Task.request_hint`): an ``MlflowException`` that MLflow's
    scoring server (and ``python -m nre_ray.serve``) answers with HTTP 400 and the rows' problems in words."""
    from mlflow.exceptions import MlflowException
    from mlflow.protos.databricks_pb2 import INVALID_PARAMETER_VALUE

    fixed = DataError(problems, hint=hint)
    return MlflowException(str(fixed), error_code=INVALID_PARAMETER_VALUE)


def pip_requirements(extra: tuple[str, ...] = ()) -> list[str]:
    """``name==version`` of what the model imports (and of ``extra``), as installed now (local version suffixes such
    as +cu121 are dropped so that the pins resolve from PyPI)."""
    pins = []
    for name in (*REQUIREMENTS, *extra):
        try:
            version = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
        pins.append(f"{name}=={version.split('+')[0]}")
    return pins


@dataclass
class LoggedModel:
    """Where :func:`log_model` put the model."""

    model_uri: str
    registered_uri: str | None = None


def _weights_only_copy(checkpoint: Path, folder: Path) -> Path:
    """The checkpoint without the optimizer and scheduler state (what predicting needs; about a third the size)."""
    # deferred: importing it loads torch
    from nre_ray.run.checkpoint import load_checkpoint, save_checkpoint

    loaded = load_checkpoint(checkpoint)
    state = {k: v for k, v in loaded.state.items() if k in ("model", "epoch", "best_epoch", "best_score", "metrics")}
    meta = {k: v for k, v in loaded.meta.items() if k not in ("format_version", "files")}
    return save_checkpoint(folder, state, loaded.config, loaded.vocab, loaded.labels, meta, loaded.assets)


def log_model(checkpoint: str | Path, tracking_uri: str, run_id: str,
              registered_model_name: str | None = None) -> LoggedModel:
    """Log ``checkpoint`` (a folder; the optimizer state is left out) as the pyfunc model ``model`` of run ``run_id``
    and register it under ``registered_model_name``; its test and validation scores are linked to it
    (:func:`nre_ray.tracking.store.attach_model`). The run's status is left as it was. ``tracking_uri``: resolved
    and checked (:func:`nre_ray.tracking.store.resolve_tracking_uri`)."""
    with tempfile.TemporaryDirectory(prefix=tempfiles.prefix("code")) as tmp:
        # The package without caches, so the model imports nre_ray in an environment that does not have it.
        code = Path(tmp) / "nre_ray"
        shutil.copytree(Path(nre_ray.__file__).parent, code,
                        ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info"))
        slim = _weights_only_copy(Path(checkpoint), Path(tmp) / "checkpoint")
        script = Path(tmp) / "relation_model.py"  # "models from code": the model is built by code, not unpickled
        script.write_text(MODEL_SCRIPT, encoding="utf-8")
        meta = json.loads((slim / "meta.json").read_text(encoding="utf-8"))
        epoch = int(meta.get("epoch", 0))
        task = task_of(meta)  # the checkpoint's: its requests, answers and example
        vocab = Vocab.from_json(json.loads((slim / "vocab.json").read_text(encoding="utf-8")))
        with tracking.mlflow_settings(tracking_uri):
            # The model is created first, in the run's experiment and with the run as its source (runs:/<id>/model
            # finds it), and logged without an active run: MLflow would otherwise link to it every metric the run
            # has at the model's step (the start-up timings). attach_model links its scores instead.
            model = mlflow.initialize_logged_model(name=MODEL_NAME, source_run_id=run_id,
                                                   experiment_id=tracking.experiment_id(tracking_uri, run_id),
                                                   params=tracking.run_params(tracking_uri, run_id))
            try:
                info = mlflow.pyfunc.log_model(
                    name=MODEL_NAME, python_model=str(script), artifacts={"checkpoint": str(slim)},
                    model_id=model.model_id, code_paths=[str(code)], signature=task.pyfunc_signature(),
                    input_example=task.pyfunc_example(vocab),
                    pip_requirements=pip_requirements(BERT_REQUIREMENTS if (slim / "pretrained").is_dir() else ()),
                    registered_model_name=registered_model_name,
                )
            except BaseException:  # Ctrl-C included: no PENDING model is left next to the run's real one
                tracking.discard_unfinished_models(tracking_uri, run_id, model.model_id)
                raise
        tracking.attach_model(tracking_uri, run_id, model.model_id, epoch)
    registered = None
    if registered_model_name and info.registered_model_version is not None:
        registered = f"models:/{registered_model_name}/{info.registered_model_version}"
    return LoggedModel(f"runs:/{run_id}/{MODEL_NAME}", registered)

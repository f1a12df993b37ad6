"""Predictions from a trained checkpoint: raw rows in, the task's prediction rows out.

:class:`Predictor` is the one component that every way of using a model goes through (``python -m nre_ray.predict``,
``python -m nre_ray.evaluate``, the MLflow pyfunc model and the model server). It rebuilds the checkpoint's task (its
meta.json's ``task``: :func:`nre_ray.tasks.lookup.task_of`) and model, and the task prepares rows with the same pure
functions that prepared the training data and turns the model's outputs into rows (the sentence task's:
:mod:`nre_ray.tasks.sentence.rows`, one row per input row, the label and its probability).

:func:`resolve_checkpoint` turns what a user names as a model (a checkpoint folder, ``runs:/<run_id>/model``,
``models:/<name>/<version>``, ``models:/<name>@<alias>``) into a local checkpoint folder.
"""

from __future__ import annotations

import re
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import torch
from torch import nn

from nre_ray import storage
from nre_ray.config import Config
from nre_ray.data.errors import DataError, Problem
from nre_ray.data.read import split_problem
from nre_ray.data.vocab import Vocab
from nre_ray.models.registry import ModelSpec
from nre_ray.run.checkpoint import CheckpointError, LoadedCheckpoint, load_checkpoint
from nre_ray.tasks.base import Task
from nre_ray.tasks.lookup import task_of
from nre_ray.tasks.sentence.task import SENTENCE
from nre_ray.tracking.store import download_model, model_store, registered_version

ON_BAD_ROWS = ("error", "skip")
PREDICT_HINT = "Fix these rows, or pass --on-bad-rows skip to predict the good rows only."


class Predictor:
    """A trained model with its task, vocabulary, labels and preprocessing settings, ready to label raw rows (the
    :class:`nre_ray.tasks.base.PredictSettings` its task predicts with).

    Build it with :meth:`from_checkpoint` (a folder) or :meth:`from_loaded`. The model is in eval mode on ``device``.
    """

    def __init__(self, model: nn.Module, config: Config, vocab: Vocab, labels: list[str], num_positions: int,
                 device: torch.device, batch_size: int = 256, assets: Mapping[str, bytes] | None = None,
                 task: Task = SENTENCE, metrics: Mapping[str, float] | None = None) -> None:
        self.task = task
        self.metrics = dict(metrics or {})  # training's, recorded with the checkpoint (the bag task's threshold)
        self.model = model.eval().to(device)
        self.assets = dict(assets or {})  # a pretrained encoder's tokenizer and config (see encode_rows)
        self.config = config
        self.vocab = vocab
        self.labels = list(labels)
        self.num_positions = num_positions
        self.device = device
        self.batch_size = batch_size

    @classmethod
    def from_checkpoint(cls, folder: str | Path, device: str | torch.device | None = None,
                        batch_size: int = 256) -> Predictor:
        """Load a checkpoint folder written by training (see :mod:`nre_ray.run.checkpoint`)."""
        return cls.from_loaded(load_checkpoint(Path(folder)), device, batch_size)

    @classmethod
    def from_loaded(cls, loaded: LoadedCheckpoint, device: str | torch.device | None = None,
                    batch_size: int = 256) -> Predictor:
        """Rebuild the task and model named in ``meta.json`` with the sizes stored there and load its weights."""
        meta = loaded.meta
        try:
            spec = ModelSpec(int(meta["vocab_size"]), int(meta["num_classes"]), int(meta["num_positions"]),
                             pretrained_config=loaded.pretrained_config)
        except KeyError as err:
            raise CheckpointError(f"the checkpoint's meta.json lacks {err}") from None
        if loaded.vocab.subword and not loaded.pretrained_config:
            raise CheckpointError("this --model bert checkpoint lacks pretrained/config.json and its tokenizer")
        task = task_of(meta)
        model = task.build_model(loaded.config.model, spec)
        model.load_state_dict(loaded.state["model"])
        return cls(model, loaded.config, loaded.vocab, loaded.labels, spec.num_positions,
                   torch.device(device or "cpu"), batch_size, loaded.assets, task, loaded.state.get("metrics"))

    def predict_rows(self, frame: pd.DataFrame, top_k: int = 0) -> pd.DataFrame:
        """The task's prediction rows of canonical rows (:attr:`nre_ray.tasks.base.Task.input_columns`; the sentence
        task's: one per input row, same order, ``predicted_relation``, ``score``, with ``top_k > 0`` also
        ``top_k_labels`` / ``top_k_scores``), and ``problem`` ("" for good rows). The index is positional."""
        return self.task.predict_rows(self.model, frame, self, top_k)

    def predict_frame(self, df: pd.DataFrame, top_k: int = 0, on_bad_rows: str = "error") -> pd.DataFrame:
        """Label the raw rows of ``df`` (the task's input columns; any others are kept, ``relation`` ignored).

        Returns ``df``'s columns in their order (same index) plus the task's output columns (the sentence task's:
        ``predicted_relation`` and ``score`` and, with ``top_k > 0``, ``top_k_labels`` / ``top_k_scores``, lists).
        Prediction columns already in ``df`` are replaced.
        A bad row raises :class:`DataError` (``row N: field: what is wrong``), or with ``on_bad_rows="skip"`` is
        left out of the result.
        """
        if on_bad_rows not in ON_BAD_ROWS:
            raise ValueError(f"on_bad_rows must be one of {ON_BAD_ROWS}, not {on_bad_rows!r}")
        inputs, outputs = self.task.input_columns, self.task.output_columns(top_k=1)
        missing = [c for c in inputs if c not in df.columns]
        if missing:
            raise DataError([Problem("input", None, None, f"missing required column{'s' if len(missing) > 1 else ''}"
                                                          f" {', '.join(missing)} (found: {', '.join(map(str, df))})")],
                            hint=f"Give each row {', '.join(inputs)} (character offsets).")
        types = [c for c in ("head_type", "tail_type") if c in df.columns]  # read by typed entity markers
        preds = self.predict_rows(df[[*inputs, *types]], top_k)
        bad = (preds["problem"] != "").to_numpy()
        if bad.any() and on_bad_rows == "error":
            raise DataError(row_problems(preds["problem"]), hint=PREDICT_HINT)
        added = [c for c in outputs if c in preds.columns]
        out = df.drop(columns=[c for c in outputs if c in df.columns])
        for column in added:
            out[column] = preds[column].to_numpy()
        return out[~bad] if bad.any() else out


def row_problems(problems: pd.Series) -> list[Problem]:
    """``row N: field: message`` problems (N 1-based) of the non-empty entries of a positional problem column."""
    found = []
    for i, problem in enumerate(problems.tolist()):
        if problem:
            found.extend(Problem(f"row {i + 1}", None, field, message) for field, message in split_problem(problem))
    return found


# --------------------------------------------------------------------------------------------------------------------
# naming a model


_MLFLOW_URIS = ("runs:/", "models:/")
_STAGES = {"latest", "production", "staging", "archived", "none"}


def is_mlflow_model(model: str) -> bool:
    """Whether ``model`` names an MLflow model (``runs:/...``, ``models:/...``), read from a tracking store."""
    return model.startswith(_MLFLOW_URIS)


@dataclass
class ResolvedModel:
    """A local checkpoint folder and where it came from."""

    checkpoint: Path
    source: str
    temp: tempfile.TemporaryDirectory | None = None

    def cleanup(self) -> None:
        """Remove the downloaded copy, if any."""
        if self.temp is not None:
            self.temp.cleanup()
            self.temp = None


def resolve_checkpoint(model: str, tracking_uri: str | None = None) -> ResolvedModel:
    """A local checkpoint folder for ``model``.

    ``model`` is a checkpoint folder, a folder holding a logged MLflow model (``MLmodel``), either of them local or in
    a store (``s3://bucket/runs/RUN/checkpoint_...``, see :mod:`nre_ray.storage`), or an MLflow URI:
    ``runs:/<run_id>/model``, ``models:/<name>/<version>``, ``models:/<name>@<alias>`` (``models:/<name>/<alias>``
    is read as the alias). Folders in a store and MLflow models are downloaded to a temporary folder (call
    :meth:`ResolvedModel.cleanup`).
    """
    if storage.is_uri(model):
        return _stored_checkpoint(model)
    if not model.startswith(_MLFLOW_URIS):
        path = Path(storage.absolute(model))
        if not path.exists():
            raise CheckpointError(f"--model {model}: no such folder (give a checkpoint folder, runs:/<run_id>/model "
                                  "or models:/<name>/<version>)")
        return ResolvedModel(_checkpoint_in(path, model), model)
    from mlflow.exceptions import MlflowException

    temp = tempfile.TemporaryDirectory(prefix="nre_ray_model_")
    try:
        local = download_model(_alias_uri(model), tracking_uri, temp.name)
        return ResolvedModel(_checkpoint_in(Path(local), model), model, temp)
    except MlflowException as err:
        temp.cleanup()
        raise _not_in_mlflow(model, err) from None
    except BaseException:
        temp.cleanup()
        raise


@dataclass(frozen=True)
class ModelIdentity:
    """Which model a command uses, pinned: ``model`` as the user named it, ``uri`` what to load (an alias resolved
    to its version number, a local folder made absolute), and where known the MLflow ``run_id`` and the registered
    ``name`` and ``version``."""

    model: str
    uri: str
    run_id: str | None = None
    name: str | None = None
    version: str | None = None


def identify_model(model: str, tracking_uri: str | None = None) -> ModelIdentity:
    """The :class:`ModelIdentity` of ``model`` (named as :func:`resolve_checkpoint` takes it): ``runs:/<id>/...``
    gives its run; ``models:/<name>/<version>`` and ``models:/<name>@<alias>`` are looked up in the registry of
    ``tracking_uri`` (an alias is pinned to the version it names now). CheckpointError when the registry has no such
    model."""
    if not model.startswith(_MLFLOW_URIS):
        return ModelIdentity(model, storage.absolute(model))
    if model.startswith("runs:/"):
        return ModelIdentity(model, model, run_id=model[len("runs:/"):].split("/", 1)[0])
    match = re.fullmatch(r"models:/([^/@]+)(?:/([^/]+)|@([^/]+))", _alias_uri(model))
    if not match or (match.group(2) and match.group(2).lower() in _STAGES):
        return ModelIdentity(model, model)  # a stage name: MLflow resolves it when the model is loaded
    from mlflow.exceptions import MlflowException

    name = match.group(1)
    try:
        version, run_id = registered_version(name, match.group(2) or match.group(3), model_store(model, tracking_uri))
    except MlflowException as err:
        raise _not_in_mlflow(model, err) from None
    return ModelIdentity(model, f"models:/{name}/{version}", run_id, name, version)


def _not_in_mlflow(model: str, err: Exception) -> CheckpointError:
    """The error for a model URI that MLflow cannot give (``err``: MLflow's)."""
    first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
    return CheckpointError(f"--model {model}: MLflow cannot give this model ({first}). Check the URI and "
                           "--tracking-uri (or MLFLOW_TRACKING_URI).")


def _stored_checkpoint(model: str) -> ResolvedModel:
    """A checkpoint folder in a store (a URI), downloaded to a temporary folder."""
    temp = tempfile.TemporaryDirectory(prefix="nre_ray_model_")
    try:
        local = storage.download(model, Path(temp.name) / (storage.name_of(model) or "model"))
        return ResolvedModel(_checkpoint_in(local, model), model, temp)
    except storage.StorageError as err:
        temp.cleanup()
        raise CheckpointError(f"--model {err}") from None
    except BaseException:
        temp.cleanup()
        raise


def _alias_uri(uri: str) -> str:
    """``models:/name/champion`` -> ``models:/name@champion`` (numbers and stage names are left alone)."""
    match = re.fullmatch(r"models:/([^/@]+)/([^/]+)", uri)
    if match and not match.group(2).isdigit() and match.group(2).lower() not in _STAGES:
        return f"models:/{match.group(1)}@{match.group(2)}"
    return uri


def _checkpoint_in(folder: Path, name: str) -> Path:
    """The checkpoint folder in ``folder``: itself, the pyfunc model's ``checkpoint`` artifact, or the only one."""
    if (folder / "meta.json").exists():
        return folder
    if (folder / "MLmodel").exists():
        from mlflow.models import Model

        flavor = Model.load(str(folder / "MLmodel")).flavors.get("python_function", {})
        artifact = (flavor.get("artifacts") or {}).get("checkpoint", {})
        if artifact.get("path") and (folder / artifact["path"] / "meta.json").exists():
            return folder / artifact["path"]
    found = sorted(p.parent for p in folder.rglob("meta.json") if (p.parent / "state.pt").exists())
    if len(found) == 1:
        return found[0]
    raise CheckpointError(f"--model {name}: {folder} holds no nre_ray checkpoint (a folder with meta.json, state.pt, "
                          "config.json, vocab.json, labels.json) and is not an nre_ray MLflow model")

"""Predictions from a trained checkpoint: raw rows in, relation labels and probabilities out.

:class:`Predictor` is the one component that every way of using a model goes through (``python -m nre_ray.predict``,
``python -m nre_ray.evaluate``, the MLflow pyfunc model and the model server). It prepares rows with the same pure
functions that prepared the training data (``check_rows`` -> ``tokenize_batch`` -> ``encode_batch`` with the
checkpoint's vocabulary and tokenizer settings, then ``EncodedSplit`` / ``EncodedDataset``), so a sentence is encoded
exactly as it was during training.

:func:`resolve_checkpoint` turns what a user names as a model (a checkpoint folder, ``runs:/<run_id>/model``,
``models:/<name>/<version>``, ``models:/<name>@<alias>``) into a local checkpoint folder.
"""

from __future__ import annotations

import functools
import logging
import re
import tempfile
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from torch import nn

from nre_ray import storage
from nre_ray.config import Config, DataConfig
from nre_ray.data.batches import EncodedSplit, encode_split, tokenize_batch
from nre_ray.data.encode import EncodedDataset
from nre_ray.data.errors import DataError, Problem
from nre_ray.data.read import check_rows, split_problem
from nre_ray.data.subword import assets_folder, encode_subword_batch
from nre_ray.data.vocab import Vocab
from nre_ray.models import build_model
from nre_ray.models.registry import ModelSpec
from nre_ray.run.checkpoint import CheckpointError, LoadedCheckpoint, load_checkpoint
from nre_ray.tracking.store import download_model, model_store, registered_version

#: The columns a prediction needs (``relation`` is not needed and is ignored when present).
INPUT_COLUMNS = ("sentence", "head", "head_offset", "tail", "tail_offset")
#: What a prediction adds to each row.
OUTPUT_COLUMNS = ("predicted_relation", "score")
TOP_K_COLUMNS = ("top_k_labels", "top_k_scores")
ON_BAD_ROWS = ("error", "skip")
PREDICT_HINT = "Fix these rows, or pass --on-bad-rows skip to predict the good rows only."


def learnt_types(vocab: Vocab) -> bool:
    """Whether the model learnt typed entity markers (its training rows had head_type/tail_type)."""
    return any(token.startswith(("<e1:", "<e2:")) for token in vocab.tokens)


#: What is said when rows without entity types reach a model trained with them (in the log; the model server also
#: says it in its answer).
UNTYPED_WARNING = ("this model was trained with entity types (typed entity markers); rows without head_type/tail_type "
                   "columns get untyped markers, which it saw rarely or never in training: give the types (the same "
                   "names as in training) for the accuracy it was measured at")


def lacks_types(columns: Iterable[str], data: DataConfig, vocab: Vocab) -> bool:
    """Whether rows with these ``columns`` lack the entity types that the model (``data``'s settings and ``vocab``)
    was trained with."""
    return data.typed_markers and not {"head_type", "tail_type"} <= set(columns) and learnt_types(vocab)


@functools.lru_cache(maxsize=1)
def _warn_untyped() -> None:
    """Say once per process that rows without entity types reach a model trained with them."""
    logging.getLogger(__name__).warning(UNTYPED_WARNING)


def encode_rows(frame: pd.DataFrame, data: DataConfig, vocab: Vocab, labels: list[str] | None = None,
                assets: Mapping[str, bytes] | None = None) -> tuple[pd.Series, EncodedSplit]:
    """Check, tokenize and encode canonical rows exactly as the training pipeline does.

    ``frame``: the :data:`INPUT_COLUMNS` as read (offsets may still be text), optionally ``problem`` (set by the
    reader), ``head_type``/``tail_type`` (typed entity markers) and, when ``labels`` is given, ``relation``. Without
    ``labels`` a ``relation`` column is ignored; with them, a row whose relation is not among ``labels`` gets a
    problem naming it. A subword vocabulary (``--model bert``) encodes with the pretrained tokenizer in ``assets``
    (:attr:`LoadedCheckpoint.assets <nre_ray.run.checkpoint.LoadedCheckpoint.assets>`) and entity markers.

    Returns ``(problems, split)``: the problem of each row ("" for rows that were encoded; positional, index reset)
    and the encoded good rows, in input order.
    """
    batch = frame.reset_index(drop=True)
    if "problem" not in batch.columns:
        batch = batch.assign(problem="")
    if labels is None:
        batch = batch.drop(columns=["relation"], errors="ignore")
    checked = check_rows(batch)
    if labels is not None:
        checked = _mark_unknown_labels(checked, labels)
    if lacks_types(checked.columns, data, vocab):
        _warn_untyped()
    if vocab.subword:
        if not assets:
            raise CheckpointError("this --model bert checkpoint carries no pretrained/ tokenizer files")
        encoded = encode_subword_batch(checked, assets_folder(assets), data.max_length, data.typed_markers, labels)
        ok = (encoded["problem"] == "").to_numpy()
        return encoded["problem"].reset_index(drop=True), EncodedSplit.from_frame(encoded[ok], data.position_window)
    tokenized = tokenize_batch(checked, data.tokenizer, data.lowercase, data.entity_markers, data.typed_markers)
    ok = (tokenized["problem"] == "").to_numpy()
    split = encode_split(tokenized[ok], vocab.tokens, labels, data.max_length, data.position_window)
    return tokenized["problem"].reset_index(drop=True), split


def _mark_unknown_labels(frame: pd.DataFrame, labels: list[str]) -> pd.DataFrame:
    known = set(labels)
    unknown = (frame["problem"] == "") & ~frame["relation"].isin(known)
    if not unknown.any():
        return frame
    frame = frame.copy()
    shown = ", ".join(labels[:8]) + (", ..." if len(labels) > 8 else "")
    frame.loc[unknown, "problem"] = [f"relation: label {r!r} is not one of the checkpoint's {len(labels)} labels "
                                     f"({shown})" for r in frame.loc[unknown, "relation"]]
    return frame


class Predictor:
    """A trained model with its vocabulary, labels and preprocessing settings, ready to label raw rows.

    Build it with :meth:`from_checkpoint` (a folder) or :meth:`from_loaded`. The model is in eval mode on ``device``.
    """

    def __init__(self, model: nn.Module, config: Config, vocab: Vocab, labels: list[str], num_positions: int,
                 device: torch.device, batch_size: int = 256, assets: Mapping[str, bytes] | None = None) -> None:
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
        """Rebuild the model named in ``meta.json`` with the sizes stored there and load its weights."""
        meta = loaded.meta
        try:
            spec = ModelSpec(int(meta["vocab_size"]), int(meta["num_classes"]), int(meta["num_positions"]),
                             pretrained_config=loaded.pretrained_config)
        except KeyError as err:
            raise CheckpointError(f"the checkpoint's meta.json lacks {err}") from None
        if loaded.vocab.subword and not loaded.pretrained_config:
            raise CheckpointError("this --model bert checkpoint lacks pretrained/config.json and its tokenizer")
        model = build_model(loaded.config.model, spec)
        model.load_state_dict(loaded.state["model"])
        return cls(model, loaded.config, loaded.vocab, loaded.labels, spec.num_positions,
                   torch.device(device or "cpu"), batch_size, loaded.assets)

    @torch.inference_mode()
    def probabilities(self, split: EncodedSplit) -> np.ndarray:
        """Softmax probabilities ``(N, C)`` of the encoded rows, computed in batches of ``batch_size``.

        The batches depend only on the order of the rows, so the same rows give the same numbers however the input
        was distributed.
        """
        dataset = EncodedDataset(split)
        n = len(dataset)
        out = np.zeros((n, len(self.labels)), dtype=np.float32)
        for start in range(0, n, self.batch_size):
            end = min(n, start + self.batch_size)
            batch = dataset.__getitems__(list(range(start, end)))
            # Positions past the largest one seen in training share its embedding (the table has no row for them).
            for key in ("head_pos", "tail_pos"):
                batch[key] = batch[key].clamp(max=self.num_positions - 1)
            batch = {k: v.to(self.device) for k, v in batch.items()}
            logits = self.model(batch)  # (B, C)
            out[start:end] = torch.softmax(logits.float(), dim=-1).cpu().numpy()
        return out

    def predict_rows(self, frame: pd.DataFrame, top_k: int = 0) -> pd.DataFrame:
        """Predictions for canonical rows (see :func:`encode_rows`), one output row per input row, same order.

        Columns: ``predicted_relation`` (None for a bad row), ``score`` (the predicted class's probability, NaN for a
        bad row), with ``top_k > 0`` also ``top_k_labels`` / ``top_k_scores`` (lists, best first), and ``problem``
        ("" for good rows). The index is positional (0..N-1).
        """
        problems, split = encode_rows(frame, self.config.data, self.vocab, assets=self.assets)
        probs = self.probabilities(split)
        good = np.flatnonzero((problems == "").to_numpy())
        n = len(problems)
        predicted = np.full(n, None, dtype=object)
        score = np.full(n, np.nan, dtype=np.float64)
        best = probs.argmax(axis=1) if len(probs) else np.zeros(0, dtype=np.int64)
        labels = np.asarray(self.labels, dtype=object)
        predicted[good] = labels[best]
        score[good] = probs[np.arange(len(best)), best]
        out = pd.DataFrame({"predicted_relation": predicted, "score": score})
        if top_k > 0:
            k = min(top_k, len(self.labels))
            order = np.argsort(-probs, axis=1, kind="stable")[:, :k]
            top_labels = np.full(n, None, dtype=object)
            top_scores = np.full(n, None, dtype=object)
            for i, p, row in zip(good.tolist(), probs, order, strict=True):
                top_labels[i] = labels[row].tolist()
                top_scores[i] = p[row].astype(np.float64).tolist()
            out["top_k_labels"], out["top_k_scores"] = top_labels, top_scores
        out["problem"] = problems.to_numpy()
        return out

    def predict_frame(self, df: pd.DataFrame, top_k: int = 0, on_bad_rows: str = "error") -> pd.DataFrame:
        """Label the raw rows of ``df`` (columns :data:`INPUT_COLUMNS`; any others are kept, ``relation`` ignored).

        Returns ``df``'s columns in their order (same index) plus ``predicted_relation`` and ``score`` and, with
        ``top_k > 0``, ``top_k_labels`` / ``top_k_scores`` (lists). Prediction columns already in ``df`` are replaced.
        A bad row raises :class:`DataError` (``row N: field: what is wrong``), or with ``on_bad_rows="skip"`` is
        left out of the result.
        """
        if on_bad_rows not in ON_BAD_ROWS:
            raise ValueError(f"on_bad_rows must be one of {ON_BAD_ROWS}, not {on_bad_rows!r}")
        missing = [c for c in INPUT_COLUMNS if c not in df.columns]
        if missing:
            raise DataError([Problem("input", None, None, f"missing required column{'s' if len(missing) > 1 else ''}"
                                                          f" {', '.join(missing)} (found: {', '.join(map(str, df))})")],
                            hint=f"Give each row {', '.join(INPUT_COLUMNS)} (character offsets).")
        types = [c for c in ("head_type", "tail_type") if c in df.columns]  # read by typed entity markers
        preds = self.predict_rows(df[[*INPUT_COLUMNS, *types]], top_k)
        bad = (preds["problem"] != "").to_numpy()
        if bad.any() and on_bad_rows == "error":
            raise DataError(row_problems(preds["problem"]), hint=PREDICT_HINT)
        added = [c for c in (*OUTPUT_COLUMNS, *TOP_K_COLUMNS) if c in preds.columns]
        out = df.drop(columns=[c for c in (*OUTPUT_COLUMNS, *TOP_K_COLUMNS) if c in df.columns])
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

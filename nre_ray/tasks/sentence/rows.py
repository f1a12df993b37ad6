"""The sentence task's rows: raw rows in (a sentence, its head and tail with character offsets), one prediction row
out per input row (the label and its probability, optionally the k best).

:func:`encode_rows` prepares rows with the same pure functions that prepared the training data (``check_rows`` ->
``tokenize_batch`` -> ``encode_batch`` with the checkpoint's vocabulary and tokenizer settings, then
``EncodedSplit``), so a sentence is encoded exactly as it was during training; :func:`probabilities` and
:func:`predict_rows` run the model on them (:class:`nre_ray.tasks.sentence.task.SentenceTask` gives them to the
spine's :class:`nre_ray.inference.predictor.Predictor`).
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Iterable, Mapping
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch
from torch import nn

from nre_ray.config import DataConfig
from nre_ray.data.batches import EncodedSplit, encode_split, tokenize_batch
from nre_ray.data.encode import EncodedDataset
from nre_ray.data.errors import DataError
from nre_ray.data.read import check_rows, parse_column_map, problems_of, read_table
from nre_ray.data.subword import assets_folder, encode_subword_batch
from nre_ray.data.vocab import Vocab
from nre_ray.run.checkpoint import CheckpointError
from nre_ray.tasks.base import PredictSettings

#: The columns a prediction needs (``relation`` is not needed and is ignored when present).
INPUT_COLUMNS = ("sentence", "head", "head_offset", "tail", "tail_offset")
#: What a prediction adds to each row.
OUTPUT_COLUMNS = ("predicted_relation", "score")
TOP_K_COLUMNS = ("top_k_labels", "top_k_scores")


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


@torch.inference_mode()
def probabilities(model: nn.Module, split: EncodedSplit, settings: PredictSettings) -> np.ndarray:
    """Softmax probabilities ``(N, C)`` of the encoded rows by ``model``, computed in batches of
    ``settings.batch_size`` on ``settings.device``.

    The batches depend only on the order of the rows, so the same rows give the same numbers however the input was
    distributed.
    """
    dataset = EncodedDataset(split)
    n = len(dataset)
    out = np.zeros((n, len(settings.labels)), dtype=np.float32)
    for start in range(0, n, settings.batch_size):
        end = min(n, start + settings.batch_size)
        batch = dataset.__getitems__(list(range(start, end)))
        # Positions past the largest one seen in training share its embedding (the table has no row for them).
        for key in ("head_pos", "tail_pos"):
            batch[key] = batch[key].clamp(max=settings.num_positions - 1)
        batch = {k: v.to(settings.device) for k, v in batch.items()}
        logits = model(batch)  # (B, C)
        out[start:end] = torch.softmax(logits.float(), dim=-1).cpu().numpy()
    return out


def top_k_lists(probs: np.ndarray, labels: list[str], top_k: int) -> tuple[np.ndarray, np.ndarray]:
    """The ``top_k`` most probable labels of each row of ``probs`` (N, C) and their probabilities, best first (ties:
    label order): two (N,) object arrays of lists (``top_k_labels``, ``top_k_scores``)."""
    k = min(top_k, len(labels))
    order = np.argsort(-probs, axis=1, kind="stable")[:, :k]
    names = np.asarray(labels, dtype=object)
    top_labels = np.empty(len(probs), dtype=object)
    top_scores = np.empty(len(probs), dtype=object)
    for i, (p, row) in enumerate(zip(probs, order, strict=True)):
        top_labels[i] = names[row].tolist()
        top_scores[i] = p[row].astype(np.float64).tolist()
    return top_labels, top_scores


def predict_rows(model: nn.Module, frame: pd.DataFrame, settings: PredictSettings, top_k: int = 0) -> pd.DataFrame:
    """Predictions for canonical rows (see :func:`encode_rows`), one output row per input row, same order.

    Columns: ``predicted_relation`` (None for a bad row), ``score`` (the predicted class's probability, NaN for a
    bad row), with ``top_k > 0`` also ``top_k_labels`` / ``top_k_scores`` (lists, best first), and ``problem``
    ("" for good rows). The index is positional (0..N-1).
    """
    problems, split = encode_rows(frame, settings.config.data, settings.vocab, assets=settings.assets)
    probs = probabilities(model, split, settings)  # (N good, C)
    good = np.flatnonzero((problems == "").to_numpy())
    n = len(problems)
    predicted = np.full(n, None, dtype=object)
    score = np.full(n, np.nan, dtype=np.float64)
    best = probs.argmax(axis=1) if len(probs) else np.zeros(0, dtype=np.int64)
    labels = np.asarray(settings.labels, dtype=object)
    predicted[good] = labels[best]
    score[good] = probs[np.arange(len(best)), best]
    out = pd.DataFrame({"predicted_relation": predicted, "score": score})
    if top_k > 0:
        top_labels = np.full(n, None, dtype=object)
        top_scores = np.full(n, None, dtype=object)
        top_labels[good], top_scores[good] = top_k_lists(probs, settings.labels, top_k)
        out["top_k_labels"], out["top_k_scores"] = top_labels, top_scores
    out["problem"] = problems.to_numpy()
    return out


def encode_file(path: str, data: DataConfig, vocab: Vocab, labels: list[str], assets: Mapping[str, bytes] | None,
                fmt: str | None = None, columns: str | None = None, on_bad_rows: str = "error"
                ) -> tuple[EncodedSplit, int]:
    """The labelled rows of ``path`` (any format training reads; ``fmt``, ``columns``: ``--format``, ``--columns``)
    encoded as training encoded them (:func:`encode_rows` with ``labels``), and how many bad rows were skipped. Bad
    rows (a label the checkpoint does not know among them) are a DataError with ``on_bad_rows="error"``."""
    frame = read_table(path, fmt, parse_column_map(columns) if columns else None, require_relation=True)
    problems, split = encode_rows(frame, data, vocab, labels, assets)
    bad = (problems != "").to_numpy()
    if bad.any() and on_bad_rows == "error":
        raise DataError(problems_of(frame.assign(problem=problems.to_numpy())[bad]),
                        hint=_bad_rows_hint(frame, bad, labels))
    return split, int(bad.sum())


def _bad_rows_hint(frame: pd.DataFrame, bad: np.ndarray, labels: list[str]) -> str:
    unknown = sorted(set(frame["relation"][bad]) - set(labels) - {""})
    named = f"Labels the checkpoint does not know: {', '.join(map(repr, unknown))}. " if unknown else ""
    return named + "Fix these rows, or pass --on-bad-rows skip to evaluate on the other rows."


def signature() -> Any:
    """The pyfunc model's signature: inputs ``sentence, head, head_offset, tail, tail_offset`` and the optional
    ``head_type, tail_type`` (read by models trained with typed entity markers); outputs ``predicted_relation,
    score``; param ``top_k`` (default 0)."""
    from mlflow.models import ModelSignature
    from mlflow.types import ColSpec, ParamSchema, ParamSpec, Schema

    inputs = Schema([ColSpec("string", "sentence"), ColSpec("string", "head"), ColSpec("long", "head_offset"),
                     ColSpec("string", "tail"), ColSpec("long", "tail_offset"),
                     ColSpec("string", "head_type", required=False), ColSpec("string", "tail_type", required=False)])
    outputs = Schema([ColSpec("string", "predicted_relation"), ColSpec("double", "score")])
    return ModelSignature(inputs=inputs, outputs=outputs, params=ParamSchema([ParamSpec("top_k", "long", 0)]))


def input_example(rows: int = 2, typed: bool = False) -> pd.DataFrame:
    """The first rows of the bundled sample's test file, as the model takes them: with ``head_type``/``tail_type``
    for a model trained with typed entity markers (``typed``), which reads them."""
    path = Path(str(resources.files("nre_ray.data") / "sample" / "test.csv"))
    frame = pd.read_csv(path, nrows=rows, keep_default_na=False)
    columns = ["sentence", "head", "head_offset", "tail", "tail_offset", *(["head_type", "tail_type"] if typed else [])]
    return frame[columns].astype({"head_offset": "int64", "tail_offset": "int64"})

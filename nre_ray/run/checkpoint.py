"""A complete, self-describing checkpoint: enough to resume training and enough to predict.

A checkpoint is a folder::

    state.pt      torch.save of {"model", "optimizer", "scheduler", "scaler" (fp16 loss scale; {} otherwise),
                  "epoch", "best_score", "best_epoch", "best_model", "metrics"} (tensors and plain values only:
                  loads with weights_only=True)
    config.json   the full run configuration
    vocab.json    the vocabulary (token list)
    labels.json   the label list (class order)
    pretrained/   only for a pretrained encoder (--model bert): its tokenizer with the entity markers and its
                  config.json, so the checkpoint predicts without the original model folder
    task/         only for a task whose examples need more of the training data than the vocabulary and labels to be
                  encoded as training encoded them (the document task's ``task/context.json``)
    meta.json     format version, task (:mod:`nre_ray.tasks.lookup`; absent in checkpoints written before the task
                  layer: the sentence task), model name, sizes, and the byte size and sha256 of every other file;
                  written last, so its presence marks a complete checkpoint

Files are written to a temporary name and renamed, so a crash during a save never leaves a half-written file, and a
folder without meta.json is refused by :func:`load_checkpoint`. In training, rank 0 saves into a local temporary
folder and only then calls ``ray.train.report``, which copies the folder to the run's storage; Ray Train registers the
checkpoint (its ``checkpoint_manager_snapshot.json``, what ``ray.train.get_checkpoint()`` returns on a restart or a
``--resume``) only after that copy has finished. A crash during the save or the copy therefore leaves the previous
checkpoint as the latest one. A copy cut short can leave an unregistered folder in storage with some files missing
or truncated; the sizes and hashes in meta.json make :func:`load_checkpoint` refuse such a folder too.
"""

from __future__ import annotations

import hashlib
import json
import pickle
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from nre_ray import storage
from nre_ray.config import Config
from nre_ray.core.redact import redact
from nre_ray.data.vocab import Vocab

FORMAT_VERSION = 1
FILES = ("state.pt", "config.json", "vocab.json", "labels.json")
#: Subfolder with the tokenizer and config.json of a pretrained encoder (see :mod:`nre_ray.data.subword`).
PRETRAINED_DIR = "pretrained"
#: Subfolder with what the checkpoint's task needs of the training data to encode examples as training did.
TASK_DIR = "task"


class CheckpointError(ValueError):
    """A checkpoint that is incomplete or does not fit the model/data at hand."""


@dataclass
class LoadedCheckpoint:
    """What :func:`load_checkpoint` returns."""

    config: Config
    vocab: Vocab
    labels: list[str]
    state: dict[str, Any]
    meta: dict[str, Any]
    assets: dict[str, bytes] = field(default_factory=dict)
    """The small files under :data:`PRETRAINED_DIR` and :data:`TASK_DIR` (``{relative path: bytes}``), read with the
    checkpoint so that it can be used after its folder is gone (see :func:`nre_ray.data.subword.assets_folder`)."""

    @property
    def pretrained_config(self) -> str | None:
        """The pretrained encoder's ``config.json`` text (``--model bert``), or None."""
        data = self.assets.get(f"{PRETRAINED_DIR}/config.json")
        return data.decode("utf-8") if data is not None else None


def pretrained_assets(folder: str | Path | None) -> dict[str, bytes] | None:
    """The files of a pretrained encoder's folder (tokenizer with entity markers, config.json) as ``assets`` for
    :func:`save_checkpoint`, under :data:`PRETRAINED_DIR`; None without a folder."""
    if not folder:
        return None
    folder = Path(folder)
    return {f"{PRETRAINED_DIR}/{p.relative_to(folder).as_posix()}": p.read_bytes()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def _write_atomic(path: Path, data: bytes) -> None:
    """Write one file of the checkpoint whole or not at all (:func:`nre_ray.storage.write_atomic`); the tests strike
    their faults here."""
    storage.write_atomic(path, data)


def _file_record(path: Path) -> dict[str, Any]:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return {"bytes": path.stat().st_size, "sha256": digest.hexdigest()}


def save_checkpoint(folder: Path, state: dict[str, Any], config: Config, vocab: Vocab, labels: list[str],
                    meta: dict[str, Any], assets: Mapping[str, bytes] | None = None) -> Path:
    """Write a checkpoint folder (see the module docstring). ``state["model"]`` must be an unwrapped state dict.

    ``assets``: more files, ``{relative path: bytes}`` (e.g. ``pretrained/tokenizer.json``), checked like the others.
    """
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    with storage.replacing(folder / "state.pt") as fh:
        torch.save(state, fh)
    _write_atomic(folder / "config.json", json.dumps(redact(config.to_dict()), indent=2).encode())
    _write_atomic(folder / "vocab.json", json.dumps(vocab.as_json(), ensure_ascii=False).encode())
    _write_atomic(folder / "labels.json", json.dumps(labels, ensure_ascii=False).encode())
    for name, data in (assets or {}).items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        _write_atomic(folder / name, data)
    files = {name: _file_record(folder / name) for name in (*FILES, *(assets or {}))}
    _write_atomic(folder / "meta.json", json.dumps({"format_version": FORMAT_VERSION, **meta, "files": files},
                                                   indent=2).encode())
    return folder


def load_checkpoint(folder: Path, map_location: str | torch.device = "cpu", weights: bool = True) -> LoadedCheckpoint:
    """Read a checkpoint folder; tensors are loaded with ``weights_only=True`` (no pickle code runs).

    ``weights=False`` skips ``state.pt`` (``state`` is then ``{}``): enough to check that a checkpoint fits.
    Raises CheckpointError for a folder that is not a complete checkpoint (a save or a copy that was cut short).
    """
    folder = Path(folder)
    if not folder.is_dir():
        raise CheckpointError(f"{folder}: no such checkpoint folder")
    missing = [n for n in ("meta.json", *FILES) if not (folder / n).exists()]
    if missing:
        raise CheckpointError(f"{folder}: not a complete nre_ray checkpoint (missing {', '.join(missing)}); its "
                              "save or copy was probably interrupted. Use an earlier checkpoint of the run.")
    try:
        meta = json.loads((folder / "meta.json").read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise CheckpointError(f"{folder}/meta.json is damaged ({err}); use an earlier checkpoint of the run") from None
    if meta.get("format_version") != FORMAT_VERSION:
        raise CheckpointError(f"{folder}: checkpoint format {meta.get('format_version')} is not supported "
                              f"(this nre_ray reads format {FORMAT_VERSION})")
    for name, record in meta.get("files", {}).items():
        if name == "state.pt" and not weights:
            continue
        if not (folder / name).is_file():
            raise CheckpointError(f"{folder}: not a complete nre_ray checkpoint (missing {name}); its save or copy "
                                  "was probably interrupted. Use an earlier checkpoint of the run.")
        if _file_record(folder / name) != record:
            raise CheckpointError(f"{folder}/{name} does not match the size and checksum recorded in meta.json "
                                  f"(truncated or changed: {(folder / name).stat().st_size} bytes, expected "
                                  f"{record['bytes']}); use an earlier checkpoint of the run.")
    state = {}
    if weights:
        try:
            state = torch.load(folder / "state.pt", map_location=map_location, weights_only=True)
        except pickle.UnpicklingError as err:
            raise CheckpointError(f"{folder}/state.pt holds more than tensors and plain values, so it is not loaded "
                                  f"(torch.load weights_only=True refused it: {str(err).splitlines()[0]})") from None
        except RuntimeError as err:  # a damaged zip archive
            raise CheckpointError(f"{folder}/state.pt cannot be read ({str(err).splitlines()[0]}); use an earlier "
                                  "checkpoint of the run") from None
    config = Config.from_stored(json.loads((folder / "config.json").read_text(encoding="utf-8")),
                              source=str(folder / "config.json"))
    vocab = Vocab.load(folder / "vocab.json")
    labels = json.loads((folder / "labels.json").read_text(encoding="utf-8"))
    assets = {name: (folder / name).read_bytes() for name in meta.get("files", {})
              if name.startswith((f"{PRETRAINED_DIR}/", f"{TASK_DIR}/"))}
    return LoadedCheckpoint(config, vocab, labels, state, meta, assets)


#: Settings a resumed run must share with its checkpoint because they shape the weights or the encoded data: every
#: ``model.*`` setting except :data:`FREE_MODEL_SETTINGS`, and these. (Data file paths may move: their content is
#: checked through the vocabulary and labels.)
FIXED_SETTINGS = ("data.format", "data.columns", "data.tokenizer", "data.lowercase", "data.min_freq",
                  "data.max_length", "data.position_window", "data.valid_fraction", "data.on_bad_rows",
                  "data.negative_label", "data.entity_markers", "data.typed_markers", "train.seed")
#: ``--embeddings`` only initialises a fresh model; ``--gradient-checkpointing`` trades memory for time only.
FREE_MODEL_SETTINGS = ("model.embeddings", "model.gradient_checkpointing")


def changed_settings(old: Config, new: Config) -> dict[str, tuple[Any, Any]]:
    """``{"section.field": (old, new)}`` for every setting that differs (``run.*`` excluded)."""
    before, after = old.flat(), new.flat()
    return {k: (before.get(k), v) for k, v in after.items() if not k.startswith("run.") and before.get(k) != v}


def check_compatible(loaded: LoadedCheckpoint, model_name: str, vocab: Vocab, labels: list[str],
                     config: Config | None = None) -> None:
    """Refuse a checkpoint written for another model, vocabulary or label set, saying which differs.

    With ``config`` (a run about to continue from this checkpoint), the :data:`FIXED_SETTINGS` must match too.
    """
    problems = []
    if loaded.meta.get("model") != model_name:
        problems.append(f"model {loaded.meta.get('model')!r} (this run: {model_name!r})")
    if loaded.vocab.tokens != vocab.tokens:
        problems.append(f"a different vocabulary ({len(loaded.vocab)} tokens; this run: {len(vocab)})")
    if loaded.labels != labels:
        problems.append(f"different labels ({loaded.labels[:5]}...; this run: {labels[:5]}...)")
    if config is not None:
        for key, (old, new) in changed_settings(loaded.config, config).items():
            if key in FIXED_SETTINGS or (key.startswith("model.") and key not in FREE_MODEL_SETTINGS):
                problems.append(f"--{key.split('.', 1)[1].replace('_', '-')} {old!r} (this run: {new!r})")
    if problems:
        raise CheckpointError("the checkpoint does not fit this run: it has " + "; ".join(problems) +
                              ". Use another --run-name or --storage-path, or the same data and settings.")

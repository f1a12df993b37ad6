"""A complete, self-describing checkpoint: enough to resume training and enough to predict.

A checkpoint is a folder::

    state.pt      torch.save of {"model", "optimizer", "scheduler", "epoch", "best_score", "best_epoch",
                  "best_model", "metrics"} (tensors and plain values only: loads with weights_only=True)
    config.json   the full run configuration
    vocab.json    the vocabulary (token list)
    labels.json   the label list (class order)
    meta.json     format version, model name, sizes; written last, so its presence marks a complete checkpoint

Files are written to a temporary name and renamed, so a crash during a save never leaves a half-written file.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from nre_ray.config import Config
from nre_ray.data.vocab import Vocab

FORMAT_VERSION = 1


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


def _write_atomic(path: Path, data: bytes) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def save_checkpoint(folder: Path, state: dict[str, Any], config: Config, vocab: Vocab, labels: list[str],
                    meta: dict[str, Any]) -> Path:
    """Write a checkpoint folder (see the module docstring). ``state["model"]`` must be an unwrapped state dict."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    tmp = folder / "state.pt.tmp"
    torch.save(state, tmp)
    os.replace(tmp, folder / "state.pt")
    _write_atomic(folder / "config.json", json.dumps(config.to_dict(), indent=2).encode())
    _write_atomic(folder / "vocab.json", json.dumps(vocab.tokens, ensure_ascii=False).encode())
    _write_atomic(folder / "labels.json", json.dumps(labels, ensure_ascii=False).encode())
    _write_atomic(folder / "meta.json", json.dumps({"format_version": FORMAT_VERSION, **meta}, indent=2).encode())
    return folder


def load_checkpoint(folder: Path, map_location: str | torch.device = "cpu") -> LoadedCheckpoint:
    """Read a checkpoint folder; tensors are loaded with ``weights_only=True`` (no pickle code runs)."""
    folder = Path(folder)
    missing = [n for n in ("meta.json", "state.pt", "config.json", "vocab.json", "labels.json")
               if not (folder / n).exists()]
    if missing:
        raise CheckpointError(f"{folder}: not a complete nre_ray checkpoint (missing {', '.join(missing)})")
    meta = json.loads((folder / "meta.json").read_text(encoding="utf-8"))
    if meta.get("format_version") != FORMAT_VERSION:
        raise CheckpointError(f"{folder}: checkpoint format {meta.get('format_version')} is not supported "
                              f"(this nre_ray reads format {FORMAT_VERSION})")
    state = torch.load(folder / "state.pt", map_location=map_location, weights_only=True)
    config = Config.from_dict(json.loads((folder / "config.json").read_text(encoding="utf-8")),
                              source=str(folder / "config.json"))
    vocab = Vocab.load(folder / "vocab.json")
    labels = json.loads((folder / "labels.json").read_text(encoding="utf-8"))
    return LoadedCheckpoint(config, vocab, labels, state, meta)


def check_compatible(loaded: LoadedCheckpoint, model_name: str, vocab: Vocab, labels: list[str]) -> None:
    """Refuse a checkpoint written for another model, vocabulary or label set, saying which differs."""
    problems = []
    if loaded.meta.get("model") != model_name:
        problems.append(f"model {loaded.meta.get('model')!r} (this run: {model_name!r})")
    if loaded.vocab.tokens != vocab.tokens:
        problems.append(f"a different vocabulary ({len(loaded.vocab)} tokens; this run: {len(vocab)})")
    if loaded.labels != labels:
        problems.append(f"different labels ({loaded.labels[:5]}...; this run: {labels[:5]}...)")
    if problems:
        raise CheckpointError("the checkpoint does not fit this run: it has " + "; ".join(problems) +
                              ". Use another --run-name or --storage-path, or the same data and settings.")

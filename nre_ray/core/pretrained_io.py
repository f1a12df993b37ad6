"""Loading a pretrained Hugging Face model, tokenizer or configuration for ``--pretrained``, quietly and with errors
that say what to do: a local folder, a folder in an object store (copied to each machine once), a name in the local
hub cache, or a hub name. Used by both sides: the tokenizer for preprocessing (:mod:`nre_ray.data.subword`) and the
encoder (:mod:`nre_ray.models.bert`), so that models need nothing from ``nre_ray.data``.

``transformers`` is imported only inside the functions that need it (it is the optional ``bert`` extra).
"""

from __future__ import annotations

import os
import socket
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from nre_ray import storage
from nre_ray.core import buildonce
from nre_ray.core.user_error import ConfigError

T = TypeVar("T")
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".h5", ".msgpack", ".onnx", ".ot", ".ckpt", ".gguf")
"""Weight files of any framework: left out of what identifies a tokenizer folder, and of the driver's copy."""
OTHER_FRAMEWORKS = (".h5", ".msgpack", ".onnx", ".ot", ".gguf", ".tflite")
"""Weights a PyTorch model does not load (TensorFlow, Flax, ONNX, Rust, llama.cpp): not copied from a store."""


def quiet_transformers() -> None:
    """Silence transformers' warnings and progress bars (errors still show)."""
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()


def is_local(name: str) -> bool:
    """Whether ``--pretrained`` names a local folder (it exists, or it is spelled like a path)."""
    return Path(name).expanduser().exists() or name.startswith(("/", "./", "../", "~"))


def _offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on")


def hub_reachable(timeout: float = 3.0) -> bool:
    """Whether the Hugging Face hub answers a TCP connection (assumed yes behind an HTTPS proxy). Checked first so
    that a machine without network fails at once rather than after the hub client's minute of retries."""
    if any(os.environ.get(k) for k in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy")):
        return True
    from urllib.parse import urlparse

    endpoint = urlparse(os.environ.get("HF_ENDPOINT") or "https://huggingface.co")
    try:
        socket.create_connection((endpoint.hostname or "huggingface.co",
                                  endpoint.port or (443 if endpoint.scheme == "https" else 80)), timeout).close()
    except OSError:
        return False
    return True


def pretrained_error(name: str, what: str, err: Exception) -> ConfigError:
    """The message for a model or tokenizer that cannot be loaded, saying to pass a local folder when offline."""
    first = str(err).strip().splitlines()[0].rstrip(".") if str(err).strip() else type(err).__name__
    if is_local(name) or storage.is_uri(name):
        return ConfigError(f"--pretrained {name}: cannot load the {what} from this folder ({first}). Give a folder "
                           "written by transformers' save_pretrained(): config.json, the weights (model.safetensors "
                           "or pytorch_model.bin) and the tokenizer files.")
    return ConfigError(f"--pretrained {name}: not a local folder, and the {what} cannot be fetched from the Hugging "
                       f"Face hub{' (HF_HUB_OFFLINE is set)' if _offline() else ''}: {first}. Without network access, "
                       "pass the path of a local model folder (e.g. one written by save_pretrained(), or a copy of "
                       "the model's hub repository) to --pretrained.")


def pretrained_copy(name: str, weights: bool) -> Path:
    """A local copy of the ``--pretrained`` folder ``name``, a URI (``s3://bucket/models/minilm``): downloaded once per
    machine (:func:`nre_ray.core.buildonce.local_copy`), with the PyTorch weights only when ``weights`` (the driver
    needs the tokenizer and config, the workers the model). ConfigError naming the URI and what to check."""
    try:
        return buildonce.local_copy(name, skip_suffixes=OTHER_FRAMEWORKS if weights else WEIGHT_SUFFIXES)
    except storage.StorageError as err:
        raise ConfigError(f"--pretrained {name}: {err.reason}" + (f". {err.hint}" if err.hint else "")) from None


def from_pretrained(load: Callable[..., T], name: str, what: str, **kwargs: Any) -> T:
    """``load(name, **kwargs)`` (an ``Auto*.from_pretrained``) for ``--pretrained``: a local folder, a folder in an
    object store (a URI, copied to this machine once), else a hub name from the local hub cache, else from the hub;
    ConfigError with what to do when none of these works."""
    quiet_transformers()
    if storage.is_uri(name):
        path = pretrained_copy(name, weights=what == "model")
        try:
            return load(str(path), **kwargs)
        except (OSError, ValueError) as err:
            raise pretrained_error(name, what, err) from None
    if is_local(name):
        path = Path(name).expanduser()
        if not path.is_dir():
            raise ConfigError(f"--pretrained {name}: no such folder")
        try:
            return load(str(path), **kwargs)
        except (OSError, ValueError) as err:  # missing files (OSError); unknown model type (ValueError)
            raise pretrained_error(name, what, err) from None
    try:
        return load(name, local_files_only=True, **kwargs)  # already in the hub cache: no network needed
    except (OSError, ValueError) as err:
        if _offline():
            raise pretrained_error(name, what, err) from None
    if not hub_reachable():
        raise pretrained_error(name, what, OSError("huggingface.co cannot be reached from this machine"))
    try:
        return load(name, **kwargs)
    except (OSError, ValueError) as err:
        raise pretrained_error(name, what, err) from None


def max_positions(config: Any) -> int | None:
    """The longest input a model config allows (RoBERTa-style models lose 2 positions to their padding offset)."""
    limit = getattr(config, "max_position_embeddings", None)
    if limit and getattr(config, "model_type", "") in ("roberta", "xlm-roberta", "camembert", "longformer"):
        limit -= 2  # position ids start after the padding index
    return int(limit) if limit else None


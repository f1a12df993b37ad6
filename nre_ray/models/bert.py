"""A pretrained transformer encoder (BERT, RoBERTa, MiniLM, ... through ``transformers.AutoModel``) with entity-start
pooling: the states at the head and tail start markers, optionally with the first token's (``[CLS]``).

``transformers`` is imported only when such a model is built (it is the optional ``bert`` extra).
"""

from __future__ import annotations

import json
from typing import Any

import torch
from torch import nn

from nre_ray.config import ConfigError
from nre_ray.core.pretrained_io import from_pretrained, max_positions, quiet_transformers


class PretrainedEncoder(nn.Module):
    """An encoder around a pretrained ``transformers`` model (``self.transformer``): the optimizer gives its weights
    ``--encoder-lr`` (:func:`nre_ray.run.optim.build_optimizer` finds them by this class). Its sentence pooler is
    dropped (never read: unused weights would stall DDP); ``pad_id`` is the model's own padding id (1 for
    RoBERTa), which padded positions are set to."""

    def __init__(self, transformer: nn.Module) -> None:
        super().__init__()
        if getattr(transformer, "pooler", None) is not None:
            transformer.pooler = None
        self.transformer = transformer
        config = transformer.config
        self.pad_id = int(config.pad_token_id) if getattr(config, "pad_token_id", None) is not None else 0


class BertEncoder(PretrainedEncoder):
    """Batch -> ``concat(h[head start marker], h[tail start marker])`` (B, 2H), or with ``with_cls`` (B, 3H).

    Reads ``tokens`` (B, T) input ids (padding is replaced by the model's own pad id, which is 1 for RoBERTa),
    ``mask`` (B, T) True on real tokens (the attention mask), ``head_span``/``tail_span`` (B, 2) whose first column is
    the position of the start marker.
    """

    def __init__(self, transformer: nn.Module, with_cls: bool = False) -> None:
        super().__init__(transformer)
        config = transformer.config
        self.max_positions = max_positions(config)
        self.with_cls = with_cls
        self.out_dim = (3 if with_cls else 2) * int(config.hidden_size)

    def forward(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """Batch of (B, T) tensors plus ``head_span``/``tail_span`` (B, 2) -> (B, 2H) or (B, 3H)."""
        mask = batch["mask"]  # (B, T) True on real tokens
        if self.max_positions and mask.shape[1] > self.max_positions:
            raise ValueError(f"a batch of {mask.shape[1]} subwords exceeds the {self.max_positions} positions of the "
                             "pretrained model; lower --max-length")
        ids = batch["tokens"].masked_fill(~mask, self.pad_id)  # (B, T)
        h = self.transformer(input_ids=ids, attention_mask=mask.long()).last_hidden_state  # (B, T, H)
        rows = torch.arange(h.shape[0], device=h.device)
        parts = [h[rows, batch["head_span"][:, 0]], h[rows, batch["tail_span"][:, 0]]]  # 2 x (B, H)
        if self.with_cls:
            parts.insert(0, h[:, 0])
        return torch.cat(parts, dim=-1)  # (B, 2H) or (B, 3H)


def load_transformer(pretrained: str, vocab_size: int) -> nn.Module:
    """``AutoModel.from_pretrained(pretrained)`` in float32, its token embeddings resized to ``vocab_size`` (the
    tokenizer with the entity markers); ConfigError (saying to pass a local folder when offline) if it cannot be
    loaded. ``pretrained`` may be a folder in an object store (``s3://...``): each machine downloads it once (see
    :func:`nre_ray.core.pretrained_io.from_pretrained`)."""
    from transformers import AutoModel

    model = from_pretrained(AutoModel.from_pretrained, pretrained, "model", dtype=torch.float32)
    if model.get_input_embeddings().num_embeddings != vocab_size:
        model.resize_token_embeddings(vocab_size)
    return model


def transformer_from_config(config_json: str) -> nn.Module:
    """An untrained model with the architecture of ``config_json`` (the text of a checkpoint's
    ``pretrained/config.json``): the checkpoint's weights are loaded into it next, so the original pretrained model
    is not needed."""
    from transformers import AutoConfig, AutoModel

    quiet_transformers()
    settings = json.loads(config_json)
    config = AutoConfig.for_model(settings.pop("model_type"), **settings)
    return AutoModel.from_config(config, dtype=torch.float32)


def build_transformer(cfg: Any, vocab_size: int, pretrained_config: str | None = None) -> nn.Module:
    """The pretrained model of ``--model bert``: ``cfg.pretrained``'s weights (embeddings resized to
    ``vocab_size``), or untrained from ``pretrained_config`` (a config.json text: loading a checkpoint); with
    ``cfg.gradient_checkpointing``, activations recomputed in the backward pass. ConfigError without the
    transformers package or a --pretrained."""
    try:
        import transformers  # noqa: F401
    except ImportError:
        raise ConfigError("--model bert needs the transformers package: pip install 'nre_ray[bert]'") from None
    if pretrained_config:
        transformer = transformer_from_config(pretrained_config)
    elif not cfg.pretrained:
        raise ConfigError("--model bert needs --pretrained PATH_OR_NAME (a model folder, local or s3://..., or a hub "
                          "name)")
    else:
        transformer = load_transformer(cfg.pretrained, vocab_size)
    if cfg.gradient_checkpointing:  # transformers 5 names it activation checkpointing (the old name is deprecated)
        enable = getattr(transformer, "activation_checkpointing_enable", None)
        if enable is not None:
            enable(activation_checkpointing_kwargs={"use_reentrant": False})
        else:
            transformer.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    return transformer


def build_bert_encoder(cfg: Any, vocab_size: int, pretrained_config: str | None = None) -> BertEncoder:
    """The encoder for ``--model bert``: :func:`build_transformer` with entity-start pooling."""
    return BertEncoder(build_transformer(cfg, vocab_size, pretrained_config), with_cls=cfg.with_cls)

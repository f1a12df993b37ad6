"""Encoders for documents: token ids -> token states and the last layer's attention, which ATLOP's head reads.

Both follow :class:`DocumentEncoder`: ``encoder(input_ids (B, T), mask (B, T)) -> (states (B, T, H), attention
(B, heads, T, T))``, plus what the windowing (:func:`.atlop.encode_long`) needs: ``window`` (the most tokens one
pass takes), ``num_start``/``num_end`` (special tokens at the ends of every input, repeated in every window).

* :class:`TransformerDocumentEncoder`, trained from scratch (nothing to download): the layers are PyTorch's
  ``nn.TransformerEncoderLayer`` with the settings of the sentence-level transformer
  (:mod:`nre_ray.models.transformer`: pre-norm, GELU, :data:`~nre_ray.models.transformer.LAYER_DROPOUT`), run
  block by block so that the last layer's attention weights come out (``nn.TransformerEncoder`` does not return
  them).
* :class:`HuggingFaceDocumentEncoder`: any ``transformers`` encoder (BERT, RoBERTa, MiniLM ...), loaded as
  ``--model bert --pretrained`` loads one (:func:`nre_ray.models.bert.load_transformer`), run with
  ``output_attentions=True`` on the eager attention implementation (the fused ones return no weights).

These belong beside the other encoders in ``nre_ray/models/`` (not moved yet).
"""

from __future__ import annotations

from typing import Any, Protocol

import torch
from torch import nn

from nre_ray.core.pretrained_io import max_positions
from nre_ray.core.special_tokens import PAD_ID
from nre_ray.data.subword import load_pretrained_tokenizer
from nre_ray.models.bert import PretrainedEncoder, build_transformer, load_transformer
from nre_ray.models.transformer import LAYER_DROPOUT, default_num_heads


class DocumentEncoder(Protocol):
    """What ATLOP's head needs from an encoder (see the module docstring)."""

    hidden_size: int
    window: int
    num_start: int
    num_end: int

    def __call__(self, input_ids: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]: ...


class TransformerDocumentEncoder(nn.Module):
    """Word embedding + learned absolute positions -> pre-norm Transformer -> final LayerNorm.

    ``(input_ids (B, T), mask (B, T)) -> (states (B, T, d_model), attention (B, heads, T, T))``: the attention is
    the last layer's, per head, over the real tokens (padded keys get 0). ``window`` = ``max_positions``.
    """

    num_start = 0
    num_end = 0

    def __init__(self, vocab_size: int, d_model: int = 128, num_layers: int = 2, num_heads: int | None = None,
                 max_positions: int = 512) -> None:
        super().__init__()
        num_heads = num_heads or default_num_heads(d_model)
        if d_model % num_heads:
            raise ValueError(f"num_heads {num_heads} must divide d_model {d_model}")
        self.embedding = nn.Embedding(vocab_size, d_model, padding_idx=PAD_ID)
        self.position = nn.Embedding(max_positions, d_model)
        self.layers = nn.ModuleList(
            nn.TransformerEncoderLayer(d_model, num_heads, dim_feedforward=4 * d_model, dropout=LAYER_DROPOUT,
                                       activation="gelu", batch_first=True, norm_first=True)
            for _ in range(num_layers))
        self.norm = nn.LayerNorm(d_model)
        self.hidden_size = d_model
        self.window = max_positions

    def forward(self, input_ids: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(B, T) ids and mask (True on real tokens) -> (B, T, D) states, (B, heads, T, T) last-layer attention."""
        width = input_ids.shape[1]
        if width > self.window:
            raise ValueError(f"{width} tokens exceed the encoder's {self.window} positions (read it in windows)")
        x = self.embedding(input_ids) + self.position(torch.arange(width, device=input_ids.device))  # (B, T, D)
        attention = x.new_zeros(0)
        for layer in self.layers:
            y = layer.norm1(x)  # (B, T, D)
            out, attention = layer.self_attn(y, y, y, key_padding_mask=~mask, need_weights=True,
                                             average_attn_weights=False)  # (B, T, D), (B, h, T, T)
            x = x + layer.dropout1(out)
            y = layer.norm2(x)
            x = x + layer.dropout2(layer.linear2(layer.dropout(layer.activation(layer.linear1(y)))))  # (B, T, D)
        return self.norm(x), attention


class HuggingFaceDocumentEncoder(PretrainedEncoder):
    """A ``transformers`` encoder -> (last hidden states (B, T, H), last layer's attentions (B, heads, T, T)).

    ``window`` is the model's position count (512 for BERT); its inputs start with one special token and end with
    one (``[CLS]``/``[SEP]``, ``<s>``/``</s>``), which each window repeats. A :class:`~nre_ray.models.bert.
    PretrainedEncoder`: its weights train at ``--encoder-lr``.
    """

    num_start = 1
    num_end = 1

    def __init__(self, transformer: nn.Module) -> None:
        super().__init__(transformer)
        if hasattr(transformer, "set_attn_implementation"):
            transformer.set_attn_implementation("eager")  # sdpa / flash attention return no attention weights
        self.hidden_size = int(transformer.config.hidden_size)
        self.window = max_positions(transformer.config) or 512

    def forward(self, input_ids: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(B, T) ids and mask -> (B, T, H) states, (B, heads, T, T) last-layer attention."""
        ids = input_ids.masked_fill(~mask, self.pad_id)  # (B, T)
        out = self.transformer(input_ids=ids, attention_mask=mask.long(), output_attentions=True)
        return out.last_hidden_state, out.attentions[-1]


def build_huggingface_encoder(model_config: Any, vocab_size: int, pretrained_config: str | None = None
                              ) -> HuggingFaceDocumentEncoder:
    """``--model bert`` for documents: ``--pretrained``'s weights (embeddings sized to the tokenizer's
    ``vocab_size``), or untrained from a checkpoint's ``pretrained_config`` (:func:`nre_ray.models.bert.
    build_transformer`, as the sentence task builds it)."""
    return HuggingFaceDocumentEncoder(build_transformer(model_config, vocab_size, pretrained_config))


def load_huggingface_encoder(pretrained: str) -> tuple[HuggingFaceDocumentEncoder, Any]:
    """The encoder and fast tokenizer of ``pretrained`` (a folder, a URI or a hub name, as ``--pretrained``),
    loaded by the project's loaders (:func:`nre_ray.models.bert.load_transformer`,
    :func:`nre_ray.data.subword.load_pretrained_tokenizer`). ATLOP's ``*`` marker is in every vocabulary, so the
    embeddings keep their size."""
    tokenizer = load_pretrained_tokenizer(pretrained)
    return HuggingFaceDocumentEncoder(load_transformer(pretrained, len(tokenizer))), tokenizer

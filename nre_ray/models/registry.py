"""Encoder registry: ``--model``'s name -> a builder of the encoder (tokens -> vectors). Registering a name twice is an
error. The heads are the tasks' (:mod:`nre_ray.tasks`): an encoder has an ``out_dim`` and maps a batch to
(B, out_dim)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from torch import nn

from nre_ray.models.bert import build_bert_encoder
from nre_ray.models.bilstm import BiLSTMAttentionEncoder
from nre_ray.models.cnn import CNNEncoder, PCNNEncoder
from nre_ray.models.embedding import WordPositionEmbedding
from nre_ray.models.transformer import TransformerEncoder, default_num_heads


@dataclass(frozen=True)
class ModelSpec:
    """What a builder (of an encoder, and of a task's head: ``num_classes``) needs to know about the data."""

    vocab_size: int
    num_classes: int
    num_positions: int
    #: ``--model bert`` loading a checkpoint: the text of its encoder's config.json (``pretrained/config.json``); the
    #: model is built untrained from it and the checkpoint's weights come next. None: ``--pretrained``'s weights.
    pretrained_config: str | None = None


Builder = Callable[["object", ModelSpec], nn.Module]
MODELS: dict[str, Builder] = {}


def register(name: str) -> Callable[[Builder], Builder]:
    """Decorator: ``@register("cnn")`` adds a builder ``(model_config, spec) -> encoder``."""

    def add(builder: Builder) -> Builder:
        if name in MODELS:
            raise ValueError(f"model {name!r} is already registered")
        MODELS[name] = builder
        return builder

    return add


def build_encoder(model_config: object, spec: ModelSpec) -> nn.Module:
    """Build the encoder named ``model_config.model`` (untrained; a pretrained one's weights loaded); an unknown name
    lists the known ones."""
    name = model_config.model
    if name not in MODELS:
        raise ValueError(f"unknown model {name!r}; choose one of: {', '.join(sorted(MODELS))}")
    return MODELS[name](model_config, spec)


def _embedding(cfg: object, spec: ModelSpec) -> WordPositionEmbedding:
    return WordPositionEmbedding(spec.vocab_size, cfg.word_dim, spec.num_positions, cfg.pos_dim,
                                 cfg.embedding_dropout)


@register("cnn")
def _cnn(cfg: object, spec: ModelSpec) -> nn.Module:
    return CNNEncoder(_embedding(cfg, spec), cfg.hidden_size, cfg.kernel_size)


@register("pcnn")
def _pcnn(cfg: object, spec: ModelSpec) -> nn.Module:
    return PCNNEncoder(_embedding(cfg, spec), cfg.hidden_size, cfg.kernel_size)


@register("bilstm")
def _bilstm(cfg: object, spec: ModelSpec) -> nn.Module:
    return BiLSTMAttentionEncoder(_embedding(cfg, spec), cfg.hidden_size, cfg.num_layers or 1, cfg.dropout)


@register("transformer")
def _transformer(cfg: object, spec: ModelSpec) -> nn.Module:
    return TransformerEncoder(_embedding(cfg, spec), cfg.hidden_size, cfg.num_layers or 2,
                              cfg.num_heads or default_num_heads(cfg.hidden_size), cfg.max_positions)


@register("bert")
def _bert(cfg: object, spec: ModelSpec) -> nn.Module:
    return build_bert_encoder(cfg, spec.vocab_size, spec.pretrained_config)

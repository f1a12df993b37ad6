"""ATLOP (Zhou et al. 2021, "Document-Level Relation Extraction with Adaptive Thresholding and Localized Context
Pooling") on any :class:`~.encoder.DocumentEncoder`.

* :func:`encode_long`: documents longer than the encoder's window are read in overlapping windows; each token's
  state is the mean of its windows' states, each attention row the sum of its windows' rows, normalised again
  (ATLOP's ``process_long_input``, for any number of windows).
* :class:`ATLOPHead`: entity embeddings pooled from their mentions' marker states with logsumexp; entity attention
  the mean of its mentions' attention rows; localized context pooling (the product of head and tail attention,
  averaged over heads, normalised, weighting the token states); then head and tail extractors and a grouped
  bilinear classifier.
* :func:`adaptive_threshold_loss` (the TH class at column 0 learns a threshold per pair; multi-label) and
  :func:`predict_labels` (the labels that score above TH, optionally only the top k).
* :class:`DocumentModel`: an encoder and the head; ``model(batch) -> logits (B, P, C)``.

Batches are :func:`.batching.pad_batch` arrays as tensors: ``input_ids``/``mask`` (B, T), ``mention_pos``
(B, E, M) (-1: none), ``pairs`` (B, P, 2) (-1: none), ``labels`` (B, P, C).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from nre_ray.tasks.document.encoder import DocumentEncoder

Encode = Callable[[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]
"""``(input_ids (N, W), mask (N, W)) -> (states (N, W, H), attention (N, heads, W, W))``."""


# --------------------------------------------------------------------------------------------------------------------
# long documents


def window_positions(length: int, window: int, num_start: int = 0, num_end: int = 0,
                     stride: int | None = None) -> list[list[int]]:
    """The token positions each window reads, for a sequence of ``length`` tokens whose first ``num_start`` and
    last ``num_end`` are special tokens (repeated in every window). One window of everything when it fits;
    else windows of ``window - num_start - num_end`` content tokens every ``stride`` content tokens (default: half
    a window, so windows overlap by half), the last one ending at the end."""
    if length <= window:
        return [list(range(length))]
    width = window - num_start - num_end
    if width < 1:
        raise ValueError(f"a window of {window} leaves no room between {num_start} + {num_end} special tokens")
    stride = stride or max(1, width // 2)
    content = length - num_start - num_end
    starts = [*range(0, content - width, stride), content - width]
    head, tail = list(range(num_start)), list(range(length - num_end, length))
    return [head + list(range(num_start + s, num_start + s + width)) + tail for s in starts]


def encode_long(encode: Encode, input_ids: torch.Tensor, mask: torch.Tensor, window: int, num_start: int = 0,
                num_end: int = 0, stride: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """``encode`` over sequences that may be longer than ``window``: (B, T) ids and mask -> (B, T, H) states and
    (B, heads, T, T) attention. A batch of at most ``window`` tokens is encoded as it is (the same result as
    without windowing). Otherwise every sequence is cut into :func:`window_positions` (all windows of the batch in
    one call to ``encode``); a token's state is the mean over the windows that read it; attention is summed over
    the windows and each row normalised to sum to 1 again (a sequence read in one window keeps its attention)."""
    b, t = input_ids.shape
    if t <= window:
        return encode(input_ids, mask)
    lengths = mask.sum(dim=1).tolist()
    plans = [window_positions(int(n), window, num_start, num_end, stride) for n in lengths]
    index = [(k, pos) for k, windows in enumerate(plans) for pos in windows]
    width = max(len(pos) for _, pos in index)
    ids = input_ids.new_zeros((len(index), width))  # (N, W)
    sub_mask = mask.new_zeros((len(index), width))  # (N, W)
    for w, (k, pos) in enumerate(index):
        ids[w, :len(pos)] = input_ids[k, pos]
        sub_mask[w, :len(pos)] = True
    states_w, attention_w = encode(ids, sub_mask)  # (N, W, H), (N, h, W, W)
    states = states_w.new_zeros((b, t, states_w.shape[-1]))  # (B, T, H)
    counts = states_w.new_zeros((b, t, 1))  # (B, T, 1)
    attention = attention_w.new_zeros((b, attention_w.shape[1], t, t))  # (B, h, T, T)
    for w, (k, pos) in enumerate(index):
        n = len(pos)
        where = torch.as_tensor(pos, device=input_ids.device)  # (n,)
        states[k].index_add_(0, where, states_w[w, :n])
        counts[k, where] += 1
        rows = attention[k].index_select(1, where)  # (h, n, T)
        rows[:, :, where] += attention_w[w, :, :n, :n]
        attention[k].index_copy_(1, where, rows)
    states = states / counts.clamp(min=1)
    several = torch.tensor([len(p) > 1 for p in plans], device=input_ids.device).view(b, 1, 1, 1)
    normalised = attention / (attention.sum(dim=-1, keepdim=True) + 1e-10)
    return states, torch.where(several, normalised, attention)


# --------------------------------------------------------------------------------------------------------------------
# the head


class ATLOPHead(nn.Module):
    """States, attention, mentions and pairs -> logits (B, P, C); column 0 is the threshold class TH.

    ``hidden``: H of the encoder; ``num_classes``: C = 1 + relations; ``emb_size``: the extractors' output, cut
    into groups of ``block_size`` for the grouped bilinear (ATLOP: 768 and 64).
    """

    def __init__(self, hidden: int, num_classes: int, emb_size: int = 768, block_size: int = 64) -> None:
        super().__init__()
        if emb_size % block_size:
            raise ValueError(f"block_size {block_size} must divide emb_size {emb_size}")
        self.head_extractor = nn.Linear(2 * hidden, emb_size)
        self.tail_extractor = nn.Linear(2 * hidden, emb_size)
        self.bilinear = nn.Linear(emb_size * block_size, num_classes)
        self.emb_size, self.block_size = emb_size, block_size

    def forward(self, states: torch.Tensor, attention: torch.Tensor, mention_pos: torch.Tensor,
                pairs: torch.Tensor) -> torch.Tensor:
        """(B, T, H), (B, h, T, T), (B, E, M), (B, P, 2) -> (B, P, C). Padded pairs get logits too (ignore them)."""
        b, t, hidden = states.shape
        heads = attention.shape[1]
        entities, entity_att = pool_entities(states, attention, mention_pos)  # (B, E, H), (B, E, h, T)
        h_idx, t_idx = pairs[..., 0].clamp(min=0), pairs[..., 1].clamp(min=0)  # (B, P)
        hs = entities.gather(1, h_idx.unsqueeze(-1).expand(-1, -1, hidden))  # (B, P, H)
        ts = entities.gather(1, t_idx.unsqueeze(-1).expand(-1, -1, hidden))  # (B, P, H)
        h_att = entity_att.gather(1, h_idx[..., None, None].expand(-1, -1, heads, t))  # (B, P, h, T)
        t_att = entity_att.gather(1, t_idx[..., None, None].expand(-1, -1, heads, t))  # (B, P, h, T)
        ht_att = (h_att * t_att).mean(dim=2)  # (B, P, T)
        ht_att = ht_att / (ht_att.sum(dim=-1, keepdim=True) + 1e-5)  # (B, P, T)
        context = torch.bmm(ht_att, states)  # (B, P, H)
        zs = torch.tanh(self.head_extractor(torch.cat([hs, context], dim=-1)))  # (B, P, emb)
        zo = torch.tanh(self.tail_extractor(torch.cat([ts, context], dim=-1)))  # (B, P, emb)
        groups = self.emb_size // self.block_size
        b1 = zs.view(b, -1, groups, self.block_size)  # (B, P, k, bs)
        b2 = zo.view(b, -1, groups, self.block_size)  # (B, P, k, bs)
        bl = (b1.unsqueeze(-1) * b2.unsqueeze(-2)).reshape(b, -1, self.emb_size * self.block_size)  # (B, P, emb*bs)
        return self.bilinear(bl)  # (B, P, C)


def pool_entities(states: torch.Tensor, attention: torch.Tensor,
                  mention_pos: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Entity embeddings (B, E, H): logsumexp of the states at their mentions' positions; entity attention
    (B, E, h, T): the mean of the attention rows at those positions. ``mention_pos`` (B, E, M), -1 (or a position
    past T) for no mention; an entity without a mention gets zeros."""
    b, t, hidden = states.shape
    valid = (mention_pos >= 0) & (mention_pos < t)  # (B, E, M)
    pos = mention_pos.clamp(0, t - 1)  # (B, E, M)
    e, m = pos.shape[1], pos.shape[2]
    at = states.gather(1, pos.reshape(b, e * m, 1).expand(-1, -1, hidden)).view(b, e, m, hidden)  # (B, E, M, H)
    has = valid.any(dim=-1, keepdim=True)  # (B, E, 1)
    keep = (valid | ~has).unsqueeze(-1)  # (B, E, M, 1): an entity without mentions pools finite values, then zeroed
    entities = torch.logsumexp(at.masked_fill(~keep, float("-inf")), dim=2) * has  # (B, E, H)
    weights = states.new_zeros((b, e, t))  # (B, E, T): 1/count at each mention's position
    share = valid.to(states.dtype) / valid.sum(dim=-1, keepdim=True).clamp(min=1)  # (B, E, M)
    weights.scatter_add_(2, pos, share)
    entity_att = torch.einsum("bet,bhts->behs", weights, attention)  # (B, E, h, T)
    return entities, entity_att


# --------------------------------------------------------------------------------------------------------------------
# loss and inference


def adaptive_threshold_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """ATLOP's adaptive-threshold loss, the mean over N pairs: (N, C) logits and multi-hot labels (column 0 = TH,
    ignored in ``labels``) -> a scalar (:func:`adaptive_threshold_losses`' mean)."""
    return adaptive_threshold_losses(logits, labels).mean()


def adaptive_threshold_losses(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """ATLOP's adaptive-threshold loss of each of N pairs: (N, C) logits and multi-hot labels (column 0 = TH,
    ignored in ``labels``) -> (N,). The positive classes are pushed above TH (softmax over the positives and TH),
    TH above the negative classes (softmax over TH and the negatives)."""
    labels = labels.clone()
    labels[:, 0] = 0.0
    th = torch.zeros_like(labels)
    th[:, 0] = 1.0
    positive = labels + th  # (N, C): positives and TH
    negative = 1.0 - labels  # (N, C): negatives and TH
    loss1 = -(F.log_softmax(logits - (1.0 - positive) * 1e30, dim=-1) * labels).sum(dim=1)  # (N,)
    loss2 = -(F.log_softmax(logits - (1.0 - negative) * 1e30, dim=-1) * th).sum(dim=1)  # (N,)
    return loss1 + loss2


def predict_labels(logits: torch.Tensor, top_k: int | None = None) -> torch.Tensor:
    """(N, C) logits -> (N, C) bool: the classes scoring above TH (column 0), at most the ``top_k`` best; column 0
    is set for a pair with none."""
    out = logits > logits[:, :1]  # (N, C)
    out[:, 0] = False
    if top_k is not None and top_k < logits.shape[1]:
        kth = logits.topk(top_k, dim=1).values[:, -1:]  # (N, 1)
        out &= logits >= kth
    out[:, 0] = ~out[:, 1:].any(dim=1)
    return out


def pair_mask(pairs: torch.Tensor) -> torch.Tensor:
    """(B, P, 2) pairs -> (B, P) bool, True on real pairs."""
    return pairs[..., 0] >= 0


# --------------------------------------------------------------------------------------------------------------------
# the model


class DocumentModel(nn.Module):
    """An encoder (see :class:`~.encoder.DocumentEncoder`), read in windows, and :class:`ATLOPHead`."""

    def __init__(self, encoder: DocumentEncoder, num_classes: int, emb_size: int = 768, block_size: int = 64,
                 stride: int | None = None) -> None:
        super().__init__()
        self.encoder = encoder
        self.head = ATLOPHead(encoder.hidden_size, num_classes, emb_size, block_size)
        self.stride = stride

    def forward(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """A padded batch -> logits (B, P, C)."""
        encoder = self.encoder
        states, attention = encode_long(encoder, batch["input_ids"], batch["mask"], encoder.window,
                                        encoder.num_start, encoder.num_end, self.stride)  # (B, T, H), (B, h, T, T)
        return self.head(states, attention, batch["mention_pos"], batch["pairs"])  # (B, P, C)

    def loss(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """The adaptive-threshold loss over the batch's real pairs."""
        logits = self(batch)  # (B, P, C)
        keep = pair_mask(batch["pairs"])  # (B, P)
        return adaptive_threshold_loss(logits[keep], batch["labels"][keep])

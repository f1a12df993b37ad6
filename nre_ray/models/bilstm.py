"""Attention-based BiLSTM sentence encoder (Zhou et al. 2016) over packed sequences."""

from __future__ import annotations

import torch
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from nre_ray.models.embedding import WordPositionEmbedding


class BiLSTMAttentionEncoder(nn.Module):
    """Embed -> BiLSTM over packed sequences -> attention pooling over the real tokens -> tanh. Output (B, H').

    ``H' = 2 * (hidden_size // 2)``: each direction has ``hidden_size // 2`` units. The LSTM runs on a
    ``PackedSequence``, so no padded timestep is ever read (the backward direction starts at each sentence's own last
    token), and padded positions get ``-inf`` attention scores before the softmax: the output of an example does not
    depend on the padding of its batch.
    """

    def __init__(self, embedding: WordPositionEmbedding, hidden_size: int, num_layers: int = 1,
                 dropout: float = 0.0) -> None:
        super().__init__()
        per_direction = max(1, hidden_size // 2)
        self.embedding = embedding
        self.lstm = nn.LSTM(embedding.dim, per_direction, num_layers=num_layers, batch_first=True,
                            bidirectional=True, dropout=dropout if num_layers > 1 else 0.0)
        self.attention = nn.Linear(2 * per_direction, 1, bias=False)  # Zhou et al.: score_t = w^T tanh(h_t)
        self.out_dim = 2 * per_direction

    def forward(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """Batch of (B, T) tensors -> (B, H')."""
        mask = batch["mask"]  # (B, T) True on real tokens
        x = self.embedding(batch["tokens"], batch["head_pos"], batch["tail_pos"])  # (B, T, E)
        lengths = mask.sum(dim=1).clamp(min=1).cpu()  # (B,) pack_padded_sequence wants them on the CPU
        packed = pack_padded_sequence(x, lengths, batch_first=True, enforce_sorted=False)
        out, _ = self.lstm(packed)
        h, _ = pad_packed_sequence(out, batch_first=True, total_length=x.shape[1])  # (B, T, H'), zeros on padding
        scores = self.attention(torch.tanh(h)).squeeze(-1)  # (B, T)
        scores = scores.masked_fill(~mask, float("-inf"))
        alpha = torch.softmax(scores.float(), dim=1).to(h.dtype)  # (B, T)
        pooled = torch.bmm(alpha.unsqueeze(1), h).squeeze(1)  # (B, H')
        return torch.tanh(pooled)

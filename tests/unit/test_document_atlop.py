"""The ATLOP document model (nre_ray.tasks.document.atlop / encoder): shapes, entity pooling, the adaptive-threshold
loss and its inference, long documents read in windows, a Hugging Face encoder, and a tiny model that learns."""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch

from nre_ray.tasks.document.atlop import (
    DocumentModel,
    adaptive_threshold_loss,
    encode_long,
    pair_mask,
    pool_entities,
    predict_labels,
    window_positions,
)
from nre_ray.tasks.document.batching import pad_batch
from nre_ray.tasks.document.encoder import TransformerDocumentEncoder, load_huggingface_encoder
from nre_ray.tasks.document.encoding import build_vocab, encode_document, relation_index
from nre_ray.tasks.document.pairs import candidate_pairs, type_pairs
from nre_ray.tasks.document.records import document_from_dict
from nre_ray.tasks.document.sample import RELATIONS, sample_documents
from nre_ray.tasks.document.scoring import score_documents


@pytest.fixture(autouse=True)
def one_thread() -> Iterator[None]:
    """One torch thread, as the training loop runs each worker (on a shared machine, more threads only contend)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def tensors(batch: dict[str, np.ndarray]) -> dict[str, torch.Tensor]:
    return {k: torch.from_numpy(v) for k, v in batch.items()}


def sample_batch(n: int = 3) -> tuple[list, dict[str, torch.Tensor], object]:
    docs = [document_from_dict(d) for d in sample_documents("train")[:n]]
    vocab = build_vocab(docs)
    allowed = type_pairs(docs)
    relations = relation_index(RELATIONS)
    encoded = [encode_document(d, candidate_pairs(d, allowed), relations, vocab.encode, pieces=lambda w: [w.lower()])
               for d in docs]
    return docs, tensors(pad_batch(encoded)), vocab


def test_shapes_of_the_model() -> None:
    torch.manual_seed(0)
    _, batch, vocab = sample_batch()
    model = DocumentModel(TransformerDocumentEncoder(len(vocab), d_model=32, num_layers=1), 1 + len(RELATIONS),
                          emb_size=32, block_size=8)
    logits = model(batch)
    b, p, _ = batch["pairs"].shape
    assert logits.shape == (b, p, 5) and torch.isfinite(logits).all()
    states, attention = model.encoder.eval()(batch["input_ids"], batch["mask"])  # eval: no dropout on weights
    t = batch["input_ids"].shape[1]
    assert states.shape == (b, t, 32) and attention.shape == (b, 8, t, t)
    assert torch.allclose(attention.sum(-1)[batch["mask"][:, None, :].expand(-1, 8, -1)], torch.ones(1))
    assert float((attention.detach() * ~batch["mask"][:, None, None, :]).abs().sum()) == 0.0  # padded keys get nothing
    assert model.loss(batch).item() > 0


def test_entity_pooling_logsumexp_and_mean_attention() -> None:
    states = torch.tensor([[[0.0, 1.0], [2.0, 0.0], [5.0, 5.0]]])  # (1, 3, 2)
    attention = torch.eye(3).view(1, 1, 3, 3)  # (1, 1, 3, 3)
    mention_pos = torch.tensor([[[0, 1], [2, -1], [-1, -1]]])  # entity 0: two mentions; entity 2: none
    entities, entity_att = pool_entities(states, attention, mention_pos)
    assert torch.allclose(entities[0, 0], torch.logsumexp(states[0, :2], dim=0))
    assert torch.equal(entities[0, 1], states[0, 2]) and torch.equal(entities[0, 2], torch.zeros(2))
    assert torch.allclose(entity_att[0, 0, 0], torch.tensor([0.5, 0.5, 0.0]))
    assert torch.equal(entity_att[0, 2], torch.zeros(1, 3))


def test_adaptive_threshold_loss_and_inference() -> None:
    labels = torch.tensor([[0.0, 1.0, 1.0, 0.0], [1.0, 0.0, 0.0, 0.0]])  # a two-label pair; a pair with none
    good = torch.tensor([[0.0, 3.0, 2.0, -3.0], [0.0, -2.0, -1.0, -4.0]])
    bad = -good
    lse = math.log(1 + math.exp(3) + math.exp(2))
    first = (lse - 3) + (lse - 2) + math.log(1 + math.exp(-3))  # positives above TH; TH above the negative
    second = math.log(1 + math.exp(-2) + math.exp(-1) + math.exp(-4))  # no positive: TH above every class
    assert float(adaptive_threshold_loss(good, labels)) == pytest.approx((first + second) / 2)
    assert float(adaptive_threshold_loss(bad, labels)) > float(adaptive_threshold_loss(good, labels))
    assert predict_labels(good).tolist() == [[False, True, True, False], [True, False, False, False]]
    assert predict_labels(good, top_k=1).tolist() == [[False, True, False, False], [True, False, False, False]]
    # the loss on a tiny batch goes down in a few steps
    torch.manual_seed(0)
    logits = torch.zeros(2, 4, requires_grad=True)
    optimizer = torch.optim.SGD([logits], lr=1.0)
    losses = []
    for _ in range(5):
        loss = adaptive_threshold_loss(logits, labels)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert all(a > b for a, b in itertools.pairwise(losses))
    assert predict_labels(logits.detach()).tolist() == predict_labels(good).tolist()
    assert pair_mask(torch.tensor([[[0, 1], [-1, -1]]])).tolist() == [[True, False]]


# --------------------------------------------------------------------------------------------------------------------
# long documents


def test_windows_cover_every_token() -> None:
    assert window_positions(10, 16) == [list(range(10))]
    for length in (17, 40, 100, 513):
        for start, end in ((0, 0), (1, 1)):
            windows = window_positions(length, 16, start, end)
            assert all(len(w) <= 16 for w in windows)
            assert sorted({p for w in windows for p in w}) == list(range(length))
            assert all(w[:start] == list(range(start)) and w[len(w) - end:] == list(range(length - end, length))
                       for w in windows)  # special tokens repeated in every window
            assert windows[-1][-1 - end] == length - 1 - end  # the last window reaches the end
    with pytest.raises(ValueError, match="no room"):
        window_positions(20, 2, 1, 1)


def local_encode(input_ids: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """A stand-in encoder whose states depend on each token alone (so stitched states must equal unwindowed ones),
    with attention spread evenly over the real tokens of its input."""
    states = torch.stack([input_ids.float(), input_ids.float() ** 2], dim=-1)  # (N, W, 2)
    attention = mask[:, None, None, :].float().expand(-1, 2, mask.shape[1], -1)  # (N, 2, W, W)
    return states, attention / attention.sum(-1, keepdim=True)


def test_long_documents_are_stitched_from_windows() -> None:
    ids = torch.arange(1, 41).view(1, 40)  # one document of 40 tokens, special tokens at both ends
    ids = torch.cat([ids, torch.zeros(1, 40, dtype=torch.long)]).clone()
    ids[1, :12] = torch.arange(100, 112)  # and a short one in the same batch
    mask = ids > 0
    states, attention = encode_long(local_encode, ids, mask, window=16, num_start=1, num_end=1)
    full_states, full_attention = local_encode(ids, mask)
    assert states.shape == (2, 40, 2) and attention.shape == (2, 2, 40, 40)
    assert torch.allclose(states[mask], full_states[mask])  # every token read, states put back in place
    assert torch.allclose(attention[0].sum(-1), torch.ones(2, 40))  # rows normalised again
    assert torch.equal(states[1, :12], full_states[1, :12])  # read in one window: unchanged
    assert torch.allclose(attention[1, :, :12, :12], full_attention[1, :, :12, :12])
    # nothing long in the batch: the encoder's own result
    short = encode_long(local_encode, ids[1:, :12], mask[1:, :12], window=16, num_start=1, num_end=1)
    assert all(torch.equal(a, b) for a, b in zip(short, local_encode(ids[1:, :12], mask[1:, :12]), strict=True))


def test_a_document_shorter_than_the_window_gives_the_same_result() -> None:
    torch.manual_seed(0)
    _, batch, vocab = sample_batch(2)
    encoder = TransformerDocumentEncoder(len(vocab), d_model=32, num_layers=1, max_positions=512).eval()
    windowed = DocumentModel(encoder, 5, emb_size=32, block_size=8).eval()
    with torch.no_grad():
        direct = windowed.head(*encoder(batch["input_ids"], batch["mask"]), batch["mention_pos"], batch["pairs"])
        assert torch.equal(windowed(batch), direct)
        encoder.window = 24  # now every document is read in windows of 24 tokens
        long = windowed(batch)
    assert batch["input_ids"].shape[1] > 24 and long.shape == direct.shape and torch.isfinite(long).all()
    windowed.train().loss(batch).backward()  # gradients flow through the stitched windows
    assert all(torch.isfinite(p.grad).all() for p in windowed.parameters() if p.grad is not None)
    assert encoder.embedding.weight.grad.abs().sum() > 0


def test_a_hugging_face_encoder_with_attention(tmp_path: Path) -> None:
    from tests.tiny_bert import make_tiny_bert

    folder = make_tiny_bert(tmp_path / "bert", words=["aspirin", "pain", "causes"])
    encoder, tokenizer = load_huggingface_encoder(str(folder))
    assert encoder.window == 128 and encoder.num_start == encoder.num_end == 1
    ids = torch.tensor([[tokenizer.cls_token_id, *tokenizer.convert_tokens_to_ids(["*", "aspirin", "*", "causes",
                                                                                    "*", "pain", "*"]) * 30,
                         tokenizer.sep_token_id]])  # 212 tokens: more than the 128 positions
    mask = torch.ones_like(ids, dtype=torch.bool)
    encoder.eval()
    with torch.no_grad():
        states, attention = encode_long(encoder, ids, mask, encoder.window, 1, 1)
        short_states, short_attention = encoder(ids[:, :20], mask[:, :20])
    assert states.shape == (1, 212, 32) and attention.shape == (1, 2, 212, 212)
    assert torch.allclose(attention.sum(-1), torch.ones(1, 2, 212), atol=1e-5)
    assert short_attention.shape == (1, 2, 20, 20) and short_states.shape == (1, 20, 32)


# --------------------------------------------------------------------------------------------------------------------
# it learns


def test_a_tiny_model_overfits_a_tiny_sample() -> None:
    torch.manual_seed(0)
    docs, batch, vocab = sample_batch(4)
    model = DocumentModel(TransformerDocumentEncoder(len(vocab), d_model=48, num_layers=2), 1 + len(RELATIONS),
                          emb_size=48, block_size=8)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    model.train()
    first = model.loss(batch).item()
    for _ in range(60):
        loss = model.loss(batch)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    model.eval()
    with torch.no_grad():
        predicted = predict_labels(model(batch)[pair_mask(batch["pairs"])])  # (N, C)
    names = ["TH", *sorted(RELATIONS)]
    rows = [(k, pair) for k in range(len(docs)) for pair in batch["pairs"][k].tolist() if pair[0] >= 0]
    predictions: dict[str, set] = {d.id: set() for d in docs}
    for (k, (h, t)), labels in zip(rows, predicted.tolist(), strict=True):
        doc = docs[k]
        predictions[doc.id] |= {(doc.entities[h].id, doc.entities[t].id, names[c]) for c in range(1, 5) if labels[c]}
    scores = score_documents(docs, predictions)
    assert loss.item() < first / 4 and scores.all.f1 == 1.0

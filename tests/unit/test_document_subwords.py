"""Documents in a pretrained encoder's subwords (``--model bert --pretrained`` on documents; tiny random BERT, offline):
ATLOP's markers and the mentions' positions on a hand-made document, a document longer than the encoder's window, the
model and its two learning rates, and a checkpoint that encodes a file as training did with the pretrained folder
gone."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

pytest.importorskip("transformers")

from nre_ray.config import Config, DataConfig
from nre_ray.data.vocab import Vocab
from nre_ray.inference.predictor import Predictor
from nre_ray.models.registry import ModelSpec
from nre_ray.run.checkpoint import PRETRAINED_DIR, load_checkpoint, pretrained_assets, save_checkpoint
from nre_ray.run.optim import build_optimizer
from nre_ray.tasks.document import prepare
from nre_ray.tasks.document.atlop import window_positions
from nre_ray.tasks.document.document_task import DOCUMENT
from nre_ray.tasks.document.encoder import HuggingFaceDocumentEncoder
from nre_ray.tasks.document.encoding import MARKER, THRESHOLD_LABEL
from nre_ray.tasks.document.records import Document, Entity, Fact, Mention
from nre_ray.tasks.document.scoring import train_triples
from nre_ray.tasks.document.split import DocumentDataset, DocumentSplit
from nre_ray.tasks.document.subwords import DocumentTokenizer, build_document_tokenizer, encoder_window
from tests.tiny_bert import make_tiny_bert

RELATIONS = {"CID": 1, "treats": 2}


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> tuple[Path, Path]:
    """A tiny BERT (128 positions; "aspirin", "causes", "pain" whole words, the rest in letters) and the document
    tokenizer folder built from it."""
    root = tmp_path_factory.mktemp("docbert")
    base = make_tiny_bert(root / "tiny", words=["aspirin", "causes", "pain"])
    return base, build_document_tokenizer(str(base), root / "tokenizer")


def hand_made() -> Document:
    """"Aspirin causes pain . Aspirin also eases severe pain ." with a chemical and a two-word disease mention."""
    sents = (("Aspirin", "causes", "pain", "."), ("Aspirin", "also", "eases", "severe", "pain", "."))
    chem = Entity("C1", "Chemical", (Mention(0, 0, 1, "Aspirin", "Chemical"), Mention(1, 0, 1, "Aspirin", "Chemical")))
    pain = Entity("D1", "Disease", (Mention(0, 2, 3, "pain", "Disease"), Mention(1, 3, 5, "severe pain", "Disease")))
    other = Entity("C2", "Chemical", (Mention(1, 2, 3, "eases", "Chemical"),))
    return Document("7", "t", sents, (chem, pain, other), (Fact(0, 1, "CID"), Fact(0, 1, "treats")))


def context(tokenizer_dir: Path, docs: list[Document]) -> dict:
    return {"tokens": [], "lowercase": False, "pretrained": pretrained_assets(tokenizer_dir), "relations": RELATIONS,
            "type_pairs": None, "train": train_triples(docs)}


def test_markers_and_mention_positions_in_subwords(folders):
    base, tokenizer_dir = folders
    tok = DocumentTokenizer.load(tokenizer_dir)
    assert len(tok.tokenizer) == len(DocumentTokenizer.load(base).tokenizer)  # "*" is in BERT's vocabulary: kept
    assert {p.name for p in tokenizer_dir.iterdir()} >= {"tokenizer.json", "config.json"}
    assert encoder_window(tokenizer_dir) == 128

    row = prepare.encode_document_row(hand_made(), context(tokenizer_dir, [hand_made()]))
    tokens = tok.tokenizer.convert_ids_to_tokens(row["input_ids"])
    assert " ".join(tokens) == ("[CLS] * aspirin * causes * pain * . * aspirin * a ##l ##s ##o * e ##a ##s ##e ##s * "
                                "* s ##e ##v ##e ##r ##e pain * . [SEP]")
    # each entity's mentions at their start markers, in the order of its mentions ([CLS] shifts them by one)
    assert row["mention_pos"] == [[1, 9], [5, 23], [16]]
    assert all(tokens[p] == MARKER for ps in row["mention_pos"] for p in ps)
    assert tokens[row["mention_pos"][1][1] + 1] == "s"  # "severe pain" starts with its first word's first piece
    assert row["pairs"] == [[0, 1], [0, 2], [1, 0], [1, 2], [2, 0], [2, 1]]
    assert row["facts"] == [(0, 1, True), (0, 2, True)]  # (pair row, relation column, seen in training)


def long_document(words: int = 120) -> Document:
    """One sentence of ``words`` words spelled in letters (so far more subwords than the tiny BERT's 128
    positions), a two-mention entity at the start and the end and one in the middle."""
    sentence = tuple(f"w{k}x" for k in range(words))
    first = Entity("A", "X", (Mention(0, 0, 1, "w0x", "X"), Mention(0, words - 2, words, "", "X")))
    middle = Entity("B", "Y", (Mention(0, words // 2, words // 2 + 1, "", "Y"),))
    return Document("long", "long", (sentence,), (first, middle), (Fact(0, 1, "CID"),))


def test_a_document_longer_than_the_window(folders):
    base, tokenizer_dir = folders
    doc = long_document()
    row = prepare.encode_document_row(doc, context(tokenizer_dir, [doc]))
    tok = DocumentTokenizer.load(tokenizer_dir)
    tokens = tok.tokenizer.convert_ids_to_tokens(row["input_ids"])
    length = len(tokens)
    assert length > 3 * 128  # not truncated: the model reads it in windows
    assert tokens[0] == "[CLS]" and tokens[-1] == "[SEP]" and tokens.count(MARKER) == 6
    assert all(tokens[p] == MARKER for ps in row["mention_pos"] for p in ps)
    last = tok.tokenizer.tokenize("w118x") + tok.tokenizer.tokenize("w119x")  # the last mention: the last 2 words
    assert row["mention_pos"][0] == [1, length - 3 - len(last)] and tokens[-2 - len(last):-2] == last
    windows = window_positions(length, 128, 1, 1)
    assert len(windows) > 3 and all(w[0] == 0 and w[-1] == length - 1 and len(w) == 128 for w in windows)

    cfg = Config.from_dict({"model": {"model": "bert", "pretrained": str(base)}})
    torch.manual_seed(0)
    model = DOCUMENT.build_model(cfg.model, ModelSpec(len(tok.tokenizer), 1 + len(RELATIONS), 0)).eval()
    assert isinstance(model.encoder, HuggingFaceDocumentEncoder) and model.encoder.window == 128
    split = DocumentSplit.from_documents([row], 1 + len(RELATIONS))
    batch = DocumentDataset(split).__getitems__([0])
    assert batch["input_ids"].shape == (1, length)
    with torch.no_grad():
        logits = model(batch)  # (1, P, C): read in windows of 128 with [CLS]/[SEP] in each
    assert logits.shape == (1, 2, 3) and torch.isfinite(logits).all()


def test_the_pretrained_weights_train_at_the_encoder_rate(folders):
    base, tokenizer_dir = folders
    cfg = Config.from_dict({"model": {"model": "bert", "pretrained": str(base)},
                            "train": {"lr": 1e-3, "encoder_lr": 5e-5, "weight_decay": 0.01, "epochs": 1}})
    model = DOCUMENT.build_model(cfg.model, ModelSpec(len(DocumentTokenizer.load(tokenizer_dir).tokenizer), 3, 0))
    optimizer, _ = build_optimizer(cfg, model, 4)
    rates: dict[float, int] = {}
    for group in optimizer.param_groups:
        rates[group["initial_lr"]] = rates.get(group["initial_lr"], 0) + sum(p.numel() for p in group["params"])
    assert type(optimizer) is torch.optim.AdamW
    assert rates[5e-5] == sum(p.numel() for p in model.encoder.transformer.parameters()) > 0
    assert rates[1e-3] == sum(p.numel() for p in model.head.parameters()) > 0


def test_the_cache_key_names_the_pretrained_model(folders):
    base, _ = folders
    words, subwords = prepare.settings_of(DataConfig(), 1), prepare.settings_of(DataConfig(), 1, str(base))
    assert "pretrained" not in words and subwords["pretrained"].startswith("sha256:")
    assert {k: v for k, v in subwords.items() if k != "pretrained"} == words


def test_a_checkpoint_encodes_documents_with_its_own_tokenizer(folders, tmp_path):
    base, built = folders
    tokenizer_dir = shutil.copytree(built, tmp_path / "tokenizer")
    docs = [hand_made(), long_document(40)]
    ctx = context(tokenizer_dir, docs)
    rows = [prepare.encode_document_row(d, ctx) for d in docs]
    cfg = Config.from_dict({"model": {"model": "bert", "pretrained": str(base)}})
    tok = DocumentTokenizer.load(tokenizer_dir)
    vocab, labels = Vocab(tok.vocabulary(), subword=True), [THRESHOLD_LABEL, *RELATIONS]
    model = DOCUMENT.build_model(cfg.model, ModelSpec(len(vocab), len(labels), 0))
    meta = {"task": "document", "model": "bert", "epoch": 1, "vocab_size": len(vocab), "num_classes": len(labels),
            "num_positions": 0}
    assets = {**pretrained_assets(tokenizer_dir), prepare.CONTEXT_ASSET: prepare.context_asset(ctx)}
    save_checkpoint(tmp_path / "ckpt", {"model": model.state_dict(), "epoch": 1}, cfg, vocab, labels, meta, assets)
    shutil.rmtree(tokenizer_dir)

    loaded = load_checkpoint(tmp_path / "ckpt")
    again = prepare.checkpoint_context(loaded.vocab, loaded.labels, False, loaded.assets)
    assert [prepare.encode_document_row(d, again) for d in docs] == rows
    with pytest.raises(ValueError, match="carries no pretrained/ tokenizer files"):
        prepare.checkpoint_context(loaded.vocab, loaded.labels, False,
                                   {k: v for k, v in loaded.assets.items() if not k.startswith(PRETRAINED_DIR)})
    # the model rebuilt from the checkpoint's config.json alone gives the trained model's logits
    predictor = Predictor.from_loaded(loaded)
    batch = DocumentDataset(DocumentSplit.from_documents(rows, len(labels))).__getitems__([0, 1])
    with torch.no_grad():
        torch.testing.assert_close(predictor.model(batch), model.eval()(batch))



def test_a_vocabulary_without_the_marker_gets_it_as_a_new_token(folders, tmp_path):
    from transformers import BertTokenizerFast

    base, _ = folders
    plain = shutil.copytree(base, tmp_path / "plain")
    words = [w for w in (plain / "vocab.txt").read_text(encoding="utf-8").splitlines() if w != MARKER]
    (plain / "vocab.txt").write_text("\n".join(words) + "\n", encoding="utf-8")
    (plain / "tokenizer.json").unlink()
    BertTokenizerFast(vocab=str(plain / "vocab.txt")).save_pretrained(str(plain))
    tokenizer_dir = build_document_tokenizer(str(plain), tmp_path / "tokenizer")
    tok = DocumentTokenizer.load(tokenizer_dir)
    assert len(tok.tokenizer) == len(words) + 1 and tok.to_ids([MARKER]) == [len(words)]
    assert json.loads((tokenizer_dir / "config.json").read_text())["vocab_size"] == len(words) + 1
    row = prepare.encode_document_row(hand_made(), context(tokenizer_dir, [hand_made()]))
    assert [row["input_ids"][p] for ps in row["mention_pos"] for p in ps] == [len(words)] * 5
    cfg = Config.from_dict({"model": {"model": "bert", "pretrained": str(plain)}})
    model = DOCUMENT.build_model(cfg.model, ModelSpec(len(tok.tokenizer), 3, 0))  # embeddings resized to the marker
    assert model.encoder.transformer.get_input_embeddings().num_embeddings == len(words) + 1

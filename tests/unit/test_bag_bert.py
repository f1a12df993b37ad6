"""--model bert inside a bag: the bag sample's sentences encoded by the sentence task's subword encoder (entity markers
by offset, the model's special tokens), the tokenizer in the checkpoint's assets for evaluate and predict, and a bag
model over the tiny BERT (tests/tiny_bert.py)."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
import torch

pytest.importorskip("transformers")

from nre_ray.config import Config
from nre_ray.data.subword import MarkerTokenizer, encode_subword_batch, tokenizer_vocab
from nre_ray.models.registry import ModelSpec
from nre_ray.run.checkpoint import CheckpointError, pretrained_assets
from nre_ray.tasks.bag import bag_rows, grouping
from nre_ray.tasks.bag.bag_split import BagDataset, BagSplit
from nre_ray.tasks.bag.bag_task import BAG
from nre_ray.tasks.bag.bags import NA
from tests.tiny_bert import bag_sample_words, make_tiny_bert

SEED = 3
TEST = grouping.sample_dir() / "test.tsv"


@pytest.fixture(scope="module")
def bert(tmp_path_factory):
    """A bag bert checkpoint's parts: its settings (bags capped at 3), the cache's tokenizer folder (markers added)
    and vocabulary, the assets a checkpoint carries, the labels and the sample's test bags as Ray Data keeps them."""
    base = make_tiny_bert(tmp_path_factory.mktemp("tiny") / "bert", bag_sample_words())
    cfg = Config.from_dict({"data": {"max_bag_size": 3, "max_length": 48}, "model": {
        "bag_aggregator": "att", "model": "bert", "pretrained": str(base)}})
    vocab, folder, _ = tokenizer_vocab(str(base), tmp_path_factory.mktemp("cache") / "pretrained",
                                       cfg.data.max_length)
    assets = {**pretrained_assets(folder), grouping.SEED_ASSET: json.dumps({"seed": SEED}).encode()}
    train, _ = bag_rows.read_bags(str(grouping.sample_dir() / "train.tsv"), None, None, None, 0, NA)
    labels = grouping.labels_of(sorted({x for text in train["labels"] for x in text.split("\n")}), {}, NA)
    bags, _ = bag_rows.read_bags(str(TEST), None, None, 3, SEED, NA)
    return cfg, vocab, folder, assets, labels, bags


def test_bag_sentences_are_encoded_by_the_subword_tokenizer_with_entity_markers(bert):
    cfg, vocab, folder, _, labels, bags = bert
    assert vocab.subword and {"[E1]", "[/E1]", "[E2]", "[/E2]"} <= set(vocab.tokens)
    settings = grouping.encode_settings(cfg.data, pretrained_assets(folder))
    encoded = grouping.encode_bags(bags, vocab.tokens, labels, settings)
    assert (encoded["problem"] == "").all() and len(encoded) == 66
    tok = MarkerTokenizer.load(folder)
    ids = {m: tok.tokenizer.convert_tokens_to_ids(m) for m in ("[CLS]", "[SEP]", "[E1]", "[/E1]", "[E2]", "[/E2]")}
    for row, text in zip(encoded.itertuples(index=False), bags["sentences"], strict=True):
        sentences = pd.DataFrame(json.loads(text)).assign(problem="")
        # the sentence task's encoder, row by row, gives the same ids and spans
        alone = encode_subword_batch(sentences, str(folder), cfg.data.max_length, False, None)
        assert row.lengths == alone["length"].tolist()
        assert row.tokens == [i for r in alone["token_ids"] for i in r]
        spans = np.asarray(row.spans).reshape(-1, 4)
        assert spans.tolist() == [[*h, *t] for h, t in zip(alone["head_span"], alone["tail_span"], strict=True)]
        starts = np.concatenate([[0], np.cumsum(row.lengths)])
        for k, (h0, h1, t0, t1) in enumerate(spans):
            sentence = row.tokens[starts[k]:starts[k + 1]]
            assert sentence[0] == ids["[CLS]"] and sentence[-1] == ids["[SEP]"]
            assert (sentence[h0], sentence[h1 - 1], sentence[t0], sentence[t1 - 1]) == \
                (ids["[E1]"], ids["[/E1]"], ids["[E2]"], ids["[/E2]"])
            words = tok.tokenizer.decode(sentence[h0 + 1:h1 - 1]).replace(" ", "")
            assert words == json.loads(text)[k]["head"].lower()  # the head's own subwords between its markers
    # no word vocabulary is looked up: the same bags with another vocabulary list encode the same
    again = grouping.encode_bags(bags, ["[PAD]", "[UNK]"], labels, settings)
    assert again["tokens"].tolist() == encoded["tokens"].tolist()


def test_evaluate_and_predict_encode_with_the_checkpoint_s_tokenizer(bert, tmp_path):
    cfg, vocab, folder, assets, labels, bags = bert
    split, skipped = BAG.encode_file(str(TEST), cfg.data, vocab, labels, assets)
    writer = BagSplit.Writer(len(labels), cfg.data.position_window)
    for row in grouping.encode_bags(bags, vocab.tokens, labels,
                                    grouping.encode_settings(cfg.data, pretrained_assets(folder))
                                    ).itertuples(index=False):
        writer.add(row)
    expected = writer.finish("test")
    assert skipped == 0 and split.info == expected.info
    for name, values in expected.sentences.flat.items():
        np.testing.assert_array_equal(split.sentences.flat[name], values, err_msg=name)
    with pytest.raises(CheckpointError, match="carries no pretrained/ tokenizer files"):
        BAG.encode_file(str(TEST), cfg.data, vocab, labels, {grouping.SEED_ASSET: assets[grouping.SEED_ASSET]})

    # the bag model over the tiny BERT: its batches are the subword batches, its scores one row per bag
    torch.manual_seed(0)
    model = BAG.build_model(cfg.model, ModelSpec(len(vocab), len(labels), 2 * cfg.data.position_window + 2)).eval()
    batch = BagDataset(split).__getitems__(list(range(4)))
    assert batch["tokens"].shape[0] == int(batch["scope"][-1]) and batch["mask"].any(dim=1).all()
    logits, query, probs = model(batch)
    # att: relation r's probability from the bag vector r's own query attends to (OpenNRE: rows need not sum to 1)
    assert probs.shape == (4, len(labels)) and bool(((probs > 0) & (probs < 1)).all())
    assert logits.shape == (len(query), len(labels)) and torch.isfinite(logits).all()
    rows = bag_rows.bag_probabilities(model, split, torch.device("cpu"), 8)
    np.testing.assert_allclose(rows[:4], probs.detach().numpy(), atol=1e-5)

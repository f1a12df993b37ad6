"""Predictor: raw rows in, labels out, with the training preprocessing; bad rows; naming a model."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
import torch

from nre_ray.cluster.session import UsageError
from nre_ray.config import Config
from nre_ray.data.batches import token_counts, tokenize_batch
from nre_ray.data.errors import DataError
from nre_ray.data.vocab import Vocab
from nre_ray.inference.predictor import Predictor, _alias_uri, resolve_checkpoint
from nre_ray.models.registry import ModelSpec
from nre_ray.run.checkpoint import CheckpointError, save_checkpoint
from nre_ray.tasks.sentence.classifier import build_model
from nre_ray.tasks.sentence.rows import encode_rows
from nre_ray.tracking import sqlite_store
from tests.helpers import TEMPLATES, tiny_frame

WINDOW = 10


def make_checkpoint(folder, model: str = "cnn", seed: int = 0, typed: bool = False):
    """A small untrained checkpoint over the tiny templates' vocabulary (positions seen up to +-4 only); ``typed``:
    its vocabulary has typed entity markers (rows with head_type ORG and tail_type PER), as if trained with types."""
    cfg = Config.from_dict({"model": {"model": model, "word_dim": 8, "pos_dim": 3, "hidden_size": 12},
                            "data": {"max_length": 32, "position_window": WINDOW}})
    rows = tiny_frame(2).assign(head_type="ORG", tail_type="PER") if typed else tiny_frame(2)
    frame = tokenize_batch(rows, "regex", True, typed, typed)
    vocab = Vocab.build(dict(zip(*token_counts(frame).to_dict("list").values(), strict=True)), 1)
    labels = sorted(TEMPLATES)
    spec = ModelSpec(len(vocab), len(labels), WINDOW + 6)  # smaller than 2 * WINDOW + 2: long inputs must still work
    torch.manual_seed(seed)
    net = build_model(cfg.model, spec)
    meta = {"model": model, "epoch": 1, "vocab_size": spec.vocab_size, "num_classes": spec.num_classes,
            "num_positions": spec.num_positions}
    return save_checkpoint(folder, {"model": net.state_dict(), "epoch": 1}, cfg, vocab, labels, meta)


def raw_rows() -> pd.DataFrame:
    frame = tiny_frame(3)
    return pd.DataFrame({"id": [f"r{i}" for i in range(len(frame))], "sentence": frame["sentence"],
                         "head": frame["head"], "head_offset": frame["head_offset"].astype(str),
                         "tail": frame["tail"], "tail_offset": frame["tail_offset"], "note": "x"})


@pytest.fixture(scope="module")
def predictor(tmp_path_factory):
    return Predictor.from_checkpoint(make_checkpoint(tmp_path_factory.mktemp("ckpt")))


def test_predict_frame_keeps_columns_order_and_index(predictor):
    rows = raw_rows()
    rows.index = rows.index + 100
    out = predictor.predict_frame(rows, top_k=3)
    assert list(out.columns) == [*rows.columns, "predicted_relation", "score", "top_k_labels", "top_k_scores"]
    assert out.index.tolist() == rows.index.tolist()
    assert (out["id"] == rows["id"]).all()
    assert set(out["predicted_relation"]) <= set(TEMPLATES)
    for label, score, top, scores in out[["predicted_relation", "score", "top_k_labels", "top_k_scores"]].itertuples(
            index=False):
        assert top[0] == label and scores[0] == pytest.approx(score)
        assert scores == sorted(scores, reverse=True) and sum(scores) == pytest.approx(1.0, abs=1e-5)


def test_same_numbers_for_any_batch_size_and_row_order(predictor, tmp_path):
    rows = raw_rows()
    base = predictor.predict_frame(rows)
    small = Predictor.from_checkpoint(make_checkpoint(tmp_path / "c"), batch_size=1).predict_frame(rows)
    assert (small["predicted_relation"] == base["predicted_relation"]).all()
    np.testing.assert_allclose(small["score"], base["score"], atol=1e-5)
    shuffled = rows.sample(frac=1.0, random_state=1)
    again = predictor.predict_frame(shuffled).loc[rows.index]
    np.testing.assert_allclose(again["score"], base["score"], atol=1e-5)


def test_relation_column_is_ignored_and_long_sentences_work(predictor):
    rows = raw_rows().head(2).assign(relation=["", "not a label"])
    long = " ".join(["word"] * 60)
    rows.loc[1, "sentence"] = f"Acme {long} met Bob ."
    rows.loc[1, ["head", "head_offset", "tail"]] = ["Acme", "0", "Bob"]
    rows.loc[1, "tail_offset"] = rows.loc[1, "sentence"].index("Bob")
    out = predictor.predict_frame(rows)
    assert out["relation"].tolist() == ["", "not a label"]
    assert out["predicted_relation"].notna().all()


def test_bad_rows_error_names_the_row_and_field_or_are_skipped(predictor):
    rows = raw_rows().head(4)
    rows.loc[1, "head_offset"] = "999"
    rows.loc[2, "tail"] = ""
    with pytest.raises(DataError) as err:
        predictor.predict_frame(rows)
    text = str(err.value)
    assert "row 2: head_offset: head runs past the end of the sentence" in text
    assert "row 3: tail: empty" in text
    assert "--on-bad-rows skip" in text
    out = predictor.predict_frame(rows, on_bad_rows="skip")
    assert out["id"].tolist() == ["r0", "r3"]


def test_missing_column_is_a_clear_error(predictor):
    with pytest.raises(DataError, match="missing required column tail_offset"):
        predictor.predict_frame(raw_rows().drop(columns=["tail_offset"]))


def test_encode_rows_with_labels_flags_unknown_labels(predictor):
    frame = tiny_frame(1)[["sentence", "head", "head_offset", "tail", "tail_offset", "relation"]].copy()
    frame.loc[0, "relation"] = "founded"
    problems, split = encode_rows(frame, predictor.config.data, predictor.vocab, predictor.labels)
    assert problems[0].startswith("relation: label 'founded' is not one of the checkpoint's 3 labels")
    assert (problems[1:] == "").all() and len(split) == len(frame) - 1
    assert split.arrays["labels"].tolist() == [predictor.labels.index(r) for r in frame["relation"][1:]]


def test_resolve_checkpoint_folder_mlmodel_folder_and_errors(tmp_path):
    ckpt = make_checkpoint(tmp_path / "model" / "artifacts" / "checkpoint")
    assert resolve_checkpoint(str(ckpt)).checkpoint == ckpt
    (tmp_path / "model" / "MLmodel").write_text(
        "flavors:\n  python_function:\n    artifacts:\n      checkpoint:\n        path: artifacts/checkpoint\n")
    assert resolve_checkpoint(str(tmp_path / "model")).checkpoint == tmp_path / "model" / "artifacts" / "checkpoint"
    with pytest.raises(CheckpointError, match="no such folder"):
        resolve_checkpoint(str(tmp_path / "nope"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(CheckpointError, match="holds no nre_ray checkpoint"):
        resolve_checkpoint(str(tmp_path / "empty"))
    store = f"sqlite:///{tmp_path / 'mlflow.db'}"
    with pytest.raises(UsageError, match=r"the MLflow tracking store .* does not exist"):  # and is not made
        resolve_checkpoint("runs:/0123456789abcdef/model", store)
    assert not (tmp_path / "mlflow.db").exists()
    sqlite_store.ready(store)
    with pytest.raises(CheckpointError, match="MLflow cannot give this model"):
        resolve_checkpoint("runs:/0123456789abcdef/model", store)


def test_alias_uris():
    assert _alias_uri("models:/nre/champion") == "models:/nre@champion"
    assert _alias_uri("models:/nre/3") == "models:/nre/3"
    assert _alias_uri("models:/nre/latest") == "models:/nre/latest"
    assert _alias_uri("runs:/abc/model") == "runs:/abc/model"


def test_checkpoint_meta_is_what_the_predictor_rebuilds_from(tmp_path):
    folder = make_checkpoint(tmp_path / "c", model="pcnn")
    meta = json.loads((folder / "meta.json").read_text())
    predictor = Predictor.from_checkpoint(folder)
    assert predictor.num_positions == meta["num_positions"] and predictor.labels == sorted(TEMPLATES)
    assert not predictor.model.training

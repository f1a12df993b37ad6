"""The pyfunc wrapper without an MLflow store: signature, example, requirements, predict, errors."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from mlflow.exceptions import MlflowException

from nre_ray.inference.predictor import Predictor
from nre_ray.inference.pyfunc import RelationModel, _weights_only_copy, pip_requirements
from nre_ray.run.checkpoint import load_checkpoint
from nre_ray.tasks.sentence.rows import input_example, signature
from tests.unit.test_inference import make_checkpoint, raw_rows


def test_signature_example_and_requirements():
    sig = signature()
    required = [c.name for c in sig.inputs.inputs if c.required]
    assert required == ["sentence", "head", "head_offset", "tail", "tail_offset"]
    assert sig.outputs.input_names() == ["predicted_relation", "score"]
    assert sig.params.params[0].name == "top_k"
    example = input_example()
    assert list(example.columns) == required and example["head_offset"].dtype == "int64"
    typed = input_example(typed=True)  # what a model trained with typed markers reads
    assert list(typed.columns) == [*required, "head_type", "tail_type"] and (typed["head_type"] != "").all()
    pins = pip_requirements()
    assert any(p.startswith("torch==") for p in pins) and any(p.startswith("mlflow==") for p in pins)
    assert all("+" not in p for p in pins)


def test_predict_returns_the_signature_columns_and_400_for_bad_rows(tmp_path):
    folder = make_checkpoint(tmp_path / "c")
    model = RelationModel()
    model.load_context(SimpleNamespace(artifacts={"checkpoint": str(folder)}))
    rows = raw_rows()
    out = model.predict(None, rows)
    assert list(out.columns) == ["predicted_relation", "score"] and len(out) == len(rows)
    expected = Predictor.from_checkpoint(folder).predict_frame(rows)
    assert out["predicted_relation"].tolist() == expected["predicted_relation"].tolist()
    assert list(model.predict(None, rows, params={"top_k": 2}).columns)[2:] == ["top_k_labels", "top_k_scores"]
    rows.loc[0, "head_offset"] = "x"
    with pytest.raises(MlflowException, match="row 1: head_offset: not an integer") as err:
        model.predict(None, rows)
    assert err.value.get_http_status_code() == 400


def test_logged_checkpoint_has_weights_only(tmp_path):
    folder = make_checkpoint(tmp_path / "c")
    full = load_checkpoint(folder)
    slim = load_checkpoint(_weights_only_copy(folder, tmp_path / "slim"))
    assert set(slim.state) == {"model", "epoch"} and slim.meta["num_positions"] == full.meta["num_positions"]
    assert slim.vocab.tokens == full.vocab.tokens and slim.labels == full.labels

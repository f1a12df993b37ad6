"""Train on documents: the bundled document sample (a few documents, a small from-scratch encoder) through the real
CLI on the session's local Ray, with 2 workers and a real MLflow sqlite store. The task comes from the data. Then the
same checkpoint through every other command: evaluate (the checkpoint folder on 1 worker and the run's MLflow model
on 3: training's test scores, from 2 workers, exactly), predict (one row per predicted fact, as many as evaluate
counts), the MLflow pyfunc model and the Ray Serve application (a document in DocRED's JSON in, its facts out, the
same as predict's)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pandas as pd
import pytest
import requests
from mlflow.tracking import MlflowClient

from nre_ray.data.__main__ import main as data_main
from nre_ray.predict import main as predict_main
from nre_ray.run.checkpoint import load_checkpoint
from nre_ray.tasks.document.counts import PREDICTED
from nre_ray.tasks.document.sample import write_sample
from nre_ray.tracking.store import mlflow_settings
from nre_ray.train import main
from tests.helpers import evaluate_on_1_and_3_workers, served

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]


def test_two_workers_train_the_document_sample(ray_cluster, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    write_sample(tmp_path / "docs", seed=0, sizes={"train": 24, "valid": 6, "test": 6})
    summary_path = tmp_path / "summary.json"
    code = main(["--data-dir", str(tmp_path / "docs"), "--hidden-size", "32",  # the task's model: transformer
                 "--num-layers", "1", "--min-freq", "1", "--batch-size", "4", "--num-workers", "2", "--epochs", "2",
                 "--run-name", "docs", "--experiment-name", "it-docs", "--summary-json", str(summary_path)])
    out = capsys.readouterr().out
    assert code == 0, out[-2000:]
    assert re.search(r"preprocess: train 24, valid 6, test 6 documents; 5 labels; vocabulary \d+", out), out
    assert "valid_micro_f1 selects the best checkpoint" in out
    assert len(re.findall(r"^epoch   \d/2  train_loss \d\.\d{4}  valid_loss .*  valid_micro_f1 \d\.\d{4}  "
                          r"valid_ign_f1 \d\.\d{4}  ", out, re.M)) == 2, out
    assert re.search(r"model: +runs:/\w+/model", out), out

    summary = json.loads(summary_path.read_text())
    assert summary["task"] == "document" and summary["select_metric"] == "valid_micro_f1"
    assert set(summary["test"]) >= {"micro_f1", "ign_f1", "intra_f1", "inter_f1", "loss"}
    meta = load_checkpoint(Path(summary["best_checkpoint"]), weights=False).meta
    assert meta["task"] == "document" and meta["model"] == "transformer"

    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    run = client.get_run(summary["run_id"])
    assert run.info.status == "FINISHED"
    assert run.data.params["data.train_rows"] == "24" and run.data.params["data.num_classes"] == "5"
    assert run.data.params["data.format"] == "docred"
    inputs = {d.dataset.name: d.dataset for d in run.inputs.dataset_inputs}
    assert set(inputs) == {"docs/train", "docs/valid", "docs/test"} and '"vertexSet"' in inputs["docs/train"].schema
    for name in ("epoch/train_loss", "epoch/valid_loss", "epoch/valid_micro_f1", "epoch/valid_ign_f1"):
        assert sorted(m.step for m in client.get_metric_history(run.info.run_id, name)) == [1, 2], name
    losses = [m.value for m in sorted(client.get_metric_history(run.info.run_id, "epoch/train_loss"),
                                      key=lambda m: m.step)]
    assert losses[1] < losses[0]  # it learns something
    assert run.data.metrics["test/micro_f1"] == pytest.approx(summary["test"]["micro_f1"])
    reports = {a.path for a in client.list_artifacts(run.info.run_id, "reports")}
    assert {"reports/valid_per_relation.md", "reports/test_per_relation.csv"} <= reports

    # the data as the run preprocessed it (its cache: no Ray), described for documents
    assert data_main(["inspect", "--data-dir", str(tmp_path / "docs"), "--min-freq", "1"]) == 0
    audit = capsys.readouterr().out
    assert "# Data audit (documents)" in audit and re.search(r"\| test \| 6 \| 0 \| \d+ \| \d+ \| \d+ \| \d+ \|", audit)
    check_the_other_commands(summary, tmp_path, capsys)


FACT_COLUMNS = ["document", "head", "head_name", "tail", "tail_name", "relation", "score"]


def check_the_other_commands(summary: dict, tmp_path: Path, capsys) -> None:
    """evaluate, predict, the pyfunc model and serve on the run's best checkpoint (see the module docstring)."""
    import mlflow.artifacts
    import mlflow.pyfunc

    best, test = summary["best_checkpoint"], tmp_path / "docs" / "test.json"
    # training scored its test split on 2 workers; evaluate on 1 and 3 (real Ray workers): the same numbers exactly
    report = evaluate_on_1_and_3_workers(summary, test, tmp_path, capsys, "6 documents", "ign_f1")
    assert report["task"] == "document"
    for name in ("micro_f1", "micro_precision", "micro_recall", "ign_f1", "intra_f1", "inter_f1"):
        assert report["metrics"][name] == summary["test"][name], name  # exactly training's test scores
    assert report["loss"] == pytest.approx(summary["test"]["loss"], rel=1e-5)

    out = tmp_path / "facts.csv"
    code = predict_main(["--model", best, "--input", str(test), "--output", str(out), "--no-progress"])
    printed = capsys.readouterr()
    assert code == 0, printed.err[-2000:]
    facts = pd.read_csv(out, keep_default_na=False, dtype={"head": str, "tail": str})
    assert list(facts.columns) == FACT_COLUMNS and "predicted 6 documents" in printed.out
    predicted = sum(report["confusion_matrix"][PREDICTED][1:])  # the facts evaluate counted as predicted
    assert len(facts) == predicted and (facts["score"] > 0.5).all()

    documents = json.loads(test.read_text(encoding="utf-8"))
    requests_rows = pd.DataFrame([{c: d[c] for c in ("title", "sents", "vertexSet")} for d in documents])
    # runs:/ resolved with the run's store: the logged model's models:/ URI is looked up in the registry URI, which
    # follows the process's global tracking URI, not the tracking_uri argument
    with mlflow_settings(summary["tracking_uri"]):
        local = mlflow.artifacts.download_artifacts(artifact_uri=summary["model_uri"], dst_path=str(tmp_path / "model"))
    pyfunc = mlflow.pyfunc.load_model(local).predict(requests_rows)
    assert list(pyfunc.columns) == FACT_COLUMNS
    pd.testing.assert_frame_equal(pyfunc.astype({"score": float}), facts, check_dtype=False, atol=1e-6)

    answers = serve_answers(best, documents)
    expected = [{c: (str(v) if c in ("head", "tail") else v) for c, v in row.items()}
                for row in facts[facts["document"] == documents[0]["title"]].to_dict(orient="records")]
    assert [{**r, "score": pytest.approx(r["score"], abs=1e-6)} for r in expected] == answers


def serve_answers(model: str, documents: list[dict]) -> list[dict]:
    """The Serve application of ``model`` on the session's Ray: a bare DocRED document (and the same in MLflow's
    ``dataframe_records``) in, its facts out; a bad document is a 400 naming it. Returns the first answer."""
    with served(model, "nre_ray_docs") as url:
        document = {c: documents[0][c] for c in ("title", "sents", "vertexSet")}
        answer = requests.post(url, json=document, timeout=60)
        assert answer.status_code == 200, answer.text
        records = requests.post(url, json={"dataframe_records": [document]}, timeout=60)
        assert records.status_code == 200 and records.json() == answer.json(), records.text
        bad = {**document, "vertexSet": [[{**document["vertexSet"][0][0], "sent_id": 99}]]}
        refused = requests.post(url, json=[document, bad], timeout=60)
        assert refused.status_code == 400 and "row 2" in refused.json()["message"], refused.text
        return answer.json()["predictions"]

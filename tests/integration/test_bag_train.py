"""Train on bags: the bundled bag sample (NYT10 TSV, NA + 4 relations) through the real CLI on the session's local Ray,
with 2 workers, a tiny CNN under selective attention and a real MLflow sqlite store. Bags are chosen by
--bag-aggregator; the held-out metrics, the PR curve's reports and the checkpoint's task are checked. Then the same
checkpoint through evaluate (the checkpoint folder on 1 worker and the run's MLflow model on 3: training's test
scores, from 2 workers, exactly), predict (one row per bag: its relation, NA below the validation threshold, and its
top k, whose entries at or above the threshold are the (bag, relation) pairs evaluate counts as predicted; the same
rows in this process and on 2 Ray workers), the MLflow pyfunc model and the Ray Serve application (a bag a row: its
pair and its sentences' texts in, the same rows as predict's out). ``python -m nre_ray.data inspect
--bag-aggregator`` describes the run's bags from its cache.

And --model bert inside the bags: a tiny random BERT (tests/tiny_bert.py) trained 1 epoch on 1 worker, whose
checkpoint, with the pretrained folder gone, evaluates the run's test file to training's test scores
exactly and predicts (predict and the pyfunc model) with the tokenizer it carries."""

from __future__ import annotations

import csv
import json
import re
import shutil
from pathlib import Path

import pandas as pd
import pytest
import requests
from mlflow.tracking import MlflowClient

from nre_ray.data.__main__ import main as data_main
from nre_ray.predict import main as predict_main
from nre_ray.run.checkpoint import load_checkpoint
from nre_ray.tasks.bag.grouping import sample_dir
from nre_ray.tracking.store import mlflow_settings
from nre_ray.train import main
from tests.helpers import evaluate_on_1_and_3_workers, evaluate_report, served

# train, then 2 evaluates, 2 predicts, the pyfunc model and serve: 233 s in all at a load of 54 without the last two
pytestmark = [pytest.mark.integration, pytest.mark.timeout(420)]

HELD_OUT = {"auc", "p_at_100", "p_at_200", "p_at_300", "micro_f1", "macro_f1", "threshold", "loss"}


def test_two_workers_train_the_bag_sample(ray_cluster, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    summary_path = tmp_path / "summary.json"
    code = main(["--bag-aggregator", "att", "--model", "cnn", "--hidden-size", "32", "--word-dim", "16",
                 "--pos-dim", "4", "--min-freq", "1", "--batch-size", "16", "--num-workers", "2", "--epochs", "2",
                 "--run-name", "bags", "--experiment-name", "it-bags", "--summary-json", str(summary_path)])
    out = capsys.readouterr().out
    assert code == 0, out[-2000:]
    assert re.search(r"preprocess: train 220, valid 66, test 66 bags; 5 labels; vocabulary \d+", out), out
    assert "valid_auc selects the best checkpoint" in out
    assert len(re.findall(r"^epoch   \d/2  train_loss \d\.\d{4}  valid_loss .*  valid_auc \d\.\d{4}  "
                          r"valid_p_at_100 \d\.\d{4}  ", out, re.M)) == 2, out
    assert re.search(r"model: +runs:/\w+/model", out), out
    assert "task/bags.json" in load_checkpoint(Path(json.loads(summary_path.read_text())["best_checkpoint"]),
                                               weights=False).meta["files"]

    summary = json.loads(summary_path.read_text())
    assert summary["task"] == "bag" and summary["select_metric"] == "valid_auc"
    assert set(summary["test"]) >= HELD_OUT and set(summary["valid"]) >= HELD_OUT - {"loss"}
    assert 0 <= summary["test"]["auc"] <= 1 and 0 <= summary["test"]["threshold"] <= 1
    meta = load_checkpoint(Path(summary["best_checkpoint"]), weights=False).meta
    assert meta["task"] == "bag" and meta["model"] == "cnn" and meta["num_classes"] == 5

    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    run = client.get_run(summary["run_id"])
    assert run.info.status == "FINISHED"
    params = run.data.params
    assert params["data.format"] == "nyt10" and params["model.bag_aggregator"] == "att"
    assert params["data.train_rows"] == "220" and params["data.num_classes"] == "5"
    assert params["train.select_metric"] == "auc" and params["data.max_bag_size"] == "100"
    inputs = {d.dataset.name: d.dataset for d in run.inputs.dataset_inputs}
    assert set(inputs) == {"sample/train", "sample/valid", "sample/test"}
    assert '"head_id"' in inputs["sample/train"].schema
    for name in ("epoch/train_loss", "epoch/valid_auc", "epoch/valid_p_at_100", "epoch/valid_micro_f1"):
        assert sorted(m.step for m in client.get_metric_history(run.info.run_id, name)) == [1, 2], name
    for name in ("auc", "p_at_100", "p_at_300", "micro_f1", "macro_f1"):
        assert run.data.metrics[f"test/{name}"] == pytest.approx(summary["test"][name]), name
    reports = {a.path for a in client.list_artifacts(run.info.run_id, "reports")}
    assert {"reports/test_pr_curve.png", "reports/test_pr_curve.csv", "reports/valid_pr_curve.png",
            "reports/test_per_relation.csv"} <= reports
    curve = pd.read_csv(client.download_artifacts(run.info.run_id, "reports/test_pr_curve.csv", str(tmp_path)))
    assert len(curve) == 66 * 4 and curve["precision"].iloc[99] == pytest.approx(summary["test"]["p_at_100"])
    relations = pd.read_csv(client.download_artifacts(run.info.run_id, "reports/test_per_relation.csv",
                                                      str(tmp_path)))
    assert (relations["threshold"] == summary["valid"]["threshold"]).all()  # where test/micro_f1 is taken
    logged_audit = client.download_artifacts(run.info.run_id, "data/audit.md", str(tmp_path))
    assert Path(logged_audit).read_text(encoding="utf-8").startswith("# Data audit (bags)")

    # the data as the run preprocessed it (its cache: no Ray), described as bags: the numbers of the sample's files
    assert data_main(["inspect", "--bag-aggregator", "att", "--min-freq", "1", "--json", "audit.json"]) == 0
    printed = capsys.readouterr().out
    assert "# Data audit (bags)" in printed
    assert "| train | 400 | 220 | 220 | 0 | 0 | 0 | 4 | 112 (50.9%) | 112 |" in printed  # multi-label: 4, NA: 112
    audit = json.loads((tmp_path / "audit.json").read_text(encoding="utf-8"))
    assert audit["task"] == "bag" and [audit["splits"][s]["bags"] for s in ("train", "valid", "test")] == [220, 66, 66]
    check_evaluate_and_predict(summary, tmp_path, capsys)


PAIR_ROWS = ["head_id", "tail_id", "head", "tail", "relation", "score"]


def check_evaluate_and_predict(summary: dict, tmp_path: Path, capsys) -> None:
    """evaluate, predict, the pyfunc model and serve on the run's best checkpoint (see the module docstring)."""
    best, test = summary["best_checkpoint"], sample_dir() / "test.tsv"  # the run's test file
    # training scored its test split on 2 workers; evaluate on 1 and 3 (real Ray workers): the same numbers exactly
    report = evaluate_on_1_and_3_workers(summary, test, tmp_path, capsys, "66 bags", "p_at_100")
    assert report["task"] == "bag"
    for name in ("auc", "p_at_100", "p_at_200", "p_at_300", "micro_f1", "micro_precision", "micro_recall",
                 "macro_f1", "threshold"):
        assert report["metrics"][name] == summary["test"][name], name  # exactly training's test scores
    assert report["metrics"]["threshold"] == summary["valid"]["threshold"]
    assert report["loss"] == pytest.approx(summary["test"]["loss"], rel=1e-5)

    rows = check_predict(best, test, report, tmp_path, capsys)
    pd.testing.assert_frame_equal(check_predict(best, test, report, tmp_path, capsys, "--local-max-rows", "0",
                                                "--num-workers", "2"), rows)
    assert (rows["relation"] != "NA").any()
    pairs = rows[PAIR_ROWS]

    asked = check_pyfunc(summary, test, pairs, tmp_path)
    answers = serve_answers(best, asked[:2])
    first_two = {(b["head_id"], b["tail_id"]) for b in asked[:2]}
    expected = [r for r in pairs.to_dict(orient="records") if (r["head_id"], r["tail_id"]) in first_two]
    assert [{**r, "score": pytest.approx(r["score"], abs=1e-6)} for r in expected] == answers


def check_predict(model: str, test: Path, report: dict, tmp_path: Path, capsys, *extra: str) -> pd.DataFrame:
    """predict of ``model`` on ``test`` with the top 5 (``extra``: more arguments): one row per bag (66), whose top-k
    entries at or above evaluate's threshold (``report``: evaluate's) are the (bag, relation) pairs evaluate counted
    as predicted and give the bag's relation. Returns the rows."""
    out = tmp_path / f"pairs_{len(list(tmp_path.glob('pairs_*.csv')))}.csv"
    code = predict_main(["--model", model, "--input", str(test), "--output", str(out), "--no-progress",
                         "--batch-size", "32", "--chunk-rows", "32", "--top-k", "5", *extra])
    printed = capsys.readouterr()
    assert code == 0, printed.err[-2000:]
    assert "predicted 66 bags" in printed.out, printed.out
    rows = pd.read_csv(out, keep_default_na=False, dtype={"head_id": str, "tail_id": str})
    assert list(rows.columns) == [*PAIR_ROWS, "top_k_labels", "top_k_scores"] and len(rows) == 66  # one per bag
    threshold = report["metrics"]["threshold"]
    above = [[(label, score) for label, score in zip(json.loads(labels), json.loads(scores), strict=True)
              if label != "NA" and score >= threshold]
             for labels, scores in zip(rows["top_k_labels"], rows["top_k_scores"], strict=True)]
    assert sum(map(len, above)) == sum(r["predicted"] for r in report["per_class"])  # evaluate's predicted pairs
    assert [found[0][0] if found else "NA" for found in above] == rows["relation"].tolist()
    return rows


def check_pyfunc(summary: dict, test: Path, pairs: pd.DataFrame, tmp_path: Path) -> list[dict]:
    """The run's MLflow pyfunc model on ``test``'s bags as request rows (a bag a row: its pair and its sentences'
    texts) answers ``pairs`` (predict's rows); returns the request rows."""
    import mlflow.artifacts
    import mlflow.pyfunc

    bags = pd.read_csv(test, sep="\t", header=None, names=["head_id", "tail_id", "head", "tail", "relation", "text"],
                       quoting=csv.QUOTE_NONE, dtype=str, keep_default_na=False)
    asked = [{"head_id": h, "tail_id": t, "head": group["head"].iloc[0], "tail": group["tail"].iloc[0],
              "sentences": [x.removesuffix("###END###").rstrip() for x in group["text"]]}
             for (h, t), group in bags.groupby(["head_id", "tail_id"], sort=True)]
    with mlflow_settings(summary["tracking_uri"]):  # runs:/ resolved with the run's store (test_document_train)
        local = mlflow.artifacts.download_artifacts(artifact_uri=summary["model_uri"],
                                                    dst_path=str(tmp_path / "model"))
    answered = mlflow.pyfunc.load_model(local).predict(pd.DataFrame(asked))
    pd.testing.assert_frame_equal(answered.astype({"score": float}), pairs, check_dtype=False, atol=1e-6)
    return asked


def serve_answers(model: str, bags: list[dict]) -> list[dict]:
    """The Serve application of ``model`` on the session's Ray: bags in (the task's own JSON and MLflow's
    ``dataframe_records``: the same answer), their (bag, relation) rows out; a bad bag is a 400 naming its row."""
    with served(model, "nre_ray_bags") as url:
        answer = requests.post(url, json={"bags": bags}, timeout=60)
        assert answer.status_code == 200, answer.text
        records = requests.post(url, json={"dataframe_records": bags}, timeout=60)
        assert records.status_code == 200 and records.json() == answer.json(), records.text
        refused = requests.post(url, json=[bags[0], {**bags[0], "sentences": ["names neither"]}], timeout=60)
        assert refused.status_code == 400 and "row 2: sentences" in refused.json()["message"], refused.text
        return answer.json()["predictions"]


def test_a_tiny_bert_inside_bags(ray_cluster, tmp_path, monkeypatch, capsys):
    pytest.importorskip("transformers")
    from tests.tiny_bert import bag_sample_words, make_tiny_bert

    monkeypatch.chdir(tmp_path)
    base = make_tiny_bert(tmp_path / "tiny-bert", bag_sample_words())
    code = main(["--bag-aggregator", "att", "--model", "bert", "--pretrained", str(base), "--max-length", "32",
                 "--batch-size", "32", "--lr", "2e-3", "--encoder-lr", "1e-3", "--num-workers", "1", "--epochs", "1",
                 "--run-name", "bag-bert", "--experiment-name", "it-bag-bert", "--summary-json", "s.json"])
    out = capsys.readouterr().out
    assert code == 0, out[-2000:]
    assert re.search(r"preprocess: train 220, valid 66, test 66 bags; 5 labels; vocabulary \d+", out), out
    summary = json.loads(Path("s.json").read_text())
    best = summary["best_checkpoint"]
    loaded = load_checkpoint(Path(best), weights=False)
    assert loaded.meta["task"] == "bag" and loaded.meta["model"] == "bert"
    assert loaded.vocab.subword and {"[E1]", "[E2]"} <= set(loaded.vocab.tokens)  # the tokenizer's, markers added
    assert {"pretrained/tokenizer.json", "pretrained/config.json", "task/bags.json"} <= set(loaded.meta["files"])

    shutil.rmtree(base)  # the checkpoint carries what it needs: the tokenizer with the markers, the model's config
    test = sample_dir() / "test.tsv"  # the run's test file
    report = evaluate_report(best, test, 1, tmp_path / "scores.json", capsys, "66 bags", "p_at_100")
    for name in ("auc", "p_at_100", "p_at_200", "p_at_300", "micro_f1", "micro_precision", "micro_recall",
                 "macro_f1", "threshold"):
        assert report["metrics"][name] == summary["test"][name], name  # exactly training's test scores (1 worker)
    assert report["loss"] == pytest.approx(summary["test"]["loss"], rel=1e-5)
    rows = check_predict(best, test, report, tmp_path, capsys)
    check_pyfunc(summary, test, rows[PAIR_ROWS], tmp_path)

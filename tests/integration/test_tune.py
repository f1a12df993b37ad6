"""``python -m nre_ray.tune`` on a real local Ray with a real MLflow sqlite store: a 4-trial sweep of 2 epochs on the
bundled sample, ASHA stopping the hopeless trials, the best checkpoint registered and predicting; then a 2-trial
sweep on bags and one on documents, each selecting on its task's metric and scoring its best checkpoint on test as
evaluate's code does."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Any

import mlflow
import pandas as pd
import pytest
from mlflow.tracking import MlflowClient

from nre_ray.core import console
from nre_ray.data.pipeline import sample_dir
from nre_ray.inference.evaluation import eval_loop_per_worker, trained_metrics
from nre_ray.run.checkpoint import load_checkpoint
from nre_ray.tasks.bag.grouping import sample_dir as bag_sample_dir
from nre_ray.tasks.document.sample import write_sample
from nre_ray.tasks.lookup import task_of
from nre_ray.tracking.store import mlflow_name, mlflow_settings
from nre_ray.tune import results as tune_results
from nre_ray.tune.__main__ import main

pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]

# lr 1e-5 learns nothing in 2 epochs (valid macro-F1 ~0.08 on 9 classes), 3e-3 learns the sample (~0.95). With the
# searcher seeded by --seed 1 the four trials draw 3e-3, 1e-5, 1e-5, 1e-5, two at a time. ASHA (grace 1, reduction 3,
# max_t 2: one rung, at epoch 1) keeps a trial past epoch 1 only when its score reaches the top third of those
# already recorded there. Trials 2 and 3 start only when trial 0 or 1 has ended, so both of those have been
# recorded, and a hopeless trial (the same score as the other hopeless ones: same seed) is below the cut whatever
# order the first two reached epoch 1 in.
SPACE = """
[train]
lr = { choice = [3e-3, 1e-5] }
"""


def test_four_trial_sweep_with_asha_on_the_sample(ray_cluster, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "space.toml").write_text(SPACE, encoding="utf-8")
    data = tmp_path / "data"
    shutil.copytree(sample_dir(), data)
    finish = tune_results.finish

    def finish_without_the_test_file(*args: Any, **kwargs: Any) -> Any:
        """The final test scores the test split as the sweep preprocessed it: the raw file is gone by then."""
        (data / "test.csv").rename(tmp_path / "test.csv.moved")
        return finish(*args, **kwargs)

    monkeypatch.setattr(tune_results, "finish", finish_without_the_test_file)
    argv = ["--data-dir", str(data), "--search-space", "space.toml", "--num-samples", "4", "--epochs", "2",
            "--num-workers", "1", "--max-concurrent-trials", "2", "--grace-period", "1", "--reduction-factor", "3",
            "--run-name", "sw", "--experiment-name", "tune-it", "--register-model", "tuned", "--summary-json",
            "summary.json"]
    assert main(argv) == 0
    assert not (data / "test.csv").exists()
    (tmp_path / "test.csv.moved").rename(data / "test.csv")
    out = capsys.readouterr().out
    assert "2 trial(s) at once, each 1 worker(s)" in out  # the plan, said up front
    # The console: phases of train's vocabulary that each open and close, a line per trial event, and nothing of
    # Ray's, Tune's or MLflow's own (Tune's configuration table, its results folder, the raylet's warning about
    # many worker processes, MLflow's run links)
    for phase in ("setup", "ray", "preprocess", "mlflow", "training", "model"):
        assert re.search(rf"^\[ *\d+\.\ds\] {phase}: .*\(\d+\.\d s\)$", out, re.M), phase
    assert not console.get().running, [p.name for p in console.get().running]  # every phase that opened closed
    assert re.search(r"^\[ *\d+\.\ds\] training: 4 trial\(s\): .*completed", out, re.M)
    assert re.search(r"^\[ *\d+\.\ds\] trial \w+ started: lr=", out, re.M)
    for chatter in ("╭", "│", "View detailed results here", "View run", "PYTHON worker processes", "(raylet)"):
        assert chatter not in out, chatter
    summary = json.loads(Path("summary.json").read_text(encoding="utf-8"))

    # Tune's results: every trial ran, at least one was stopped by ASHA after epoch 1, the good one completed.
    trials = summary["trials"]
    assert len(trials) == 4 and not [t for t in trials if t["error"]]
    stopped = [t for t in trials if t["outcome"] == "stopped early (ASHA)"]
    assert len(stopped) >= 2 and all(t["epochs"] == 1 and t["train.lr"] == 1e-5 for t in stopped)
    assert [t["train.lr"] for t in trials if t["outcome"] == "completed" and t["epochs"] == 2]
    assert summary["best_params"] == {"train.lr": 3e-3} and summary["best_valid"] > 0.5  # 9 classes: chance ~0.11
    assert summary["test"]["macro_f1"] > 0.5

    # MLflow: one parent run and four child runs, each with its params and its per-epoch curve.
    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("tune-it")
    runs = client.search_runs([experiment.experiment_id])
    parent = client.get_run(summary["run_id"])
    children = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == parent.info.run_id]
    assert len(runs) == 5 and len(children) == 4
    assert parent.info.status == "FINISHED" and all(r.info.status == "FINISHED" for r in children)
    by_trial = {r.data.tags["nre_ray.trial_id"]: r for r in children}
    for trial in trials:
        child = by_trial[trial["trial_id"]]
        assert float(child.data.params["train.lr"]) == trial["train.lr"]
        assert child.data.tags["nre_ray.tune.outcome"] == trial["outcome"]
        steps = sorted(m.step for m in client.get_metric_history(child.info.run_id, mlflow_name("valid_macro_f1")))
        assert steps == list(range(1, trial["epochs"] + 1))
        assert mlflow_name("test_macro_f1") not in child.data.metrics  # only the sweep's choice sees the test split
    artifacts = {a.path for a in client.list_artifacts(parent.info.run_id)}
    assert {"trials.csv", "trials.html", "trials_parallel.png", "search_space.json", "space.toml", "reports",
            "data"} <= artifacts
    table = pd.read_csv(client.download_artifacts(parent.info.run_id, "trials.csv", str(tmp_path / "dl")))
    assert len(table) == 4 and table["trial_id"].iloc[0] == summary["best_trial"]
    assert parent.data.params["best.train.lr"] == "0.003"
    assert parent.data.params["data.source.test"] == str(data / "test.csv")  # this sweep's own inputs
    assert parent.data.metrics[mlflow_name("test_macro_f1")] == pytest.approx(summary["test"]["macro_f1"])

    # The best model is registered and labels raw rows.
    assert summary["registered_model_uri"] == "models:/tuned/1"
    rows = pd.read_csv(sample_dir() / "test.csv").head(100)
    with mlflow_settings(f"sqlite:///{tmp_path / 'mlflow.db'}"):  # models:/ resolves against the global URI
        predicted = mlflow.pyfunc.load_model("models:/tuned/1").predict(rows.drop(columns=["relation"]))
    assert (predicted["predicted_relation"] == rows["relation"]).mean() > 0.5

    # The same sweep name again is refused (nothing overwritten); a finished sweep has nothing to resume.
    assert main([*argv[:-2]]) == 2
    assert "already exists" in capsys.readouterr().err
    assert main([*argv[:-2], "--resume"]) == 2
    assert "already finished" in capsys.readouterr().err


def test_bad_search_space_is_refused_before_anything_starts(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "space.toml").write_text("[data]\nmin_freq = { choice = [1, 2] }\n", encoding="utf-8")
    assert main(["--search-space", "space.toml", "--run-name", "bad"]) == 2
    err = capsys.readouterr().err
    assert "space.toml: [data] min_freq: cannot be searched: data options are fixed" in err
    assert not (tmp_path / "ray_results").exists() and not (tmp_path / "mlflow.db").exists()
    assert main(["--run-name", "nothing", "--resume"]) == 2  # no sweep of that name to continue
    assert "no MLflow run named 'nothing'" in capsys.readouterr().err


def _evaluated(checkpoint: str, data: Path, folder: Path) -> dict[str, float]:
    """The scores ``python -m nre_ray.evaluate`` gives ``checkpoint`` on the labelled file ``data``: the file encoded
    by the checkpoint's task (:meth:`~nre_ray.tasks.base.Task.encode_file`, not the sweep's cache) and scored by
    evaluate's worker loop, here in Ray Train's local mode (one rank in this process: no worker group to wait for)."""
    import ray.train
    from ray.train.torch import TorchTrainer

    loaded = load_checkpoint(Path(checkpoint))
    task, meta = task_of(loaded.meta), loaded.meta
    split, skipped = task.encode_file(str(data), loaded.config.data, loaded.vocab, loaded.labels, loaded.assets)
    assert skipped == 0
    model = {"task": task.name, "config": loaded.config.to_dict(), "state": loaded.state["model"],
             "spec": (int(meta["vocab_size"]), int(meta["num_classes"]), int(meta["num_positions"]),
                      loaded.pretrained_config)}
    sink = folder / f"evaluated-{task.name}.json"
    TorchTrainer(eval_loop_per_worker,
                 train_loop_config={"model": model, "data": split, "labels": loaded.labels,
                                    "negative_label": loaded.config.data.negative_label,
                                    "trained": trained_metrics(loaded), "threads": 1, "sink": str(sink)},
                 scaling_config=ray.train.ScalingConfig(num_workers=0),
                 run_config=ray.train.RunConfig(name=f"evaluated-{task.name}", storage_path=str(folder))).fit()
    return json.loads(sink.read_text(encoding="utf-8"))["metrics"]


def _check_sweep(client: MlflowClient, summary: dict, task: str, metric: str, test_file: Path, folder: Path) -> dict:
    """A finished 2-trial sweep on ``task``'s data: it selected on the task's ``metric``, its best trial is the
    argmax of its children's validation curves, and its parent run's test scores are evaluate's on ``test_file``.
    Returns the parent run's metrics."""
    assert summary["task"] == task and summary["select_metric"] == f"valid_{metric}"
    parent = client.get_run(summary["run_id"])
    assert parent.info.status == "FINISHED"
    params = parent.data.params
    assert params["train.select_metric"] == metric and params["tune.metric"] == f"valid_{metric}"
    children = client.search_runs([parent.info.experiment_id], f"tags.`mlflow.parentRunId` = '{parent.info.run_id}'")
    assert len(children) == 2 and all(r.info.status == "FINISHED" for r in children)
    curves = {}
    for child in children:
        history = sorted((m.step, m.value) for m in client.get_metric_history(child.info.run_id,
                                                                              mlflow_name(f"valid_{metric}")))
        trial = next(t for t in summary["trials"] if t["trial_id"] == child.data.tags["nre_ray.trial_id"])
        assert [step for step, _ in history] == list(range(1, trial["epochs"] + 1))  # every epoch it trained
        curves[trial["trial_id"]] = history
    best = max(value for history in curves.values() for _, value in history)
    assert summary["best_valid"] == best == max(value for _, value in curves[summary["best_trial"]])
    assert summary["best_epoch"] == next(step for step, value in curves[summary["best_trial"]] if value == best)
    meta = load_checkpoint(Path(summary["best_checkpoint"]), weights=False).meta
    assert meta["task"] == task and meta["epoch"] == summary["best_epoch"]  # the epoch the trial's loop selected
    metrics = {k: v for k, v in parent.data.metrics.items()}
    assert metrics[mlflow_name(f"best_valid_{metric}")] == best
    evaluated = _evaluated(summary["best_checkpoint"], test_file, folder)
    assert {k: metrics[mlflow_name(f"test_{k}")] for k in evaluated} == pytest.approx(evaluated, abs=1e-12)
    assert summary["test"] == pytest.approx(evaluated, abs=1e-12)
    table = pd.read_csv(client.download_artifacts(parent.info.run_id, "trials.csv", str(folder / task)))
    assert table[f"best_valid_{metric}"].iloc[0] == best
    return metrics


BAG_SPACE = """
[train]
lr = { choice = [3e-3, 3e-4] }
"""
DOCUMENT_SPACE = """
[train]
lr = { choice = [3e-3, 3e-4] }
"""


def test_bag_and_document_sweeps_select_on_their_tasks_metric(ray_cluster, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "bags.toml").write_text(BAG_SPACE, encoding="utf-8")
    (tmp_path / "documents.toml").write_text(DOCUMENT_SPACE, encoding="utf-8")
    write_sample(tmp_path / "docs", seed=0, sizes={"train": 24, "valid": 6, "test": 6})
    common = ["--num-samples", "2", "--epochs", "2", "--num-workers", "1", "--max-concurrent-trials", "2",
              "--min-freq", "1", "--hidden-size", "32", "--experiment-name", "tune-tasks", "--no-log-model"]
    assert main(["--bag-aggregator", "att", "--model", "cnn", "--word-dim", "16", "--pos-dim", "4",
                 "--search-space", "bags.toml", "--run-name", "bags", "--summary-json", "bags.json", *common]) == 0
    out = capsys.readouterr().out
    assert "ASHA on valid_auc" in out and re.search(r"preprocess: train 220, valid 66, test 66 bags", out), out
    assert re.search(r"^  test  auc \d\.\d{4}  p_at_100 \d\.\d{4}  ", out, re.M), out  # the bag task's scores
    # documents: the task comes from the data, and its model (transformer) without --model
    assert main(["--data-dir", str(tmp_path / "docs"), "--num-layers", "1", "--batch-size", "4",
                 "--search-space", "documents.toml", "--run-name", "docs", "--summary-json", "docs.json",
                 *common]) == 0
    out = capsys.readouterr().out
    assert "ASHA on valid_micro_f1" in out and "test 6 documents" in out, out
    assert re.search(r"^  test  micro_f1 \d\.\d{4}  micro_precision ", out, re.M), out

    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    bags = json.loads(Path("bags.json").read_text(encoding="utf-8"))
    metrics = _check_sweep(client, bags, "bag", "auc", bag_sample_dir() / "test.tsv", tmp_path)
    # the bags' F1 at the threshold chosen on validation, and the per-relation report at that threshold too
    relations = pd.read_csv(client.download_artifacts(bags["run_id"], "reports/test_per_relation.csv",
                                                      str(tmp_path / "reports")))
    assert (relations["threshold"] == metrics[mlflow_name("test_threshold")]).all()
    trained = trained_metrics(load_checkpoint(Path(bags["best_checkpoint"])))
    assert metrics[mlflow_name("test_threshold")] == trained["valid_threshold"]
    docs = json.loads(Path("docs.json").read_text(encoding="utf-8"))
    _check_sweep(client, docs, "document", "micro_f1", tmp_path / "docs" / "test.json", tmp_path)
    assert load_checkpoint(Path(docs["best_checkpoint"]), weights=False).meta["model"] == "transformer"
    artifacts = {a.path for a in client.list_artifacts(docs["run_id"], "data")}
    assert "data/audit.md" in artifacts
    audit = Path(client.download_artifacts(docs["run_id"], "data/audit.md", str(tmp_path / "audit"))).read_text()
    assert audit.startswith("# Data audit (documents)")  # the task's own audit

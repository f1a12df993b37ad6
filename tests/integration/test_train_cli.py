"""The real CLI on a real local Ray cluster with a real MLflow sqlite store."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from nre_ray.run.checkpoint import load_checkpoint
from nre_ray.train import main

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]


def _client(folder: Path) -> MlflowClient:
    return MlflowClient(f"sqlite:///{folder / 'mlflow.db'}")


def test_two_workers_two_epochs_on_the_sample(ray_cluster, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    summary_path = tmp_path / "summary.json"
    code = main(["--num-workers", "2", "--epochs", "2", "--run-name", "sample", "--experiment-name", "it",
                 "--summary-json", str(summary_path)])
    assert code == 0
    out = capsys.readouterr().out
    assert "best epoch" in out and "test " in out
    # The console: each phase with its time, the epoch lines from the driver under a legend, no worker prefixes
    for phase in ("ray: using the Ray this process has already joined", "preprocess: ", "mlflow: run ", "workers: 2 up",
                  "model: runs:/"):
        assert re.search(r"^\[ *\d+\.\ds\] " + re.escape(phase), out, re.M), phase
    assert "valid_macro_f1 selects the best checkpoint; * marks an epoch that improved it" in out
    assert re.search(r"^epoch   1/2  train_loss \d\.\d{4}  valid_loss .*  \*$", out, re.M)
    assert len(re.findall(r"^epoch   \d/2  ", out, re.M)) == 2
    assert "RayTrainWorker" not in out and "\x1b[" not in out
    assert "warning" not in out  # (logging the model once warned of rows without entity types: its own example)
    assert re.search(r"^look at it: mlflow ui --backend-store-uri sqlite:///.* then open "
                     r"http://127\.0\.0\.1:5000/#/experiments/\d+/runs/[0-9a-f]{32}\?workflowType=machine_learning$",
                     out, re.M), out[-500:]

    summary = json.loads(summary_path.read_text())
    assert summary["run_name"] == "sample" and summary["best_epoch"] in (1, 2)
    assert Path(summary["best_checkpoint"]).is_dir()
    assert summary["valid"]["macro_f1"] > 0.5  # 9 classes: chance is about 0.11
    assert summary["test"]["macro_f1"] > 0.5
    assert summary["storage_path"] == str(tmp_path / "ray_results")

    client = _client(tmp_path)
    run = client.get_run(summary["run_id"])
    assert run.info.status == "FINISHED" and run.info.run_name == "sample"
    assert run.data.params["train.epochs"] == "2" and run.data.params["model.model"] == "cnn"
    assert run.data.tags["workers"] == "2" and int(run.data.tags["threads_per_worker"]) >= 1
    assert int(run.data.params["data.train_rows"]) > 0 and int(run.data.params["data.num_classes"]) == 9
    # the start-up split, reported with the first epoch: one value each at step 0, stamped at the first step
    startup = {name: client.get_metric_history(run.info.run_id, f"system/startup_{name}_s")
               for name in ("imports", "ray", "preprocess", "workers", "loop_setup", "total")}
    assert all(len(points) == 1 and points[0].step == 0 for points in startup.values()), startup
    assert startup["total"][0].timestamp == startup["workers"][0].timestamp
    assert startup["total"][0].timestamp < min(m.timestamp for m in client.get_metric_history(
        run.info.run_id, "epoch/train_loss"))
    assert "system/startup_first_step_at" not in run.data.metrics
    history = client.get_metric_history(run.info.run_id, "epoch/valid_macro_f1")
    assert sorted(m.step for m in history) == [1, 2]
    for name in ("epoch/train_loss", "epoch/valid_accuracy", "epoch/valid_micro_f1", "epoch/train_lr",
                 "system/examples_per_sec"):
        assert len(client.get_metric_history(run.info.run_id, name)) == 2, name
    assert run.data.metrics["test/macro_f1"] == pytest.approx(summary["test"]["macro_f1"])

    artifacts = {a.path for a in client.list_artifacts(run.info.run_id, "best_checkpoint")}
    assert {"best_checkpoint/state.pt", "best_checkpoint/vocab.json", "best_checkpoint/labels.json"} <= artifacts
    reports = {a.path for a in client.list_artifacts(run.info.run_id, "reports")}
    assert "reports/test_confusion_matrix.png" in reports and "reports/valid_per_class.md" in reports
    data = {a.path for a in client.list_artifacts(run.info.run_id, "data")}
    assert {"data/audit.md", "data/audit.json"} <= data  # the data audit of every run
    audit = json.loads(Path(client.download_artifacts(run.info.run_id, "data/audit.json", str(tmp_path / "a")))
                       .read_text(encoding="utf-8"))
    assert {s: audit["splits"][s]["rows"] for s in ("train", "valid", "test")} == {"train": 3000, "valid": 500,
                                                                                    "test": 500}
    local = Path(client.download_artifacts(run.info.run_id, "best_checkpoint", str(tmp_path / "dl")))
    loaded = load_checkpoint(local)
    assert loaded.state["epoch"] == summary["best_epoch"]
    assert "no_relation" in loaded.labels

    # The same run name again is refused: nothing is overwritten.
    assert main(["--num-workers", "1", "--epochs", "1", "--run-name", "sample"]) == 2
    assert "already has checkpoints" in capsys.readouterr().err


def test_word_vectors_on_two_workers_say_so_on_the_console(ray_cluster, tmp_path, monkeypatch, capsys):
    """Every rank loads the vectors; rank 0's note reaches the driver's console as a plain line, and the workers
    go on (a report that one rank made and the other did not would hang them)."""
    monkeypatch.chdir(tmp_path)
    vectors = tmp_path / "vectors.txt"
    vectors.write_text("".join(f"{w} " + " ".join(["0.25"] * 8) + "\n" for w in ("the", "of", "in", "zzzq")),
                       encoding="utf-8")
    code = main(["--num-workers", "2", "--epochs", "1", "--run-name", "vectors", "--word-dim", "8",
                 "--embeddings", str(vectors), "--summary-json", "s.json"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert re.search(r"^\[ *\d+\.\ds\] embeddings: 3 of \d+ vocabulary words found in " + re.escape(str(vectors)), out,
                     re.M), out
    assert "pid=" not in out
    run = _client(tmp_path).get_run(json.loads(Path("s.json").read_text())["run_id"])
    assert run.data.params["embeddings.hits"] == "3"


def test_chinese_data_without_valid_file(ray_cluster, tmp_path, monkeypatch, shared_datasets):
    """DeepKE's Chinese data: no valid file (a stratified split of train), extra columns, CJK tokens."""
    monkeypatch.chdir(tmp_path)
    code = main(["--data-dir", str(shared_datasets / "deepke_chinese" / "csv"), "--num-workers", "2",
                 "--epochs", "1", "--run-name", "zh", "--summary-json", "s.json"])
    assert code == 0
    summary = json.loads(Path("s.json").read_text())
    assert summary["test"]["macro_f1"] > 0.3  # 10 balanced classes: chance is 0.1


def test_use_gpu_without_gpu_is_a_clear_error(ray_cluster, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(["--use-gpu", "--epochs", "1"]) == 2
    err = capsys.readouterr().err
    assert "--use-gpu: this Ray cluster has no GPU" in err and "Traceback" not in err


def test_help_lists_every_option():
    out = subprocess.run([sys.executable, "-m", "nre_ray.train", "--help"], capture_output=True, text=True,
                         check=True).stdout
    for flag in ("--data-dir", "--model", "--num-workers", "--use-gpu", "--epochs", "--batch-size", "--lr", "--seed",
                 "--experiment-name", "--run-name", "--tracking-uri", "--storage-path", "--address",
                 "--summary-json"):
        assert flag in out

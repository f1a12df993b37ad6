"""What a run looks like in MLflow (a real sqlite store): metric names and steps, tags, resolved params, dataset
inputs, and the logged model with its scores linked to it."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import mlflow
import pytest
from mlflow.tracking import MlflowClient

from nre_ray.cluster.session import Resources
from nre_ray.config import Config
from nre_ray.inference.pyfunc import log_model
from nre_ray.run import runner
from nre_ray.tracking import store as tracking
from tests.unit.test_inference import make_checkpoint, raw_rows

EPOCH = {"epoch": 1, "train_loss": 1.5, "valid_loss": 1.2, "valid_macro_f1": 0.5, "valid_accuracy": 0.6, "lr": 1e-3,
         "examples_per_sec": 900.0, "epoch_seconds": 3.0, "epoch_cpu_seconds": 2.5, "best_epoch": 1,
         "selection_rank": 1}


def test_metric_names_put_curves_first_and_bookkeeping_aside():
    logged, tags = tracking.mlflow_metrics({**EPOCH, "epoch": 2}, step=2)
    names = {name: step for name, _, step in logged}
    assert names == {"epoch/train_loss": 2, "epoch/valid_loss": 2, "epoch/valid_macro_f1": 2,
                     "epoch/valid_accuracy": 2, "epoch/train_lr": 2, "system/examples_per_sec": 2,
                     "system/epoch_seconds": 2, "system/epoch_cpu_seconds": 2}
    assert tags == {"best_epoch": "1"}
    logged, tags = tracking.mlflow_metrics({"test_macro_f1": 0.7, "best_epoch": 3, "startup_total_s": 9.5,
                                            tracking.FIRST_STEP_AT: 1.7e9}, step=3)
    assert logged == [("test/macro_f1", 0.7, 0), ("system/startup_total_s", 9.5, 0)] and tags == {"best_epoch": "3"}
    assert tracking.mlflow_name("trials_completed") == "trials_completed"  # not a curve: as it is
    for key in ("train_loss", "lr", "valid_pos_macro_f1", "test_accuracy", "startup_ray_s", "examples_per_sec"):
        assert tracking.loop_name(tracking.mlflow_name(key)) == key


@pytest.fixture()
def store(tmp_path):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    run_id = tracking.start_run(uri, "t", "run-1", {"nre_ray.run_name": "run-1"})
    return uri, run_id, MlflowClient(uri)


def prepared(tmp_path: Path) -> SimpleNamespace:
    sources = {name: str(tmp_path / "mydata" / f"{name}.csv") for name in ("train", "test")}
    return SimpleNamespace(splits={"train": [0] * 30, "valid": [0] * 5, "test": [0] * 7}, sources=sources,
                           cache_dir=str(tmp_path / "cache" / "abc123"))


def test_run_has_source_user_datasets_and_resolved_params(store, tmp_path):
    uri, run_id, client = store
    tracking.log_datasets(uri, run_id, prepared(tmp_path))
    tracking.log_datasets(uri, run_id, prepared(tmp_path))  # again (a resume): nothing twice
    run = client.get_run(run_id)
    assert run.data.tags["mlflow.user"] and run.data.tags["mlflow.source.name"]
    assert client.get_experiment(run.info.experiment_id).tags["mlflow.experimentKind"] == "custom_model_development"
    inputs = {d.dataset.name: d for d in run.inputs.dataset_inputs}
    assert sorted(inputs) == ["mydata/test", "mydata/train", "mydata/valid"]
    assert '"num_rows": 7' in inputs["mydata/test"].dataset.profile
    assert str(tmp_path / "mydata" / "train.csv") in inputs["mydata/valid"].dataset.source  # drawn from train
    assert len({d.dataset.digest for d in inputs.values()}) == 3

    cfg = Config.from_dict({"train": {"num_workers": 2}})
    target = runner.Target(run_name="run-1", storage="/abs/ray_results", tracking_uri=uri)
    params = runner.resolved_params(cfg, target, resources=Resources({"CPU": 0.5}, 1, placement_timeout=900.0))
    assert params["run.storage_path"] == "/abs/ray_results" and params["train.select_metric"] == "macro_f1"
    assert params["data.cache_dir"].endswith(".nre_ray_cache") and Path(params["data.cache_dir"]).is_absolute()
    assert params["train.cpus_per_worker"] == 0.5 and params["data.data_dir"].endswith("sample")
    assert params["train.placement_timeout"] == 900.0  # the wait the cluster's kind set (no --placement-timeout)
    assert params["data.format"] == "csv" and params["model.num_layers"] is None  # a cnn has no layers setting
    bilstm = runner.resolved_params(Config.from_dict({"model": {"model": "transformer", "hidden_size": 64}}), target)
    assert bilstm["model.num_layers"] == 2 and bilstm["model.num_heads"] >= 1
    assert all(value is not None for key, value in params.items() if key.startswith("run.storage"))


def test_metrics_read_back_under_the_loop_names(store):
    uri, run_id, client = store
    tracker = tracking.MlflowTracker(uri, run_id)
    # the first epoch reports the start-up split, stamped with the first step's time
    tracker.log_metrics({**EPOCH, "startup_total_s": 9.0, tracking.FIRST_STEP_AT: 1_700_000_000.5}, step=1)
    tracker.log_metrics({**EPOCH, "epoch": 2, "valid_macro_f1": 0.4, "selection_rank": 0}, step=2)
    tracker.log_metrics({"best_epoch": 1, "test_macro_f1": 0.55}, step=1)
    assert tracking.metric_steps(uri, run_id, "epoch") == {1, 2}
    metrics = tracking.run_metrics(uri, run_id)
    assert metrics["test_macro_f1"] == 0.55 and metrics["valid_macro_f1"] == 0.4 and metrics["startup_total_s"] == 9
    run = client.get_run(run_id)
    assert not {"epoch", "selection_rank", "best_epoch", tracking.FIRST_STEP_AT} & set(run.data.metrics)
    (startup,) = client.get_metric_history(run_id, "system/startup_total_s")
    assert (startup.step, startup.timestamp) == (0, 1_700_000_000_500)
    assert run.data.tags["best_epoch"] == "1"
    assert [m.step for m in client.get_metric_history(run_id, "test/macro_f1")] == [0]


def test_logged_model_carries_the_scores_of_its_epoch(store, tmp_path):
    uri, run_id, client = store
    tracking.log_datasets(uri, run_id, prepared(tmp_path))
    tracker = tracking.MlflowTracker(uri, run_id)
    tracker.log_metrics({"startup_total_s": 9.0}, step=0)
    tracker.log_metrics(EPOCH, step=1)  # the checkpoint's epoch (make_checkpoint: epoch 1)
    tracker.log_metrics({**EPOCH, "epoch": 2, "valid_macro_f1": 0.4}, step=2)
    tracker.log_metrics({"test_macro_f1": 0.55, "test_accuracy": 0.66}, step=1)
    logged = log_model(make_checkpoint(tmp_path / "ckpt"), uri, run_id)
    assert logged.model_uri == f"runs:/{run_id}/model"

    run = client.get_run(run_id)
    assert run.info.status == "RUNNING"  # left as it was
    (output,) = run.outputs.model_outputs
    assert output.step == 1
    model = client.get_logged_model(output.model_id)
    linked = {m.key: (m.value, m.dataset_name, m.step) for m in model.metrics}
    assert linked == {"test/macro_f1": (0.55, "mydata/test", 0), "test/accuracy": (0.66, "mydata/test", 0),
                      "epoch/valid_macro_f1": (0.5, "mydata/valid", 1),
                      "epoch/valid_accuracy": (0.6, "mydata/valid", 1), "epoch/valid_loss": (1.2, "mydata/valid", 1)}
    assert len(client.get_metric_history(run_id, "test/macro_f1")) == 1  # linking added no point to the run
    with tracking.mlflow_settings(uri):
        loaded = mlflow.pyfunc.load_model(logged.model_uri)
    rows = raw_rows().astype({"head_offset": "int64"})
    assert len(loaded.predict(rows)) == len(rows)


def test_the_warm_up_creates_no_store_and_leaves_errors_to_the_run(store, tmp_path):
    missing = tmp_path / "new" / "mlflow.db"
    for uri in (f"sqlite:///{missing}", store[0], "http://127.0.0.1:9"):  # a new file, the store, a dead server
        tracking.warm_up(uri)
    assert not missing.exists() and not missing.parent.exists()
    assert tracking.find_run(store[0], "t", "run-1", "missing") is None  # the warmed store still answers


def test_the_run_page_opens_in_the_model_training_view():
    assert tracking.run_page("http://127.0.0.1:5000/", "3", "abc") == \
        "http://127.0.0.1:5000/#/experiments/3/runs/abc?workflowType=machine_learning"
    assert tracking.run_page("http://h:5000", None, "abc") == "http://h:5000/#/experiments?workflowType=machine_learning"


def test_mlflow_settings_leaves_no_tracking_uri_behind(monkeypatch, tmp_path):
    """mlflow.set_tracking_uri writes MLFLOW_TRACKING_URI; later runs in the process must not inherit it."""
    import os

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    with tracking.mlflow_settings(f"sqlite:///{tmp_path / 'other.db'}"):
        assert os.environ["MLFLOW_TRACKING_URI"].endswith("other.db")
    assert "MLFLOW_TRACKING_URI" not in os.environ


def test_a_model_whose_logging_was_cut_short_is_discarded(tmp_path):
    """A log_model cut short (Ctrl-C, a killed driver) leaves a PENDING model; --resume and log_model's own failure
    path delete it, and never the run's READY model."""
    from mlflow.entities import LoggedModelStatus

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    run_id = tracking.start_run(uri, "cut", "r", {})
    client = MlflowClient(uri)
    experiment = tracking.experiment_id(uri, run_id)
    cut = client.create_logged_model(experiment, name="model", source_run_id=run_id)
    ready = client.create_logged_model(experiment, name="model", source_run_id=run_id)
    client.finalize_logged_model(ready.model_id, LoggedModelStatus.READY)
    assert tracking.discard_unfinished_models(uri, run_id, ready.model_id) == 0
    assert tracking.discard_unfinished_models(uri, run_id) == 1
    left = client.search_logged_models([experiment], filter_string=f"source_run_id = '{run_id}'")
    assert [m.model_id for m in left] == [ready.model_id] and cut.model_id != ready.model_id

"""``--resume`` and the refusal to overwrite: the checks that run before Ray starts, and finding the MLflow run."""

from __future__ import annotations

import pytest

from nre_ray.config import Config, ConfigError
from nre_ray.tracking import store as tracking
from nre_ray.train import main


def _uri(tmp_path) -> str:
    return f"sqlite:///{tmp_path / 'mlflow.db'}"


def test_resume_needs_a_run_name():
    with pytest.raises(ConfigError, match="--resume needs the --run-name"):
        Config.from_dict({"run": {"resume": True}})


def test_reusing_a_run_name_is_refused_and_suggests_resume(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "ray_results" / "r1" / "checkpoint_2026-01-01_00-00-00.000000").mkdir(parents=True)
    assert main(["--run-name", "r1", "--epochs", "1"]) == 2
    err = capsys.readouterr().err
    assert "already has checkpoints" in err and "nothing was overwritten" in err and "--resume" in err
    assert "Traceback" not in err


def test_resume_without_such_a_run_is_a_clear_error(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(["--resume", "--run-name", "ghost", "--tracking-uri", _uri(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "--resume: no MLflow run named 'ghost'" in err and "without --resume" in err

    # Checkpoints without their MLflow run (another tracking URI, say): refused too, saying what was found.
    (tmp_path / "ray_results" / "ghost" / "checkpoint_x").mkdir(parents=True)
    assert main(["--resume", "--run-name", "ghost", "--tracking-uri", _uri(tmp_path)]) == 2
    assert "has checkpoints (checkpoint_x) but no MLflow run" in capsys.readouterr().err


def test_a_finished_run_is_not_resumed(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    storage = str(tmp_path / "ray_results")
    run_id = tracking.start_run(_uri(tmp_path), "nre_ray", "done", {"nre_ray.run_name": "done",
                                                                    "storage_path": storage})
    tracking.end_run(_uri(tmp_path), run_id, "FINISHED")
    assert main(["--resume", "--run-name", "done", "--tracking-uri", _uri(tmp_path)]) == 2
    assert f"(MLflow run {run_id}) has already finished" in capsys.readouterr().err


def test_find_run_and_reopen(tmp_path):
    uri = _uri(tmp_path)
    assert tracking.find_run(uri, "nre_ray", "r", "/s") is None  # no experiment yet
    old = tracking.start_run(uri, "nre_ray", "r", {"nre_ray.run_name": "r", "storage_path": "/s"})
    other = tracking.start_run(uri, "nre_ray", "r", {"nre_ray.run_name": "r", "storage_path": "/elsewhere"})
    quoted = tracking.start_run(uri, "nre_ray", "it's \"q\"", {"nre_ray.run_name": "it's \"q\"", "storage_path": "/s"})
    assert tracking.find_run(uri, "nre_ray", "r", "/s").info.run_id == old
    assert tracking.find_run(uri, "nre_ray", "r", "/elsewhere").info.run_id == other
    assert tracking.find_run(uri, "nre_ray", "it's \"q\"", "/s").info.run_id == quoted
    assert tracking.find_run(uri, "nre_ray", "r", "/nowhere") is None
    tracking.end_run(uri, old, "KILLED")
    tracking.reopen_run(uri, old)
    assert tracking.find_run(uri, "nre_ray", "r", "/s").info.status == "RUNNING"


def test_check_resume_fits_the_checkpoint_records_changes_and_fills_a_missing_epoch(tmp_path, monkeypatch, capsys):
    """The driver-side check before --resume reopens a run (Ray Train's record of the run is faked here)."""
    from types import SimpleNamespace

    import ray.train

    from nre_ray.run import runner
    from nre_ray.run.checkpoint import CheckpointError
    from tests.unit.test_checkpoint import LABELS, VOCAB, _config, _save

    folder = _save(tmp_path / "ckpt", _config(), epoch=3)
    latest = SimpleNamespace(checkpoint=ray.train.Checkpoint.from_directory(str(folder)),
                             metrics={"epoch": 3, "valid_macro_f1": 0.75})
    monkeypatch.setattr(runner, "_latest_result", lambda storage, name: latest)
    uri = _uri(tmp_path)
    run_id = tracking.start_run(uri, "nre_ray", "r", {"nre_ray.run_name": "r", "storage_path": "/s"})
    tracking.MlflowTracker(uri, run_id).log_metrics({"epoch": 1}, step=1)
    resumed = tracking.find_run(uri, "nre_ray", "r", "/s")
    prepared = SimpleNamespace(vocab=VOCAB, labels=LABELS)
    cfg = Config.from_dict({**_config().to_dict(), "train": {"epochs": 20}, "run": {"resume": True, "run_name": "r"}})

    tags, missing = runner._check_resume(cfg, "/s", "r", prepared, resumed, uri)
    assert tags == {"nre_ray.resume_changes": '{"train.epochs": "100 -> 20"}'}
    assert missing == {"epoch": 3, "valid_macro_f1": 0.75}  # registered by Ray, never logged: logged on resume
    out = capsys.readouterr().out
    assert f"resuming run 'r' (MLflow run {run_id}) after epoch 3; logging epoch 3's metrics" in out

    tracking.MlflowTracker(uri, run_id).log_metrics(missing, step=3)
    assert runner._check_resume(cfg, "/s", "r", prepared, resumed, uri)[1] == {}
    wider = Config.from_dict({**cfg.to_dict(), "model": {**cfg.to_dict()["model"], "hidden_size": 32}})
    with pytest.raises(CheckpointError, match="--hidden-size 8 \\(this run: 32\\)"):
        runner._check_resume(wider, "/s", "r", prepared, resumed, uri)


def test_the_experiment_opens_as_a_model_training_one(tmp_path):
    """MLflow 3.17's UI opens an untagged experiment in its GenAI view (traces); the tag opens its runs."""
    from mlflow.tracking import MlflowClient

    from nre_ray.tracking import store as tracking

    uri = _uri(tmp_path)
    tracking.start_run(uri, "kinds", "a", {"nre_ray.run_name": "a", "storage_path": "/s"})
    experiment = MlflowClient(uri).get_experiment_by_name("kinds")
    assert experiment.tags["mlflow.experimentKind"] == "custom_model_development"

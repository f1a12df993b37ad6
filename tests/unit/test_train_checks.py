"""What ``python -m nre_ray.train`` refuses before Ray starts: clear messages, exit status 2, no Ray, no MLflow run."""

from __future__ import annotations

import pytest

from nre_ray.train import main


@pytest.fixture
def in_tmp(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    return tmp_path


def _refused(argv: list[str], capsys) -> str:
    import ray

    up_before = ray.is_initialized()  # the suite's session Ray may be up already (integration tests run first)
    assert main(argv) == 2
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err and "ray:" not in captured.out  # no ray phase: refused before it
    assert ray.is_initialized() == up_before
    return captured.err


def test_missing_input_files_are_named_before_ray_starts(in_tmp, capsys):
    err = _refused(["--train", "nope/train.csv", "--test", "nope/test.csv"], capsys)
    assert "nope/train.csv: --train: file not found" in err and "nope/test.csv: --test: file not found" in err
    assert not (in_tmp / "mlflow.db").exists()  # no MLflow run was created
    err = _refused(["--data-dir", "no_such_folder"], capsys)
    assert "no_such_folder" in err and "data directory not found" in err


def test_select_metric_and_model_are_checked_before_ray_starts(in_tmp, capsys):
    err = _refused(["--select-metric", "pos_macro_f1"], capsys)
    assert "--select-metric pos_macro_f1 needs --negative-label" in err and "macro_f1" in err
    with pytest.raises(SystemExit) as stopped:
        main(["--select-metric", "f1_macro"])
    assert stopped.value.code == 2
    assert "invalid choice: 'f1_macro' (choose from 'accuracy', 'macro_f1'" in capsys.readouterr().err


def test_summary_json_folder_must_exist(in_tmp, capsys):
    err = _refused(["--summary-json", "missing/summary.json"], capsys)
    assert "--summary-json missing/summary.json: the folder" in err


def test_allow_local_storage_puts_the_cache_under_the_storage_path_where_every_node_reads_it(tmp_path, monkeypatch):
    from nre_ray.config import Config
    from nre_ray.run.runner import cache_on_every_node, resolve_target

    monkeypatch.chdir(tmp_path)
    storage = tmp_path / "nfs" / "runs"
    cfg = Config.from_dict({"run": {"storage_path": str(storage), "allow_local_storage": True, "run_name": "r"}})
    resolve_target(cfg)
    assert cfg.data.cache_dir == str(storage / ".nre_ray_cache") and cache_on_every_node(cfg, str(storage))
    own = Config.from_dict({"run": {"storage_path": str(storage), "allow_local_storage": True, "run_name": "r"},
                            "data": {"cache_dir": str(tmp_path / "local_cache")}})
    resolve_target(own)  # a --cache-dir of the user's stays, and off the storage path it is this node's only
    assert own.data.cache_dir == str(tmp_path / "local_cache") and not cache_on_every_node(own, str(storage))
    plain = Config.from_dict({"run": {"storage_path": str(storage), "run_name": "r"}})
    resolve_target(plain)
    assert plain.data.cache_dir == str(tmp_path / ".nre_ray_cache") and not cache_on_every_node(plain, str(storage))


def test_a_run_name_in_use_by_another_command_is_refused_before_anything_starts(in_tmp, capsys):
    """Two commands with one --run-name on one storage path would write into one folder: the second is refused while
    the first runs (here a process holding the name as a run does), and the name is free once that one has ended."""
    import subprocess
    import sys

    from nre_ray.config import Config
    from nre_ray.run import runner
    from nre_ray.tune.__main__ import main as tune_main

    storage = in_tmp / "runs"
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time\nfrom nre_ray.core import buildonce\n"
         f"with buildonce.turn({str(storage / 'r1')!r}, wait=False):\n    print('held', flush=True)\n"
         "    sys.stdin.read()"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        err = _refused(["--run-name", "r1", "--storage-path", str(storage)], capsys)
        assert err.strip() == (f"error: run 'r1' is running now in another command on this machine ({storage / 'r1'}); "
                               "nothing was touched. Wait for it to end (then --resume continues it), or choose "
                               "another --run-name.")
        assert tune_main(["--run-name", "r1", "--storage-path", str(storage), "--num-samples", "1"]) == 2
        assert "error: sweep 'r1' is running now in another command" in capsys.readouterr().err
        assert not storage.exists() and not (in_tmp / "mlflow.db").exists()
    finally:
        holder.communicate("", timeout=30)
    cfg = Config()
    cfg.run.run_name, cfg.run.storage_path = "r1", str(storage)
    with runner.claim_run(cfg):  # free again
        pass


def test_a_storage_path_in_a_missing_bucket_is_one_line_before_anything_starts(in_tmp, object_store, capsys):
    """Train and tune (the commands that take --storage-path): refused in setup, not by the workers' first checkpoint
    46 s later, after an MLflow run was created."""
    from nre_ray import storage
    from nre_ray.tune.__main__ import main as tune_main

    missing = "s3://no-such-bucket-nre/runs"
    said = (f"error: --storage-path {missing}: the bucket does not exist. Check the URI, and the environment of every "
            "node: AWS_ENDPOINT_URL")
    err = _refused(["--storage-path", missing, "--epochs", "1"], capsys)
    assert err.startswith(said) and len(err.splitlines()) == 1, err
    assert tune_main(["--storage-path", missing, "--num-samples", "1"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(said) and len(err.splitlines()) == 1, err
    assert not list(in_tmp.iterdir())  # no mlflow.db, no ray_results
    storage.check_bucket(f"{object_store}/runs")  # a bucket that exists passes; so do local paths
    storage.check_bucket(str(in_tmp / "runs"))

"""Using a trained model, for real: one small model trained on the bundled sample, then the checkpoint folder, the
runs:/ model, the registered model and the served model give the same predictions; 1 and 2 prediction workers give
the same file; bad rows stop with a clear message; evaluation gives the same scores on 1, 2 and 3 workers."""

from __future__ import annotations

import io
import json
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import mlflow
import numpy as np
import pandas as pd
import pytest
import requests
from mlflow.tracking import MlflowClient

from nre_ray import storage
from nre_ray.cluster.ports import free_port
from nre_ray.data.pipeline import sample_dir
from nre_ray.evaluate import main as evaluate_main
from nre_ray.inference.evaluation import evaluate_file
from nre_ray.inference.predictor import Predictor
from nre_ray.predict import main as predict_main
from nre_ray.tasks.sentence import rows as sentence_rows
from nre_ray.tasks.sentence.rows import INPUT_COLUMNS
from nre_ray.tracking.store import mlflow_settings
from nre_ray.train import main as train_main

pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]
SAMPLE_TEST = sample_dir() / "test.csv"
REGISTERED = "nre_sample"
SERVE_TIMEOUT_S = 180


@pytest.fixture(scope="module")
def trained(ray_cluster, tmp_path_factory):
    """One epoch on the sample, its model logged and registered; returns the summary dict and the folder."""
    folder = tmp_path_factory.mktemp("predict")
    uri = f"sqlite:///{folder / 'mlflow.db'}"
    code = train_main(["--epochs", "1", "--num-workers", "1", "--cpus-per-worker", "2", "--run-name", "predict-it",
                       "--experiment-name", "it",
                       "--tracking-uri", uri, "--storage-path", str(folder / "ray_results"),
                       "--cache-dir", str(folder / "cache"), "--register-model", REGISTERED,
                       "--summary-json", str(folder / "summary.json")])
    assert code == 0
    summary = json.loads((folder / "summary.json").read_text())
    return {**summary, "folder": folder}


def sample_rows(n: int = 60) -> pd.DataFrame:
    return pd.read_csv(SAMPLE_TEST, nrows=n, keep_default_na=False)


def assert_same(got: pd.DataFrame, expected: pd.DataFrame) -> None:
    assert got["predicted_relation"].tolist() == expected["predicted_relation"].tolist()
    np.testing.assert_allclose(np.asarray(got["score"], dtype=float), expected["score"].to_numpy(), rtol=0,
                               atol=1e-6)


def test_training_logs_and_registers_the_model(trained):
    run_id = trained["run_id"]
    assert trained["model_uri"] == f"runs:/{run_id}/model"
    assert trained["registered_model_uri"] == f"models:/{REGISTERED}/1"
    client = MlflowClient(trained["tracking_uri"])
    run = client.get_run(run_id)
    assert run.info.status == "FINISHED"
    assert run.data.tags["threads_per_worker"] == "2"  # --cpus-per-worker 2: 2 CPUs reserved, 2 torch threads
    version = client.get_model_version(REGISTERED, "1")
    assert version.run_id == run_id
    # What the MLflow UI shows: the splits as dataset inputs, the model with its scores, the params as used.
    assert {d.dataset.name for d in run.inputs.dataset_inputs} == {"sample/train", "sample/valid", "sample/test"}
    (output,) = run.outputs.model_outputs
    assert output.step == trained["best_epoch"]
    linked = {m.key: m for m in client.get_logged_model(output.model_id).metrics}
    assert linked["test/macro_f1"].value == pytest.approx(trained["test"]["macro_f1"])
    assert linked["test/macro_f1"].dataset_name == "sample/test"
    assert linked["epoch/valid_macro_f1"].value == pytest.approx(trained["valid"]["macro_f1"])
    assert not [key for key in linked if not key.startswith(("test/", "epoch/valid_"))]
    assert run.data.params["run.storage_path"] == str(trained["folder"] / "ray_results")
    assert run.data.params["train.select_metric"] == "macro_f1" and run.data.tags["mlflow.user"]


def test_checkpoint_runs_registered_and_served_models_agree(trained, caplog):
    rows = sample_rows()
    inputs = [*INPUT_COLUMNS, "head_type", "tail_type"]  # the sample has entity types: its model learnt typed markers
    expected = Predictor.from_checkpoint(trained["best_checkpoint"]).predict_frame(rows)
    before = os.environ.get("MLFLOW_TRACKING_URI")
    with mlflow_settings(trained["tracking_uri"]):
        for uri in (trained["model_uri"], trained["registered_model_uri"]):
            model = mlflow.pyfunc.load_model(uri)
            schema = model.metadata.get_input_schema()
            assert [c.name for c in schema.inputs if c.required] == list(INPUT_COLUMNS)
            got = model.predict(rows[inputs])
            assert list(got.columns) == ["predicted_relation", "score"]
            assert_same(got, expected)
    assert os.environ.get("MLFLOW_TRACKING_URI") == before  # nothing leaks into later runs of this process
    assert_same(served_predictions(trained, rows[inputs]), expected)
    # without the types the rows get untyped markers, which this model never saw: it says so
    sentence_rows._warn_untyped.cache_clear()  # said once per process
    with caplog.at_level(logging.WARNING, logger="nre_ray.tasks.sentence.rows"):
        Predictor.from_checkpoint(trained["best_checkpoint"]).predict_frame(rows[list(INPUT_COLUMNS)])
    assert "trained with entity types" in caplog.text


def served_predictions(trained: dict, rows: pd.DataFrame) -> pd.DataFrame:
    """``mlflow models serve`` in a subprocess (killed at the end, whatever happens), then POST /invocations."""
    port = free_port()
    bin_dir = str(Path(sys.executable).parent)  # the server starts uvicorn from PATH
    env = {**os.environ, "MLFLOW_TRACKING_URI": trained["tracking_uri"], "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    log = open(trained["folder"] / "serve.log", "wb")  # closed in finally
    server = subprocess.Popen([sys.executable, "-m", "mlflow", "models", "serve", "-m", trained["model_uri"],
                               "--env-manager", "local", "--host", "127.0.0.1", "-p", str(port), "-w", "1"],
                              env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + SERVE_TIMEOUT_S
        while True:
            assert server.poll() is None, f"the server exited: {(trained['folder'] / 'serve.log').read_text()[-2000:]}"
            try:
                if requests.get(f"{base}/ping", timeout=2).status_code == 200:
                    break
            except requests.ConnectionError:
                pass
            assert time.monotonic() < deadline, f"the server was not up after {SERVE_TIMEOUT_S} s"
            time.sleep(1)
        payload = {"dataframe_split": json.loads(rows.to_json(orient="split", index=False))}
        response = requests.post(f"{base}/invocations", json=payload, timeout=60)
        assert response.status_code == 200, response.text
        bad = rows.head(2).copy()
        bad.loc[1, "head_offset"] = 9999
        refused = requests.post(f"{base}/invocations", timeout=60,
                                json={"dataframe_split": json.loads(bad.to_json(orient="split", index=False))})
        assert refused.status_code == 400 and "row 2: head_offset" in refused.json()["message"]
        return pd.DataFrame(response.json()["predictions"])
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        try:
            server.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait(timeout=15)
        log.close()


def test_cli_gives_the_same_file_with_1_and_2_workers_and_any_model_uri(trained, tmp_path, capfd):
    rows = sample_rows(200).drop(columns=["relation"])
    rows.insert(2, "note", "keep me")
    source = tmp_path / "in.csv"
    rows.to_csv(source, index=False)
    outputs = []
    # Ray Data with 1 and 2 actors (--local-max-rows 0), then in this process without Ray (a small input's default)
    for workers, model, local in ((1, trained["best_checkpoint"], "0"), (2, trained["model_uri"], "0"),
                                  (2, trained["registered_model_uri"], "0"), (1, trained["model_uri"], "5000")):
        out = tmp_path / f"out{len(outputs)}.csv"
        code = predict_main(["--model", model, "--input", str(source), "--output", str(out), "--num-workers",
                             str(workers), "--chunk-rows", "32", "--batch-size", "16", "--tracking-uri",
                             trained["tracking_uri"], "--no-progress", "--local-max-rows", local])
        said = capfd.readouterr()  # file descriptors: what Ray's C++ core worker prints is seen too
        assert code == 0, said.err
        assert "core_worker" not in said.err and "RayDeprecationWarning" not in said.err, said.err
        said = said.out
        assert ("in this process" in said) == (local != "0") and ("Ray worker(s)" in said) == (local == "0")
        outputs.append(pd.read_csv(out, dtype=str, keep_default_na=False))
    first = outputs[0]
    assert list(first.columns) == [*rows.columns, "predicted_relation", "score"]
    assert first["id"].tolist() == rows["id"].tolist() and (first["note"] == "keep me").all()
    for other in outputs[1:]:
        pd.testing.assert_frame_equal(other, first)
    assert_same(first.astype({"score": float}), Predictor.from_checkpoint(trained["best_checkpoint"])
                .predict_frame(rows))


def test_cli_bad_row_exits_2_with_file_line_and_field(trained, tmp_path, capsys):
    rows = sample_rows(40)
    rows.loc[2, "head_offset"] = 9999
    source = tmp_path / "bad.csv"
    rows.to_csv(source, index=False)
    out = tmp_path / "out.jsonl"
    args = ["--model", trained["best_checkpoint"], "--input", str(source), "--output", str(out), "--num-workers",
            "2", "--chunk-rows", "8", "--no-progress", "--local-max-rows", "0"]
    for extra in ([], ["--local-max-rows", "100"]):  # through Ray, then in this process: the same message
        assert predict_main([*args, *extra]) == 2
        err = capsys.readouterr().err
        assert f"{source}:4: head_offset: head runs past the end of the sentence" in err and "Traceback" not in err
        assert not out.exists()
    assert predict_main([*args, "--on-bad-rows", "skip"]) == 0
    written = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["id"] for r in written] == [i for k, i in enumerate(rows["id"]) if k != 2]
    assert "skipped 1 bad rows" in capsys.readouterr().out
    assert (tmp_path / "out.rejected.csv").exists()


def test_cli_reads_and_writes_an_object_store_through_ray(trained, tmp_path, object_store, capfd):
    """``--input`` and ``--output`` as s3:// URIs (a real S3 server) with Ray's read tasks and 2 actors: the
    predictions of the checkpoint, the offsets as integers in Parquet."""
    rows = sample_rows(200).drop(columns=["relation"])
    source = tmp_path / "in.csv"
    rows.to_csv(source, index=False)
    folder = storage.join(object_store, "predict-it")
    storage.upload(source, f"{folder}/in.csv")
    code = predict_main(["--model", trained["best_checkpoint"], "--input", f"{folder}/in.csv", "--output",
                         f"{folder}/out.parquet", "--num-workers", "2", "--chunk-rows", "32", "--no-progress",
                         "--local-max-rows", "0"])
    said = capfd.readouterr()
    assert code == 0, said.err
    assert f"2 Ray worker(s)) -> {folder}/out.parquet" in said.out
    got = pd.read_parquet(io.BytesIO(storage.read_bytes(f"{folder}/out.parquet")))
    assert list(got.columns) == [*rows.columns, "predicted_relation", "score"] and got["id"].tolist() == \
        rows["id"].tolist()
    assert got["head_offset"].dtype == got["tail_offset"].dtype == "int64"
    assert got["head_offset"].tolist() == rows["head_offset"].tolist()
    assert_same(got, Predictor.from_checkpoint(trained["best_checkpoint"]).predict_frame(rows))
    assert storage.list_files(folder) == [f"{folder}/in.csv", f"{folder}/out.parquet"]


def test_the_request_of_serves_help_is_answered_well_by_a_model_of_the_sample(trained):
    """``python -m nre_ray.serve --help`` ends with a curl request: its row, as the server labels it (the server
    labels rows with this Predictor; tests/integration/test_serve.py checks that its answers are the predict CLI's),
    gets the relation it states. Without its entity types it was answered no_relation (0.23)."""
    from nre_ray.serve.cli import EXAMPLES

    payload = json.loads(EXAMPLES.split("-d '", 1)[1].split("'", 1)[0])
    rows = pd.DataFrame(payload["dataframe_records"])
    assert {"head_type", "tail_type"} <= set(rows.columns)  # the sample, and so its model, has entity types
    got = Predictor.from_checkpoint(trained["best_checkpoint"]).predict_frame(rows, **payload["params"])
    assert got["predicted_relation"].tolist() == ["founded_by"], got.to_dict("records")


def _preemption_watchers() -> int:
    """How many preemption watcher actors Ray Train has started in this Ray, alive or dead."""
    import ray._private.state  # the GCS's actor table: the State API needs the dashboard, which tests point away

    return sum(a["ActorClassName"] == "PreemptionWatcher" for a in ray._private.state.actors().values())


def test_evaluate_gives_identical_scores_on_1_2_and_3_workers(trained, tmp_path, capsys):
    watchers = _preemption_watchers()
    reports = [evaluate_file(trained["best_checkpoint"], str(SAMPLE_TEST), num_workers=n) for n in (1, 2, 3)]
    # scoring starts no preemption watcher (killing it at the end logged a core_worker.cc error on a cluster)
    assert _preemption_watchers() == watchers
    assert [r["workers"] for r in reports] == [1, 2, 3]
    for other in reports[1:]:
        assert other["metrics"] == reports[0]["metrics"]
        assert np.array_equal(other["confusion_matrix"], reports[0]["confusion_matrix"])
    assert reports[0]["rows"] == 500
    assert reports[0]["metrics"]["macro_f1"] == pytest.approx(trained["test"]["macro_f1"], abs=1e-9)

    out = tmp_path / "metrics.json"
    assert evaluate_main(["--model", trained["best_checkpoint"], "--data", str(SAMPLE_TEST), "--num-workers", "2",
                          "--negative-label", "no_relation", "--output", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "pos_macro_f1" in printed and "no_relation" in printed
    # the test session's Ray: joined, not started (nor said to be)
    assert "ray: using the Ray this process has already joined" in printed and "starting a local Ray" not in printed
    saved = json.loads(out.read_text())
    assert saved["negative_label"] == "no_relation" and len(saved["per_class"]) == len(saved["labels"])

    unknown = pd.read_csv(SAMPLE_TEST, nrows=20, keep_default_na=False)
    unknown.loc[[3, 5], "relation"] = "parent_of"
    path = tmp_path / "unknown.csv"
    unknown.to_csv(path, index=False)
    assert evaluate_main(["--model", trained["best_checkpoint"], "--data", str(path)]) == 2
    err = capsys.readouterr().err
    assert f"{path}:5: relation: label 'parent_of' is not one of the checkpoint's" in err
    assert "Labels the checkpoint does not know: 'parent_of'" in err


def test_a_prediction_worker_that_dies_ends_the_command_with_one_clear_error(trained, tmp_path):
    """The actor pool's worker process killed (as the OOM killer would) while it labels: exit status 1, a one-line
    error that says what to do, no traceback, and no output file (actors are not restarted: predict.py says why)."""
    from nre_ray.cluster.processes import cmdline
    from tests.procs import descendants, env, stop_tree

    rows = pd.concat([sample_rows(500)] * 200, ignore_index=True)  # 100,000 rows: the actor labels for seconds
    source, out = tmp_path / "big.csv", tmp_path / "out.csv"
    rows.to_csv(source, index=False)
    proc = subprocess.Popen([sys.executable, "-m", "nre_ray.predict", "--model", trained["best_checkpoint"], "--input",
                             str(source), "--output", str(out), "--local-max-rows", "0", "--no-progress"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=tmp_path,
                            env=env(NRE_RAY_OWN_RAY="1"))  # its own Ray: its actors are among its descendants
    try:
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline and proc.poll() is None:
            actors = [p for p in descendants(proc.pid) if "MapWorker" in cmdline(p) and "PredictChunks" in cmdline(p)]
            if actors:
                time.sleep(1)  # labelling by now
                os.kill(actors[0], signal.SIGKILL)
                break
            time.sleep(0.2)
        else:
            pytest.fail("no prediction actor appeared")
        said, _ = proc.communicate(timeout=180)
    finally:
        stop_tree(proc)
    assert proc.returncode == 1, said
    assert "error: a prediction worker died (ActorDiedError), most often killed for memory: nothing was written" \
        in said and "Traceback" not in said and "\x1b[" not in said, said
    assert not out.exists() and not list(tmp_path.glob(".nre_ray_predict_*"))  # nor its staging folder

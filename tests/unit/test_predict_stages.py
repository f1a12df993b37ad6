"""The prediction CLI's stages without Ray: chunk -> actor's labelling -> ordered writing, bad rows, writers."""

from __future__ import annotations

import io
import json

import pandas as pd
import pytest

from nre_ray import storage
from nre_ray.data.chunks import plan_chunks
from nre_ray.data.errors import DataError
from nre_ray.inference.predict_options import PredictOptions
from nre_ray.inference.prediction import PredictChunks, UsageError, Writer, _write, output_format, predict_file
from nre_ray.inference.predictor import Predictor
from nre_ray.predict import main
from nre_ray.run.checkpoint import load_checkpoint
from tests.unit.test_inference import make_checkpoint, raw_rows


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return make_checkpoint(tmp_path_factory.mktemp("ckpt"))


def labelled_batches(checkpoint, path, chunk_rows=4, top_k=0):
    """What the Ray pipeline yields, computed in this process: one labelled frame per chunk, in order."""
    plan = plan_chunks(path, chunk_rows=chunk_rows)
    actor = PredictChunks(load_checkpoint(checkpoint), batch_size=3, top_k=top_k, threads=1, device="cpu")
    return plan, (actor(plan.read(i)) for i in range(len(plan.chunks)))


@pytest.mark.parametrize("suffix", [".csv", ".jsonl", ".parquet", ".tsv"])
def test_output_keeps_input_columns_order_and_matches_predict_frame(checkpoint, tmp_path, suffix):
    rows = raw_rows()
    source = tmp_path / "in.csv"
    rows.to_csv(source, index=False)
    plan, batches = labelled_batches(checkpoint, source, top_k=2)
    out = tmp_path / f"out{suffix}"
    summary = _write(batches, plan, out, output_format(out), "error", progress=False)
    assert summary.rows == summary.written == len(rows) and summary.rejected is None
    if suffix == ".parquet":
        got = pd.read_parquet(out)
    elif suffix == ".jsonl":
        got = pd.read_json(out, lines=True, dtype=False)
    else:
        got = pd.read_csv(out, sep="\t" if suffix == ".tsv" else ",", dtype=str, keep_default_na=False)
    assert list(got.columns) == [*rows.columns, "predicted_relation", "score", "top_k_labels", "top_k_scores"]
    assert got["id"].tolist() == rows["id"].tolist()
    expected = Predictor.from_checkpoint(checkpoint).predict_frame(rows, top_k=2)
    assert got["predicted_relation"].tolist() == expected["predicted_relation"].tolist()
    assert [float(s) for s in got["score"]] == pytest.approx(expected["score"].tolist(), abs=1e-6)
    top = got["top_k_labels"].iloc[0]
    assert list(json.loads(top) if isinstance(top, str) else top) == expected["top_k_labels"].iloc[0]
    for column in ("head_offset", "tail_offset"):  # Parquet: integers; the text formats: the text as read
        if suffix == ".parquet":
            assert got[column].dtype == "int64" and got[column].tolist() == rows[column].astype(int).tolist()
        else:
            assert got[column].tolist() == rows[column].astype(str).tolist()


def test_bad_rows_error_writes_nothing_and_names_file_and_line(checkpoint, tmp_path):
    rows = raw_rows()
    rows.loc[6, "tail_offset"] = -3
    source = tmp_path / "in.csv"
    rows.to_csv(source, index=False)
    plan, batches = labelled_batches(checkpoint, source)
    out = tmp_path / "out.csv"
    with pytest.raises(DataError) as err:
        _write(batches, plan, out, "csv", "error", progress=False)
    assert f"{source}:8: tail_offset: negative" in str(err.value)
    assert [p.name for p in tmp_path.iterdir()] == ["in.csv"]  # no output, no staging folder


def test_bad_rows_skipped_are_listed_beside_the_output(checkpoint, tmp_path):
    rows = raw_rows()
    rows.loc[[2, 7], "head"] = ""
    source = tmp_path / "in.csv"
    rows.to_csv(source, index=False)
    plan, batches = labelled_batches(checkpoint, source)
    summary = _write(batches, plan, tmp_path / "out.csv", "csv", "skip", progress=False)
    assert (summary.written, summary.skipped) == (len(rows) - 2, 2)
    rejected = pd.read_csv(tmp_path / "out.rejected.csv", dtype=str, keep_default_na=False)
    assert rejected["line"].tolist() == ["4", "9"] and rejected["id"].tolist() == ["r2", "r7"]
    assert rejected["problem"].str.startswith("head: empty").all()
    written = pd.read_csv(tmp_path / "out.csv", dtype=str)
    assert "r2" not in written["id"].tolist() and len(written) == len(rows) - 2


def test_mapped_offset_columns_are_integers_in_parquet(checkpoint, tmp_path):
    rows = raw_rows().rename(columns={"head_offset": "pos1", "tail_offset": "pos2"})
    source = tmp_path / "in.jsonl"
    rows.to_json(source, orient="records", lines=True)
    summary = predict_file(PredictOptions(model=str(checkpoint), input=str(source),
                                          output=str(tmp_path / "out.parquet"),
                                          columns="pos1=head_offset,pos2=tail_offset", no_progress=True))
    got = pd.read_parquet(tmp_path / "out.parquet")
    assert summary.in_process and got["pos1"].dtype == got["pos2"].dtype == "int64"
    assert got["pos1"].tolist() == rows["pos1"].astype(int).tolist() and got["note"].tolist() == rows["note"].tolist()


def test_input_output_and_model_in_an_object_store(checkpoint, tmp_path, object_store, capsys):
    """``--input``, ``--output`` and ``--model`` as s3:// URIs (a real S3 server): the same rows as a local run,
    the rejected rows beside the output, integer offsets in Parquet; a missing input or bucket is one line, exit 2,
    and nothing is written."""
    rows = raw_rows()
    rows.loc[2, "head"] = ""
    source = tmp_path / "in.csv"
    rows.to_csv(source, index=False)
    base = storage.join(object_store, "predict", tmp_path.name)
    storage.upload(source, f"{base}/in.csv")
    storage.upload(checkpoint, f"{base}/checkpoint")
    args = ["--input", f"{base}/in.csv", "--on-bad-rows", "skip", "--chunk-rows", "4", "--no-progress"]
    assert main(["--model", f"{base}/checkpoint", *args, "--output", f"{base}/out/labelled.parquet"]) == 0
    said = capsys.readouterr().out
    assert f"-> {base}/out/labelled.parquet" in said and f"listed in {base}/out/labelled.rejected.csv" in said
    assert main(["--model", str(checkpoint), *args, "--input", str(source), "--output", str(tmp_path / "o.parquet")]) \
        == 0
    got = pd.read_parquet(io.BytesIO(storage.read_bytes(f"{base}/out/labelled.parquet")))
    pd.testing.assert_frame_equal(got, pd.read_parquet(tmp_path / "o.parquet"))
    assert got["head_offset"].dtype == "int64" and len(got) == len(rows) - 1
    rejected = pd.read_csv(io.BytesIO(storage.read_bytes(f"{base}/out/labelled.rejected.csv")), dtype=str)
    assert rejected["id"].tolist() == ["r2"] and rejected["file"].tolist() == [f"{base}/in.csv"]
    assert storage.list_files(f"{base}/out") == [f"{base}/out/labelled.parquet", f"{base}/out/labelled.rejected.csv"]
    capsys.readouterr()

    assert main(["--model", str(checkpoint), *args, "--input", f"{base}/missing.csv", "--output", f"{base}/x.csv"]) \
        == 2
    err = capsys.readouterr().err
    assert f"{base}/missing.csv: file not found" in err and "Traceback" not in err
    assert main(["--model", str(checkpoint), *args, "--output", "s3://no-such-bucket-here/x.csv"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: s3://no-such-bucket-here/x.csv: the bucket does not exist") and \
        len(err.splitlines()) == 1
    assert main(["--model", f"{base}/no-checkpoint", *args, "--output", str(tmp_path / "y.csv")]) == 2
    assert f"--model {base}/no-checkpoint: not found" in capsys.readouterr().err
    assert not storage.exists(f"{base}/x.csv") and not (tmp_path / "y.csv").exists()


def test_writer_parquet_keeps_one_schema_across_batches(tmp_path):
    writer = Writer(tmp_path / "o.parquet", "parquet")
    writer.write(pd.DataFrame({"a": pd.Series(["x", 3], dtype=object), "score": [0.5, 0.25]}))
    writer.write(pd.DataFrame({"a": pd.Series([None, {"k": 1}], dtype=object), "score": [0.1, 0.2]}))
    writer.close()
    got = pd.read_parquet(tmp_path / "o.parquet")
    assert got["a"].tolist()[:2] == ["x", "3"] and got["a"].iloc[3] == '{"k": 1}'


def test_output_format_and_usage_errors(checkpoint, tmp_path, capsys):
    assert output_format("a.ndjson") == "jsonl" and output_format("b.PQ") == "parquet"
    with pytest.raises(UsageError, match="cannot tell the format"):
        output_format("a.xlsx")
    source = tmp_path / "in.csv"
    raw_rows().to_csv(source, index=False)
    assert main(["--model", str(checkpoint), "--input", str(source), "--output", str(tmp_path / "o.txt")]) == 2
    assert "cannot tell the format" in capsys.readouterr().err
    assert main(["--model", str(tmp_path / "nope"), "--input", str(source), "--output", str(tmp_path / "o.csv")]) == 2
    assert "no such folder" in capsys.readouterr().err
    assert main(["--model", str(checkpoint), "--input", str(tmp_path / "missing.csv"),
                 "--output", str(tmp_path / "o.csv")]) == 2
    assert "missing.csv: file not found" in capsys.readouterr().err


def test_a_small_input_is_labelled_in_this_process_without_ray(checkpoint, tmp_path):
    """The default path for a small file: no Ray imported, the same file as the actors' stages write, and the
    progress as plain lines (no carriage returns) when stderr is not a terminal."""
    import subprocess
    import sys

    rows = raw_rows()
    source = tmp_path / "in.csv"
    rows.to_csv(source, index=False)
    script = ("import sys; from nre_ray.predict import main; code = main(sys.argv[1:]); "
              "assert 'ray' not in sys.modules, 'Ray was imported'; sys.exit(code)")
    done = subprocess.run([sys.executable, "-c", script, "--model", str(checkpoint), "--input", str(source),
                           "--output", str(tmp_path / "here.csv"), "--chunk-rows", "4", "--num-workers", "3"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert f"predicted {len(rows)} rows" in done.stdout and "in this process" in done.stdout
    assert "predict: labelling" in done.stderr and "\r" not in done.stderr and "core_worker" not in done.stderr
    plan, batches = labelled_batches(checkpoint, source)
    _write(batches, plan, tmp_path / "stages.csv", "csv", "error", progress=False)
    here, stages = (pd.read_csv(tmp_path / name, dtype=str, keep_default_na=False) for name in ("here.csv",
                                                                                              "stages.csv"))
    assert list(here.columns) == list(stages.columns)
    pd.testing.assert_frame_equal(here.drop(columns="score"), stages.drop(columns="score"))
    assert here["score"].astype(float).tolist() == pytest.approx(stages["score"].astype(float).tolist(), abs=1e-6)


def test_a_dead_prediction_actor_is_recognised_through_the_errors_that_wrap_it():
    import ray.exceptions

    from nre_ray.inference.prediction import worker_died

    died = ray.exceptions.ActorDiedError()
    try:
        try:
            raise died
        except ray.exceptions.ActorDiedError as err:
            raise RuntimeError("Ray Data's execution failed") from err
    except RuntimeError as wrapped:
        assert worker_died(wrapped)
    assert not worker_died(ValueError("a bug of ours")) and not worker_died(DataError([]))

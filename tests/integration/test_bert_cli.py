"""--model bert through the real CLI: a tiny random BERT fine-tuned by 2 workers, then used with its folder deleted."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

pytest.importorskip("transformers")

from nre_ray.config import DataConfig
from nre_ray.data.pipeline import prepare, sample_dir
from nre_ray.inference.predictor import Predictor
from nre_ray.run.checkpoint import PRETRAINED_DIR, load_checkpoint
from nre_ray.train import main
from tests.tiny_bert import make_tiny_bert

pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]

FRESH = """
import json, sys
import mlflow.pyfunc, pandas as pd
from nre_ray.inference.predictor import Predictor
checkpoint, rows, model_uri = sys.argv[1:4]
frame = pd.read_csv(rows, keep_default_na=False)
out = Predictor.from_checkpoint(checkpoint).predict_frame(frame)
served = mlflow.pyfunc.load_model(model_uri).predict(frame)
print(json.dumps({"labels": out["predicted_relation"].tolist(), "scores": out["score"].tolist(),
                  "served": served["predicted_relation"].tolist()}))
"""


def test_bert_two_workers_then_predict_in_a_fresh_process(ray_cluster, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    base = make_tiny_bert(tmp_path / "tiny-bert")
    code = main(["--model", "bert", "--pretrained", str(base), "--typed-markers", "--num-workers", "2",
                 "--epochs", "1", "--batch-size", "32", "--lr", "2e-3", "--encoder-lr", "1e-3", "--dropout", "0.1",
                 "--max-length", "64", "--run-name", "bert", "--summary-json", "s.json"])
    out = capsys.readouterr().out
    assert code == 0, out
    summary = json.loads(Path("s.json").read_text())
    checkpoint = Path(summary["best_checkpoint"])
    assert (checkpoint / PRETRAINED_DIR / "tokenizer.json").is_file()
    assert (checkpoint / PRETRAINED_DIR / "config.json").is_file()
    loaded = load_checkpoint(checkpoint)
    assert loaded.vocab.subword and "<e1:person>" in loaded.vocab.tokens
    assert loaded.config.model.pretrained == str(base)
    assert summary["test"]["macro_f1"] >= 0.75, summary["test"]  # one epoch reaches 0.82 here; chance is about 0.11

    # The same data and settings again: the encoded splits and the tokenizer come from the cache, with no Ray work.
    cached = prepare(DataConfig(typed_markers=True, max_length=64), 1, str(base))
    assert cached.cache_hit and cached.vocab.tokens == loaded.vocab.tokens
    assert (Path(cached.pretrained_dir) / "tokenizer.json").is_file()

    rows = pd.read_csv(sample_dir() / "test.csv", keep_default_na=False).head(40)
    rows.to_csv(tmp_path / "rows.csv", index=False)
    here = Predictor.from_checkpoint(checkpoint).predict_frame(rows)
    assert here["predicted_relation"].notna().all()

    shutil.rmtree(base)  # the pretrained folder is gone: the checkpoint and the MLflow model must not need it
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "MLFLOW_TRACKING_URI": summary["tracking_uri"]}
    model_uri = f"runs:/{summary['run_id']}/model"
    result = subprocess.run([sys.executable, "-c", FRESH, str(checkpoint), str(tmp_path / "rows.csv"), model_uri],
                            capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    fresh = json.loads(result.stdout.strip().splitlines()[-1])
    assert fresh["labels"] == here["predicted_relation"].tolist()
    assert fresh["scores"] == pytest.approx(here["score"].tolist(), abs=1e-6)
    assert fresh["served"] == fresh["labels"]

"""--model bert on documents through the real CLI: a tiny random BERT (128 positions: most sample documents are longer
and are read in windows) fine-tuned on the bundled document sample by 2 workers, then evaluate on the checkpoint
with the pretrained folder deleted: training's test scores exactly."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

pytest.importorskip("transformers")

from nre_ray.data.__main__ import main as data_main
from nre_ray.evaluate import main as evaluate_main
from nre_ray.run.checkpoint import PRETRAINED_DIR, load_checkpoint
from nre_ray.tasks.document.counts import PREDICTED
from nre_ray.tasks.document.sample import write_sample
from nre_ray.train import main
from tests.tiny_bert import make_tiny_bert

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]


def test_bert_on_documents_then_evaluate_without_the_pretrained_folder(ray_cluster, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    docs = tmp_path / "docs"
    write_sample(docs, seed=0, sizes={"train": 24, "valid": 6, "test": 6})
    base = make_tiny_bert(tmp_path / "tiny-bert")
    # batches of 2 at a high head rate: 6 steps a worker, after which the model predicts facts (wrong ones mostly)
    code = main(["--data-dir", str(docs), "--model", "bert", "--pretrained", str(base), "--num-workers", "2",
                 "--epochs", "1", "--batch-size", "2", "--lr", "3e-2", "--encoder-lr", "1e-3", "--run-name", "docbert",
                 "--experiment-name", "it-docbert", "--no-log-model", "--summary-json", "s.json"])
    out = capsys.readouterr().out
    assert code == 0, out[-2000:]
    vocabulary = json.loads((base / "tokenizer.json").read_text(encoding="utf-8"))["model"]["vocab"]
    assert f"preprocess: train 24, valid 6, test 6 documents; 5 labels; vocabulary {len(vocabulary)}" in out, out
    assert re.search(r"^epoch   1/1  train_loss \d\.\d{4}  valid_loss ", out, re.M), out

    summary = json.loads(Path("s.json").read_text())
    checkpoint = Path(summary["best_checkpoint"])
    assert {"tokenizer.json", "config.json"} <= {p.name for p in (checkpoint / PRETRAINED_DIR).iterdir()}
    loaded = load_checkpoint(checkpoint, weights=False)
    assert loaded.meta["task"] == "document" and loaded.meta["model"] == "bert" and loaded.vocab.subword

    # inspect as a --model bert run sees the data: the run's cache (no Ray started), in subwords against the model's
    # 128 positions
    assert data_main(["inspect", "--data-dir", str(docs), "--model", "bert", "--pretrained", str(base)]) == 0
    printed = capsys.readouterr().out
    assert "Length in the pretrained tokenizer's subwords" in printed, printed
    assert "The window is the pretrained model's positions (128 subwords)" in printed, printed
    longer = re.search(r"^\| train \|(?: [\d.]+ \|){4} (\d+) \|$", printed, re.M)
    assert longer and int(longer.group(1)) > 0, printed

    shutil.rmtree(base)  # evaluate needs only the checkpoint: its tokenizer files and config.json
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    test = docs / "test.json"
    code = evaluate_main(["--model", str(checkpoint), "--data", str(test), "--output", "scores.json",
                          "--num-workers", "1"])
    printed = capsys.readouterr()
    assert code == 0, printed.err[-2000:]
    assert f"{test}: 6 documents, 1 worker(s)" in printed.out, printed.out
    report = json.loads(Path("scores.json").read_text())
    assert sum(report["confusion_matrix"][PREDICTED][1:]) > 0  # facts predicted: the scores below are not all 0
    for name in ("micro_f1", "micro_precision", "micro_recall", "ign_f1", "intra_f1", "inter_f1"):
        assert report["metrics"][name] == summary["test"][name], name  # training scored it on 2 workers
    assert report["loss"] == pytest.approx(summary["test"]["loss"], rel=1e-5)

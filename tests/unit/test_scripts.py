"""The benchmark scripts import and parse their options, and bench_accuracy writes one table per dataset."""

import importlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"


@pytest.mark.parametrize("name", sorted(p.name for p in SCRIPTS.glob("*.py") if p.name != "bench_common.py"))
def test_script_help(name: str) -> None:
    out = subprocess.run([sys.executable, str(SCRIPTS / name), "--help"], capture_output=True, text=True, timeout=120,
                         cwd=SCRIPTS, check=False)
    assert out.returncode == 0, out.stderr
    assert "usage:" in out.stdout


@pytest.fixture
def bench_accuracy(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(SCRIPTS))
    module = importlib.import_module("bench_accuracy")
    monkeypatch.setattr(module, "RESULTS_MD", tmp_path / "results.md")
    monkeypatch.setattr(module, "RESULTS_JSON", tmp_path / "results_accuracy.json")
    monkeypatch.setattr(module, "README", tmp_path / "README.md")
    return module


def _row(model: str, dataset: str, macro: float, micro: float | None) -> dict:
    return {"model": model, "dataset": dataset, "data_dir": f"/data/{dataset}", "test_macro_f1": macro,
            "test_micro_f1": micro, "test_accuracy": 0.5, "valid_macro_f1": 0.6, "best_epoch": 3, "epochs": 4,
            "workers": 2, "epoch_seconds": 1.25, "epoch_cpu_seconds": 1.0, "wall_s": 90,
            "command": f"python -m nre_ray.train --model {model} --data-dir /data/{dataset}",
            "stop_reason": "early stop: valid_macro_f1 did not improve for 1 epochs after epoch 3 (--patience 1)",
            "machine": {"nproc": 2, "loadavg_at_start": [1.5, 1.0, 1.0]}}


def test_bench_accuracy_one_table_per_dataset(bench_accuracy, tmp_path):
    (tmp_path / "results.md").write_text("# Results\n\nintro kept\n", encoding="utf-8")
    readme = "# nre_ray\n\n<!-- bench_accuracy:summary:begin -->\nold\n<!-- bench_accuracy:summary:end -->\nrest\n"
    (tmp_path / "README.md").write_text(readme, encoding="utf-8")
    rows = {"deepke_chinese": {"cnn": _row("cnn", "deepke_chinese", 0.9469, 0.94),
                               "bilstm": _row("bilstm", "deepke_chinese", 0.95, 0.95),
                               "bert": _row("bert", "deepke_chinese", 0.99, 0.99)},
            "fewrel": {"pcnn": _row("pcnn", "fewrel", 0.8347, None), "cnn": _row("cnn", "fewrel", 0.8382, 0.8375)},
            "mine": {"bilstm": _row("bilstm", "mine", 0.7, 0.7)}}
    bench_accuracy.write_results(rows)
    text = (tmp_path / "results.md").read_text(encoding="utf-8")
    assert text.startswith("# Results\n\nintro kept\n")
    # known datasets first in their fixed order, then others; within a table the encoders in registry order
    titles = [line for line in text.splitlines() if line.startswith("## ")]
    assert titles == ["## FewRel (16 relations, English): test scores by encoder",
                      "## DeepKE Chinese (10 relations): test scores by encoder", "## mine: test scores by encoder"]
    fewrel = text[text.index("## FewRel"):text.index("## DeepKE")]
    assert fewrel.index("| cnn | 83.82 | 83.75 |") < fewrel.index("| pcnn | 83.47 | not recorded |")
    assert "| cnn | 94.69 | 94.00 | 50.00 | 60.00 | 4 (3) | 1.2 | 1 | 1.5 min | 2 | 2 cores, load 1.5 |" in text
    # each row's exact command, and why it stopped
    assert ("- cnn: `python -m nre_ray.train --model cnn --data-dir /data/fewrel`; early stop: valid_macro_f1 did "
            "not improve for 1 epochs after epoch 3 (--patience 1)") in fewrel
    assert "train and test from `/data/mine`" in text
    # the README's summary: each encoder's score and time per dataset, the rest of the README kept
    summary = (tmp_path / "README.md").read_text(encoding="utf-8")
    assert summary.startswith("# nre_ray\n\n<!-- bench_accuracy:summary:begin -->\n| encoder |")
    assert summary.endswith("<!-- bench_accuracy:summary:end -->\nrest\n") and "old" not in summary
    assert "| encoder | FewRel: test macro-F1, then the run | DeepKE Chinese: test macro-F1, then the run |" in summary
    assert ("| `--model cnn` | 83.82: 4 epochs, 0 CPU min of training per worker; 2 min at load 2 | 94.69: 4 epochs, 0 "
            "CPU min of training per worker; 2 min at load 2 | not run |") in summary
    assert "| `--model bert` (MiniLM-L6) | not run | 99.00: 4 epochs," in summary
    # a second write replaces the section instead of appending another
    bench_accuracy.write_results(rows)
    assert (tmp_path / "results.md").read_text(encoding="utf-8") == text
    assert bench_accuracy.load_rows() == rows


def test_bench_accuracy_reads_rows_saved_before_datasets(bench_accuracy, tmp_path):
    old = {"cnn": _row("cnn", "fewrel", 0.8, None)}
    (tmp_path / "results_accuracy.json").write_text(json.dumps(old), encoding="utf-8")
    assert bench_accuracy.load_rows() == {"fewrel": old}


def test_bench_document_results_splits_redocred_by_seed(tmp_path, monkeypatch):
    """Re-DocRED's one file here is cut 80/10/10 by a seeded shuffle: disjoint, every document once, in the file's
    order within a part, the same parts for the same seed and other parts for another; a held-out document with a
    relation no training document has moves to train."""
    monkeypatch.syspath_prepend(str(SCRIPTS))
    module = importlib.import_module("bench_document_results")
    source = tmp_path / "dev_revised.json"
    source.write_text(json.dumps([{"title": f"d{i}", "sents": [["x"]], "vertexSet": [], "labels": []}
                                  for i in range(50)]), encoding="utf-8")
    rare = tmp_path / "rare.json"  # d7 alone has relation P9: wherever the cut puts it, it trains
    rare.write_text(json.dumps([{"title": f"d{i}", "sents": [["x"]], "vertexSet": [],
                                 "labels": [{"h": 0, "t": 1, "r": "P9" if i == 7 else "P1"}]} for i in range(50)]),
                    encoding="utf-8")
    for seed in range(8):
        folder = tmp_path / f"rare-{seed}"
        folder.mkdir()
        sizes = module.redocred_split(rare, folder, seed)
        train = [d["title"] for d in json.loads((folder / "train.json").read_text())]
        assert "d7" in train and sizes["train_documents"] == 40 + sizes["moved_to_train"]
        assert sizes["moved_to_train"] <= 1 and sum(v for k, v in sizes.items() if k.endswith("documents")) == 50

    def parts(seed: int) -> dict[str, list[str]]:
        folder = tmp_path / str(seed)
        folder.mkdir()
        sizes = module.redocred_split(source, folder, seed)
        assert sizes == {"moved_to_train": 0, "train_documents": 40, "dev_documents": 5, "test_documents": 5}
        return {n: [d["title"] for d in json.loads((folder / f"{n}.json").read_text())] for n in ("train", "dev",
                                                                                                    "test")}

    first = parts(0)
    titles = [t for p in first.values() for t in p]
    assert sorted(titles) == sorted(f"d{i}" for i in range(50))
    assert all(p == sorted(p, key=lambda t: int(t[1:])) for p in first.values())
    (tmp_path / "0").rename(tmp_path / "old")
    assert parts(0) == first and parts(1) != first


def test_bench_document_results_keeps_the_learning_curve(tmp_path, monkeypatch):
    """Every epoch's training loss and validation scores, read back from the run's MLflow store (a real sqlite
    store here), in the order of the epochs, whatever order they were logged in."""
    from mlflow.tracking import MlflowClient

    monkeypatch.syspath_prepend(str(SCRIPTS))
    module = importlib.import_module("bench_document_results")
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowClient(uri)
    run_id = client.create_run(client.create_experiment("curve")).info.run_id
    for epoch, f1 in ((2, 0.3), (1, 0.1), (3, 0.2)):
        client.log_metric(run_id, "epoch/valid_micro_f1", f1, step=epoch)
        client.log_metric(run_id, "epoch/train_loss", 1.0 / epoch, step=epoch)
    curve = module.learning_curve(uri, run_id)
    assert [e["epoch"] for e in curve] == [1, 2, 3]
    assert [e["valid_micro_f1"] for e in curve] == [0.1, 0.3, 0.2] and curve[1]["train_loss"] == 0.5
    assert "valid_ign_f1" not in curve[0]  # not logged: not made up

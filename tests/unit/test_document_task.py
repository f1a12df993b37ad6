"""The document task through the task interface, on a few documents of the bundled sample: the data folder it
recognises, the batches, the loss, and counts that add up exactly over shards and score as :mod:`scoring` does."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from nre_ray.config import Config, DataConfig
from nre_ray.core.user_error import ConfigError
from nre_ray.data.errors import DataError
from nre_ray.models.registry import ModelSpec
from nre_ray.run.checkpoint import CheckpointError
from nre_ray.tasks.document import prepare
from nre_ray.tasks.document.atlop import pair_mask, predict_labels
from nre_ray.tasks.document.document_task import DOCUMENT
from nre_ray.tasks.document.encoding import THRESHOLD_LABEL, build_vocab, relation_index
from nre_ray.tasks.document.readers import read_documents
from nre_ray.tasks.document.sample import write_sample
from nre_ray.tasks.document.scoring import score_documents, train_triples
from nre_ray.tasks.document.split import DocumentSplit
from nre_ray.tasks.lookup import check_checkpoint_folder, task_for, task_of
from nre_ray.tasks.sentence.task import SENTENCE

SIZES = {"train": 12, "valid": 5, "test": 5}


@pytest.fixture(scope="module")
def sample(tmp_path_factory):
    folder = tmp_path_factory.mktemp("docs")
    write_sample(folder, seed=3, sizes=SIZES)
    return folder


def _encoded(sample, split: str, pubtator: bool = False):
    train = read_documents(sample / "train.json").documents
    docs = read_documents(sample / f"{split}.json").documents
    relations = relation_index(f.relation for d in train for f in d.facts)
    vocab = build_vocab(train, 1)
    context = {"tokens": list(vocab.tokens), "lowercase": True, "relations": relations,
               "type_pairs": [("PER", "ORG")] if pubtator else None, "train": train_triples(train)}
    labels = [THRESHOLD_LABEL, *relations]
    rows = [prepare.encode_document_row(d, context) for d in docs]
    return docs, labels, vocab, DocumentSplit.from_documents(rows, len(labels), split), context


def test_the_task_is_chosen_from_the_data_folder(sample, tmp_path):
    assert task_for(str(sample)).name == "document"
    cdr = tmp_path / "cdr"
    cdr.mkdir()
    (cdr / "CDR_TrainingSet.PubTator.txt").write_text("1|t|Aspirin and pain.\n1|a|None.\n", encoding="utf-8")
    assert task_for(str(cdr)).name == "document"
    assert prepare.find_files(cdr) == {"train": cdr / "CDR_TrainingSet.PubTator.txt"}
    assert DOCUMENT.format_of(DataConfig(data_dir=str(cdr))) == "pubtator"
    assert DOCUMENT.format_of(DataConfig(data_dir=str(sample))) == "docred"
    sentences = tmp_path / "sentences"
    sentences.mkdir()
    (sentences / "train.csv").write_text("sentence,head,tail,relation\n", encoding="utf-8")
    assert task_for(str(sentences)).name == "sentence"
    assert task_for(str(tmp_path / "missing")).name == "sentence"  # its readers say what is wrong
    with pytest.raises(DataError, match="no training file of documents"):
        prepare.find_files(tmp_path)


def test_split_round_trips_through_the_cache_files(sample, tmp_path):
    _, _, _, split, _ = _encoded(sample, "valid")
    split.save(tmp_path, "valid")
    assert DOCUMENT.splits_complete(tmp_path, ["valid"]) and not DOCUMENT.splits_complete(tmp_path, ["test"])
    again = DOCUMENT.open_split(tmp_path, "valid")
    assert again.ids == split.ids and len(again) == SIZES["valid"]
    for k in split.arrays:
        np.testing.assert_array_equal(again.arrays[k], split.arrays[k])


def test_batches_loss_and_exact_counts_over_shards(sample, tmp_path):
    docs, labels, vocab, split, _ = _encoded(sample, "valid")
    dataset = DOCUMENT.dataset(split)
    batch = dataset.__getitems__(list(range(len(split))))
    b, p, c = batch["labels"].shape
    assert (b, c) == (len(split), len(labels)) and batch["pairs"].shape == (b, p, 2)
    assert batch["input_ids"].shape == batch["mask"].shape and batch["mention_pos"].shape[0] == b
    # every fact of the documents is a label on a candidate pair (every ordered pair here) or counted as uncovered
    facts = sum(len(d.facts) for d in docs)
    assert int(batch["labels"][pair_mask(batch["pairs"])][:, 1:].sum()) + int(batch["uncovered"][:, 0].sum()) \
        == facts

    cfg = Config.from_dict({"model": {"model": "transformer", "hidden_size": 32, "num_layers": 1}})
    torch.manual_seed(0)
    model = DOCUMENT.build_model(cfg.model, ModelSpec(len(vocab), len(labels), 0)).eval()
    with torch.no_grad():
        output = model(batch)  # (B, P, C)
        mean, total = DOCUMENT.loss(output, batch), DOCUMENT.loss(output, batch, reduction="sum")
    assert DOCUMENT.examples(batch) == b and torch.isfinite(mean)
    assert torch.allclose(total, mean * b)
    # scored on outputs that get some facts right, miss some and add some: every kind of count is non-zero
    generator = torch.Generator().manual_seed(5)
    output = torch.randn(output.shape, generator=generator) - 1.5  # (B, P, C)
    output[..., 0] = 0.0  # TH
    output += 3.0 * (batch["labels"] > 0.5) * (torch.rand(output.shape, generator=generator) < 0.7)

    whole = DOCUMENT.new_counts(labels, len(split), torch.device("cpu"))
    DOCUMENT.count(whole, output, batch)
    shards = DOCUMENT.new_counts(labels, len(split), torch.device("cpu"))
    for rank in range(3):  # a 3-worker shard each, batches of 1 or 2 documents, summed in any order
        indices = list(range(rank, len(split), 3))
        for part in (indices[:1], indices[1:]):
            if part:
                one = dataset.__getitems__(part)
                rows = torch.as_tensor(part)
                DOCUMENT.count(shards, output[rows][:, :one["pairs"].shape[1]], one)
    assert torch.equal(shards, whole) and shards.dtype == torch.int64
    tp, predicted, gold, in_train, intra_tp = whole[:5, 1:].sum(dim=1).tolist()
    assert 0 < tp < predicted and tp < gold and 0 < in_train < tp and 0 < intra_tp < tp, whole

    # the scores of the counts are scoring.py's on the same predictions
    keep = pair_mask(batch["pairs"])
    predictions = {}
    for k, doc in enumerate(docs):
        predicted = predict_labels(output[k][keep[k]])
        predictions[doc.id] = {(doc.entities[int(h)].id, doc.entities[int(t)].id, labels[r])
                               for (h, t), row in zip(batch["pairs"][k][keep[k]].tolist(), predicted, strict=True)
                               for r in torch.nonzero(row).flatten().tolist() if r > 0}
    reference = score_documents(docs, predictions, train_triples(read_documents(sample / "train.json").documents))
    scores = DOCUMENT.scores(whole, labels, None)
    summary = reference.summary()
    for mine, theirs in (("micro_f1", "f1"), ("micro_precision", "precision"), ("micro_recall", "recall"),
                         ("ign_f1", "ign_f1"), ("intra_f1", "intra_f1"), ("inter_f1", "inter_f1")):
        assert scores[mine] == pytest.approx(summary[theirs], abs=1e-12), mine
    assert set(scores) == set(DOCUMENT.metric_names(labels, None))
    DOCUMENT.write_reports(whole, labels, tmp_path, "valid", "valid")
    assert (tmp_path / "valid_per_relation.csv").is_file()
    assert "| label | precision |" in (tmp_path / "valid_per_relation.md").read_text(encoding="utf-8")
    per = {row["label"]: row for row in DOCUMENT.per_label(whole, labels)}
    for row in reference.relation_report():
        assert (per[row["relation"]]["tp"], per[row["relation"]]["gold"]) == (row["tp"], row["gold"])


def test_hand_counted_scores():
    # columns: TH, r1, r2; rows: tp, predicted, gold, tp in train, intra tp, intra predicted, intra gold
    counts = np.array([[0, 2, 1], [0, 4, 1], [0, 3, 3], [0, 1, 0], [0, 2, 0], [0, 2, 0], [0, 2, 1]])
    s = DOCUMENT.scores(counts, ["TH", "r1", "r2"], None)
    p, r = 3 / 5, 3 / 6
    assert s["micro_f1"] == pytest.approx(2 * p * r / (p + r))
    assert s["ign_precision"] == pytest.approx(2 / 4)
    assert s["intra_f1"] == pytest.approx(2 * 1 * (2 / 3) / (1 + 2 / 3))
    assert s["inter_f1"] == pytest.approx(2 * (1 / 3) * (1 / 3) / (2 / 3))


def test_type_pairs_restrict_the_candidates(sample):
    _, _, _, every, _ = _encoded(sample, "valid")
    _, _, _, typed, _ = _encoded(sample, "valid", pubtator=True)
    assert 0 < len(typed.arrays["pairs"]) < len(every.arrays["pairs"])
    assert typed.arrays["uncovered"].sum() > 0  # facts on other type pairs can never be predicted


def test_settings_and_commands_refused_in_one_line(tmp_path):
    with pytest.raises(ConfigError, match="document models take --model transformer"):
        DOCUMENT.check_settings(Config.from_dict({}))
    DOCUMENT.check_settings(Config.from_dict({"model": {"model": "transformer"}}))
    with pytest.raises(ConfigError, match="elastic runs on documents are not supported yet"):
        DOCUMENT.check_settings(Config.from_dict({"model": {"model": "transformer"}, "train": {"num_workers": "1-2"}}))
    assert DOCUMENT.default_metric(None) == "micro_f1" and DOCUMENT.unsupported("train") is None
    assert DOCUMENT.why_no_metric("accuracy", ["TH", "P17"], None) == "document models report other scores"
    assert SENTENCE.why_no_metric("ign_f1", ["a", "b"], None) == "sentence models report other scores"
    assert SENTENCE.why_no_metric("pos_macro_f1", ["a", "b"], "Other") \
        == "--negative-label 'Other' is not one of the labels"
    with pytest.raises(CheckpointError, match=r"^document models: predict is not supported yet \(issue 37\)$"):
        task_of({"task": "document"}, "predict")
    assert task_of({"task": "document"}).name == "document" and task_of({}, "predict").name == "sentence"
    (tmp_path / "meta.json").write_text(json.dumps({"task": "document"}), encoding="utf-8")
    with pytest.raises(CheckpointError, match="serve is not supported yet"):
        check_checkpoint_folder(tmp_path, "serve")
    check_checkpoint_folder(tmp_path / "none", "serve")  # no meta.json: the loader says what is wrong


def test_data_inspect_refuses_a_document_folder(sample, capsys):
    from nre_ray.data.__main__ import main

    assert main(["inspect", "--data-dir", str(sample)]) == 2
    assert capsys.readouterr().err == "error: document models: inspect is not supported yet (issue 37)\n"


def test_bad_documents_are_an_error_or_skipped_and_listed(sample, tmp_path):
    docs = json.loads((sample / "train.json").read_text(encoding="utf-8"))
    docs[2]["vertexSet"][0][0]["pos"] = [0, 99]  # outside its sentence
    (tmp_path / "train.json").write_text(json.dumps(docs), encoding="utf-8")
    (tmp_path / "dev.json").write_bytes((sample / "valid.json").read_bytes())
    files = prepare.find_files(tmp_path)
    assert set(files) == {"train", "valid"}
    with pytest.raises(DataError, match=r"document 2 .*pos \[0, 99\] is outside sentence"):
        prepare.read_files(files, DataConfig())
    read, problems = prepare.read_files(files, DataConfig(on_bad_rows="skip"))
    assert len(read["train"].documents) == SIZES["train"] - 1 and len(problems) == 1


def test_validation_drawn_from_train_keeps_the_training_file_relations(sample, tmp_path):
    docs = json.loads((sample / "train.json").read_text(encoding="utf-8"))
    docs[0]["labels"].append({"h": 0, "t": 1, "r": "rare", "evidence": []})  # a relation of one document
    (tmp_path / "train.json").write_text(json.dumps(docs), encoding="utf-8")
    read, _ = prepare.read_files(prepare.find_files(tmp_path), DataConfig())
    for seed in range(8):  # whichever side the document lands on, every fact has a label column
        documents, relations, drawn = prepare.split_documents(read, 0.25, seed)
        assert drawn and "rare" in relations and len(documents["valid"]) == 3
        assert len(documents["train"]) + len(documents["valid"]) == SIZES["train"]
        assert {f.relation for ds in documents.values() for d in ds for f in d.facts} <= set(relations)


def test_document_settings_key_the_cache():
    a = prepare.settings_of(DataConfig(), 1)
    assert a["task"] == "document" and prepare.settings_of(DataConfig(min_freq=1), 1) != a

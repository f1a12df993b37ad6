"""The document task through the task interface, on a few documents of the bundled sample: the data folder it
recognises, the batches, the loss, and counts that add up exactly over shards and score as :mod:`scoring` does."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
import torch

from nre_ray.config import Config, DataConfig
from nre_ray.core.user_error import ConfigError
from nre_ray.data.chunks import canonical_part
from nre_ray.data.errors import DataError
from nre_ray.inference.predictor import Predictor
from nre_ray.models.registry import ModelSpec
from nre_ray.run.checkpoint import CheckpointError, load_checkpoint, save_checkpoint
from nre_ray.tasks.document import fact_rows, prepare
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
    DOCUMENT.check_settings(Config.from_dict({"model": {"model": "bert", "pretrained": "bert-base-cased"}}))
    DOCUMENT.check_settings(Config.from_dict({"model": {"model": "transformer"}, "train": {"num_workers": "1-2"}}))
    assert DOCUMENT.default_metric(None) == "micro_f1" and DOCUMENT.unsupported("train") is None
    assert DOCUMENT.why_no_metric("accuracy", ["TH", "P17"], None) == "document models report other scores"
    assert SENTENCE.why_no_metric("ign_f1", ["a", "b"], None) == "sentence models report other scores"
    assert SENTENCE.why_no_metric("pos_macro_f1", ["a", "b"], "Other") \
        == "--negative-label 'Other' is not one of the labels"
    for command in ("evaluate", "predict", "serve", "pyfunc", "inspect", "tune"):  # every command takes documents
        assert task_of({"task": "document"}, command).name == "document"
    assert task_of({"task": "document"}).name == "document" and task_of({}, "predict").name == "sentence"
    (tmp_path / "meta.json").write_text(json.dumps({"task": "bag"}), encoding="utf-8")
    check_checkpoint_folder(tmp_path, "inspect")  # every command takes bags and documents now; the refusal stays
    with pytest.raises(CheckpointError, match=r"^bag models: distill is not supported yet \(issue 38\)$"):
        check_checkpoint_folder(tmp_path, "distill")
    (tmp_path / "meta.json").write_text(json.dumps({"task": "document"}), encoding="utf-8")
    check_checkpoint_folder(tmp_path, "tune")
    check_checkpoint_folder(tmp_path, "serve")
    check_checkpoint_folder(tmp_path / "none", "serve")  # no meta.json: the loader says what is wrong


def test_the_audit_describes_documents(sample):
    docs = {s: read_documents(sample / f"{s}.json").documents for s in ("train", "test")}
    splits = {s: _encoded(sample, s)[3] for s in docs}
    labels = _encoded(sample, "test")[1]
    audit = prepare.audit_of(docs, labels, splits, 2)
    test = audit["splits"]["test"]
    assert test["rows"] == SIZES["test"] and audit["splits"]["train"]["rejected"] == 2
    assert test["mentions"] == sum(len(e.mentions) for d in docs["test"] for e in d.entities) > test["entities"]
    assert test["candidate_pairs"] == len(splits["test"].arrays["pairs"])
    assert test["facts"] == sum(test["labels"].values()) == sum(len(d.facts) for d in docs["test"])
    # encoded tokens: the words and two markers per mention
    assert test["tokens"]["max"] == max(d.num_tokens + 2 * sum(len(e.mentions) for e in d.entities)
                                        for d in docs["test"])
    assert audit["window"] == 512 and test["longer_than_window"] == 0
    text = DOCUMENT.audit_markdown(audit)
    assert "| test | 5 | 0 |" in text and "longer than 512 (read in windows)" in text
    assert "## Facts per relation" in text and f"| works_for | {audit['splits']['train']['labels']['works_for']}" \
        in text


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


def _checkpoint(sample, folder, bias: float = 0.0):
    """A document checkpoint of an untrained model on the sample's training split (what training writes), its
    relation columns' bias raised by ``bias`` so that it predicts some facts; and the test split as training
    encoded it."""
    docs, labels, vocab, split, context = _encoded(sample, "test")
    cfg = Config.from_dict({"model": {"model": "transformer", "hidden_size": 32, "num_layers": 1}})
    torch.manual_seed(0)
    model = DOCUMENT.build_model(cfg.model, ModelSpec(len(vocab), len(labels), 0))
    with torch.no_grad():
        model.head.bilinear.bias[1:] += bias
    meta = {"task": "document", "model": "transformer", "epoch": 1, "vocab_size": len(vocab),
            "num_classes": len(labels), "num_positions": 0}
    save_checkpoint(folder, {"model": model.state_dict(), "epoch": 1}, cfg, vocab, labels, meta,
                    {prepare.CONTEXT_ASSET: prepare.context_asset(context)})
    return load_checkpoint(folder), docs, split


def test_a_checkpoint_encodes_a_file_as_training_did(sample, tmp_path):
    loaded, _, split = _checkpoint(sample, tmp_path / "ckpt")
    assert set(loaded.assets) == {prepare.CONTEXT_ASSET}
    again, skipped = DOCUMENT.encode_file(str(sample / "test.json"), loaded.config.data, loaded.vocab,
                                          loaded.labels, loaded.assets)
    assert skipped == 0 and again.ids == split.ids
    for k in split.arrays:  # the same candidate pairs, facts, "seen in training" and intra flags
        np.testing.assert_array_equal(again.arrays[k], split.arrays[k])
    with pytest.raises(ConfigError, match="--format and --columns do not apply to documents"):
        DOCUMENT.encode_file(str(sample / "test.json"), loaded.config.data, loaded.vocab, loaded.labels,
                             loaded.assets, fmt="csv")
    with pytest.raises(CheckpointError, match=r"lacks task/context\.json .* train it again"):
        DOCUMENT.encode_file(str(sample / "test.json"), loaded.config.data, loaded.vocab, loaded.labels, {})
    # a relation the checkpoint does not know: an error naming the file and the document, or skipped
    docs = json.loads((sample / "test.json").read_text(encoding="utf-8"))
    docs[1]["labels"][0]["r"] = "spouse_of"
    (tmp_path / "test.json").write_text(json.dumps(docs), encoding="utf-8")
    with pytest.raises(DataError, match=r"test.json.*document 1 .*relation 'spouse_of' is not one of"):
        DOCUMENT.encode_file(str(tmp_path / "test.json"), loaded.config.data, loaded.vocab, loaded.labels,
                             loaded.assets)
    part, skipped = DOCUMENT.encode_file(str(tmp_path / "test.json"), loaded.config.data, loaded.vocab,
                                         loaded.labels, loaded.assets, on_bad_rows="skip")
    assert skipped == 1 and len(part) == len(split) - 1


def test_predicted_facts_are_the_counted_predictions(sample, tmp_path):
    loaded, docs, split = _checkpoint(sample, tmp_path / "ckpt", bias=0.3)
    predictor = Predictor.from_loaded(loaded, batch_size=2)
    plan = DOCUMENT.plan_input(str(sample / "test.json"), None, None, chunk_rows=2)
    assert plan.total_rows == len(docs) and [c.rows for c in plan.chunks] == [2, 2, 1]
    rows = pd.concat([predictor.predict_rows(canonical_part(plan.read(i))) for i in range(len(plan.chunks))],
                     ignore_index=True)
    assert list(rows.columns) == ["document", "facts", "problem"] and (rows["problem"] == "").all()
    assert rows["document"].tolist() == [d.id for d in docs]
    facts = DOCUMENT.answer(rows)
    assert list(facts.columns) == DOCUMENT.answer_columns() == list(fact_rows.ANSWER_COLUMNS)
    # as many facts as the counts call predicted, each above the threshold, on entities of its document
    batch = DOCUMENT.dataset(split).__getitems__(list(range(len(split))))
    counts = DOCUMENT.new_counts(loaded.labels, len(split), torch.device("cpu"))
    with torch.no_grad():
        DOCUMENT.count(counts, predictor.model(batch), batch)
    assert 0 < len(facts) == int(counts[1, 1:].sum())
    assert (facts["score"] > 0.5).all() and set(facts["relation"]) <= set(loaded.labels[1:])
    names = {d.id: {e.id: e.mentions[0].text for e in d.entities} for d in docs}
    assert all(names[r.document][r.head] == r.head_name and names[r.document][r.tail] == r.tail_name
               for r in facts.itertuples())
    # the same documents as request rows (DocRED's fields, JSON values or their text) give the same facts
    items = json.loads((sample / "test.json").read_text(encoding="utf-8"))
    request = pd.DataFrame([{"title": d["title"], "sents": d["sents"], "vertexSet": json.dumps(d["vertexSet"])}
                            for d in items])
    answered = predictor.predict_frame(request)
    pd.testing.assert_frame_equal(DOCUMENT.answer(answered), facts)
    assert DOCUMENT.answer(predictor.predict_frame(request, top_k=1)).groupby(["document", "head", "tail"]).size() \
        .max() == 1


def test_bad_documents_in_requests_and_files(sample, tmp_path):
    loaded, _, _ = _checkpoint(sample, tmp_path / "ckpt")
    predictor = Predictor.from_loaded(loaded)
    items = json.loads((sample / "test.json").read_text(encoding="utf-8"))[:2]
    items[1]["vertexSet"][0][0]["sent_id"] = 99
    request = pd.DataFrame([{c: d[c] for c in fact_rows.INPUT_COLUMNS} for d in items])
    rows = predictor.predict_rows(request)
    assert rows["problem"][0] == "" and "sent_id" in rows["problem"][1]
    with pytest.raises(DataError, match="row 2"):
        predictor.predict_frame(request)
    assert len(predictor.predict_frame(request, on_bad_rows="skip")) == 1
    (tmp_path / "test.json").write_text(json.dumps(items), encoding="utf-8")
    frame = DOCUMENT.plan_input(str(tmp_path / "test.json"), None, None, 10).read(0)
    assert frame["_nre_problem"].tolist()[0] == "" and "sent_id" in frame["_nre_problem"].tolist()[1]


def test_requests_in_the_task_s_own_form(sample):
    items = json.loads((sample / "test.json").read_text(encoding="utf-8"))[:2]
    one = {c: items[0][c] for c in ("title", "sents", "vertexSet")}
    assert DOCUMENT.parse_request(one)["title"].tolist() == [items[0]["title"]]
    assert len(DOCUMENT.parse_request(items)) == 2 and len(DOCUMENT.parse_request({"documents": items})) == 2
    assert DOCUMENT.parse_request({"dataframe_records": [one]}) is None and DOCUMENT.parse_request([1]) is None
    signature = DOCUMENT.pyfunc_signature()
    assert signature.inputs.input_names() == list(fact_rows.INPUT_COLUMNS)
    assert signature.outputs.input_names() == list(fact_rows.ANSWER_COLUMNS)
    assert list(DOCUMENT.pyfunc_example(None).columns) == list(fact_rows.INPUT_COLUMNS)


def test_the_default_model_follows_the_data(sample, tmp_path):
    from nre_ray.config import config_from_args
    from nre_ray.train import cli_parser, task_model

    def config(*argv: str) -> Config:
        return config_from_args(cli_parser().parse_args(list(argv)), default_model=task_model)

    bare = config("--data-dir", str(sample))
    assert bare.model.model == "transformer" and bare.model.hidden_size == 256  # the transformer's own defaults
    DOCUMENT.check_settings(bare)
    with pytest.raises(ConfigError, match="--model cnn: document models take --model transformer"):
        DOCUMENT.check_settings(config("--data-dir", str(sample), "--model", "cnn"))  # given: kept, and refused
    (tmp_path / "train.csv").write_text("sentence,head,tail,relation\n", encoding="utf-8")
    assert config("--data-dir", str(tmp_path)).model.model == config().model.model == "cnn"


def test_an_elastic_step_over_documents_is_the_same_update_at_every_world_size(sample):
    """An elastic run's step (nre_ray.run.elastic: the step's documents shared among the ranks, each document's loss
    divided by the step's document count, the gradients summed over the ranks) gives the same gradients at 1, 2 and
    3 simulated ranks (dropout off: eval mode, whose logits are the training ones without it)."""
    from tests.helpers import elastic_step_gradients

    _, labels, vocab, split, _ = _encoded(sample, "train")
    dataset = DOCUMENT.dataset(split)
    cfg = Config.from_dict({"model": {"model": "transformer", "hidden_size": 32, "num_layers": 1}})

    def gradients(world: int) -> list[torch.Tensor]:
        return elastic_step_gradients(
            DOCUMENT, lambda: DOCUMENT.build_model(cfg.model, ModelSpec(len(vocab), len(labels), 0)).eval(), dataset,
            world, step=0, batch=9, micro=2, seed=5)

    fixed = gradients(3)
    assert any(g.abs().sum() > 0 for g in fixed)
    for world in (1, 2):
        for mine, theirs in zip(gradients(world), fixed, strict=True):
            torch.testing.assert_close(mine, theirs, rtol=1e-4, atol=1e-6)

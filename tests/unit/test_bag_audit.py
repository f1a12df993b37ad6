"""The bag data audit (``python -m nre_ray.data inspect --bag-aggregator``) on tiny hand-made bag files, built by the
preprocessing's own batch functions run as plain pandas (read, key, group and cap, encode: what Ray Data runs), with
every figure counted by hand: bags and sentences, bag sizes, what --max-bag-size leaves out, multi-label and NA bags,
facts, sentence lengths against --max-length, bags keyed by ids or by text, pairs shared between splits."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from nre_ray.config import DataConfig
from nre_ray.data.vocab import Vocab
from nre_ray.tasks.bag import grouping
from nre_ray.tasks.bag.bag_audit import SentenceLengths, audit_markdown, audit_of
from nre_ray.tasks.bag.bag_split import BagSplit
from nre_ray.tasks.bag.bag_task import BAG
from nre_ray.tasks.bag.bags import NA

SEED = 3


def _line(ids: str, head: str, tail: str, relation: str, sentence: str) -> str:
    head_id, tail_id = ids.split()
    return "\t".join([head_id, tail_id, head, tail, relation, sentence + " ###END###"]) + "\n"


# Tokens per sentence: its words (the regex tokenizer splits on spaces here) and the 4 entity markers.
TRAIN = [  # 10 sentences, 4 bags
    _line("/m/a1 /m/b1", "Ann", "Paris", "born_in", "Ann was born in Paris ."),  # 10 tokens
    _line("/m/a1 /m/b1", "Ann", "Paris", "born_in", "Ann left Paris ."),  # 8
    _line("/m/a1 /m/b1", "Ann", "Paris", NA, "Ann saw Paris ."),  # 8: NA beside born_in is dropped
    _line("/m/a2 /m/b2", "Bob", "Rome", "born_in", "Bob was born in Rome ."),  # 10
    _line("/m/a2 /m/b2", "Bob", "Rome", "lives_in", "Bob lives in Rome ."),  # 9: a bag with two relations
    _line("/m/a3 /m/b3", "Cy", "Oslo", NA, "Cy flew over Oslo once ."),  # 10: the NA bag, one sentence
    _line("/m/a4 /m/b4", "Di", "Kyiv", "lives_in", "Di lives in Kyiv ."),  # 9
    _line("/m/a4 /m/b4", "Di", "Kyiv", "lives_in", "Di still lives in Kyiv ."),  # 10
    _line("/m/a4 /m/b4", "Di", "Kyiv", "lives_in",
          "Di has lived in Kyiv for many years now , says everyone who knows her well ."),  # 17 words: 21
    _line("/m/a4 /m/b4", "Di", "Kyiv", "lives_in", "Di and Kyiv ."),  # 8
]
VALID = [
    _line("/m/a2 /m/b2", "Bob", "Rome", "lives_in", "Bob moved to Rome ."),  # Bob/Rome: a training pair
    _line("/m/a6 /m/b6", "Fay", "Bonn", "born_in", "Fay was born in Bonn ."),
]
TEST = [
    _line("/m/a1 /m/b1", "Ann", "Paris", "born_in", "Ann grew up in Paris ."),  # Ann/Paris: a training pair
    _line("/m/a5 /m/b5", "Eve", "Lima", NA, "Eve visited Lima ."),
    _line("/m/a5 /m/b5", "Eve", "Lima", NA, "Eve liked Lima ."),
    _line("/m/a6 /m/b6", "Fay", "Bonn", "born_in", "Fay was born in Bonn today ."),  # Fay/Bonn: a validation pair
]


def _write(folder: Path, files: dict[str, list[str]], suffix: str = ".tsv") -> dict[str, Path]:
    folder.mkdir(parents=True, exist_ok=True)
    paths = {}
    for split, lines in files.items():
        paths[split] = folder / f"{split}{suffix}"
        paths[split].write_text("".join(lines), encoding="utf-8")
    return paths


def _audit(paths: dict[str, Path], fmt: str, max_bag_size: int, max_length: int) -> dict:
    """The files' audit as the preprocessing makes it: each file read, keyed, grouped into capped bags, encoded with
    the training bags' labels and vocabulary, written into BagSplits, the lengths streamed into SentenceLengths."""
    bags = {}
    for split, path in paths.items():
        item = pd.DataFrame({"split": [split], "path": [str(path)], "format": [fmt]})
        rows = pd.concat(list(grouping.read_split_file(item, None)), ignore_index=True)
        assert (rows["problem"] == "").all(), rows["problem"].tolist()
        keyed = grouping.keyed_good_rows(rows)
        bags[split] = pd.concat([grouping.bags_of_group(group, max_bag_size, SEED, NA)
                                 for _, group in keyed.groupby(["split", "bag"], sort=True)], ignore_index=True)
    stats = grouping.bag_stats(bags["train"], "regex", True, True, True)
    tokens = stats[stats["kind"] == "token"]
    vocab = Vocab.build(dict(zip(tokens["name"], tokens["count"], strict=True)), 1)
    labels = grouping.labels_of(sorted(stats.loc[stats["kind"] == "label", "name"]), {}, NA)
    settings = {"tokenizer": "regex", "lowercase": True, "markers": True, "typed": True, "max_length": max_length,
                "window": 20}
    lengths, splits = SentenceLengths(), {}
    for split, frame in bags.items():
        encoded = grouping.encode_bags(frame, vocab.tokens, labels, settings)
        lengths.add(encoded)
        writer = BagSplit.Writer(len(labels), 20)
        for row in encoded.itertuples(index=False):
            writer.add(row)
        splits[split] = writer.finish(split)
    return audit_of(splits, labels, NA, lengths, max_length, max_bag_size, {"test": 2}, {})


def test_the_audit_of_hand_made_nyt10_files(tmp_path: Path) -> None:
    paths = _write(tmp_path, {"train": TRAIN, "valid": VALID, "test": TEST})
    audit = _audit(paths, "nyt10", max_bag_size=100, max_length=12)
    assert audit["labels"] == [NA, "born_in", "lives_in"] and audit["max_bag_size"] == 100
    train, valid, test = (audit["splits"][s] for s in ("train", "valid", "test"))
    assert train == {
        "bags": 4, "rejected": 0, "rejected_bags": 0, "sentences": 10, "kept_sentences": 10,
        "bags_by_ids": 4, "bags_by_text": 0,
        "bag_size": {"mean": 2.5, "min": 1, "p50": 3, "p90": 4, "max": 4},  # sizes 3, 2, 1, 4
        "single_sentence_bags": 1, "capped_bags": 0, "capped_sentences": 0, "unencoded_sentences": 0,
        "multi_label_bags": 1, "na_bags": 1, "facts": 4,  # Ann born_in, Bob born_in + lives_in, Di lives_in
        "labels": {NA: 1, "born_in": 2, "lives_in": 2},
        # tokens 10 8 8 10 9 10 9 10 21 8: sorted 8 8 8 9 9 10 10 10 10 21
        "length": {"mean": 10.3, "p50": 10, "p90": 21, "p95": 21, "p99": 21, "max": 21}, "truncated": 1}
    assert (valid["bags"], valid["sentences"], valid["shared_with_train"], valid["facts"]) == (2, 2, 1, 2)
    assert "shared_with_valid" not in valid
    assert (test["bags"], test["sentences"], test["rejected"], test["na_bags"], test["facts"]) == (3, 4, 2, 1, 2)
    assert (test["shared_with_train"], test["shared_with_valid"], test["single_sentence_bags"]) == (1, 1, 2)
    assert test["bag_size"] == {"mean": 1.3, "min": 1, "p50": 1, "p90": 2, "max": 2}
    assert test["length"]["max"] == 11 and test["truncated"] == 0  # "Fay was born in Bonn today ." is 11 tokens
    assert audit["warnings"] == [
        "train/test overlap: 1 of 3 test bags (33.3%) are entity pairs that also have a training bag; distant "
        "supervision labels the pair, so the model was trained on their relations and test scores are optimistic",
        "train/valid overlap: 1 of 2 valid bags (50.0%) are entity pairs that also have a training bag; distant "
        "supervision labels the pair, so the model was trained on their relations and valid scores are optimistic",
        "1 label with training bags has no validation bags: NA",
        "1 label with training bags has no test bags: lives_in",
        "3 labels with fewer than 5 training bags: NA (1), born_in (2), lives_in (2)"]
    assert json.loads(json.dumps(audit)) == audit  # what --json writes

    markdown = audit_markdown(audit)
    assert markdown.startswith("# Data audit (bags)\n\n## Warnings\n\n- train/test overlap: 1 of 3 test bags")
    assert "| train | 10 | 4 | 4 | 0 | 0 | 0 | 1 | 1 (25.0%) | 4 |" in markdown
    assert "| test | 4 | 3 | 3 | 0 | 2 | 0 | 0 | 1 (33.3%) | 2 |" in markdown
    assert "| train | 2.5 | 1 | 3 | 4 | 4 | 1 (25.0%) | 0 | 0 (0.0%) |" in markdown
    assert "| train | 10.3 | 10 | 21 | 21 | 21 | 21 | 1 |" in markdown and "longer than 12 tokens" in markdown
    assert "| test | 3 | 1 | 1 |" in markdown and "| valid | 2 | 1 |  |" in markdown
    assert "| lives_in | 2 | 1 | 0 |" in markdown


def test_the_size_cap_is_counted_as_training_applies_it(tmp_path: Path) -> None:
    paths = _write(tmp_path, {"train": TRAIN})
    audit = _audit(paths, "nyt10", max_bag_size=2, max_length=12)
    train = audit["splits"]["train"]
    # Ann's 3 sentences keep 2, Di's 4 keep 2: 2 bags over the cap, 3 sentences left out; the labels count them all
    assert (train["sentences"], train["kept_sentences"]) == (10, 7)
    assert (train["capped_bags"], train["capped_sentences"]) == (2, 3)
    assert train["bag_size"]["max"] == 4 and train["labels"] == {NA: 1, "born_in": 2, "lives_in": 2}
    assert train["length"]["max"] <= 21 and train["truncated"] <= 1  # the lengths of the 7 sentences kept
    assert "| train | 2.5 | 1 | 3 | 4 | 4 | 1 (25.0%) | 2 | 3 (30.0%) |" in audit_markdown(audit)
    assert "--max-bag-size 2: a bag keeps at most 2 sentences" in audit_markdown(audit)


def test_bags_keyed_by_ids_and_by_text(tmp_path: Path) -> None:
    header = "sentence,head,head_offset,tail,tail_offset,relation,head_id,tail_id\n"
    train = [header, "Ann met Bob .,Ann,0,Bob,8,knows,/p/1,/p/2\n", "Ann and Bob .,Ann,0,Bob,8,knows,/p/1,/p/2\n",
             "Ann met Bob .,Ann,0,Bob,8,knows,,\n",  # no ids: the (Ann, Bob) text pair, another bag
             "Cy met Di .,Cy,0,Di,7,NA,,\n"]
    test = [header, "Ann saw Bob .,Ann,0,Bob,8,knows,,\n", "Cy saw Di .,Cy,0,Di,7,knows,/p/3,/p/4\n"]
    paths = _write(tmp_path, {"train": train, "test": test}, ".csv")
    audit = _audit(paths, "csv", max_bag_size=100, max_length=128)
    train_info, test_info = audit["splits"]["train"], audit["splits"]["test"]
    assert (train_info["bags"], train_info["bags_by_ids"], train_info["bags_by_text"]) == (3, 1, 2)
    assert (train_info["sentences"], train_info["na_bags"], train_info["facts"]) == (4, 1, 2)
    # (Ann, Bob) by text is a training bag; (Cy, Di) by ids is not the training bag (Cy, Di) by text
    assert (test_info["bags_by_ids"], test_info["bags_by_text"], test_info["shared_with_train"]) == (1, 1, 1)


def test_inspect_finds_the_bag_cache_without_ray(tmp_path: Path) -> None:
    paths = _write(tmp_path / "data", {"train": TRAIN, "test": TEST})
    cfg = DataConfig(data_dir=str(tmp_path / "data"), cache_dir=str(tmp_path / "cache"))
    assert not BAG.is_cached(cfg, SEED)
    folder = grouping.cache_folder(cfg, grouping.find_bag_files(cfg), SEED)
    folder.mkdir(parents=True)
    (folder / grouping.MARKER).write_text(json.dumps({"task": "bag"}), encoding="utf-8")
    assert BAG.is_cached(cfg, SEED) and not BAG.is_cached(cfg, SEED + 1)
    assert not BAG.is_cached(DataConfig(data_dir=cfg.data_dir, cache_dir=cfg.cache_dir, no_cache=True), SEED)
    assert not BAG.is_cached(DataConfig(data_dir=cfg.data_dir, cache_dir=cfg.cache_dir, max_bag_size=5), SEED)
    assert BAG.unsupported("inspect") is None and paths["train"].is_file()


@pytest.mark.parametrize("flags", [[], ["--bag-aggregator", "avg"]])
def test_inspect_without_a_training_file_stops_before_ray(tmp_path: Path, flags: list[str],
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    from nre_ray.data.__main__ import main

    _write(tmp_path / "gids", {"dev": VALID, "test": TEST})
    assert main(["inspect", "--data-dir", str(tmp_path / "gids"), "--cache-dir", str(tmp_path / "c"), *flags]) == 2
    assert "no training file" in capsys.readouterr().err

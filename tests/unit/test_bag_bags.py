"""Bag building: ids against text pairs, multi-label pairs with NA, the seeded size cap, bags split across files, and
shards balanced by sentences."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from nre_ray.tasks.bag import bags
from nre_ray.tasks.bag.bags import BAG_COLUMNS, bag_labels, balance_shards, build_bags, merge_bags


def rows(spec: list[tuple[str, str, str, str, str]], file: str = "a.tsv") -> pd.DataFrame:
    """Read-like rows from (head_id, tail_id, head, tail, relation); sentences numbered by line."""
    return pd.DataFrame({
        "sentence": [f"{h} and {t} in sentence {i}" for i, (_, _, h, t, _) in enumerate(spec, start=1)],
        "head": [s[2] for s in spec], "head_offset": ["0"] * len(spec), "tail": [s[3] for s in spec],
        "tail_offset": [str(len(s[2]) + 5) for s in spec], "relation": [s[4] for s in spec],
        "head_id": [s[0] for s in spec], "tail_id": [s[1] for s in spec],
        "file": [file] * len(spec), "line": list(range(1, len(spec) + 1)),
    })


def test_ids_against_text_pairs() -> None:
    frame = rows([("/m/1", "/m/2", "Obama", "Hawaii", "born"),
                  ("/m/1", "/m/2", "Barack_Obama", "Hawaii", "NA"),  # same ids, other text: same bag
                  ("/m/9", "/m/2", "Obama", "Hawaii", "NA"),  # other ids, same text: another bag
                  ("", "", "Obama", "Hawaii", "NA"),  # no ids: keyed by text
                  ("", "", "Obama", "Hawaii", "lived"),
                  ("/m/1", "", "Obama", "Hawaii", "NA")])  # one id only: text too
    built = build_bags(frame)
    assert list(built.columns) == list(BAG_COLUMNS)
    by_key = {k: r for k, r in zip(built["bag"], built.to_dict("records"), strict=True)}
    assert sorted(by_key) == ["id\x1f/m/1\x1f/m/2", "id\x1f/m/9\x1f/m/2", "text\x1fObama\x1fHawaii"]
    ids_bag = by_key["id\x1f/m/1\x1f/m/2"]
    assert ids_bag["labels"] == ("born",) and ids_bag["total"] == 2 and ids_bag["size"] == 2
    assert (ids_bag["head_id"], ids_bag["tail_id"]) == ("/m/1", "/m/2")
    text_bag = by_key["text\x1fObama\x1fHawaii"]
    assert text_bag["labels"] == ("lived",) and text_bag["total"] == 3 and text_bag["head_id"] == ""
    no_ids = build_bags(frame.drop(columns=["head_id", "tail_id"]))
    assert no_ids["bag"].tolist() == ["text\x1fBarack_Obama\x1fHawaii", "text\x1fObama\x1fHawaii"]


def test_multi_label_and_na() -> None:
    assert bag_labels(["NA", "NA"]) == ("NA",)
    assert bag_labels(["NA", "/b", "/a", "/b"]) == ("/a", "/b")  # NA plus relations: the relations
    assert bag_labels(["none"], na="none") == ("none",) and bag_labels([]) == ()
    frame = rows([("/m/1", "/m/2", "A", "B", relation) for relation in ("/r2", "NA", "/r1")])
    assert build_bags(frame)["labels"].tolist() == [("/r1", "/r2")]


def test_size_cap_is_seeded_order_free_and_counts_every_label() -> None:
    spec = [("/m/1", "/m/2", "A", "B", "NA")] * 40 + [("/m/1", "/m/2", "A", "B", "/r")]
    frame = rows(spec)
    capped = build_bags(frame, max_bag_size=5, seed=7).iloc[0]
    assert capped["size"] == 5 and capped["total"] == 41 and capped["labels"] == ("/r",)
    kept = [s["line"] for s in capped["sentences"]]
    shuffled = frame.sample(frac=1.0, random_state=3)
    assert [s["line"] for s in build_bags(shuffled, 5, seed=7).iloc[0]["sentences"]] == kept
    assert [s["line"] for s in build_bags(frame, 5, seed=8).iloc[0]["sentences"]] != kept
    assert build_bags(frame, 100, seed=7).iloc[0]["size"] == 41
    assert [s["line"] for s in build_bags(frame, 100, seed=7).iloc[0]["sentences"]][:5] == kept  # bottom-k: a prefix
    everything = build_bags(frame).iloc[0]
    counts = np.zeros(41)  # every sentence is kept about equally often over seeds: uniform sampling
    for seed in range(400):
        ranked = sorted(everything["sentences"], key=lambda s: bags.priority(seed, everything["bag"], s))
        for s in ranked[:5]:
            counts[s["line"] - 1] += 1
    assert counts.sum() == 2000 and counts.min() > 20 and counts.max() < 80  # mean 48.8
    with pytest.raises(ValueError, match="max_bag_size must be >= 1"):
        build_bags(frame, 0)


def test_bags_split_across_files_merge() -> None:
    spec = [("/m/1", "/m/2", "A", "B", "NA")] * 7 + [("/m/3", "/m/4", "C", "D", "/r")] * 3
    one = rows(spec, "part-1.tsv")
    two = rows([("/m/1", "/m/2", "A", "B", "/q")] * 6 + [("/m/5", "/m/6", "E", "F", "NA")], "part-2.tsv")
    whole = build_bags(pd.concat([one, two], ignore_index=True), max_bag_size=4, seed=1)
    parts = pd.concat([build_bags(two, 4, seed=1), build_bags(one, 4, seed=1)], ignore_index=True)
    merged = merge_bags(parts, max_bag_size=4, seed=1)
    pd.testing.assert_frame_equal(merged, whole)
    first = whole.iloc[0]
    assert first["labels"] == ("/q",) and first["total"] == 13 and first["size"] == 4
    assert {s["file"] for s in first["sentences"]} <= {"part-1.tsv", "part-2.tsv"}
    shuffled = pd.concat([two, one]).sample(frac=1, random_state=0)
    blocks = [build_bags(shuffled.iloc[i:i + 6], 4, seed=1) for i in range(0, len(shuffled), 6)]  # Ray blocks
    pd.testing.assert_frame_equal(merge_bags(pd.concat(blocks, ignore_index=True), 4, seed=1), whole)


def test_with_bag_keys_for_a_groupby() -> None:
    frame = rows([("/m/1", "/m/2", "A", "B", "NA"), ("", "", "A", "B", "NA")])
    keyed = bags.with_bag_keys(frame)
    assert keyed["bag"].tolist() == ["id\x1f/m/1\x1f/m/2", "text\x1fA\x1fB"] and "bag" not in frame.columns
    groups = [build_bags(group) for _, group in keyed.groupby("bag")]  # what map_groups runs, one group at a time
    pd.testing.assert_frame_equal(pd.concat(groups, ignore_index=True), build_bags(frame))


def test_balance_shards_by_sentences() -> None:
    sizes = [1] * 60 + [30, 2, 25, 5, 1, 40]
    shards = balance_shards(sizes, 3)
    loads = np.bincount(shards, weights=sizes, minlength=3)
    assert loads.sum() == sum(sizes) and loads.max() - loads.min() <= 1  # 164 sentences: 55, 55, 54
    bags_per_shard = np.bincount(shards, minlength=3)
    assert bags_per_shard.max() - bags_per_shard.min() >= 10  # balanced by sentences, not by bags (16, 24, 26)
    assert np.array_equal(balance_shards(sizes, 3), shards)
    assert balance_shards([5, 5], 4).tolist() == [0, 1] and balance_shards([], 2).tolist() == []
    with pytest.raises(ValueError, match="num_shards must be >= 1"):
        balance_shards([1], 0)


def test_a_rank_s_batches_come_from_its_sentence_balanced_shard_in_as_many_steps_as_every_rank() -> None:
    from nre_ray.tasks.bag.bag_split import BagBatchSampler

    rng = np.random.default_rng(0)
    sizes = [int(s) for s in rng.choice([1, 1, 1, 2, 3, 8, 40], size=101)]
    one = BagBatchSampler(sizes, 8)
    first = list(one)
    assert sorted(i for b in first for i in b) == list(range(101)) and max(map(len, first)) <= 8
    one.set_epoch(1)
    assert list(one) != first and sorted(i for b in one for i in b) == list(range(101))
    for world in (2, 3):
        ranks = [BagBatchSampler(sizes, 8, r, world, seed=4) for r in range(world)]
        batches = [list(r) for r in ranks]
        assert len({len(r) for r in ranks}) == 1 and all(len(b) == len(ranks[0]) for b in batches)  # DDP's steps
        shards = [sorted({i for b in mine for i in b}) for mine in batches]
        assert sorted(i for s in shards for i in s) == list(range(101))  # disjoint, every bag
        totals = [sum(sizes[i] for i in s) for s in shards]
        assert max(totals) - min(totals) <= max(sizes)  # sentences balanced, not bags
        assert batches == [list(BagBatchSampler(sizes, 8, r, world, seed=4)) for r in range(world)]
    few = [list(BagBatchSampler([2, 1], 4, r, 3)) for r in range(3)]
    assert all(len(b) == 1 and b[0] for b in few)  # fewer bags than ranks: each still takes its one step

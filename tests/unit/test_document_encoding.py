"""Document encoding and batching (nre_ray.tasks.document.pairs / encode / batching / sample): candidate pairs from
type pairs, markers and mention positions, label matrices, length batches, token-balanced shards, padding."""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np
import pytest

from nre_ray.tasks.document.batching import (
    LengthBatchSampler,
    deal_batches,
    length_batches,
    pad_batch,
    padding_share,
    shard_by_tokens,
)
from nre_ray.tasks.document.encoding import (
    MARKER,
    build_vocab,
    encode_document,
    label_matrix,
    mark_tokens,
    relation_index,
    uncovered_facts,
)
from nre_ray.tasks.document.pairs import candidate_pairs, type_pairs
from nre_ray.tasks.document.readers import read_documents
from nre_ray.tasks.document.records import Document, Entity, Fact, Mention
from nre_ray.tasks.document.sample import RELATIONS, sample_documents, write_sample


def doc() -> Document:
    """"Aspirin causes pain . Aspirin also eases severe pain ." with a chemical and a two-word disease mention."""
    sents = (("Aspirin", "causes", "pain", "."), ("Aspirin", "also", "eases", "severe", "pain", "."))
    chem = Entity("C1", "Chemical", (Mention(0, 0, 1, "Aspirin", "Chemical"), Mention(1, 0, 1, "Aspirin", "Chemical")))
    pain = Entity("D1", "Disease", (Mention(0, 2, 3, "pain", "Disease"), Mention(1, 3, 5, "severe pain", "Disease")))
    other = Entity("C2", "Chemical", (Mention(1, 2, 3, "eases", "Chemical"),))
    return Document("7", "t", sents, (chem, pain, other), (Fact(0, 1, "CID"), Fact(0, 1, "treats")))


def test_candidate_pairs_every_ordered_pair_or_the_training_type_pairs() -> None:
    d = doc()
    assert candidate_pairs(d) == [(0, 1), (0, 2), (1, 0), (1, 2), (2, 0), (2, 1)]
    allowed = type_pairs([d])
    assert allowed == {("Chemical", "Disease")}
    assert candidate_pairs(d, allowed) == [(0, 1), (2, 1)]
    assert uncovered_facts(d, [(2, 1)]) == 2


def test_markers_positions_and_labels() -> None:
    d = doc()
    tokens, positions = mark_tokens(d)
    assert " ".join(tokens) == "* Aspirin * causes * pain * . * Aspirin * also * eases * * severe pain * ."
    assert positions == [[0, 8], [4, 15], [12]]
    assert all(tokens[p] == MARKER for ps in positions for p in ps)
    relations = relation_index(["treats", "CID", "CID"])
    assert relations == {"CID": 1, "treats": 2}
    pairs = candidate_pairs(d)
    labels = label_matrix(d, pairs, relations)
    assert labels.shape == (6, 3) and labels.dtype == np.float32
    assert labels[0].tolist() == [0, 1, 1] and labels[1:, 0].tolist() == [1] * 5 and labels[1:, 1:].sum() == 0
    # subword pieces and special tokens shift the positions
    pieces = {"Aspirin": ["as", "##pirin"]}
    vocab = {}
    encoded = encode_document(d, pairs, relations, lambda ts: [vocab.setdefault(t, len(vocab) + 5) for t in ts],
                              pieces=lambda w: pieces.get(w, [w]), start=[101], end=[102])
    assert encoded.input_ids[0] == 101 and encoded.input_ids[-1] == 102 and encoded.length == len(tokens) + 2 + 2
    assert encoded.mention_pos == [[1, 10], [6, 18], [15]]
    assert all(encoded.input_ids[p] == vocab[MARKER] for ps in encoded.mention_pos for p in ps)
    assert encoded.pairs.shape == (6, 2) and np.array_equal(encoded.labels, labels)


def test_vocabulary_and_word_encoding() -> None:
    vocab = build_vocab([doc()])
    assert vocab.tokens[:2] == ["<pad>", "<unk>"] and MARKER in vocab.index and "aspirin" in vocab.index
    encoded = encode_document(doc(), [(0, 1)], {"CID": 1}, vocab.encode, pieces=lambda w: [w.lower()])
    assert encoded.input_ids.dtype == np.int64 and 1 not in encoded.input_ids.tolist()  # nothing unknown


def test_length_batches_bound_padding() -> None:
    rng = random.Random(0)
    lengths = [rng.randint(20, 600) for _ in range(200)]
    batches = length_batches(lengths, max_tokens=2048)
    assert sorted(i for b in batches for i in b) == list(range(200))
    assert all(len(b) * max(lengths[i] for i in b) <= 2048 for b in batches)
    shuffled = [list(range(k, min(k + 4, 200))) for k in range(0, 200, 4)]  # 4 at a time, in file order
    assert padding_share(lengths, batches) < 0.05 < padding_share(lengths, shuffled)
    assert length_batches(lengths, 2048) == batches  # deterministic
    again = length_batches(lengths, 2048, shuffle_seed=3)
    assert sorted(map(tuple, again)) == sorted(map(tuple, batches)) and again != batches
    assert length_batches([5000, 10], 100) == [[1], [0]]  # too long: alone
    assert [len(b) for b in length_batches([10] * 10, 1000, max_size=4)] == [4, 4, 2]
    assert padding_share([3, 3], [[0, 1]]) == 0.0 and padding_share([], []) == 0.0
    with pytest.raises(ValueError):
        length_batches([1], 0)


def test_shards_balance_tokens_not_documents() -> None:
    lengths = [20, 1000, 300, 500, 100, 50, 30]
    shards = shard_by_tokens(lengths, 2)
    assert shards == [[1], [0, 2, 3, 4, 5, 6]]  # 1000 tokens each: equal tokens, not equal counts
    rng = random.Random(1)
    lengths = [rng.randint(1, 500) for _ in range(101)]
    for n in (1, 2, 3):
        totals = [sum(lengths[i] for i in s) for s in shard_by_tokens(lengths, n)]
        assert max(totals) - min(totals) <= max(lengths)
    assert shard_by_tokens([5], 3) == [[0], [], []]


def test_pad_batch_shapes() -> None:
    relations = relation_index(["CID", "treats"])
    short = Document("s", "s", (("a", "b"),), (Entity("x", "T", (Mention(0, 0, 1, "a", "T"),)),
                                               Entity("y", "T", (Mention(0, 1, 2, "b", "T"),))), ())
    docs = [encode_document(d, candidate_pairs(d), relations, lambda ts: [3] * len(ts)) for d in (doc(), short)]
    batch = pad_batch(docs)
    assert batch["input_ids"].shape == (2, docs[0].length) and batch["mask"].sum(1).tolist() == [d.length for d in docs]
    assert batch["mention_pos"].shape == (2, 3, 2) and batch["mention_pos"][1].tolist() == [[0, -1], [3, -1],
                                                                                             [-1, -1]]
    assert batch["pairs"].shape == (2, 6, 2) and batch["pairs"][1, 2:].tolist() == [[-1, -1]] * 4
    assert batch["labels"].shape == (2, 6, 3) and batch["labels"][1, :2, 0].tolist() == [1, 1]


def test_sample_is_deterministic_valid_and_multi_label(tmp_path: Path) -> None:
    paths = write_sample(tmp_path)
    assert json.loads(Path(paths["train"]).read_text()) == sample_documents("train")
    assert Path(write_sample(tmp_path / "again")["test"]).read_bytes() == Path(paths["test"]).read_bytes()
    train = read_documents(paths["train"]).documents
    assert len(train) == 240 and {f.relation for d in train for f in d.facts} == set(RELATIONS)
    assert any(len({f.relation for f in d.facts if (f.head, f.tail) == (g.head, g.tail)}) == 2
               for d in train for g in d.facts)  # a pair with two relations
    assert any(len(set(f.evidence)) == 2 for d in train for f in d.facts)  # told across two sentences
    assert sample_documents("valid")[0]["title"] != sample_documents("test")[0]["title"]
    assert sum(Path(p).stat().st_size for p in paths.values()) < 600_000


def test_a_document_the_encoding_cannot_take_is_named_with_its_file_line_and_id_not_a_traceback() -> None:
    from dataclasses import replace

    from nre_ray.data.errors import DataError
    from nre_ray.tasks.document.prepare import encode_batch, encoding_problems

    good = replace(doc(), facts=(Fact(0, 1, "CID"),), source="cdr/train.txt", line=12)
    bad = replace(good, id="8", line=40)  # "treats" is not among the context's relations: a KeyError inside
    bad = replace(bad, facts=(Fact(0, 1, "treats"),))
    context = {"tokens": ["<pad>", "<unk>"], "lowercase": False, "relations": {"CID": 1}, "type_pairs": None,
               "train": frozenset()}
    batch = {"split": np.asarray(["train", "train"], dtype=object), "position": np.asarray([0, 1]),
             "document": np.asarray([json.dumps(d.to_dict()) for d in (good, bad)], dtype=object)}
    out = encode_batch(batch, context)
    assert out["error"][0] == "" and json.loads(out["encoded"][0])["id"] == "7"
    assert out["encoded"][1] == "" and out["error"][1].startswith("KeyError")
    err = encoding_problems({"train": [good, bad]}, [("train", 1, out["error"][1])])
    assert isinstance(err, DataError)
    first = str(err).splitlines()[0]
    assert first.startswith("cdr/train.txt:40: document '8' passed the checks but could not be encoded (KeyError")
    assert "please report it" in str(err)


def test_batches_are_dealt_to_ranks_in_equal_numbers_with_balanced_tokens() -> None:
    lengths = [5, 100, 7, 60, 61, 8, 90, 9, 10, 30]
    batches = length_batches(lengths, max_tokens=120)
    size = [len(b) * max(lengths[i] for i in b) for b in batches]
    for ranks in (1, 2, 3):
        dealt = deal_batches(lengths, batches, ranks)
        assert {len(d) for d in dealt} == {-(-len(batches) // ranks)}  # as many steps on every rank (DDP)
        assert sorted({k for d in dealt for k in d}) == list(range(len(batches)))  # every batch runs
        totals = [sum(size[k] for k in d) for d in dealt]
        assert max(totals) - min(totals) <= max(size)
    assert deal_batches(lengths, batches, 1) == [sorted(range(len(batches)), key=lambda k: (-size[k], k))]


def test_a_rank_s_length_batches_bound_padding_and_change_order_not_content_by_epoch() -> None:
    rng = random.Random(0)
    lengths = [rng.randint(20, 400) for _ in range(200)]
    one = LengthBatchSampler(lengths, batch_size=4)
    first = list(one)
    assert sorted(i for b in first for i in b) == list(range(200))  # one worker: every document once
    assert max(len(b) * max(lengths[i] for i in b) for b in first) <= max(one.max_tokens, max(lengths))
    order = random.Random(1).sample(range(200), 200)
    random_batches = [order[k:k + 4] for k in range(0, 200, 4)]  # what a plain sampler's batches of 4 pad
    assert one.padding_share() < 0.05 < padding_share(lengths, random_batches)
    one.set_epoch(1)
    second = list(one)
    assert second != first and sorted(map(sorted, second)) == sorted(map(sorted, first))
    ranks = [LengthBatchSampler(lengths, 4, rank, 3, seed=7) for rank in range(3)]
    assert len({len(r) for r in ranks}) == 1 and [list(r) for r in ranks] == [
        list(LengthBatchSampler(lengths, 4, rank, 3, seed=7)) for rank in range(3)]  # deterministic

"""Vocabulary: PAD/UNK, min frequency, deterministic order, JSON round trip."""

from nre_ray.data.vocab import PAD, UNK, UNK_ID, Vocab


def test_build_min_freq_and_order(tmp_path):
    v = Vocab.build({"b": 3, "a": 3, "c": 1, "d": 2}, min_freq=2)
    assert v.tokens == [PAD, UNK, "a", "b", "d"]
    assert v.encode(["a", "zzz", "d"]) == [2, UNK_ID, 4]
    v.save(tmp_path / "v.json")
    assert Vocab.load(tmp_path / "v.json").tokens == v.tokens

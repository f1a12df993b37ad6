"""Entity markers as words for the encoders trained from scratch: placement, spans, vocabulary, unseen types."""

import numpy as np
import pandas as pd
import pytest

from nre_ray.data.batches import encode_flat, tokenize_batch
from nre_ray.data.markers import MARKERS, is_marker, typed_markers, untyped
from nre_ray.data.tokenize import regex_tokens, tokenize_example
from nre_ray.data.vocab import Vocab


def test_markers_wrap_each_entity_and_the_span_starts_at_the_start_marker():
    t = tokenize_example("Acme was founded by Ann.", 0, 4, 20, 3, markers=MARKERS)
    assert t.tokens == ["[E1]", "acme", "[/E1]", "was", "founded", "by", "[E2]", "ann", "[/E2]", "."]
    assert (t.head, t.tail) == ((0, 3), (6, 9))
    assert t.tokens[t.head[0]] == "[E1]" and t.tokens[t.tail[1] - 1] == "[/E2]"


@pytest.mark.parametrize("sentence, head, tail, expected", [
    # tail before head, adjacent entities (the end marker comes before the next start marker)
    ("AnnAcme", (3, 7), (0, 3), ["[E2]", "ann", "[/E2]", "[E1]", "acme", "[/E1]"]),
    # nested: the outer entity opens first and closes last
    ("New York University", (0, 19), (0, 8), ["[E1]", "[E2]", "new", "york", "[/E2]", "university", "[/E1]"]),
    # the same span twice
    ("Ann", (0, 3), (0, 3), ["[E1]", "[E2]", "ann", "[/E2]", "[/E1]"]),
    # an entity at the sentence's end
    ("born in Paris", (0, 4), (8, 13), ["[E1]", "born", "[/E1]", "in", "[E2]", "paris", "[/E2]"]),
])
def test_marker_order(sentence, head, tail, expected):
    t = tokenize_example(sentence, head[0], head[1] - head[0], tail[0], tail[1] - tail[0], markers=MARKERS)
    assert t.tokens == expected
    assert t.tokens[t.head[0]] == "[E1]" and t.tokens[t.head[1] - 1] == "[/E1]"
    assert t.tokens[t.tail[0]] == "[E2]" and t.tokens[t.tail[1] - 1] == "[/E2]"


def test_no_text_tokenizes_to_a_marker():
    for text in ("[E1] x [/E2]", "<e1:person> y", "[e1]"):
        assert not any(is_marker(t) for t in regex_tokens(text, lowercase=False))
        assert not any(is_marker(t) for t in regex_tokens(text, lowercase=True))


def test_typed_markers_where_the_row_has_types():
    batch = pd.DataFrame({"sentence": ["Ann met Bob", "Ann met Bob"], "head": ["Ann"] * 2, "head_offset": [0, 0],
                          "tail": ["Bob"] * 2, "tail_offset": [8, 8], "head_type": ["person", None],
                          "tail_type": ["sports team", ""], "problem": ["", ""]})
    out = tokenize_batch(batch, "regex", True, markers=True, typed=True)
    assert out["tokens"][0] == ["<e1:person>", "ann", "</e1:person>", "met", "<e2:sports_team>", "bob",
                                "</e2:sports_team>"]
    assert out["tokens"][1] == ["[E1]", "ann", "[/E1]", "met", "[E2]", "bob", "[/E2]"]
    untyped_out = tokenize_batch(batch, "regex", True, markers=True, typed=False)
    assert untyped_out["tokens"][0] == out["tokens"][1]
    assert tokenize_batch(batch, "regex", True)["tokens"][0] == ["ann", "met", "bob"]


def test_markers_enter_the_vocabulary_below_min_freq_and_unseen_types_read_as_untyped():
    vocab = Vocab.build({"ann": 5, "rare": 1, "[E1]": 1, "<e1:person>": 1}, min_freq=2)
    assert "[E1]" in vocab.index and "<e1:person>" in vocab.index and "rare" not in vocab.index
    tokens = [["<e1:person>", "ann", "<e1:planet>", "rare"]]
    flat = encode_flat(tokens, np.array([[0, 2, 2, 4]]), vocab.tokens, max_length=10, window=5)
    assert flat["tokens"].tolist() == [vocab.index["<e1:person>"], vocab.index["ann"], vocab.index["[E1]"], 1]


def test_untyped():
    assert [untyped(m) for m in typed_markers("a", "b")] == list(MARKERS)
    assert untyped("word") == "word"

"""Tokenization, entity spans from offsets, position features, truncation."""

import pytest

from nre_ray.data.tokenize import (
    clip_span,
    pcnn_segments,
    regex_tokens,
    relative_positions,
    tokenize_example,
    truncation_window,
)


def test_regex_tokens_words_punctuation_digits_and_cjk():
    assert regex_tokens("Acme's 2nd plant, in São Paulo (1999).", lowercase=False) == [
        "Acme", "'", "s", "2nd", "plant", ",", "in", "São", "Paulo", "(", "1999", ")", "."]
    assert regex_tokens("张玲执导2014年的GDP", lowercase=True) == ["张", "玲", "执", "导", "2014", "年", "的", "gdp"]


def test_entity_span_comes_from_offsets_not_from_string_search():
    s = "Paris Hilton was born in New York, not in Paris."
    second = s.rindex("Paris")
    t = tokenize_example(s, 0, len("Paris Hilton"), second, len("Paris"), lowercase=False)
    assert t.tokens[t.head[0]:t.head[1]] == ["Paris", "Hilton"]
    assert t.tail == (len(t.tokens) - 2, len(t.tokens) - 1)
    assert t.tokens[t.tail[0]] == "Paris"


def test_entity_inside_a_word_is_cut_at_its_boundaries():
    s = "TheAcme plant"
    t = tokenize_example(s, 3, 4, 8, 5, lowercase=False)
    assert t.tokens == ["The", "Acme", "plant"]
    assert (t.head, t.tail) == ((1, 2), (2, 3))


def test_nested_entities():
    s = "The University of Oxford Press"
    t = tokenize_example(s, 4, len("University of Oxford Press"), s.index("Oxford"), 6, lowercase=False)
    assert t.tokens[t.head[0]:t.head[1]] == ["University", "of", "Oxford", "Press"]
    assert t.tokens[t.tail[0]:t.tail[1]] == ["Oxford"]


def test_jieba_keeps_entities_whole():
    s = "《逐风行》是纵横中文网签约作家清水秋风创作的小说"
    t = tokenize_example(s, 1, 3, 6, 5, tokenizer="jieba")
    assert t.tokens[t.head[0]:t.head[1]] == ["逐风行"]
    assert t.tokens[t.tail[0]:t.tail[1]] == ["纵横中文网"]


def test_whitespace_entity_is_an_error():
    with pytest.raises(ValueError, match="head"):
        tokenize_example("a   b", 1, 2, 4, 1)


def test_relative_positions_zero_on_entity_and_clipped():
    window = 2
    pos = relative_positions(7, (2, 4), window)
    inside = window + 1
    assert pos == [inside - 2, inside - 1, inside, inside, inside + 1, inside + 2, inside + 2]
    assert min(pos) >= 1 and max(pos) <= 2 * window + 1


def test_pcnn_segments_either_order():
    assert pcnn_segments(7, (1, 2), (4, 5)) == [1, 1, 2, 2, 2, 3, 3]
    assert pcnn_segments(7, (4, 5), (1, 2)) == [1, 1, 2, 2, 2, 3, 3]


def test_truncation_keeps_both_entities():
    start, end = truncation_window(200, (150, 152), (120, 121), 40)
    assert end - start == 40
    assert start <= 120 and 152 <= end
    assert truncation_window(10, (0, 1), (8, 9), 40) == (0, 10)
    assert clip_span((150, 152), (start, end)) == (150 - start, 152 - start)

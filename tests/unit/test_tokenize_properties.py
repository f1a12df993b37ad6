"""Property-based tests (hypothesis) of tokenization, entity spans, position features and truncation.

Sentences mix words, digits, CJK characters, punctuation, underscores and runs of whitespace; entities are any
character ranges with a visible character, anywhere (apart, adjacent, nested or overlapping)."""

from __future__ import annotations

import pandas as pd
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from nre_ray.data.batches import encode_batch
from nre_ray.data.tokenize import (
    clip_span,
    pcnn_segments,
    relative_positions,
    tokenize_example,
    truncation_window,
)

PIECES = st.sampled_from(["Acme", "acme's", "São", "Paulo", "2014", "3.5", "GDP", "x_y", "张", "玲", "北京大学", "年",
                          "の", "한", ",", ".", "(", ")", "-", "“", "”", "%", "—", "ü", "Ωmega", "e1", "A1b2"])
SPACES = st.sampled_from(["", " ", "  ", "\t", "\u3000", "\n"])
PROPERTY = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def visible(text: str) -> str:
    """``text`` without whitespace."""
    return "".join(ch for ch in text if not ch.isspace())


@st.composite
def sentences(draw: st.DrawFn) -> str:
    words = draw(st.lists(st.tuples(PIECES, SPACES), min_size=1, max_size=25))
    return "".join(word + space for word, space in words)


@st.composite
def entity(draw: st.DrawFn, sentence: str) -> tuple[int, int]:
    """``(offset, length)`` of a character range of ``sentence`` that holds a visible character."""
    start = draw(st.integers(0, len(sentence) - 1))
    end = draw(st.integers(start + 1, len(sentence)))
    assume(visible(sentence[start:end]))
    return start, end - start


@st.composite
def examples(draw: st.DrawFn) -> tuple[str, tuple[int, int], tuple[int, int]]:
    sentence = draw(sentences())
    assume(visible(sentence))
    return sentence, draw(entity(sentence)), draw(entity(sentence))


@PROPERTY
@given(examples())
def test_entity_token_span_maps_back_to_the_entity_text(example: tuple[str, tuple[int, int], tuple[int, int]]) -> None:
    sentence, (ho, hl), (to, tl) = example
    out = tokenize_example(sentence, ho, hl, to, tl, "regex", lowercase=False)
    for (start, end), (offset, length) in ((out.head, (ho, hl)), (out.tail, (to, tl))):
        assert 0 <= start < end <= len(out.tokens)
        assert "".join(out.tokens[start:end]) == visible(sentence[offset:offset + length])
    assert "".join(out.tokens) == visible(sentence)  # nothing visible is lost or invented


@PROPERTY
@given(examples())
def test_lowercasing_changes_only_the_case_of_each_token(example: tuple[str, tuple[int, int], tuple[int, int]]) -> None:
    sentence, (ho, hl), (to, tl) = example
    kept = tokenize_example(sentence, ho, hl, to, tl, "regex", lowercase=False)
    lowered = tokenize_example(sentence, ho, hl, to, tl, "regex", lowercase=True)
    assert lowered.tokens == [t.lower() for t in kept.tokens]
    assert (lowered.head, lowered.tail) == (kept.head, kept.tail)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(examples())
def test_jieba_entity_spans_map_back_modulo_whitespace(example: tuple[str, tuple[int, int], tuple[int, int]]) -> None:
    sentence, (ho, hl), (to, tl) = example
    out = tokenize_example(sentence, ho, hl, to, tl, "jieba", lowercase=False)
    for (start, end), (offset, length) in ((out.head, (ho, hl)), (out.tail, (to, tl))):
        assert start < end
        assert visible("".join(out.tokens[start:end])) == visible(sentence[offset:offset + length])


@PROPERTY
@given(st.integers(1, 60), st.data(), st.integers(1, 12))
def test_positions_are_window_plus_one_exactly_on_the_entity(length: int, data: st.DataObject, window: int) -> None:
    start = data.draw(st.integers(0, length - 1))
    end = data.draw(st.integers(start + 1, length))
    positions = relative_positions(length, (start, end), window)
    assert len(positions) == length
    assert [i for i, p in enumerate(positions) if p == window + 1] == list(range(start, end))
    assert all(1 <= p <= 2 * window + 1 for p in positions)
    assert positions == sorted(positions)  # non-decreasing left to right


@st.composite
def spans(draw: st.DrawFn) -> tuple[int, tuple[int, int], tuple[int, int], int]:
    length = draw(st.integers(1, 300))
    chosen = []
    for _ in range(2):
        start = draw(st.integers(0, length - 1))
        chosen.append((start, draw(st.integers(start + 1, min(length, start + 12)))))
    return length, chosen[0], chosen[1], draw(st.integers(4, 80))


@PROPERTY
@given(spans())
def test_truncation_keeps_both_entities_whenever_they_fit(case: tuple[int, tuple[int, int], tuple[int, int],
                                                                      int]) -> None:
    length, head, tail, max_length = case
    start, end = truncation_window(length, head, tail, max_length)
    assert 0 <= start <= end <= length
    assert end - start == min(length, max_length)
    reach = max(head[1], tail[1]) - min(head[0], tail[0])
    if reach <= max_length:
        assert start <= head[0] and head[1] <= end
        assert start <= tail[0] and tail[1] <= end
        assert clip_span(head, (start, end)) == (head[0] - start, head[1] - start)
    else:  # too far apart: the window starts at the first entity
        assert start == min(head[0], tail[0])


@PROPERTY
@given(examples(), st.integers(4, 40), st.integers(1, 10))
def test_encoded_rows_keep_the_entities_and_mark_them_after_truncation(
        example: tuple[str, tuple[int, int], tuple[int, int]], max_length: int, window: int) -> None:
    sentence, (ho, hl), (to, tl) = example
    out = tokenize_example(sentence, ho, hl, to, tl, "regex", lowercase=False)
    batch = pd.DataFrame({"tokens": [out.tokens], "head_start": [out.head[0]], "head_end": [out.head[1]],
                          "tail_start": [out.tail[0]], "tail_end": [out.tail[1]], "relation": ["r"]})
    row = encode_batch(batch, ["<pad>", "<unk>", *sorted(set(out.tokens))], ["r"], max_length, window).iloc[0]
    n = row["length"]
    assert n == min(len(out.tokens), max_length) == len(row["token_ids"]) == len(row["segments"])
    for span, key in ((row["head_span"], "head_pos"), (row["tail_span"], "tail_pos")):
        assert [i for i, p in enumerate(row[key]) if p == window + 1] == list(range(span[0], span[1]))
    reach = max(out.head[1], out.tail[1]) - min(out.head[0], out.tail[0])
    if reach <= max_length:  # both entities whole, and their ids are the entity tokens' ids
        start = truncation_window(len(out.tokens), out.head, out.tail, max_length)[0]
        for (s, e), original in ((row["head_span"], out.head), (row["tail_span"], out.tail)):
            assert (s + start, e + start) == original
    assert row["segments"] == pcnn_segments(n, tuple(row["head_span"]), tuple(row["tail_span"]))

"""Entity markers, subword offsets and truncation for pretrained encoders (a tiny WordPiece tokenizer, offline)."""

from __future__ import annotations

import os
import subprocess
import sys

import pandas as pd
import pytest

pytest.importorskip("transformers")

from nre_ray.config import ConfigError
from nre_ray.data.subword import (
    MARKERS,
    MarkerTokenizer,
    build_tokenizer,
    encode_rows_with,
    encode_subword_batch,
    entity_types,
    insert_markers,
    keep_window,
    marker_vocabulary,
)
from tests.tiny_bert import make_tiny_bert

WORDS = ["ann", "met", "sister", "acme", "inc", "founded", "by", "in", "the", "city", "of", "new", "york",
         "university", "is", "lives", "and", "said"]


@pytest.fixture(scope="module")
def tok(tmp_path_factory) -> MarkerTokenizer:
    base = make_tiny_bert(tmp_path_factory.mktemp("tiny"), WORDS)
    folder = build_tokenizer(str(base), tmp_path_factory.mktemp("tok"),
                             marker_vocabulary(["person", "org"], ["person", "sports team"]), 64)
    return MarkerTokenizer.load(folder)


def row(sentence: str, head: str, head_offset: int, tail: str, tail_offset: int, **extra) -> dict:
    assert sentence[head_offset:head_offset + len(head)] == head
    assert sentence[tail_offset:tail_offset + len(tail)] == tail
    return {"sentence": sentence, "head": head, "head_offset": head_offset, "tail": tail, "tail_offset": tail_offset,
            "relation": "r", "problem": "", **extra}


def tokens_of(tok: MarkerTokenizer, encoded: pd.Series) -> list[str]:
    return tok.tokenizer.convert_ids_to_tokens(encoded["token_ids"])


def inside(tokens: list[str], span: list[int]) -> str:
    """The text between a start marker and its end marker (WordPiece continuations glued)."""
    return "".join(t[2:] if t.startswith("##") else t for t in tokens[span[0] + 1:span[1] - 1])


# --------------------------------------------------------------------------------------------------------------------
# markers in text


@pytest.mark.parametrize(("sentence", "head", "tail", "expected"), [
    ("Acme was founded by Ann.", (0, 4), (20, 23), "[E1] Acme [/E1] was founded by [E2] Ann [/E2] ."),
    ("Ann founded Acme", (12, 16), (0, 3), "[E2] Ann [/E2] founded [E1] Acme [/E1] "),
    ("New York University", (0, 19), (0, 8), "[E1] [E2] New York [/E2] University [/E1] "),
    ("New York University", (0, 8), (0, 19), "[E2] [E1] New York [/E1] University [/E2] "),
    ("in New York City now", (3, 16), (7, 11), "in [E1] New [E2] York [/E2] City [/E1] now"),
    ("abcdef", (0, 4), (2, 6), "[E1] ab [E2] cd [/E1] ef [/E2] "),
    ("Ann Ann", (0, 3), (0, 3), "[E1] [E2] Ann [/E2] [/E1] Ann"),
    ("AnnBob", (0, 3), (3, 6), "[E1] Ann [/E1] [E2] Bob [/E2] "),
    ("北京大学位于北京。", (6, 8), (0, 4), "[E2] 北京大学 [/E2] 位于 [E1] 北京 [/E1] 。"),
])
def test_insert_markers(sentence, head, tail, expected):
    marked = insert_markers(sentence, head, tail)
    assert marked.text == expected
    for marker, position in zip(MARKERS, marked.positions, strict=True):
        assert marked.text[position:position + len(marker)] == marker


def test_marker_vocabulary_and_types():
    frame = pd.DataFrame({"head_type": ["person", " sports team ", None, ""], "tail_type": ["org", "org", "", None]})
    heads, tails = entity_types(frame)
    assert heads == ["person", "sports_team"] and tails == ["org"]
    assert marker_vocabulary(heads, tails) == [*MARKERS, "<e1:person>", "</e1:person>", "<e1:sports_team>",
                                               "</e1:sports_team>", "<e2:org>", "</e2:org>"]


# --------------------------------------------------------------------------------------------------------------------
# subword positions


def test_repeated_entity_strings_use_the_offsets(tok):
    sentence = "Ann met Ann and the sister of Ann said Ann lives in the city."
    third = sentence.index("Ann", sentence.index("of"))
    fourth = sentence.rindex("Ann")
    rows = pd.DataFrame([row(sentence, "Ann", third, "Ann", fourth), row(sentence, "Ann", fourth, "Ann", 0)])
    out = encode_rows_with(tok, rows, 64, False, ["r"])
    first, second = out.iloc[0], out.iloc[1]
    tokens = tokens_of(tok, first)
    assert tokens[0] == "[CLS]" and tokens[-1] == "[SEP]"
    assert tokens[first["head_span"][0]] == "[E1]" and tokens[first["head_span"][1] - 1] == "[/E1]"
    assert tokens[first["tail_span"][0]] == "[E2]" and tokens[first["tail_span"][1] - 1] == "[/E2]"
    # The head is the third "ann", the tail the fourth: the words before each marker say so.
    assert tokens[first["head_span"][0] - 1] == "of"
    assert tokens[first["tail_span"][0] - 1] == "said"
    assert inside(tokens, first["head_span"]) == "ann" and inside(tokens, first["tail_span"]) == "ann"
    tokens = tokens_of(tok, second)
    assert second["tail_span"][0] == 1 and tokens[second["head_span"][0] - 1] == "said"
    assert first["label"] == 0 and first["length"] == len(first["token_ids"])


def test_punctuation_inside_and_around_entities(tok):
    sentence = "(Acme, Inc.) was founded by Ann-Ann in New York."
    rows = pd.DataFrame([row(sentence, "Acme, Inc.", 1, "Ann-Ann", 28)])
    out = encode_rows_with(tok, rows, 64, False, None).iloc[0]
    tokens = tokens_of(tok, out)
    assert inside(tokens, out["head_span"]) == "acme,inc."
    assert inside(tokens, out["tail_span"]) == "ann-ann"
    assert tokens[out["head_span"][0] - 1] == "(" and tokens[out["head_span"][1]] == ")"
    assert out["label"] == -1


def test_chinese_text_nested_and_typed_markers(tok):
    sentence = "北京大学位于北京。"
    rows = pd.DataFrame([
        row(sentence, "北京", 6, "北京大学", 0, head_type="person", tail_type="sports team"),
        row(sentence, "北京大学", 0, "北京", 0, head_type="org", tail_type="city"),  # nested; unknown tail type
    ])
    out = encode_rows_with(tok, rows, 64, True, ["r"])
    tokens = tokens_of(tok, out.iloc[0])
    assert tokens == ["[CLS]", "<e2:sports_team>", "北", "京", "大", "学", "</e2:sports_team>", "位", "于",
                      "<e1:person>", "北", "京", "</e1:person>", "。", "[SEP]"]
    assert list(out.iloc[0]["head_span"]) == [9, 13] and list(out.iloc[0]["tail_span"]) == [1, 7]
    tokens = tokens_of(tok, out.iloc[1])
    assert tokens[:9] == ["[CLS]", "<e1:org>", "[E2]", "北", "京", "[/E2]", "大", "学", "</e1:org>"]
    assert inside(tokens, out.iloc[1]["head_span"]) == "[E2]北京[/E2]大学"
    untyped = encode_rows_with(tok, rows, 64, False, ["r"])
    assert tokens_of(tok, untyped.iloc[0])[1] == "[E2]"


def test_rows_with_problems_stay_empty(tok):
    rows = pd.DataFrame([row("Ann met Acme.", "Ann", 0, "Acme", 8), {**row("x y", "x", 0, "y", 2), "problem": "bad"}])
    out = encode_rows_with(tok, rows, 64, False, ["r"])
    assert out["problem"].tolist() == ["", "bad"]
    assert out.iloc[1]["length"] == 0 and out.iloc[1]["token_ids"] == []


def test_batch_function_loads_the_tokenizer_from_its_folder(tok):
    folder = tok.tokenizer.name_or_path
    rows = pd.DataFrame([row("Ann met Acme.", "Ann", 0, "Acme", 8)])
    a = encode_subword_batch(rows, folder, 64, False, ["r"])
    b = encode_rows_with(tok, rows, 64, False, ["r"])
    assert a["token_ids"].tolist() == b["token_ids"].tolist()


# --------------------------------------------------------------------------------------------------------------------
# truncation


def test_keep_window():
    assert keep_window(10, (2, 4), (6, 8), 20) == [(0, 10)]
    assert keep_window(100, (40, 43), (50, 55), 20) == [(38, 58)]  # centred on both
    assert keep_window(100, (80, 83), (5, 9), 10) == [(5, 12), (80, 83)]  # far apart: one piece each
    assert keep_window(100, (0, 90), (60, 65), 20) == [(0, 15), (60, 65)]  # nested, too long
    assert keep_window(100, (0, 90), (5, 8), 20) == [(0, 20)]  # nested, the inner one starts early


def test_truncation_keeps_both_entities_and_the_special_tokens(tok):
    filler = " ".join(["the city of new york"] * 12)
    sentence = f"Ann met {filler} and Acme said {filler} in the city."
    near = f"{filler} Ann met Acme {filler}"
    rows = pd.DataFrame([row(sentence, "Ann", 0, "Acme", sentence.index("Acme")),
                         row(near, "Acme", near.index("Acme"), "Ann", near.index("Ann"))])
    out = encode_rows_with(tok, rows, 24, False, ["r"])
    for _, encoded in out.iterrows():
        tokens = tokens_of(tok, encoded)
        assert len(tokens) == encoded["length"] == 24
        assert tokens[0] == "[CLS]" and tokens[-1] == "[SEP]"
        assert tokens[encoded["head_span"][0]] == "[E1]" and tokens[encoded["tail_span"][0]] == "[E2]"
    far, close = (tokens_of(tok, out.iloc[i]) for i in (0, 1))
    assert inside(far, out.iloc[0]["head_span"]) == "ann" and "acme" in far
    assert close[out.iloc[1]["head_span"][1] - 1] == "[/E1]" and close[out.iloc[1]["tail_span"][1] - 1] == "[/E2]"
    start = close.index("[E2]")
    assert 4 <= start <= 14  # the window is centred on the entities


# --------------------------------------------------------------------------------------------------------------------
# loading


def test_bad_pretrained_paths_are_config_errors(tmp_path):
    with pytest.raises(ConfigError, match="no such folder"):
        build_tokenizer(str(tmp_path / "missing"), tmp_path / "out", MARKERS, 32)
    with pytest.raises(ConfigError, match="cannot load the tokenizer from this folder"):
        build_tokenizer(str(tmp_path), tmp_path / "out", MARKERS, 32)


def test_max_length_beyond_the_model_is_refused(tmp_path):
    base = make_tiny_bert(tmp_path / "tiny", WORDS)  # 128 positions
    with pytest.raises(ConfigError, match="--max-length 200 exceeds the 128 positions"):
        build_tokenizer(str(base), tmp_path / "out", MARKERS, 200)


@pytest.mark.timeout(120)
def test_hub_name_offline_says_to_pass_a_local_path(tmp_path):
    code = ("from nre_ray.data.subword import build_tokenizer\n"
            "from nre_ray.config import ConfigError\n"
            "try:\n    build_tokenizer('some-org/some-model', 'out', ['[E1]'], 32)\n"
            "except ConfigError as err:\n    print('ERROR', err)\n")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf")}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=tmp_path,
                         timeout=100).stdout
    assert "ERROR --pretrained some-org/some-model: not a local folder" in out
    assert "HF_HUB_OFFLINE is set" in out and "pass the path of a local model folder" in out

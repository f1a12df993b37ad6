"""SemEval-2010 Task 8 text: ``NUMBER<TAB>"sentence with <e1>..</e1> and <e2>..</e2>"``, then the label line and
an optional ``Comment:`` line."""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path

import pandas as pd

from nre_ray.data.errors import DataError, Problem
from nre_ray.data.formats.common import RecordColumns, batched, output_columns
from nre_ray.data.schema import quote

SEMEVAL_SENTENCE = re.compile(r'^\s*(\d+)\t\s*"(.*)"\s*$')
SEMEVAL_TAG = re.compile(r"</?e[12]>")


def read(
    path: Path, lines: Iterable[str], column_map: Mapping[str, str] | None, require_relation: bool,
    rows_per_chunk: int | None,
) -> Iterator[pd.DataFrame]:
    """The records of a SemEval file from its ``lines`` (without their ends), in frames of ``rows_per_chunk`` records
    (None: one frame). ``column_map`` is always None: the format has fixed fields."""
    name = str(path)
    has_relation = False
    for blocks in batched(_semeval_blocks(lines), rows_per_chunk):
        has_relation = has_relation or any(label is not None for _, _, _, label, _ in blocks)
        if require_relation and not has_relation:
            raise DataError([Problem(name, None, None,
                                     "no relation labels: this is an unlabelled SemEval file (sentence lines only)")],
                            hint="Use the labelled file (TRAIN_FILE.TXT or TEST_FILE_FULL.TXT), "
                                 "or read this one as prediction input.")
        rows = RecordColumns(output_columns({"relation": ""} if has_relation else {}))
        for line, number, body, label, after in blocks:
            if number is None:
                rows.add(line, {}, f"row: not a SemEval sentence line (expected 'NUMBER<TAB>\"sentence\"', "
                                   f"found {body})")
                continue
            values, problem = _semeval_sentence(body)
            values["id"] = number
            if has_relation:
                values["relation"] = label or ""
                if label is None and not problem:
                    problem = ("relation: SemEval block has no label line (expected a label such as 'Other' or "
                               f"'Cause-Effect(e1,e2)' on the line after the sentence, found {after})")
            rows.add(line, values, problem)
        yield rows.frame(name)


_END = object()


def _semeval_blocks(lines: Iterable[str]) -> Iterator[tuple[int, str | None, str, str | None, str]]:
    """``(line, number, quoted sentence, label, what followed)`` per block; number None for a stray line."""
    numbered = enumerate(lines, start=1)
    ahead = next(numbered, _END)
    while ahead is not _END:
        number, current = ahead
        ahead = next(numbered, _END)
        current = current.rstrip("\r")
        if not current.strip():
            continue
        match = SEMEVAL_SENTENCE.match(current)
        if not match:
            yield number, None, quote(current.strip()), None, ""
            continue
        nxt = ahead[1].rstrip("\r").strip() if ahead is not _END else ""
        after = quote(nxt) if nxt else "a blank line" if ahead is not _END else "the end of the file"
        label = None
        if nxt and not SEMEVAL_SENTENCE.match(ahead[1]) and not nxt.lower().startswith("comment"):
            label, ahead = nxt, next(numbered, _END)
        if ahead is not _END and ahead[1].strip().lower().startswith("comment"):
            ahead = next(numbered, _END)
        yield number, match.group(1), match.group(2), label, after


def _semeval_sentence(body: str) -> tuple[dict[str, str], str]:
    """Strip ``<e1>``/``<e2>`` tags: sentence, head (e1), tail (e2) and their offsets in the stripped sentence."""
    pieces: list[str] = []
    length, position = 0, 0
    opened: dict[str, int] = {}
    spans: dict[str, tuple[int, int]] = {}
    for match in SEMEVAL_TAG.finditer(body):
        pieces.append(body[position:match.start()])
        length += match.start() - position
        position = match.end()
        tag = match.group().strip("</>")
        if not match.group().startswith("</"):
            if tag in opened or tag in spans:
                return {}, f"sentence: <{tag}> opened twice (expected one <e1>...</e1> and one <e2>...</e2>)"
            opened[tag] = length
        elif tag in opened:
            spans[tag] = (opened.pop(tag), length)
        else:
            return {}, f"sentence: </{tag}> without <{tag}> (expected one <e1>...</e1> and one <e2>...</e2>)"
    pieces.append(body[position:])
    if opened or set(spans) != {"e1", "e2"}:
        found = ", ".join(sorted(spans)) or "none"
        return {}, f"sentence: entity tags incomplete (expected one <e1>...</e1> and one <e2>...</e2>, found {found})"
    sentence = "".join(pieces)
    (h_start, h_end), (t_start, t_end) = spans["e1"], spans["e2"]
    return {"sentence": sentence, "head": sentence[h_start:h_end], "head_offset": str(h_start),
            "tail": sentence[t_start:t_end], "tail_offset": str(t_start)}, ""

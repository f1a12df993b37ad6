"""The document data audit for people: :func:`audit_markdown` renders :func:`.prepare.audit_of`'s dict (what
``python -m nre_ray.data inspect`` prints for a folder of documents and a run logs as ``data/audit.md``)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any


def _table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> list[str]:
    def cell(value: Any) -> str:
        return f"{value:.1f}" if isinstance(value, float) else str(value)

    return ["| " + " | ".join(header) + " |", "|" + "---|" * len(header),
            *("| " + " | ".join(cell(v) for v in row) + " |" for row in rows)]


def audit_markdown(audit: Mapping[str, Any]) -> str:
    """The document audit as Markdown: per split its documents, entities, mentions, candidate pairs and facts; the
    lengths in words and in encoded tokens against the encoder's window; the facts per relation."""
    splits = audit["splits"]
    names = [s for s in splits if splits[s].get("rows")]
    window = audit.get("window")
    note = " (valid drawn from train)" if audit.get("valid_from_train") else ""
    lines = ["# Data audit (documents)", "", f"## Documents{note}", ""]
    lines += _table(["split", "documents", "skipped", "entities", "mentions", "candidate pairs", "facts"],
                    [[s, splits[s]["rows"], splits[s].get("rejected", 0), splits[s].get("entities", 0),
                      splits[s].get("mentions", 0), splits[s].get("candidate_pairs", 0), splits[s].get("facts", 0)]
                     for s in splits])
    subwords = bool(audit.get("subwords"))
    tokens = ("Length in the pretrained tokenizer's subwords (with mention markers and the model's special tokens)"
              if subwords else "Length in encoded tokens (with mention markers)")
    for key, title in (("length", "Length in words"), ("tokens", tokens)):
        header = ["split", "mean", "p50", "p90", "max"]
        extra = key == "tokens" and window
        if extra:
            header.append(f"longer than {window} (read in windows)")
        body = [[s, *(splits[s].get(key, {}).get(h, "") for h in header[1:5]),
                 *([splits[s].get("longer_than_window", "")] if extra else [])] for s in names]
        lines += ["", f"## {title}", "", *_table(header, body)]
    if window and subwords:
        lines += ["", f"The window is the pretrained model's positions ({window} subwords); longer documents are "
                      "read in windows overlapping by half."]
    elif window:
        lines += ["", f"The window is --max-positions' default ({window} tokens); longer documents are read in "
                      "overlapping windows."]
    lines += ["", "## Facts per relation", ""]
    lines += _table(["relation", *names], [[r, *(splits[s]["labels"].get(r, 0) for s in names)]
                                          for r in audit["labels"]])
    return "\n".join(lines) + "\n"

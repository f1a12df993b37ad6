"""The bag data audit: what ``python -m nre_ray.data inspect --bag-aggregator ...`` prints for sentence files
grouped into bags, and what a bag run logs as ``data/audit.md`` and ``data/audit.json``.

Nothing here groups sentences: the numbers are those of the bags the preprocessing built for training
(:mod:`.grouping`), so the audit describes exactly what a run trains and is scored on:

* the encoded splits (:class:`~.bag_split.BagSplit`): per bag its key (``id``/``text`` kind, for the pairs shared
  between splits), ``total`` (its good sentences, before ``--max-bag-size``), how many it kept and its label set;
* the token counts of the kept sentences before truncation (:class:`SentenceLengths`, fed with
  :func:`.grouping.encode_bags`' rows as they stream to the driver), against ``--max-length``;
* the bad rows and refused bags per split.

:func:`audit_of` makes the JSON-ready dict (``python -m nre_ray.data inspect --json``), :func:`warnings_of` its
warnings (train/test pairs first: a pair of the test split that also has a training bag has had its relations
taught, which inflates held-out scores) and :func:`audit_markdown` the report.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from itertools import chain
from typing import Any

import numpy as np
import pandas as pd

from nre_ray.data.audit import SPLIT_ORDER, histogram_summary, label_warnings, markdown_table
from nre_ray.tasks.bag.bag_split import BagSplit

ID_KIND = "id\x1f"
"""How the key of a bag keyed by its (head_id, tail_id) pair begins (:func:`.bags.bag_keys`); others are keyed by
the (head, tail) texts."""


class SentenceLengths:
    """Per split, the histogram of the kept sentences' token counts before truncation (``counts[s][n]``: sentences
    of split ``s`` with ``n`` tokens), added a part of encoded bags at a time."""

    def __init__(self) -> None:
        self.counts: dict[str, np.ndarray] = {}

    def add(self, part: pd.DataFrame) -> None:
        """Add the good bags of ``part`` (rows of :func:`.grouping.encode_bags`: ``split``, ``full_lengths``,
        ``problem``)."""
        good = part[part["problem"] == ""]
        for split, rows in good.groupby("split", sort=False):
            values = np.fromiter(chain.from_iterable(rows["full_lengths"]), dtype=np.int64)
            if not len(values):
                continue
            counts = np.bincount(values)
            before = self.counts.get(str(split), np.zeros(0, dtype=np.int64))
            size = max(len(before), len(counts))
            self.counts[str(split)] = np.pad(before, (0, size - len(before))) + np.pad(counts, (0, size - len(counts)))

    def histogram(self, split: str) -> np.ndarray:
        """The split's histogram (empty when it has no sentence)."""
        return self.counts.get(split, np.zeros(0, dtype=np.int64))


def _size_summary(sizes: np.ndarray) -> dict[str, float]:
    """Mean, min, p50, p90 and max of bag sizes (percentiles as ``numpy.percentile(method="higher")``: sizes that
    occur)."""
    if not len(sizes):
        return {}
    return {"mean": round(float(sizes.mean()), 1), "min": int(sizes.min()),
            "p50": int(np.percentile(sizes, 50, method="higher")),
            "p90": int(np.percentile(sizes, 90, method="higher")), "max": int(sizes.max())}


def split_numbers(split: BagSplit, labels: Sequence[str], na: str, lengths: np.ndarray, max_length: int,
                  max_bag_size: int) -> dict[str, Any]:
    """One split's part of the audit (see :func:`audit_of`); ``lengths``: its :class:`SentenceLengths` histogram."""
    total = split.total  # (B,) good sentences of each bag, before the cap
    sizes = split.sizes  # (B,) sentences kept
    per_bag = split.labels.sum(axis=1)  # (B,) labels of each bag
    na_column = list(labels).index(na) if na in labels else None
    na_bags = int(split.labels[:, na_column].sum()) if na_column is not None else 0
    by_ids = sum(1 for k in split.info["keys"] if k.startswith(ID_KIND))
    capped = np.minimum(total, max_bag_size)
    return {
        "bags": len(split), "sentences": int(total.sum()), "kept_sentences": int(sizes.sum()),
        "bags_by_ids": by_ids, "bags_by_text": len(split) - by_ids,
        "bag_size": _size_summary(total), "single_sentence_bags": int((total == 1).sum()),
        "capped_bags": int((total > max_bag_size).sum()), "capped_sentences": int((total - capped).sum()),
        "unencoded_sentences": int((capped - sizes).sum()),
        "multi_label_bags": int((per_bag > 1).sum()), "na_bags": na_bags,
        "facts": int(split.labels.sum()) - na_bags,
        "labels": {str(lab): int(n) for lab, n in zip(labels, split.labels.sum(axis=0), strict=True)},
        "length": histogram_summary(lengths), "truncated": int(lengths[max_length + 1:].sum()),
    }


def audit_of(splits: Mapping[str, BagSplit], labels: Sequence[str], na: str, lengths: SentenceLengths,
             max_length: int, max_bag_size: int, rejected_rows: Mapping[str, int] | None = None,
             rejected_bags: Mapping[str, int] | None = None, valid_from_train: bool = False) -> dict[str, Any]:
    """The bag audit of the built ``splits``.

    Args:
        splits: split name -> its encoded bags.
        labels: the class names (``na`` among them when the training bags have it).
        na: the no-relation label (``--negative-label``, default NA).
        lengths: the kept sentences' token counts before truncation.
        max_length: ``--max-length``: sentences with more tokens are truncated.
        max_bag_size: ``--max-bag-size``: bags keep at most this many sentences.
        rejected_rows: split name -> bad rows left out (``--on-bad-rows skip``).
        rejected_bags: split name -> bags left out (no sentence encodes, or a relation training lacks).
        valid_from_train: the validation bags were drawn from the training file.

    Returns:
        A JSON-ready dict: ``task`` ("bag"), ``labels``, ``negative_label``, ``max_length``, ``max_bag_size``,
        ``valid_from_train``, ``splits`` and ``warnings``. Per split: ``bags``, ``rejected`` (bad rows),
        ``rejected_bags``, ``sentences`` (of its bags, before the cap), ``kept_sentences``, ``bags_by_ids`` /
        ``bags_by_text`` (keyed by the (head_id, tail_id) pair, or by the (head, tail) texts), ``bag_size``
        (sentences per bag before the cap: mean, min, p50, p90, max), ``single_sentence_bags``, ``capped_bags`` and
        ``capped_sentences`` (bags over the cap, and the sentences it leaves out), ``unencoded_sentences`` (kept
        sentences left out because an entity covers no token), ``multi_label_bags``, ``na_bags`` (labelled NA
        alone), ``facts`` ((bag, relation) pairs, NA not counted), ``labels`` (bags per label), ``length`` (tokens
        of the kept sentences: mean, p50, p90, p95, p99, max), ``truncated`` (kept sentences longer than
        ``max_length``) and, for valid and test, ``shared_with_train`` (bags whose pair has a training bag); for
        test with a validation split, ``shared_with_valid``.
    """
    names = [s for s in SPLIT_ORDER if s in splits] + [s for s in splits if s not in SPLIT_ORDER]
    keys = {name: set(splits[name].info["keys"]) for name in names}
    out: dict[str, dict[str, Any]] = {}
    for name in names:
        info = split_numbers(splits[name], labels, na, lengths.histogram(name), max_length, max_bag_size)
        info = {"bags": info.pop("bags"), "rejected": int((rejected_rows or {}).get(name, 0)),
                "rejected_bags": int((rejected_bags or {}).get(name, 0)), **info}
        if name != "train" and "train" in keys:
            info["shared_with_train"] = len(keys[name] & keys["train"])
        if name == "test" and "valid" in keys:
            info["shared_with_valid"] = len(keys[name] & keys["valid"])
        out[name] = info
    audit = {"task": "bag", "labels": list(labels), "negative_label": na, "max_length": int(max_length),
             "max_bag_size": int(max_bag_size), "valid_from_train": bool(valid_from_train), "splits": out}
    audit["warnings"] = warnings_of(audit)
    return audit


def warnings_of(audit: Mapping[str, Any]) -> list[str]:
    """Plain-language warnings about what silently spoils a bag result (fields: :func:`audit_of`)."""
    splits = audit["splits"]
    out = []
    for name in ("test", "valid"):
        shared = splits.get(name, {}).get("shared_with_train", 0)
        if shared:
            bags = splits[name]["bags"]
            out.append(f"train/{name} overlap: {shared} of {bags} {name} bags ({shared / bags:.1%}) are entity "
                       "pairs that also have a training bag; distant supervision labels the pair, so the model was "
                       f"trained on their relations and {name} scores are optimistic")
    out += label_warnings(splits, audit["labels"], "bags", ("label", "labels"), "bags")
    for name in splits:
        lost = splits[name].get("unencoded_sentences", 0)
        if lost:
            out.append(f"{name}: {lost} sentences were left out of their bags because an entity covers no token "
                       "(check the entity offsets and --tokenizer)")
    return out


def _share(part: int, whole: int) -> str:
    return f"{part} ({part / whole:.1%})" if whole else str(part)


def audit_markdown(audit: Mapping[str, Any]) -> str:
    """The bag audit as Markdown: warnings; per split its sentences and bags (by ids or by text), multi-label and NA
    bags and facts; bag sizes and what ``--max-bag-size`` leaves out; the kept sentences' lengths against
    ``--max-length``; entity pairs shared between splits; bags per label."""
    splits = audit["splits"]
    names = [s for s in splits if splits[s].get("bags")]
    cap, max_length = audit["max_bag_size"], audit["max_length"]
    lines = ["# Data audit (bags)", ""]
    lines += (["## Warnings", "", *(f"- {w}" for w in audit["warnings"]), ""] if audit["warnings"]
              else ["No warnings.", ""])
    note = " (valid drawn from train)" if audit.get("valid_from_train") else ""
    lines += [f"## Bags{note}", ""]
    lines += markdown_table(
        ["split", "sentences", "bags", "keyed by ids", "keyed by text", "rejected rows", "rejected bags",
         "multi-label bags", f"{audit['negative_label']} bags", "facts"],
        [[s, i["sentences"], i["bags"], i["bags_by_ids"], i["bags_by_text"], i["rejected"], i["rejected_bags"],
          i["multi_label_bags"], _share(i["na_bags"], i["bags"]), i["facts"]] for s, i in splits.items()])
    lines += ["", "A bag is one entity pair: its (head_id, tail_id) where the rows have both ids, else its (head, "
                  f"tail) texts. Facts are (bag, relation) pairs, {audit['negative_label']} left out.", ""]
    lines += [f"## Sentences per bag (before --max-bag-size {cap})", ""]
    lines += markdown_table(
        ["split", "mean", "min", "p50", "p90", "max", "one sentence", f"bags over {cap}", "sentences left out"],
        [[s, *(splits[s]["bag_size"].get(h) for h in ("mean", "min", "p50", "p90", "max")),
          _share(splits[s]["single_sentence_bags"], splits[s]["bags"]), splits[s]["capped_bags"],
          _share(splits[s]["capped_sentences"], splits[s]["sentences"])] for s in names])
    lines += ["", f"--max-bag-size {cap}: a bag keeps at most {cap} sentences (a seeded sample; its labels still "
                  "count every sentence).", ""]
    lines += ["## Sentence length in tokens (the sentences kept)", ""]
    header = ["split", "mean", "p50", "p90", "p95", "p99", "max"]
    lines += markdown_table([*header, f"longer than {max_length} tokens"],
                            [[s, *(splits[s]["length"].get(h) for h in header[1:]), splits[s]["truncated"]]
                             for s in names])
    shared = [s for s in names if "shared_with_train" in splits[s] or "shared_with_valid" in splits[s]]
    if shared:
        lines += ["", "## Entity pairs in more than one split", ""]
        lines += markdown_table(["split", "bags", "pair also in train", "pair also in valid"],
                                [[s, splits[s]["bags"], splits[s].get("shared_with_train"),
                                  splits[s].get("shared_with_valid")] for s in shared])
    lines += ["", "## Bags per label", ""]
    lines += markdown_table(["label", *names], [[lab, *(splits[s]["labels"].get(lab, 0) for s in names)]
                                                for lab in audit["labels"]])
    return "\n".join(lines) + "\n"

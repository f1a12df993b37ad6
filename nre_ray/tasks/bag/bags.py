"""Bag building: pure functions on pandas batches, for Ray Data's ``groupby(BAG).map_groups`` (and plain pandas).

A *bag* is every sentence of one entity pair: of one (head id, tail id) pair where the row has both ids, else of one
(head, tail) text pair (:func:`bag_keys`). Its label is the set of relations of all its sentences, NA dropped when a
relation is there (OpenNRE: NA is a label; a pair labelled NA and a relation holds the relation) (:func:`bag_labels`).

Bags are capped by **bottom-k sampling**: each sentence gets a priority, a 64-bit hash of (seed, bag key, the
sentence's text, offsets, line: not its file's name nor its label, so the same file read from another folder, or
without its labels, as evaluate and predict may read it, gives the same bags in the same order); a bag keeps its
``max_bag_size`` sentences of lowest priority. That is a uniform sample without replacement, deterministic by seed,
independent of the order of the rows and of how the input is split: the bottom-k of a union is the bottom-k of the
parts' bottom-k, so a bag split across input files (or Ray blocks) and capped in each part merges
(:func:`merge_bags`) into exactly the bag capped as a whole. The label and ``total`` always count every sentence,
kept or not.

A bag frame (:data:`BAG_COLUMNS`) has one row per bag: ``bag`` (the key), ``head_id``, ``tail_id``, ``head``,
``tail`` (of the bag's first kept sentence), ``labels`` (tuple of str, sorted), ``total`` (sentences before the cap),
``size`` (kept), and ``sentences``: the kept sentences as a tuple of dicts of :data:`SENTENCE_FIELDS`, ordered by
priority. :func:`balance_shards` spreads bags over workers by sentences.
"""

from __future__ import annotations

import hashlib
import heapq
from collections.abc import Iterable, Sequence

import numpy as np
import pandas as pd

NA = "NA"
"""OpenNRE's and NYT10's name of the no-relation label."""
BAG = "bag"
SENTENCE_FIELDS = ("sentence", "head", "head_offset", "tail", "tail_offset", "relation", "file", "line")
PRIORITY_FIELDS = tuple(f for f in SENTENCE_FIELDS if f not in ("file", "relation"))
"""What a sentence's sampling priority hashes (:func:`priority`): not where its file lies, nor its label (a file
without labels, to predict on, gives the bags of the same file with them)."""
BAG_COLUMNS = ("bag", "head_id", "tail_id", "head", "tail", "labels", "total", "size", "sentences")
_SEP = "\x1f"  # the unit separator: in no entity name or id


def bag_keys(frame: pd.DataFrame) -> pd.Series:
    """The bag key of every row: ``"id" SEP head_id SEP tail_id`` where the row has both ids (columns ``head_id``,
    ``tail_id``, "" when absent), else ``"text" SEP head SEP tail``. Keys of the two kinds never meet."""
    heads, tails = frame["head"].astype(str), frame["tail"].astype(str)
    if "head_id" not in frame.columns or "tail_id" not in frame.columns:
        return ("text" + _SEP + heads + _SEP + tails).rename(BAG)
    head_ids, tail_ids = frame["head_id"].fillna("").astype(str), frame["tail_id"].fillna("").astype(str)
    has_ids = (head_ids != "") & (tail_ids != "")
    keys = ("id" + _SEP + head_ids + _SEP + tail_ids).where(has_ids, "text" + _SEP + heads + _SEP + tails)
    return keys.rename(BAG)


def with_bag_keys(frame: pd.DataFrame) -> pd.DataFrame:
    """``frame`` with a ``bag`` column (:func:`bag_keys`): the batch function that comes before the groupby."""
    out = frame.copy()
    out[BAG] = bag_keys(frame).to_numpy()
    return out


def bag_labels(relations: Iterable[str], na: str = NA) -> tuple[str, ...]:
    """The label set of a bag from its sentences' relations: sorted, NA dropped when another relation is there,
    ``(na,)`` when there is nothing else (an empty bag has no label: ``()``)."""
    found = set(relations)
    if not found:
        return ()
    relations_only = found - {na}
    return tuple(sorted(relations_only)) if relations_only else (na,)


def priority(seed: int, bag: str, sentence: dict[str, object]) -> int:
    """The 64-bit sampling priority of one sentence of ``bag`` (lower is kept first); see the module docstring."""
    text = _SEP.join([str(seed), bag, *(str(sentence.get(f, "")) for f in PRIORITY_FIELDS)])
    return int.from_bytes(hashlib.blake2b(text.encode("utf-8"), digest_size=8).digest(), "big")


def build_bags(frame: pd.DataFrame, max_bag_size: int | None = None, seed: int = 0, na: str = NA) -> pd.DataFrame:
    """The bags of the rows of ``frame`` (read rows, with or without a ``bag`` column), one row per bag, sorted by key.

    Args:
        frame: rows of :data:`SENTENCE_FIELDS` (+ ``head_id``/``tail_id`` when the data has ids); rows with a
            ``problem`` must have been dropped or reported before.
        max_bag_size: keep at most this many sentences per bag (bottom-k by :func:`priority`); None: all.
        seed: the sampling seed.
        na: the no-relation label.

    Returns:
        A bag frame of :data:`BAG_COLUMNS`. Works on any batch: one group of ``map_groups``, or a whole file.
    """
    if max_bag_size is not None and max_bag_size < 1:
        raise ValueError(f"max_bag_size must be >= 1 or None, found {max_bag_size}")
    keys = frame[BAG] if BAG in frame.columns else bag_keys(frame)
    records = frame.to_dict("records")
    groups: dict[str, list[dict[str, object]]] = {}
    for key, record in zip(keys, records, strict=True):
        groups.setdefault(key, []).append(record)
    rows = []
    for key in sorted(groups):
        members = groups[key]
        sentences = [{f: _field(m, f) for f in SENTENCE_FIELDS} for m in members]
        kept = _bottom_k([(priority(seed, key, s), s) for s in sentences], max_bag_size)
        rows.append(_bag_row(key, members[0], kept, bag_labels((m["relation"] for m in members), na), len(members)))
    return _bag_frame(rows)


def merge_bags(bags: pd.DataFrame, max_bag_size: int | None = None, seed: int = 0, na: str = NA) -> pd.DataFrame:
    """Bag frames of several parts (files, blocks) concatenated -> one row per key: the union of the labels, the
    totals summed, the kept sentences the bottom-k of the parts' (exactly what :func:`build_bags` gives on all the
    rows at once, when the parts were built with the same ``max_bag_size`` and ``seed``)."""
    rows = []
    for key, part in sorted(bags.groupby(BAG, sort=False), key=lambda kv: kv[0]):
        sentences = [s for group in part["sentences"] for s in group]
        kept = _bottom_k([(priority(seed, key, s), s) for s in sentences], max_bag_size)
        labels = bag_labels((label for group in part["labels"] for label in group), na)
        first = part.iloc[0].to_dict()
        rows.append(_bag_row(key, first, kept, labels, int(part["total"].sum())))
    return _bag_frame(rows)


def _field(record: dict[str, object], name: str) -> object:
    value = record.get(name, "")
    if name == "line":
        return int(value) if value != "" else 0  # type: ignore[call-overload]
    return "" if value is None else str(value)


def _bottom_k(scored: list[tuple[int, dict[str, object]]], k: int | None) -> list[dict[str, object]]:
    """The sentences of the ``k`` lowest priorities, ordered by priority (ties: by their fields)."""
    def order(item: tuple[int, dict[str, object]]) -> tuple[object, ...]:
        return (item[0], *(str(item[1][f]) for f in SENTENCE_FIELDS))

    chosen = sorted(scored, key=order) if k is None else heapq.nsmallest(k, scored, key=order)
    return [s for _, s in chosen]


def _bag_row(key: str, first: dict[str, object], kept: list[dict[str, object]], labels: tuple[str, ...],
             total: int) -> dict[str, object]:
    kind, head_part, tail_part = key.split(_SEP)
    return {
        "bag": key,
        "head_id": head_part if kind == "id" else "",
        "tail_id": tail_part if kind == "id" else "",
        "head": kept[0]["head"] if kept else first.get("head", ""),
        "tail": kept[0]["tail"] if kept else first.get("tail", ""),
        "labels": labels,
        "total": total,
        "size": len(kept),
        "sentences": tuple(kept),
    }


def _bag_frame(rows: list[dict[str, object]]) -> pd.DataFrame:
    frame = pd.DataFrame(rows, columns=list(BAG_COLUMNS))
    frame["total"] = frame["total"].astype(np.int64)
    frame["size"] = frame["size"].astype(np.int64)
    return frame


def balance_shards(sizes: Sequence[int], num_shards: int) -> np.ndarray:
    """The shard (0 .. num_shards-1) of each bag so that the shards hold about as many *sentences* each.

    Greedy longest-processing-time: bags from the largest down (ties: by position) each go to the shard with the
    fewest sentences so far (ties: the lowest shard). Deterministic; the largest shard exceeds the mean by at most
    the largest bag. ``sizes``: the sentences of each bag (kept, after the cap), in a fixed bag order (sorted keys).
    """
    if num_shards < 1:
        raise ValueError(f"num_shards must be >= 1, found {num_shards}")
    sizes = np.asarray(sizes, dtype=np.int64)
    shards = np.zeros(len(sizes), dtype=np.int64)
    heap = [(0, shard) for shard in range(num_shards)]
    for index in np.lexsort((np.arange(len(sizes)), -sizes)):
        load, shard = heapq.heappop(heap)
        shards[index] = shard
        heapq.heappush(heap, (load + int(sizes[index]), shard))
    return shards

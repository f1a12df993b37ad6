"""The bag task's rows: a file of sentences in (any format training reads for bags), its entity-pair bags built as
training built them, and one row per bag predicted out.

A file is read by the readers of training (:func:`.grouping.read_split_file`) and grouped into bags by the same pure
functions (:func:`~.bags.build_bags`, :func:`~.bags.merge_bags`: the checkpoint's ``--max-bag-size`` and the seed it
carries, :data:`.grouping.SEED_ASSET`, so each bag keeps the same sentences in the same order), then encoded by
:func:`.grouping.encode_bags` with the checkpoint's vocabulary and labels (``--model bert``: with the tokenizer and
entity markers the checkpoint carries under ``pretrained/``, :func:`sentence_settings`). Evaluate therefore scores a
split file exactly as training scored it, wherever the file lies now, and predict scores the same file without its
labels the same way (a sentence's sampling priority leaves out its file's name and its label).

* :func:`encode_file` (evaluate): a labelled file -> a :class:`~.bag_split.BagSplit`;
* :func:`plan_bags` (predict): the file as chunks of rows, one row per bag (its sentences as JSON in ``_nre_bag``;
  a bad sentence is a row with its problem);
* :func:`predict_rows`: per bag row, its ``head_id``, ``tail_id``, ``head``, ``tail``, ``relation`` and ``score``
  (with ``top_k``: ``top_k_labels``, ``top_k_scores``), and ``problem``;
* :func:`answer`: the good rows' prediction columns (:data:`OUTPUT_COLUMNS`), what predict writes, the pyfunc model
  returns and serve answers: one row per bag;
* :func:`request_bags`: request rows (:data:`REQUEST_COLUMNS`, one bag each) as :func:`predict_rows`' bag rows.

What a prediction is: one row per bag, as OpenNRE's bag inference gives (its pair, the relation, its score), with the
``top_k`` most probable labels beside (``--top-k``, as for sentences). ``relation`` is the most probable relation
other than NA when its probability is at least the checkpoint's validation threshold (``valid_threshold``, the
micro-F1 threshold training chose on validation and scored the test split at), else NA; ``score`` is that
relation's probability (NA's: its own column's, or one minus the best relation's where the labels have no NA). A
multi-label bag (NYT10 has them) shows its other relations in the top k; evaluate counts every (bag, relation) at or
above the threshold as predicted, so a bag's top-k entries at or above the threshold are what evaluate counted.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import numpy as np
import pandas as pd
import torch
from torch import nn

from nre_ray.data.checks import check_rows
from nre_ray.data.chunks import PREFIX, FramePlan, frame_plan
from nre_ray.data.errors import MAX_SHOWN
from nre_ray.data.vocab import Vocab
from nre_ray.run.checkpoint import PRETRAINED_DIR, CheckpointError
from nre_ray.tasks.bag import bag_scores
from nre_ray.tasks.bag.bag_split import BagDataset, BagSplit
from nre_ray.tasks.bag.bags import BAG, NA, build_bags, merge_bags, with_bag_keys
from nre_ray.tasks.bag.files import COLUMNS, detect_bag_format, nyt10_record
from nre_ray.tasks.bag.grouping import (
    SEED_ASSET,
    encode_bags,
    encode_settings,
    fail_or_skip,
    keyed_good_rows,
    read_split_file,
    stored_bags,
)
from nre_ray.tasks.base import PredictSettings
from nre_ray.tasks.sentence.rows import TOP_K_COLUMNS, top_k_lists

PAIR_COLUMNS = ("head_id", "tail_id", "head", "tail")
#: The column of :func:`bag_frame` that holds a bad sentence row's text (None on a bag's row).
SENTENCE = "sentence"
"""A bag's entity pair: the ids (empty where the file has none) and the entities' texts."""
REQUEST_COLUMNS = (*PAIR_COLUMNS, "sentences")
"""A bag as a request's row (the pyfunc model's and the server's): its pair (ids "" when there are none) and
``sentences``, a list of texts that each name the head and the tail as written (found as NYT10's reader finds
them), or its JSON text."""
OUTPUT_COLUMNS = (*PAIR_COLUMNS, "relation", "score")
"""Per bag: its pair, its relation (NA below the validation threshold) and that relation's probability; with
``--top-k`` also :data:`~nre_ray.tasks.sentence.rows.TOP_K_COLUMNS`."""
THRESHOLD = "valid_threshold"
"""The checkpoint's metric (its state's ``metrics``) that holds the validation threshold."""
EVALUATE_HINT = "Fix these rows, or pass --on-bad-rows skip to evaluate on the good rows only."


def seed_of(assets: Mapping[str, bytes] | None) -> int:
    """The seed the checkpoint's bags were sampled with (:data:`.grouping.SEED_ASSET`); CheckpointError without it."""
    data = (assets or {}).get(SEED_ASSET)
    if data is None:
        raise CheckpointError(f"this bag checkpoint lacks {SEED_ASSET} (the seed its bags were built with): it was "
                              "trained before evaluate and predict took bag models; train it again")
    return int(json.loads(data.decode("utf-8"))["seed"])


def threshold_of(trained: Mapping[str, float]) -> float:
    """The validation threshold training recorded with the checkpoint (``trained``: its state's metrics);
    CheckpointError without one."""
    if THRESHOLD not in trained:
        raise CheckpointError(f"this bag checkpoint records no {THRESHOLD} (the threshold chosen on validation)")
    return float(trained[THRESHOLD])


def sentence_settings(data: Any, vocab: Vocab, assets: Mapping[str, bytes] | None) -> dict[str, Any]:
    """How the checkpoint's training encoded a bag's sentences (:func:`.grouping.encode_settings`, ``data``: its data
    settings): a subword vocabulary (``--model bert``) with the tokenizer files the checkpoint carries under
    ``pretrained/``; CheckpointError when they are missing."""
    if not vocab.subword:
        return encode_settings(data)
    files = {k: v for k, v in (assets or {}).items() if k.startswith(f"{PRETRAINED_DIR}/")}
    if not files:
        raise CheckpointError(f"this --model bert checkpoint carries no {PRETRAINED_DIR}/ tokenizer files")
    return encode_settings(data, files)


def read_bags(path: str, fmt: str | None, columns: str | None, max_bag_size: int | None, seed: int, na: str,
              require_relation: bool = True) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The bags of the file ``path`` as :func:`.grouping.stored_bags` keeps them (in key order; at most
    ``max_bag_size`` sentences each, sampled with ``seed``; None: all), and its bad rows (``file``, ``line``,
    ``problem``, the row's text). A file that cannot be read at all is a DataError."""
    fmt = fmt or detect_bag_format(path)
    read = pd.concat(list(read_split_file(pd.DataFrame({"split": ["eval"], "path": [str(path)], "format": [fmt]}),
                                          columns, require_relation)), ignore_index=True)
    fatal = read[read["fatal"] == 1]
    fail_or_skip(fatal, len(fatal), "error", True)
    bad = read.loc[read["problem"] != "", ["file", "line", "problem", "sentence", "head", "tail", "relation"]]
    good = keyed_good_rows(read)
    if not len(good):
        return stored_bags(build_bags(good.drop(columns=["split"])), "eval").iloc[:0], bad
    return stored_bags(build_bags(good.drop(columns=["split"]), max_bag_size, seed, na), "eval"), bad


def _bag_problems(encoded: pd.DataFrame) -> pd.DataFrame:
    """The bags :func:`.grouping.encode_bags` refused, as bad rows (their first sentence's file and line)."""
    bad = encoded[encoded["problem"] != ""]
    return pd.DataFrame({"file": bad["first_file"], "line": bad["first_line"], "problem": bad["problem"]})


def _split_of(encoded: pd.DataFrame, num_classes: int, window: int) -> BagSplit:
    """The good encoded bags as a :class:`BagSplit` (in key order)."""
    writer = BagSplit.Writer(num_classes, window)
    for row in encoded[encoded["problem"] == ""].itertuples(index=False):
        writer.add(row)
    return writer.finish("eval")


# --------------------------------------------------------------------------------------------------------------------
# evaluate


def encode_file(path: str, data: Any, vocab: Vocab, labels: list[str], assets: Mapping[str, bytes] | None,
                fmt: str | None = None, columns: str | None = None, on_bad_rows: str = "error"
                ) -> tuple[BagSplit, int]:
    """The labelled bags of ``path`` encoded as the checkpoint's training encoded them (``data``: its data settings),
    and how many bad rows and bags were skipped. A bad row (as training reads it), a bag none of whose sentences
    encodes, or a bag with a relation the checkpoint does not know is a DataError naming the file and line, or with
    ``on_bad_rows="skip"`` left out and counted."""
    na = data.negative_label or NA
    bags, bad = read_bags(path, fmt, columns, data.max_bag_size, seed_of(assets), na)
    fail_or_skip(bad.head(MAX_SHOWN), len(bad), on_bad_rows, False, EVALUATE_HINT)
    encoded = encode_bags(bags, list(vocab.tokens), labels, sentence_settings(data, vocab, assets)) if len(bags) \
        else bags
    refused = _bag_problems(encoded) if len(bags) else bad.iloc[:0]
    fail_or_skip(refused.head(MAX_SHOWN), len(refused), on_bad_rows, False, EVALUATE_HINT)
    split = _split_of(encoded, len(labels), data.position_window) if len(bags) \
        else BagSplit.Writer(len(labels), data.position_window).finish("eval")
    return split, len(bad) + len(refused)


# --------------------------------------------------------------------------------------------------------------------
# predict: the input file as chunks of bag rows


def bag_frame(path: str, fmt: str | None, columns: str | None) -> pd.DataFrame:
    """Every bag of ``path`` as a row, all its sentences (the checkpoint's size cap is applied when it predicts:
    :func:`predict_rows`): ``bag`` (its key), ``sentence`` (None), ``_nre_bag`` (the bag as JSON), ``_nre_file``,
    ``_nre_line`` (of its first sentence in the file), ``_nre_problem`` (""); then one row per bad sentence row, its
    ``sentence`` (the text, for ``.rejected.csv``) and its problem."""
    bags, bad = read_bags(path, fmt, columns, None, 0, NA, require_relation=False)
    good = [{BAG: b[BAG], SENTENCE: None, PREFIX + "bag": json.dumps(b, ensure_ascii=False),
             PREFIX + "file": str(path), PREFIX + "line": min(int(x["line"]) for x in json.loads(b["sentences"])),
             PREFIX + "problem": ""}
            for b in bags.drop(columns=["split"]).to_dict(orient="records")]
    rejected = [{BAG: None, SENTENCE: r.sentence, PREFIX + "bag": None, PREFIX + "file": r.file,
                 PREFIX + "line": int(r.line), PREFIX + "problem": r.problem} for r in bad.itertuples(index=False)]
    columns_out = [BAG, SENTENCE, *(PREFIX + c for c in ("bag", "file", "line", "problem"))]
    return pd.DataFrame(good + rejected, columns=columns_out)


def plan_bags(path: str, fmt: str | None, columns: str | None, chunk_rows: int) -> FramePlan:
    """``path`` as a :class:`~nre_ray.data.chunks.FramePlan` of :func:`bag_frame`'s rows, ``chunk_rows`` bags a chunk
    (the file is read whole: bags need all of a pair's sentences); a file that cannot be read is a DataError now."""
    return frame_plan(str(path), bag_frame(path, fmt, columns), chunk_rows)


# --------------------------------------------------------------------------------------------------------------------
# requests: one bag a row


def _texts(value: Any) -> list[str] | None:
    """A request's ``sentences`` as a list of texts (a list, an array, or its JSON text), or None."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            return None
    if isinstance(value, np.ndarray):
        value = value.tolist()
    if not isinstance(value, list) or not value or not all(isinstance(t, str) for t in value):
        return None
    return value


def request_bag(k: int, row: Mapping[str, Any]) -> tuple[str | None, str]:
    """The request row ``row`` (the ``k``-th, 0-based) as :func:`bag_frame`'s bag JSON, and "" or its problem: one
    bag whatever its pair's rows elsewhere; each sentence's entity offsets found as NYT10's reader finds them
    (:func:`.files.nyt10_record`) and checked as training checks rows."""
    texts = _texts(row.get("sentences"))
    if texts is None:
        return None, "sentences: a non-empty list of texts, each naming the head and the tail"
    pair = [str(row.get(c) if row.get(c) is not None else "") for c in PAIR_COLUMNS]
    records = []
    for i, text in enumerate(texts):
        values, problem = nyt10_record([*pair, NA, text])  # a relation the rows' checks accept, never asked
        records.append({**values, "file": f"row {k + 1}", "line": i + 1, "problem": problem})
    checked = check_rows(pd.DataFrame(records).reindex(columns=list(COLUMNS), fill_value=""))
    found = [f"sentence {i + 1}: {p}" for i, p in enumerate(checked["problem"]) if p]
    if found:
        return None, "sentences: " + "; ".join(found)
    bag = stored_bags(build_bags(with_bag_keys(checked.drop(columns=["problem"]))), "request").iloc[0].to_dict()
    return json.dumps(bag, ensure_ascii=False), ""


def request_bags(frame: pd.DataFrame) -> pd.DataFrame:
    """Request rows (:data:`REQUEST_COLUMNS`) as the canonical bag rows :func:`predict_rows` takes (``bag``,
    ``problem``, positional)."""
    made = [request_bag(k, row) for k, row in enumerate(frame.to_dict(orient="records"))]
    return pd.DataFrame({"bag": [b for b, _ in made], "problem": [p for _, p in made]})


# --------------------------------------------------------------------------------------------------------------------
# predicting


@torch.inference_mode()
def bag_probabilities(model: nn.Module, split: BagSplit, device: torch.device, batch_size: int) -> np.ndarray:
    """(B, C) float32: each bag's relation probabilities (the aggregator's scores), ``batch_size`` bags a batch."""
    dataset = BagDataset(split)
    out = [np.zeros((0, split.num_classes), dtype=np.float32)]
    for start in range(0, len(split), batch_size):
        batch = {k: v.to(device) for k, v in dataset.__getitems__(range(start, min(len(split), start + batch_size)))
                 .items()}
        out.append(model.scores(batch).float().cpu().numpy())  # (b, C)
    return np.concatenate(out)


def bag_answers(probs: np.ndarray, labels: list[str], na: int | None, threshold: float
                ) -> tuple[np.ndarray, np.ndarray]:
    """Per bag (a row of ``probs`` (B, C)): its relation, the most probable one other than column ``na`` when its
    probability is at least ``threshold`` (ties: label order), else NA (``labels[na]``, or :data:`~.bags.NA` where
    the labels have none); and that relation's probability (NA's: column ``na``'s, or one minus the best relation's).
    Two (B,) arrays: object (the names) and float64."""
    others = probs.astype(np.float64).copy()
    if na is not None:
        others[:, na] = -1.0
    best = others.argmax(axis=1) if len(probs) else np.zeros(0, dtype=np.int64)
    top = others[np.arange(len(best)), best]
    chosen = top >= threshold
    none = probs[:, na].astype(np.float64) if na is not None else 1.0 - top
    names = np.where(chosen, np.asarray(labels, dtype=object)[best], labels[na] if na is not None else NA)
    return names.astype(object), np.where(chosen, top, none)


def predict_rows(model: nn.Module, frame: pd.DataFrame, settings: PredictSettings, top_k: int = 0) -> pd.DataFrame:
    """Per canonical bag row (``bag``: :func:`bag_frame`'s JSON, ``problem``; or a request row,
    :data:`REQUEST_COLUMNS`): the pair (:data:`PAIR_COLUMNS`), ``relation`` and ``score`` (:func:`bag_answers` at
    the checkpoint's validation threshold), with ``top_k > 0`` ``top_k_labels`` / ``top_k_scores`` (lists, best
    first), and ``problem`` ("" for good rows; a bag none of whose sentences encodes gets one), positional. Rows of
    one entity pair are one bag (their sentences together). The checkpoint's
    ``--max-bag-size`` sample is drawn here, with its seed."""
    data = settings.config.data
    if "bag" not in frame.columns:
        frame = request_bags(frame)
    frame = frame.reset_index(drop=True)
    problems = frame["problem"].fillna("").astype(str).to_numpy(dtype=object)
    good = np.flatnonzero(problems == "")
    columns = output_columns(top_k)
    out = {c: np.full(len(frame), None, dtype=object) for c in columns}
    out["score"] = np.full(len(frame), np.nan)
    if len(good):
        bags = pd.DataFrame([json.loads(frame["bag"][k]) for k in good])
        bags["sentences"] = [json.loads(s) for s in bags["sentences"]]
        bags["labels"] = [()] * len(bags)  # what the model is asked, not what the file says
        capped = merge_bags(bags.drop(columns=["split"], errors="ignore"), data.max_bag_size, seed_of(settings.assets))
        encoded = encode_bags(stored_bags(capped, "predict"), list(settings.vocab.tokens), settings.labels,
                              sentence_settings(data, settings.vocab, settings.assets))
        rows_of: dict[str, list[int]] = {}
        for key, k in zip(bags[BAG], good, strict=True):
            rows_of.setdefault(key, []).append(k)
        for key, problem in zip(encoded[BAG], encoded["problem"], strict=True):
            problems[rows_of[key]] = problem
        split = _split_of(encoded, len(settings.labels), data.position_window)
        probs = bag_probabilities(model, split, settings.device, settings.batch_size)
        na = bag_scores.na_index(settings.labels, data.negative_label)
        found = dict(zip(("relation", "score"), bag_answers(probs, settings.labels, na,
                                                            threshold_of(settings.metrics)), strict=True))
        if top_k > 0:
            found.update(zip(TOP_K_COLUMNS, top_k_lists(probs, settings.labels, top_k), strict=True))
        for b, key in enumerate(split.info["keys"]):
            for k in rows_of[key]:
                for column in PAIR_COLUMNS:
                    out[column][k] = split.info[column][b]
                for column, values in found.items():
                    out[column][k] = values[b]
    return pd.DataFrame({**out, "problem": problems})


def output_columns(top_k: int = 0) -> list[str]:
    """:data:`OUTPUT_COLUMNS`, and with ``top_k > 0`` the top-k lists."""
    return [*OUTPUT_COLUMNS, *(TOP_K_COLUMNS if top_k > 0 else ())]


def answer(frame: pd.DataFrame) -> pd.DataFrame:
    """The prediction columns of rows that hold :func:`predict_rows`' (one row per bag; the input's other columns,
    its sentences among them, are left out)."""
    columns = [c for c in (*OUTPUT_COLUMNS, *TOP_K_COLUMNS) if c in frame.columns]
    return frame[columns].astype({"score": "float64"})

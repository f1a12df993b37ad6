"""Subword encoding for pretrained transformer encoders (``--model bert``): entity markers, offsets, truncation.

The recipe of Baldini Soares et al. (2019), "entity markers": the head and the tail are wrapped in marker tokens that
are added to the model's tokenizer as special tokens, ``[E1] Acme [/E1] was founded by [E2] Ann [/E2]``, or with
``--typed-markers`` and ``head_type``/``tail_type`` columns ``<e1:org> Acme </e1:org> ... <e2:person> Ann
</e2:person>`` (a type not seen in the training split falls back to the untyped markers). The classifier reads the
encoder's states at the two start markers.

Pure functions, written once and run by Ray Data (training) and by the predictor (new rows):

* :func:`insert_markers` puts the markers into the sentence by character offsets (never by searching for the
  entity's text), for head before or after tail, adjacent, nested and overlapping entities.
* :func:`encode_rows_with` tokenizes marked sentences with the model's *fast* tokenizer and finds each marker's
  subword position through the offset mapping; :func:`keep_window` truncates to ``max_length`` subwords, keeping
  both entities (a window around them, or when they are too far apart one piece around each) and the model's
  special tokens (``[CLS]``/``[SEP]``, ``<s>``/``</s>``).
* :func:`encode_subword_batch` wraps it as a pandas batch function for Ray Data ``map_batches``; the tokenizer is
  loaded once per worker process.

A tokenizer folder for training is made once, on the driver, by :func:`build_tokenizer`: the pretrained tokenizer plus
the marker tokens, and the pretrained model's ``config.json`` with its vocabulary size set to the enlarged tokenizer.
The same folder travels inside every checkpoint (``pretrained/``), so a checkpoint predicts with no access to the
original model path.

Output columns per row (the ones :meth:`nre_ray.data.batches.EncodedSplit.from_frame` stores flat, unpadded):
``token_ids`` (input ids with the special tokens), ``length``, ``head_span``/``tail_span`` (``[start marker, end
marker + 1)`` in ``token_ids``: ``span[0]`` is the start marker the encoder pools) and ``label``. The relative
positions and PCNN pieces follow from the spans: batches derive them (:func:`nre_ray.data.batches.derived_features`).
"""

from __future__ import annotations

import atexit
import hashlib
import shutil
import tempfile
from collections.abc import Mapping, Sequence
from functools import lru_cache
from pathlib import Path
from typing import Any, Self

import numpy as np
import pandas as pd

from nre_ray import storage
from nre_ray.config import ConfigError
from nre_ray.core.pretrained_io import (
    WEIGHT_SUFFIXES,
    from_pretrained,
    max_positions,
    pretrained_copy,
    quiet_transformers,
)
from nre_ray.data.batches import label_ids
from nre_ray.data.markers import MARKERS, clean_type, insert_markers, marker_vocabulary, typed_markers
from nre_ray.data.tokenize import Span, truncation_window
from nre_ray.data.vocab import Vocab

# --------------------------------------------------------------------------------------------------------------------
# the tokenizer


def load_pretrained_tokenizer(name: str) -> Any:
    """``AutoTokenizer.from_pretrained(name)``, required to be a fast tokenizer; ConfigError if it cannot be had."""
    from transformers import AutoTokenizer

    tokenizer = from_pretrained(AutoTokenizer.from_pretrained, name, "tokenizer")
    if not getattr(tokenizer, "is_fast", False):
        raise ConfigError(f"--pretrained {name}: the tokenizer ({type(tokenizer).__name__}) is not a fast "
                          "tokenizer; entity offsets need one (a folder with tokenizer.json)")
    return tokenizer


def build_tokenizer(pretrained: str, folder: str | Path, markers: Sequence[str], max_length: int) -> Path:
    """Save the pretrained tokenizer plus ``markers`` (special tokens) and the model's ``config.json`` (its
    ``vocab_size`` set to the enlarged tokenizer's length, the size the model's embeddings are resized to) into
    ``folder``; return it. Done once, on the driver."""
    from transformers import AddedToken, AutoConfig

    tokenizer = load_pretrained_tokenizer(pretrained)
    config = from_pretrained(AutoConfig.from_pretrained, pretrained, "model configuration")
    limit = max_positions(config)
    if limit and max_length > limit:
        raise ConfigError(f"--max-length {max_length} exceeds the {limit} positions {pretrained} was trained with; "
                          f"pass --max-length {limit} or less")
    new = [AddedToken(m, special=True, lstrip=True, rstrip=False, normalized=False) for m in markers]
    tokenizer.add_special_tokens({"additional_special_tokens": new}, replace_extra_special_tokens=False)
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    tokenizer.save_pretrained(str(folder))
    config.vocab_size = len(tokenizer)
    config.save_pretrained(str(folder))
    return folder


def tokenizer_vocab(pretrained: str, folder: str | Path, max_length: int, head_types: Sequence[str] = (),
                    tail_types: Sequence[str] = ()) -> tuple[Vocab, str, int]:
    """A preprocessing cache's tokenizer for ``--model bert`` (the sentence task's and the bag task's): ``folder``
    emptied, then :func:`build_tokenizer` with the entity markers (typed ones for ``head_types``/``tail_types``,
    :func:`marker_vocabulary`). Returns (the vocabulary: the tokenizer's tokens in id order, the folder, the
    unknown token's id or -1)."""
    shutil.rmtree(folder, ignore_errors=True)
    build_tokenizer(pretrained, folder, marker_vocabulary(head_types, tail_types), max_length)
    tok = MarkerTokenizer.load(folder)
    unk = tok.tokenizer.unk_token_id
    return Vocab(tok.vocabulary(), subword=True), str(folder), -1 if unk is None else unk



class SubwordTokenizer:
    """A fast tokenizer and what encoding needs of it: the special tokens around a sequence (``prefix``/``suffix``:
    ``[CLS]``/``[SEP]``, ``<s>``/``</s>``), the padding id and the vocabulary."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        with_special = tokenizer("x", add_special_tokens=True)["input_ids"]
        plain = tokenizer("x", add_special_tokens=False)["input_ids"]
        at = next((i for i in range(len(with_special) - len(plain) + 1)
                   if with_special[i:i + len(plain)] == plain), 0)
        self.prefix: list[int] = list(with_special[:at])
        self.suffix: list[int] = list(with_special[at + len(plain):])
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0

    @classmethod
    def load(cls, folder: str | Path) -> Self:
        """Load a folder written by :func:`build_tokenizer` (or a checkpoint's ``pretrained/``)."""
        quiet_transformers()
        from transformers import AutoTokenizer

        return cls(AutoTokenizer.from_pretrained(str(folder)))

    def vocabulary(self) -> list[str]:
        """The tokens in id order (``len`` is the embedding size the model needs)."""
        return list(self.tokenizer.convert_ids_to_tokens(list(range(len(self.tokenizer)))))


class MarkerTokenizer(SubwordTokenizer):
    """A :class:`SubwordTokenizer` with the marker tokens added: the marker ids and the known marker strings."""

    def __init__(self, tokenizer: Any) -> None:
        super().__init__(tokenizer)
        self.known = set(tokenizer.get_added_vocab())
        missing = [m for m in MARKERS if m not in self.known]
        if missing:
            raise ValueError(f"the tokenizer has no entity markers {missing}: build it with build_tokenizer()")

    def markers_for(self, head_type: object, tail_type: object, typed: bool) -> tuple[str, str, str, str]:
        """The markers of one row: typed ones when asked for and known to the tokenizer, else the untyped ones."""
        if not typed:
            return MARKERS
        chosen = typed_markers(clean_type(head_type), clean_type(tail_type))
        head = chosen[:2] if chosen[0] in self.known else MARKERS[:2]
        tail = chosen[2:] if chosen[2] in self.known else MARKERS[2:]
        return (*head, *tail)


@lru_cache(maxsize=4)
def cached_tokenizer(folder: str) -> MarkerTokenizer:
    """:meth:`MarkerTokenizer.load`, once per process and folder."""
    return MarkerTokenizer.load(folder)


# --------------------------------------------------------------------------------------------------------------------
# encoding


def keep_window(length: int, first: Span, second: Span, budget: int) -> list[Span]:
    """Pieces ``[start, end)`` of a sequence of ``length`` tokens that fit in ``budget`` tokens and keep both entity
    spans (``first``/``second``, markers included; either order).

    Both entities fit: one window centred on them (:func:`~nre_ray.data.tokenize.truncation_window`). Too far
    apart: one piece from the start of each (the later one gets at most half the budget, the earlier one the rest),
    so both start markers, the states the classifier reads, are always kept.
    """
    if length <= budget:
        return [(0, length)]
    a, b = sorted((first, second))
    if max(a[1], b[1]) - a[0] <= budget:
        return [truncation_window(length, a, b, budget)]
    second_budget = min(b[1] - b[0], budget // 2)
    first_budget = budget - second_budget
    if b[0] < a[0] + first_budget:  # the second starts inside the first piece (nested or overlapping)
        return [(a[0], min(length, a[0] + budget))]
    return [(a[0], a[0] + first_budget), (b[0], min(length, b[0] + second_budget))]


def _locate(ids: Sequence[int], offsets: Sequence[tuple[int, int]], marker_id: int, char: int) -> int:
    """Index of the token with id ``marker_id`` whose offsets cover character ``char`` (-1 if there is none)."""
    for i, (token, (lo, hi)) in enumerate(zip(ids, offsets, strict=True)):
        if token == marker_id and lo <= char < hi:
            return i
    return -1


def encode_rows_with(tok: MarkerTokenizer, batch: pd.DataFrame, max_length: int, typed: bool,
                     labels: Sequence[str] | None) -> pd.DataFrame:
    """Encode checked rows (``sentence``, ``head``, ``head_offset``, ``tail``, ``tail_offset``, ``problem``; optional
    ``head_type``/``tail_type``/``relation``) with ``tok``. Rows with a ``problem`` are left empty (length 0).

    Adds the columns listed in the module docstring; ``label`` is the class id of ``relation`` among ``labels`` (-1
    without labels, without a ``relation`` column, or for an unknown relation).
    """
    n = len(batch)
    problems = batch["problem"].tolist() if "problem" in batch.columns else [""] * n
    head_types = batch["head_type"].tolist() if "head_type" in batch.columns else [""] * n
    tail_types = batch["tail_type"].tolist() if "tail_type" in batch.columns else [""] * n
    good = [i for i in range(n) if not problems[i]]
    marked, markers = [], []
    sentences, heads, tails = batch["sentence"].tolist(), batch["head"].tolist(), batch["tail"].tolist()
    head_offsets, tail_offsets = batch["head_offset"].tolist(), batch["tail_offset"].tolist()
    for i in good:
        ho, to = int(head_offsets[i]), int(tail_offsets[i])
        row_markers = tok.markers_for(head_types[i], tail_types[i], typed)
        markers.append(row_markers)
        marked.append(insert_markers(sentences[i], (ho, ho + len(heads[i])), (to, to + len(tails[i])), row_markers))
    encoded = tok.tokenizer([m.text for m in marked], add_special_tokens=False, return_offsets_mapping=True,
                            verbose=False) if marked else {"input_ids": [], "offset_mapping": []}
    budget = max_length - len(tok.prefix) - len(tok.suffix)
    cols: dict[str, list] = {k: [[] for _ in range(n)] for k in ("token_ids", "head_span", "tail_span")}
    cols["length"] = [0] * n
    cols["full_length"] = [0] * n  # before the window: what an audit counts as too long
    problems = list(problems)
    for j, i in enumerate(good):
        ids, offsets = encoded["input_ids"][j], encoded["offset_mapping"][j]
        ids_of = tok.tokenizer.convert_tokens_to_ids(list(markers[j]))
        where = [_locate(ids, offsets, mid, char) for mid, char in zip(ids_of, marked[j].positions, strict=True)]
        if min(where) < 0:
            problems[i] = "sentence: an entity marker was lost in tokenization (unexpected; please report it)"
            continue
        head, tail = (where[0], where[1] + 1), (where[2], where[3] + 1)
        pieces = keep_window(len(ids), head, tail, budget)
        kept = [k for lo, hi in pieces for k in range(lo, hi)]
        new_index = {old: new + len(tok.prefix) for new, old in enumerate(kept)}
        token_ids = tok.prefix + [ids[k] for k in kept] + tok.suffix
        spans = []
        for start, end in (head, tail):
            s = new_index[start]
            e = new_index[end - 1] + 1 if end - 1 in new_index else _piece_end(pieces, start) + len(tok.prefix)
            spans.append((s, e))
        length = len(token_ids)
        cols["token_ids"][i] = token_ids
        cols["length"][i] = length
        cols["full_length"][i] = len(ids) + len(tok.prefix) + len(tok.suffix)
        cols["head_span"][i], cols["tail_span"][i] = list(spans[0]), list(spans[1])
    out = batch.copy()
    for key, values in cols.items():
        out[key] = values
    out["problem"] = problems
    out["label"] = label_ids(out["relation"], list(labels)) if labels is not None and "relation" in out.columns \
        else -1
    return out


def _piece_end(pieces: list[Span], start: int) -> int:
    """Position (in the kept sequence, before the prefix) of the end of the piece that holds ``start``."""
    before = 0
    for lo, hi in pieces:
        if lo <= start < hi:
            return before + hi - lo
        before += hi - lo
    return before


def encode_subword_batch(batch: pd.DataFrame, tokenizer_dir: str, max_length: int, typed: bool,
                         labels: list[str] | None) -> pd.DataFrame:
    """:func:`encode_rows_with` for Ray Data ``map_batches`` (pandas batches): the tokenizer in ``tokenizer_dir``
    (a folder this process can read) is loaded once per process."""
    return encode_rows_with(cached_tokenizer(str(tokenizer_dir)), batch, max_length, typed, labels)


def entity_types(frame: pd.DataFrame) -> tuple[list[str], list[str]]:
    """The distinct non-empty head and tail types of ``frame`` (for :func:`marker_vocabulary`)."""
    def distinct(column: str) -> list[str]:
        if column not in frame.columns:
            return []
        return sorted({t for t in (clean_type(v) for v in np.asarray(frame[column], dtype=object)) if t})

    return distinct("head_type"), distinct("tail_type")


def fingerprint(pretrained: str) -> str:
    """What identifies ``--pretrained``'s tokenizer for the preprocessing cache: a hash of a local folder's small files
    (tokenizer, vocabulary, config; not the weights), or the hub name. A folder in an object store is hashed from
    its local copy without the weights (the one the tokenizer is then built from), so the same files give the same
    fingerprint wherever they are."""
    path = pretrained_copy(pretrained, weights=False) if storage.is_uri(pretrained) else Path(pretrained).expanduser()
    if not path.is_dir():
        return pretrained
    digest = hashlib.sha256()
    for file in sorted(path.iterdir()):
        if file.is_file() and file.suffix not in WEIGHT_SUFFIXES and file.stat().st_size < 64 << 20:
            digest.update(file.name.encode())
            digest.update(file.read_bytes())
    return f"sha256:{digest.hexdigest()[:20]}"


_ASSET_FOLDERS: dict[str, str] = {}


def assets_folder(assets: Mapping[str, bytes], prefix: str = "pretrained/") -> str:
    """A local folder holding the ``assets`` under ``prefix`` (a checkpoint's tokenizer and config, kept in memory
    by :class:`nre_ray.run.checkpoint.LoadedCheckpoint`), written once per process and content; removed at exit."""
    files = {name[len(prefix):]: data for name, data in sorted(assets.items()) if name.startswith(prefix)}
    if not files:
        raise ValueError(f"no {prefix} files: this checkpoint carries no pretrained tokenizer")
    digest = hashlib.sha256()
    for name, data in files.items():
        digest.update(name.encode() + b"\0" + hashlib.sha256(data).digest())
    key = digest.hexdigest()
    if key not in _ASSET_FOLDERS or not Path(_ASSET_FOLDERS[key]).is_dir():
        folder = tempfile.mkdtemp(prefix="nre_ray_tokenizer_")
        atexit.register(shutil.rmtree, folder, ignore_errors=True)
        for name, data in files.items():
            (Path(folder) / name).parent.mkdir(parents=True, exist_ok=True)
            (Path(folder) / name).write_bytes(data)
        _ASSET_FOLDERS[key] = folder
    return _ASSET_FOLDERS[key]

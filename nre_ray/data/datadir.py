"""Finding the split files and the label file of a data directory (local, or a folder in an object store)."""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from pathlib import Path, PurePosixPath

from nre_ray import storage
from nre_ray.data.errors import DataError, Problem
from nre_ray.data.formats.common import HINT_PATH, Source, list_names, storage_problem

DATA_EXTENSIONS = (".csv", ".tsv", ".tab", ".jsonl", ".ndjson", ".json", ".parquet", ".pq", ".txt")
LABEL_FILES = ("relation.txt", "relation.csv", "rel2id.json")


_SPLIT_NAMES = {
    "train": re.compile(r"^(?:.*[_.-])?train(?:[_-]file)?$"),
    "valid": re.compile(r"^(?:.*[_.-])?(?:valid|validation|dev|val)$"),
    "test": re.compile(r"^(?:.*[_.-])?test(?:[_-]file(?:[_-]full)?)?$"),
}
_PLAIN_NAMES = {"train", "valid", "validation", "dev", "val", "test"}


def find_data_files(data_dir: Source) -> dict[str, Source]:
    """Find the split files and the label file of a data directory.

    Keys: ``train`` (required), ``valid`` (``valid.*``, ``dev.*``, ``val.*``), ``test``, ``labels``
    (``relation.txt`` / ``relation.csv`` / ``rel2id.json`` / ``*_rel2id.json``); absent keys mean not found. Any
    supported data extension is accepted (``train.csv/.tsv/.jsonl/.json/.parquet/.txt`` ...), as are prefixed names
    (``semeval_train.txt``) and SemEval's ``TRAIN_FILE.TXT`` / ``TEST_FILE_FULL.TXT``. Raises :class:`DataError` when
    the directory does not exist, has no training file, or has two candidates for one split.

    A URI (``s3://bucket/data``) is listed in its store: the files found are URIs (str), local ones :class:`Path`.
    """
    if storage.is_uri(data_dir):
        try:
            return _find_data_files(os.fspath(data_dir), storage.credentials_hint(os.fspath(data_dir)))
        except storage.StorageError as err:
            raise storage_problem(err) from None
    return _find_data_files(Path(data_dir), HINT_PATH)


def _find_data_files(data_dir: Source, hint: str) -> dict[str, Source]:
    if not storage.is_dir(data_dir):
        message = "is a file (expected a data directory)" if storage.exists(data_dir) else "data directory not found"
        raise DataError([Problem(str(data_dir), None, None, message)], hint=hint)
    listed: list[Source] = [Path(p) for p in storage.list_files(data_dir)] if isinstance(data_dir, Path) else \
        list(storage.list_files(data_dir))
    files = sorted(p for p in listed if not _name(p).startswith("."))
    found: dict[str, Source] = {}
    for split, pattern in _SPLIT_NAMES.items():
        candidates = [p for p in files if _suffix(p) in DATA_EXTENSIONS and pattern.match(_stem(p))]
        chosen = _choose(data_dir, split, candidates)
        if chosen is not None:
            found[split] = chosen
    if "train" not in found:
        held = list_names([_name(p) for p in files]) if files else "nothing (the directory is empty)"
        raise DataError([Problem(str(data_dir), None, None,
                                 f"no training file (expected train.csv, train.tsv, train.jsonl, train.json, "
                                 f"train.parquet or train.txt; the directory holds {held})")],
                        hint="Name the training file train.<ext>, or pass --train FILE.")
    labels = _label_file(files)
    if labels is not None:
        found["labels"] = labels
    return found


def _name(path: Source) -> str:
    return PurePosixPath(str(path)).name


def _suffix(path: Source) -> str:
    return PurePosixPath(str(path)).suffix.lower()


def _stem(path: Source) -> str:
    return PurePosixPath(str(path)).stem.lower()


def _choose(data_dir: Source, split: str, candidates: list[Source]) -> Source | None:
    if not candidates:
        return None

    def rank(path: Source) -> tuple[int, int]:
        stem = _stem(path)
        return (0 if stem in _PLAIN_NAMES else 1, 0 if stem.endswith("full") else 1)

    best = min(rank(p) for p in candidates)
    chosen = [p for p in candidates if rank(p) == best]
    if len(chosen) > 1:
        raise DataError([Problem(str(data_dir), None, None,
                                 f"more than one {split} file ({', '.join(_name(p) for p in chosen)})")],
                        hint=f"Keep one {split} file in the directory, or name it with --{split} FILE.")
    return chosen[0]


def _label_file(files: Sequence[Source]) -> Source | None:
    by_name = {_name(p).lower(): p for p in files}
    for name in LABEL_FILES:
        if name in by_name:
            return by_name[name]
    prefixed = [p for p in files if _name(p).lower().endswith("_rel2id.json")]
    return prefixed[0] if prefixed else None

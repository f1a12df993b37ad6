"""Pretrained word vectors (word2vec / GloVe / fastText text format) copied into a model's word embedding.

The format is one word per line followed by its vector, separated by spaces, optionally gzipped (``.gz``), with an
optional first line ``COUNT DIM`` (word2vec and fastText write it, GloVe does not). Words that contain spaces (a few
GloVe entries) are read correctly: the vector is the last DIM fields of the line.

The file may be a URI (``s3://bucket/vectors/glove.txt.gz``, see :mod:`nre_ray.storage`): it is streamed from its
store, by the driver (the dimension check) and by every worker, never copied to disk.
"""

from __future__ import annotations

import gzip
import io
import os
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import IO

import torch
from torch import nn

from nre_ray import storage
from nre_ray.core.special_tokens import PAD_ID
from nre_ray.models.embedding import WordPositionEmbedding


def _open(path: Path | str) -> IO[str]:
    if storage.is_uri(path):
        try:
            stream = storage.open_input(path, compression="gzip" if os.fspath(path).endswith(".gz") else None)
        except storage.StorageError as err:
            reason = "word vector file not found" if err.kind == storage.NOT_FOUND else err.reason
            raise ValueError(f"{path}: {reason} (--embeddings). {err.hint}") from None
        return io.TextIOWrapper(stream, encoding="utf-8", errors="replace")
    path = Path(path)
    if path.suffix == ".gz":
        return gzip.open(path, "rt", encoding="utf-8", errors="replace")
    return path.open(encoding="utf-8", errors="replace")


def _is_header(fields: list[str]) -> bool:
    return len(fields) == 2 and all(f.isdigit() for f in fields)


def _lines(path: Path | str) -> Iterator[tuple[int, list[str]]]:
    """(line number, fields) of each non-empty line; a gzip or decoding problem names the file."""
    try:
        with _open(path) as handle:
            for lineno, line in enumerate(handle, start=1):
                fields = [f for f in line.rstrip().split(" ") if f]
                if fields:
                    yield lineno, fields
    except FileNotFoundError:
        raise ValueError(f"{path}: word vector file not found (--embeddings)") from None
    except (OSError, EOFError) as err:  # gzip.BadGzipFile is an OSError
        raise ValueError(f"{path}: cannot read word vectors: {err}") from None


def vector_dim(path: str | Path) -> int:
    """The dimension of the vectors in ``path`` (a file or a URI), from its header or its first vector line."""
    path = path if storage.is_uri(path) else Path(path)
    for _, fields in _lines(path):
        return int(fields[1]) if _is_header(fields) else len(fields) - 1
    raise ValueError(f"{path}: no word vectors in this file (--embeddings)")


def check_dim(path: str | Path, word_dim: int) -> None:
    """Raise ValueError if the vectors in ``path`` do not have ``word_dim`` values (cheap: reads the first line)."""
    dim = vector_dim(path)
    if dim != word_dim:
        raise ValueError(f"{path}: line 1: the word vectors have dimension {dim}, but --word-dim is {word_dim}; "
                         f"pass --word-dim {dim} or use vectors of dimension {word_dim}")


def load_word_vectors(path: str | Path, vocab: Mapping[str, int] | Sequence[str], embedding: nn.Embedding,
                      lowercase: bool = False) -> int:
    """Copy the vectors of vocabulary words from ``path`` into the rows of ``embedding``; return the hit count.

    ``vocab``: ``{token: row}`` (a :class:`~nre_ray.data.vocab.Vocab`'s ``index``) or the token list (row ``i`` is
    token ``i``). With ``lowercase`` (the vocabulary was built from lower-cased text) words match case-insensitively;
    an exact lower-case entry wins over a capitalised one, otherwise the first entry in the file wins. Row 0
    (padding) is never written and stays zero. Rows of words without a vector keep their initialisation. A vector of
    the wrong dimension is a ValueError naming the file, the line and both dimensions. ``path``: a file or a URI.
    """
    path = path if storage.is_uri(path) else Path(path)
    index = vocab if isinstance(vocab, Mapping) else {t: i for i, t in enumerate(vocab)}
    dim = embedding.embedding_dim
    found: dict[int, tuple[bool, list[float]]] = {}  # row -> (entry spelled exactly like the token, vector)
    file_dim: int | None = None
    for lineno, fields in _lines(path):
        if file_dim is None:
            file_dim = int(fields[1]) if _is_header(fields) else len(fields) - 1
            if file_dim != dim:
                raise ValueError(f"{path}: line {lineno}: the word vectors have dimension {file_dim}, but --word-dim "
                                 f"is {dim}; pass --word-dim {file_dim} or use vectors of dimension {dim}")
            if _is_header(fields):
                continue
        if len(fields) < dim + 1:
            raise ValueError(f"{path}: line {lineno}: {len(fields) - 1} values where the file's vectors have "
                             f"dimension {dim} (a truncated or malformed line)")
        word = " ".join(fields[:-dim])
        key = word.lower() if lowercase else word
        row = index.get(key)
        is_exact = word == key
        if row is None or row == PAD_ID or (row in found and (found[row][0] or not is_exact)):
            continue  # not in the vocabulary, padding, or already filled by an entry at least as good
        try:
            found[row] = (is_exact, [float(v) for v in fields[-dim:]])
        except ValueError:
            raise ValueError(f"{path}: line {lineno}: the vector of {word!r} has a value that is not a number "
                             "(binary word2vec files are not supported: convert them to text)") from None
    if found:
        weight = embedding.weight
        rows = torch.tensor(list(found), device=weight.device)
        with torch.no_grad():
            weight[rows] = torch.tensor([v for _, v in found.values()], dtype=weight.dtype, device=weight.device)
    return len(found)


def word_embedding(model: nn.Module) -> nn.Embedding:
    """The word table of the model's :class:`WordPositionEmbedding` (unwrapping DDP is the caller's job)."""
    for module in model.modules():
        if isinstance(module, WordPositionEmbedding):
            return module.word
    raise ValueError(f"--embeddings: the model {type(model).__name__} has no word embedding to load vectors into")

"""Documents in a pretrained encoder's subwords (``--model bert --pretrained``), as ATLOP reads them: each word cut
into the tokenizer's pieces, ATLOP's ``*`` (:data:`.encoding.MARKER`) before and after every mention, the model's
special tokens at the ends (``[CLS]`` ... ``[SEP]``), each mention read at its start marker's subword
(:func:`.encoding.encode_document` does the marking; this module gives it the pieces and ids).

* :func:`build_document_tokenizer` (driver, once per cache): the pretrained tokenizer and the model's
  ``config.json`` saved in a folder (:func:`nre_ray.data.subword.build_tokenizer`), ``*`` added only where the
  vocabulary lacks it as one token. Every checkpoint carries that folder (``pretrained/``), so evaluate, predict and
  serve encode new documents with the same tokenizer after the original model folder is gone.
* :func:`document_tokenizer`: the tokenizer of those files (``{"pretrained/...": bytes}``, as the encoding context
  and a checkpoint's assets hold them), loaded once per process (:func:`nre_ray.data.subword.assets_folder`).

Documents are not truncated: one longer than the encoder's positions is read in overlapping windows by the model
(:func:`.atlop.encode_long`), ``[CLS]``/``[SEP]`` repeated in each.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from functools import lru_cache
from pathlib import Path

from nre_ray.core.pretrained_io import max_positions
from nre_ray.data.subword import SubwordTokenizer, assets_folder, build_tokenizer, load_pretrained_tokenizer
from nre_ray.tasks.document.encoding import MARKER
from nre_ray.tasks.document.records import Document


class DocumentTokenizer(SubwordTokenizer):
    """A fast tokenizer that cuts a document's words into pieces (:meth:`pieces`) and turns pieces and the marker
    into ids (:meth:`to_ids`); ``prefix``/``suffix`` are the special tokens at the ends."""

    def pieces(self, doc: Document) -> Callable[[str], Sequence[str]]:
        """Word -> its pieces, for the words of ``doc`` (all of them cut in one call of the tokenizer). A word the
        tokenizer drops whole (a control character) gets no pieces (:func:`.encoding.mark_tokens` keeps it as one
        unknown token)."""
        words = sorted({w for sentence in doc.sentences for w in sentence})
        ids = self.tokenizer(words, add_special_tokens=False)["input_ids"] if words else []
        cut = {w: self.tokenizer.convert_ids_to_tokens(i) for w, i in zip(words, ids, strict=True)}
        return cut.__getitem__

    def to_ids(self, tokens: list[str]) -> list[int]:
        """The ids of pieces and markers (an unknown string: the tokenizer's unknown id)."""
        return list(self.tokenizer.convert_tokens_to_ids(tokens))


def marker_is_a_token(tokenizer: SubwordTokenizer) -> bool:
    """Whether ``*`` is one token of the vocabulary (BERT's and RoBERTa's have it; then its pretrained embedding is
    used, as ATLOP does)."""
    unk = tokenizer.tokenizer.unk_token_id
    return tokenizer.tokenizer.convert_tokens_to_ids(MARKER) not in (None, unk)


def build_document_tokenizer(pretrained: str, folder: str | Path) -> Path:
    """Save ``--pretrained``'s tokenizer and ``config.json`` into ``folder`` (:func:`~nre_ray.data.subword.
    build_tokenizer`: ``vocab_size`` set to the tokenizer's length), with ``*`` added as a token only where the
    vocabulary has no such token; return the folder. No length limit: documents are read in windows."""
    has_marker = marker_is_a_token(SubwordTokenizer(load_pretrained_tokenizer(pretrained)))
    return build_tokenizer(pretrained, folder, [] if has_marker else [MARKER], 0)


def encoder_window(folder: str | Path) -> int | None:
    """The positions of the encoder whose ``config.json`` is in ``folder`` (the window documents are read in), or
    None when the config does not say."""
    from types import SimpleNamespace

    settings = json.loads((Path(folder) / "config.json").read_text(encoding="utf-8"))
    return max_positions(SimpleNamespace(**settings))


@lru_cache(maxsize=4)
def _loaded(files: tuple[tuple[str, bytes], ...]) -> DocumentTokenizer:
    return DocumentTokenizer.load(assets_folder(dict(files)))


def document_tokenizer(files: Mapping[str, bytes]) -> DocumentTokenizer:
    """The tokenizer of ``files`` (``{"pretrained/<name>": bytes}``: the encoding context's, a checkpoint's assets),
    loaded once per process and content."""
    return _loaded(tuple(sorted(files.items())))

"""An encoded split of documents, as the cache keeps it, and the torch dataset the loop reads batches from.

A document is encoded once, in the Ray Data preprocessing (:mod:`.prepare`), into the parts of
:class:`~.encoding.EncodedDocument` plus what its exact scores need (:mod:`.metrics`): per candidate pair whether it
is intra-sentence, per gold fact whether it was seen in training (DocRED's Ign F1), and the gold facts no candidate
pair can predict (they count as missed). :class:`DocumentSplit` holds N such documents in flat arrays with offsets
(no padding) and is saved as one ``<split>.documents.npz`` and ``<split>.documents.json`` (the document ids and the
label count) in the cache folder; :class:`DocumentDataset` pads a batch of them as
:func:`~.batching.pad_batch` does.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from nre_ray.tasks.document.batching import pad_batch
from nre_ray.tasks.document.encoding import EncodedDocument

ARRAYS = ("ids", "ids_off", "ment", "ment_off", "ent_off", "pairs", "pair_off", "intra", "fact_pair", "fact_col",
          "fact_train", "uncovered")
"""The flat arrays of a split (see :meth:`DocumentSplit.from_documents`)."""


class DocumentSplit:
    """N encoded documents, flat (``ids`` (T_total,) with ``ids_off`` (N + 1,); mentions ``ment`` (M_total,) with
    ``ment_off`` (E_total + 1,) per entity and ``ent_off`` (N + 1,) per document; ``pairs`` (P_total, 2) with
    ``pair_off`` (N + 1,); ``intra`` (P_total,) bool; the gold facts on candidate pairs as ``fact_pair`` (F,) (a
    global pair index), ``fact_col`` (F,) (the label column) and ``fact_train`` (F,) bool (seen in training);
    ``uncovered`` (N, 2, C) int64: gold facts on no candidate pair, all and intra-sentence, per label column)."""

    def __init__(self, arrays: Mapping[str, np.ndarray], ids: Sequence[str], num_classes: int, name: str = "") -> None:
        self.arrays = {k: np.asarray(arrays[k]) for k in ARRAYS}
        self.ids = list(ids)
        self.num_classes = num_classes
        self.name = name

    def __len__(self) -> int:
        return len(self.ids)

    @property
    def lengths(self) -> np.ndarray:
        """(N,) tokens per document."""
        return np.diff(self.arrays["ids_off"])

    @classmethod
    def from_documents(cls, docs: Sequence[Mapping[str, Any]], num_classes: int, name: str = "") -> DocumentSplit:
        """A split of encoded documents, each a mapping with ``id``, ``input_ids`` (T,), ``mention_pos`` (E lists),
        ``pairs`` (P, 2), ``intra`` (P,), ``facts`` ((pair, column, seen in training) triples) and ``uncovered``
        (2, C) (what :func:`.prepare.encode_document_row` gives)."""
        def offsets(sizes: Sequence[int]) -> np.ndarray:
            out = np.zeros(len(sizes) + 1, dtype=np.int64)
            np.cumsum(np.asarray(sizes, dtype=np.int64), out=out[1:])
            return out

        entities = [ps for d in docs for ps in d["mention_pos"]]
        pair_off = offsets([len(d["pairs"]) for d in docs])
        facts = [(int(pair_off[k]) + int(p), int(c), bool(s)) for k, d in enumerate(docs) for p, c, s in d["facts"]]
        arrays = {
            "ids": np.concatenate([np.asarray(d["input_ids"], dtype=np.int64) for d in docs]) if docs
            else np.zeros(0, dtype=np.int64),
            "ids_off": offsets([len(d["input_ids"]) for d in docs]),
            "ment": np.asarray([p for ps in entities for p in ps], dtype=np.int64),
            "ment_off": offsets([len(ps) for ps in entities]),
            "ent_off": offsets([len(d["mention_pos"]) for d in docs]),
            "pairs": np.asarray([p for d in docs for p in d["pairs"]], dtype=np.int64).reshape(-1, 2),
            "pair_off": pair_off,
            "intra": np.asarray([b for d in docs for b in d["intra"]], dtype=bool),
            "fact_pair": np.asarray([f[0] for f in facts], dtype=np.int64),
            "fact_col": np.asarray([f[1] for f in facts], dtype=np.int64),
            "fact_train": np.asarray([f[2] for f in facts], dtype=bool),
            "uncovered": np.asarray([d["uncovered"] for d in docs], dtype=np.int64).reshape(-1, 2, num_classes),
        }
        return cls(arrays, [str(d["id"]) for d in docs], num_classes, name)

    def document(self, i: int) -> tuple[EncodedDocument, np.ndarray, np.ndarray, np.ndarray]:
        """Document ``i``: its :class:`EncodedDocument` (labels (P, C), column 0 set for pairs without a fact), its
        pairs' ``intra`` (P,) bool, ``in_train`` (P, C) bool and ``uncovered`` (2, C)."""
        a = self.arrays
        ids = a["ids"][a["ids_off"][i]:a["ids_off"][i + 1]]
        e0, e1 = a["ent_off"][i], a["ent_off"][i + 1]
        mentions = [a["ment"][a["ment_off"][e]:a["ment_off"][e + 1]].tolist() for e in range(e0, e1)]
        p0, p1 = int(a["pair_off"][i]), int(a["pair_off"][i + 1])
        labels = np.zeros((p1 - p0, self.num_classes), dtype=np.float32)
        in_train = np.zeros((p1 - p0, self.num_classes), dtype=bool)
        mine = (a["fact_pair"] >= p0) & (a["fact_pair"] < p1)
        rows, cols = a["fact_pair"][mine] - p0, a["fact_col"][mine]
        labels[rows, cols] = 1.0
        in_train[rows, cols] = a["fact_train"][mine]
        labels[:, 0] = labels[:, 1:].sum(axis=1) == 0
        doc = EncodedDocument(self.ids[i], ids, mentions, a["pairs"][p0:p1], labels)
        return doc, a["intra"][p0:p1], in_train, a["uncovered"][i]

    @staticmethod
    def files(name: str) -> list[str]:
        """The files of split ``name`` in a cache folder."""
        return [f"{name}.documents.npz", f"{name}.documents.json"]

    def save(self, folder: Path, name: str) -> None:
        """Write the split's files into ``folder`` (the JSON file last: it marks the split complete)."""
        np.savez(Path(folder) / f"{name}.documents.npz", **self.arrays)
        (Path(folder) / f"{name}.documents.json").write_text(
            json.dumps({"ids": self.ids, "num_classes": self.num_classes}, ensure_ascii=False), encoding="utf-8")

    @classmethod
    def open(cls, folder: Path | str, name: str) -> DocumentSplit:
        """The split ``name`` saved in ``folder`` (read whole: document splits are small)."""
        meta = json.loads((Path(folder) / f"{name}.documents.json").read_text(encoding="utf-8"))
        with np.load(Path(folder) / f"{name}.documents.npz", allow_pickle=False) as data:
            arrays = {k: data[k] for k in ARRAYS}
        return cls(arrays, meta["ids"], int(meta["num_classes"]), name)


class DocumentDataset(torch.utils.data.Dataset):
    """A :class:`DocumentSplit` as padded batches: ``__getitems__(indices)`` gives (B, T) ``input_ids`` and ``mask``,
    (B, E, M) ``mention_pos``, (B, P, 2) ``pairs`` (-1: padding), (B, P, C) ``labels``, (B, P) ``intra``,
    (B, P, C) ``in_train``, (B, 2, C) ``uncovered`` and (B,) ``index`` (the documents' indices in the split)."""

    def __init__(self, split: DocumentSplit) -> None:
        self.split = split

    def __len__(self) -> int:
        return len(self.split)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        return self.__getitems__([index])

    def __getitems__(self, indices: Sequence[int]) -> dict[str, torch.Tensor]:
        parts = [self.split.document(int(i)) for i in indices]
        batch = pad_batch([p[0] for p in parts])
        b, p, c = batch["labels"].shape
        intra = np.zeros((b, p), dtype=bool)
        in_train = np.zeros((b, p, c), dtype=bool)
        for k, (_, pair_intra, pair_train, _) in enumerate(parts):
            intra[k, :len(pair_intra)] = pair_intra
            in_train[k, :len(pair_intra)] = pair_train
        batch.update(intra=intra, in_train=in_train, uncovered=np.stack([q[3] for q in parts]),
                     index=np.asarray(indices, dtype=np.int64))
        return {k: torch.from_numpy(v) for k, v in batch.items()}

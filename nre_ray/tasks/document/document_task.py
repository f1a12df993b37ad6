"""The document task through the task interface (:class:`nre_ray.tasks.base.Task`): one example is one document,
its entities' mentions and every candidate pair's relations (DocRED / Re-DocRED JSON, BioCreative V CDR PubTator).

* data: a folder with a DocRED JSON or PubTator file whose name names a split (``train.json``, ``dev.json``,
  ``CDR_TrainingSet.PubTator.txt`` ...), read, checked and encoded by :mod:`.prepare` (Ray Data) into the cache as
  :class:`~.split.DocumentSplit` objects; batches are :class:`~.split.DocumentDataset`'s: (B, T) ``input_ids`` and
  ``mask``, (B, E, M) ``mention_pos``, (B, P, 2) ``pairs``, (B, P, C) ``labels`` (column 0: TH), and what the exact
  scores need (``intra``, ``in_train``, ``uncovered``, ``index``);
* model: ATLOP (:class:`~.atlop.DocumentModel`) on the from-scratch document transformer
  (:class:`~.encoder.TransformerDocumentEncoder`: ``--model transformer``, ``--hidden-size``, ``--num-layers``,
  ``--num-heads``, ``--max-positions`` the window longer documents are read in) or on any Hugging Face encoder
  (:class:`~.encoder.HuggingFaceDocumentEncoder`: ``--model bert --pretrained``, the documents in its subwords
  (:mod:`.subwords`), its position count the window; its weights at ``--encoder-lr``), logits (B, P, C); the loss
  is the adaptive-threshold loss, each document's the mean over its candidate pairs (``--label-smoothing`` does not
  apply);
* metrics: (K, C) int64 counts (:mod:`.counts`): micro P/R/F1 over facts, Ign F1, intra/inter-sentence F1, macro
  F1; exact on any number of workers;
* rows (:mod:`.fact_rows`): evaluate encodes a labelled file with the context the checkpoint carries of its
  training split (so its scores are training's on the same documents); predict, the MLflow pyfunc model and serve
  answer one row per predicted fact (document, head and tail entity, relation, score); a request is a document in
  DocRED's JSON (:meth:`DocumentTask.parse_request`);
* tune searches :data:`SEARCH_SPACE` (the document model's options) and selects on validation ``micro_f1``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import torch
from torch import nn

from nre_ray.core.user_error import ConfigError
from nre_ray.models.registry import ModelSpec
from nre_ray.tasks.base import PredictSettings, Task
from nre_ray.tasks.document import counts as doc_counts
from nre_ray.tasks.document.atlop import DocumentModel, adaptive_threshold_losses, pair_mask
from nre_ray.tasks.document.batching import LengthBatchSampler
from nre_ray.tasks.document.encoder import (
    HuggingFaceDocumentEncoder,
    TransformerDocumentEncoder,
    build_huggingface_encoder,
)
from nre_ray.tasks.document.split import DocumentDataset, DocumentSplit

if TYPE_CHECKING:
    import pandas as pd

    from nre_ray.config import DataConfig
    from nre_ray.data.batches import EncodedSplit
    from nre_ray.data.pipeline import Prepared
    from nre_ray.data.vocab import Vocab

MODELS = ("transformer", "bert")
"""The ``--model`` values the document task trains: an encoder trained from scratch, or a pretrained one."""
ISSUE = "issue 37"
SUPPORTED = frozenset({"train", "evaluate", "predict", "serve", "pyfunc", "inspect", "tune"})
"""The commands that take document data and models (:meth:`DocumentTask.unsupported`)."""
SEARCH_SPACE: dict[str, dict[str, dict[str, list[Any]]]] = {
    "train": {"lr": {"loguniform": [3e-4, 3e-3]}, "batch_size": {"choice": [4, 8]},
              "weight_decay": {"choice": [0.0, 1e-4]}},
    "model": {"hidden_size": {"choice": [64, 128, 256]}, "num_layers": {"choice": [1, 2]}},
}
"""What ``python -m nre_ray.tune`` searches on documents without ``--search-space`` (:meth:`DocumentTask.search_space`):
the options the document model takes (not ``--dropout``, ``--embedding-dropout`` or ``--kernel-size``), with a few
documents a batch (a document is hundreds of tokens and its candidate pairs)."""


class DocumentTask(Task):
    """Document-level relation extraction: entities with mentions, facts on entity pairs (module docstring)."""

    name: ClassVar[str] = "document"
    unit: ClassVar[str] = "documents"
    eval_batch_size: ClassVar[int] = 8  # a document's attention is (heads, T, T)
    input_columns: ClassVar[tuple[str, ...]] = ("title", "sents", "vertexSet")  # .fact_rows.INPUT_COLUMNS
    summary_metrics: ClassVar[tuple[str, ...]] = ("micro_f1", "micro_precision", "micro_recall", "ign_f1",
                                                  "intra_f1", "inter_f1")
    epoch_metric: ClassVar[tuple[str, str]] = ("ign_f1", "ign_f1")

    # data

    def recognises(self, data_dir: str) -> bool:
        """A folder holding a DocRED JSON or PubTator file whose name names a split (its first bytes only)."""
        from nre_ray.tasks.document.prepare import has_documents

        return has_documents(data_dir)

    record_columns: ClassVar[tuple[tuple[str, str], ...]] = (
        ("string", "title"), ("string", "sents"), ("string", "vertexSet"), ("string", "labels"))
    """DocRED's fields (PubTator's documents are read into them)."""

    def format_of(self, data: DataConfig) -> str | None:
        """``docred`` or ``pubtator``: the training file's (:func:`.readers.detect_document_format`)."""
        from nre_ray.tasks.document.prepare import find_files
        from nre_ray.tasks.document.readers import detect_document_format

        return detect_document_format(find_files(data.data_dir)["train"])

    def check_data(self, data: DataConfig) -> None:
        """The folder's document files (:func:`.prepare.find_files`: a training file at least)."""
        from nre_ray.tasks.document.prepare import find_files

        find_files(data.data_dir)

    def prepare(self, data: DataConfig, seed: int, pretrained: str | None = None, shared_cache: str | None = None,
                on_every_node: bool = False, multi_node: bool | None = None) -> Prepared:
        """:func:`.prepare.prepare_documents`, in ``pretrained``'s subwords when given (``--model bert``), fetched
        from or published to ``shared_cache``. The documents are read and the cache built on the driver's node (the
        placement arguments do not apply)."""
        from nre_ray.tasks.document.prepare import prepare_documents

        return prepare_documents(data, seed, pretrained, shared_cache)

    def is_cached(self, data: DataConfig, seed: int, shared_cache: str | None = None,
                  pretrained: str | None = None) -> bool:
        """:func:`.prepare.is_cached` (the local cache, or ``shared_cache``)."""
        from nre_ray.tasks.document.prepare import is_cached

        return is_cached(data, seed, pretrained, shared_cache)

    def audit_markdown(self, audit: Mapping[str, Any]) -> str:
        """:func:`.describe.audit_markdown`: documents, entities, mentions, candidate pairs, facts per relation,
        lengths in words and tokens against the encoder's window."""
        from nre_ray.tasks.document.describe import audit_markdown

        return audit_markdown(audit)

    def open_split(self, folder: Path, name: str) -> DocumentSplit:
        """:meth:`DocumentSplit.open`."""
        return DocumentSplit.open(folder, name)

    def splits_complete(self, folder: Path, names: list[str]) -> bool:
        """Every split's ``.documents.npz`` and ``.documents.json``."""
        return all((Path(folder) / f).is_file() for n in names for f in DocumentSplit.files(n))

    def dataset(self, split: EncodedSplit) -> DocumentDataset:
        """Padded batches of documents (:class:`DocumentDataset`)."""
        return DocumentDataset(split)  # type: ignore[arg-type]

    # model and loss

    default_model: ClassVar[str | None] = "transformer"

    def search_space(self, model: str) -> dict[str, dict[str, dict[str, list[Any]]]] | None:
        """:data:`SEARCH_SPACE` for ``--model transformer``; ``--model bert``'s own space (its learning rates) for a
        pretrained encoder, whose size is the model's."""
        return SEARCH_SPACE if model == "transformer" else None

    def train_batches(self, split: EncodedSplit, batch_size: int, rank: int, world_size: int, seed: int
                      ) -> LengthBatchSampler:
        """Batches by length, at most ``batch_size`` x the mean document length in padded tokens, dealt to the ranks
        by tokens (:class:`~.batching.LengthBatchSampler`)."""
        return LengthBatchSampler(split.lengths, batch_size, rank, world_size, seed)  # type: ignore[attr-defined]

    def check_settings(self, config: Any) -> None:
        """``--model transformer`` or ``--model bert`` (:data:`MODELS`). Elastic runs take documents (a document's
        loss is its own: the same update at any world size, tests/unit/test_document_task.py); their steps are
        ``--batch-size`` documents a rank at random, not :meth:`train_batches`' length batches."""
        model = config.model.model
        if model not in MODELS:
            raise ConfigError(f"--model {model}: document models take --model transformer (an encoder trained from "
                              "scratch) or --model bert --pretrained PATH_OR_NAME (a pretrained encoder)")

    def build_model(self, model_config: Any, spec: ModelSpec) -> nn.Module:
        """ATLOP on a :class:`TransformerDocumentEncoder` of ``--hidden-size`` (d_model), ``--num-layers``
        (default 2), ``--num-heads`` and ``--max-positions`` (its window), or with ``--model bert`` on a
        :class:`HuggingFaceDocumentEncoder` (``--pretrained``'s weights, or a checkpoint's
        ``spec.pretrained_config``; its hidden size and positions); the grouped bilinear's size is the encoder's
        hidden size, in blocks of gcd(hidden size, 64)."""
        encoder: TransformerDocumentEncoder | HuggingFaceDocumentEncoder
        if model_config.model == "bert":
            encoder = build_huggingface_encoder(model_config, spec.vocab_size, spec.pretrained_config)
        else:
            encoder = TransformerDocumentEncoder(spec.vocab_size, model_config.hidden_size,
                                                 model_config.num_layers or 2, model_config.num_heads,
                                                 model_config.max_positions)
        hidden = encoder.hidden_size
        return DocumentModel(encoder, spec.num_classes, emb_size=hidden, block_size=math.gcd(hidden, 64))

    def loss(self, output: torch.Tensor, batch: Mapping[str, torch.Tensor], label_smoothing: float = 0.0,
             reduction: str = "mean") -> torch.Tensor:
        """The adaptive-threshold loss of the logits ``output`` (B, P, C): each document's is the mean over its
        candidate pairs (0 for a document without one); the mean or the sum over the B documents."""
        keep = pair_mask(batch["pairs"])  # (B, P)
        losses = torch.zeros_like(keep, dtype=torch.float32)  # (B, P)
        losses[keep] = adaptive_threshold_losses(output[keep].float(), batch["labels"][keep].float())
        per_document = losses.sum(dim=1) / keep.sum(dim=1).clamp(min=1)  # (B,)
        return per_document.sum() if reduction == "sum" else per_document.mean()

    def examples(self, batch: Mapping[str, torch.Tensor]) -> int:
        """The batch's documents."""
        return batch["input_ids"].shape[0]

    # metrics

    def new_counts(self, labels: list[str], num_examples: int, device: torch.device) -> torch.Tensor:
        """(K, C) int64 zeros (:mod:`.counts`)."""
        return doc_counts.new_counts(len(labels), device)

    def count(self, counts: torch.Tensor, output: torch.Tensor, batch: Mapping[str, torch.Tensor]) -> None:
        """:func:`.counts.count`."""
        doc_counts.count(counts, output, batch)

    def metric_names(self, labels: list[str], negative_label: str | None) -> list[str]:
        """:data:`.counts.METRICS`."""
        return list(doc_counts.METRICS)

    def default_metric(self, negative_label: str | None) -> str:
        """``micro_f1``: F1 over facts, as the field reports it."""
        return "micro_f1"

    def scores(self, counts: Any, labels: list[str], negative_label: str | None) -> dict[str, float]:
        """:func:`.counts.scores`."""
        return doc_counts.scores(counts)

    def write_reports(self, counts: Any, labels: list[str], folder: Path, name: str, title: str) -> None:
        """``{name}_per_relation.csv`` and ``.md``: precision, recall, F1 and counts per relation, and the scores."""
        import pandas as pd

        rows = self.per_label(counts, labels)
        columns = ["label", "precision", "recall", "f1", "tp", "predicted", "gold"]
        pd.DataFrame(rows, columns=columns).to_csv(folder / f"{name}_per_relation.csv", index=False)
        cells = [[f"{r[c]:.4f}" if isinstance(r[c], float) else str(r[c]) for c in columns] for r in rows]
        lines = [f"# {title}", "", *(f"- {k}: {v:.4f}" for k, v in doc_counts.scores(counts).items()), "",
                 "| " + " | ".join(columns) + " |", "|" + "---|" * len(columns),
                 *("| " + " | ".join(row) + " |" for row in cells), ""]
        (folder / f"{name}_per_relation.md").write_text("\n".join(lines), encoding="utf-8")

    def per_label(self, counts: Any, labels: list[str]) -> list[dict[str, Any]]:
        """:func:`.counts.per_label`."""
        return doc_counts.per_label(counts, labels)

    # rows

    def unsupported(self, command: str) -> str | None:
        """Every command takes documents (:data:`SUPPORTED`)."""
        if command in SUPPORTED:
            return None
        return f"document models: {command} is not supported yet ({ISSUE})"

    def output_columns(self, top_k: int = 0) -> list[str]:
        """Per input document: ``document`` (its id) and ``facts`` (:mod:`.fact_rows`)."""
        from nre_ray.tasks.document import fact_rows

        return list(fact_rows.OUTPUT_COLUMNS)

    def answer(self, frame: pd.DataFrame) -> pd.DataFrame:
        """One row per predicted fact (:func:`.fact_rows.answer`)."""
        from nre_ray.tasks.document import fact_rows

        return fact_rows.answer(frame)

    def answer_columns(self, top_k: int = 0) -> list[str]:
        """``document``, ``head``, ``head_name``, ``tail``, ``tail_name``, ``relation``, ``score``."""
        from nre_ray.tasks.document import fact_rows

        return list(fact_rows.ANSWER_COLUMNS)

    def encode_file(self, path: str, data: DataConfig, vocab: Vocab, labels: list[str],
                    assets: Mapping[str, bytes] | None, fmt: str | None = None, columns: str | None = None,
                    on_bad_rows: str = "error") -> tuple[DocumentSplit, int]:
        """:func:`.fact_rows.encode_file`: a DocRED JSON or PubTator file, encoded with the checkpoint's context."""
        from nre_ray.tasks.document import fact_rows

        return fact_rows.encode_file(path, data, vocab, labels, assets, fmt, columns, on_bad_rows)

    def plan_input(self, path: str, fmt: str | None, columns: str | None, chunk_rows: int) -> Any:
        """:func:`.fact_rows.plan_documents`: one row per document."""
        from nre_ray.tasks.document import fact_rows

        return fact_rows.plan_documents(path, fmt, columns, chunk_rows)

    def predict_rows(self, model: nn.Module, frame: pd.DataFrame, settings: PredictSettings,
                     top_k: int = 0) -> pd.DataFrame:
        """:func:`.fact_rows.predict_rows`: per document its id and predicted facts (``top_k > 0``: at most k
        relations a pair)."""
        from nre_ray.tasks.document import fact_rows

        return fact_rows.predict_rows(model, frame, settings, top_k)

    report_metrics: ClassVar[tuple[str, ...] | None] = doc_counts.METRICS

    request_hint: ClassVar[str] = ("Fix these documents (DocRED's JSON: title, sents as lists of tokens, vertexSet as "
                                   "lists of mentions with name, sent_id, pos [start, end) and type) and send them "
                                   "again.")

    def pyfunc_signature(self) -> Any:
        """Inputs ``title`` (string), ``sents`` and ``vertexSet`` (any JSON: DocRED's values, or their text);
        outputs one row per fact (:data:`.fact_rows.ANSWER_COLUMNS`); param ``top_k`` (at most k relations a
        pair; 0: every relation above the threshold)."""
        from mlflow.models import ModelSignature
        from mlflow.types import ColSpec, ParamSchema, ParamSpec, Schema
        from mlflow.types.schema import AnyType

        from nre_ray.tasks.document import fact_rows

        inputs = Schema([ColSpec("string", "title"), ColSpec(AnyType(), "sents"), ColSpec(AnyType(), "vertexSet")])
        outputs = Schema([*(ColSpec("string", c) for c in fact_rows.ANSWER_COLUMNS if c != "score"),
                          ColSpec("double", "score")])
        return ModelSignature(inputs=inputs, outputs=outputs, params=ParamSchema([ParamSpec("top_k", "long", 0)]))

    def pyfunc_example(self, vocab: Vocab) -> pd.DataFrame:
        """A document of the bundled document sample (:mod:`.sample`), as request columns."""
        import pandas as pd

        from nre_ray.tasks.document import fact_rows
        from nre_ray.tasks.document.sample import sample_documents

        docs = sample_documents("test", seed=0, sizes={"test": 1})
        return pd.DataFrame([{c: d[c] for c in fact_rows.INPUT_COLUMNS} for d in docs])

    def parse_request(self, payload: Any) -> pd.DataFrame | None:
        """A document in DocRED's JSON (an object with ``sents`` and ``vertexSet``), a list of them, or
        ``{"documents": [...]}``, as request rows (``title``, ``sents``, ``vertexSet``); None for anything else."""
        import pandas as pd

        from nre_ray.tasks.document import fact_rows

        items = payload.get("documents") if isinstance(payload, dict) and set(payload) <= {"documents", "params"} \
            else payload
        items = [items] if isinstance(items, dict) else items
        if not isinstance(items, list) or not items or not all(isinstance(d, dict) and "sents" in d and
                                                               "vertexSet" in d for d in items):
            return None
        return pd.DataFrame([{c: d.get(c, "") if c == "title" else d[c] for c in fact_rows.INPUT_COLUMNS}
                             for d in items], columns=list(fact_rows.INPUT_COLUMNS))


#: The document task (stateless: one object serves every caller).
DOCUMENT = DocumentTask()

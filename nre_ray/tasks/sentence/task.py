"""The sentence task through the task interface (:class:`nre_ray.tasks.base.Task`): one row is one example, a sentence
with one head and one tail entity and one label.

* data: every format of :mod:`nre_ray.data.formats` (csv, tsv, jsonl, parquet, DeepKE, OpenNRE, SemEval), read and
  encoded by the spine's Ray Data pipeline into an :class:`nre_ray.data.batches.EncodedSplit`; batches are
  :class:`nre_ray.data.encode.EncodedDataset`'s: (B, T) ``tokens``, ``head_pos``, ``tail_pos``, ``segments``,
  ``mask``, (B, 2) ``head_span``/``tail_span``, (B,) ``labels`` and ``index``;
* model: ``--model``'s encoder under :class:`nre_ray.tasks.sentence.classifier.RelationClassifier`, logits (B, C);
  the loss is softmax cross-entropy (with ``--label-smoothing``);
* metrics: a (C, C) confusion matrix (rows gold, columns predicted) counted on each rank's shard and all-reduced, and
  its scores (:mod:`nre_ray.tasks.sentence.metrics`: accuracy, macro/micro, the positive-class and SemEval scores)
  and reports (:mod:`nre_ray.tasks.sentence.reports`);
* rows: one prediction per input row, the label and its probability (:mod:`nre_ray.tasks.sentence.rows`).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np
import torch
from torch import nn

from nre_ray.config import METRICS, metric_names
from nre_ray.data.batches import EncodedSplit
from nre_ray.data.encode import EncodedDataset
from nre_ray.models.registry import ModelSpec
from nre_ray.tasks.base import PredictSettings, Task
from nre_ray.tasks.sentence import metrics, rows
from nre_ray.tasks.sentence.classifier import build_model
from nre_ray.tracking.store import SENTENCE_COLUMNS

if TYPE_CHECKING:
    import pandas as pd

    from nre_ray.config import DataConfig
    from nre_ray.data.pipeline import Prepared
    from nre_ray.data.vocab import Vocab


class SentenceTask(Task):
    """Sentence-level relation classification: one sentence, one entity pair, one label (module docstring)."""

    name: ClassVar[str] = "sentence"
    unit: ClassVar[str] = "rows"
    input_columns: ClassVar[tuple[str, ...]] = rows.INPUT_COLUMNS

    def recognises(self, data_dir: str) -> bool:
        """Every folder: the sentence formats are the spine's readers' (:mod:`nre_ray.data.formats`), which say
        themselves what they cannot read. The other tasks are asked first (:func:`nre_ray.tasks.lookup.task_for`)."""
        return True

    record_columns: ClassVar[tuple[tuple[str, str], ...]] = SENTENCE_COLUMNS

    def format_of(self, data: DataConfig) -> str | None:
        """``--format``, else the training file's detected format (:func:`nre_ray.data.formats.detect_format`)."""
        from nre_ray.data.formats import detect_format  # pandas: when a run starts
        from nre_ray.data.pipeline import resolve_files

        return data.format or detect_format(resolve_files(data)["train"])

    def check_data(self, data: DataConfig) -> None:
        """The folder's split files (:func:`nre_ray.data.datadir.find_data_files`: a training file at least)."""
        from nre_ray.data.datadir import find_data_files  # pandas, pyarrow: when a run starts

        if data.data_dir:
            find_data_files(data.data_dir)

    def prepare(self, data: DataConfig, seed: int, pretrained: str | None = None, shared_cache: str | None = None,
                on_every_node: bool = False, multi_node: bool | None = None) -> Prepared:
        """The spine's Ray Data pipeline (:func:`nre_ray.data.pipeline.prepare`)."""
        from nre_ray.data.pipeline import prepare  # pandas, pyarrow: when a run starts

        return prepare(data, seed, pretrained, shared_cache=shared_cache, on_every_node=on_every_node,
                       multi_node=multi_node)

    def check_inputs(self, data: DataConfig) -> None:
        """:func:`nre_ray.data.pipeline.check_inputs`: the files, ``--columns``, the label file, the first chunk of
        every local split file."""
        from nre_ray.data.pipeline import check_inputs

        check_inputs(data)

    def is_cached(self, data: DataConfig, seed: int, shared_cache: str | None = None,
                  pretrained: str | None = None) -> bool:
        """:func:`nre_ray.data.pipeline.is_cached`."""
        from nre_ray.data.pipeline import is_cached

        return is_cached(data, seed, pretrained, shared_cache=shared_cache)

    def audit_markdown(self, audit: Mapping[str, Any]) -> str:
        """:func:`nre_ray.data.audit.to_markdown`: rows, duplicates, lengths, distances, labels, warnings."""
        from nre_ray.data.audit import to_markdown  # pandas: when a run starts

        return to_markdown(audit)

    def open_split(self, folder: Path, name: str) -> EncodedSplit:
        """:meth:`EncodedSplit.open`: read by rows, on demand."""
        return EncodedSplit.open(folder, name)

    def splits_complete(self, folder: Path, names: list[str]) -> bool:
        """:func:`nre_ray.data.pipeline.split_files_complete`."""
        from nre_ray.data.pipeline import split_files_complete

        return split_files_complete(folder, names)

    def dataset(self, split: EncodedSplit) -> EncodedDataset:
        """The split's rows, batched and padded to a batch's longest row (:class:`EncodedDataset`)."""
        return EncodedDataset(split)

    def build_model(self, model_config: Any, spec: ModelSpec) -> nn.Module:
        """``--model``'s encoder with the classifier head (:func:`nre_ray.tasks.sentence.classifier.build_model`)."""
        return build_model(model_config, spec)

    def loss(self, output: torch.Tensor, batch: Mapping[str, torch.Tensor], label_smoothing: float = 0.0,
             reduction: str = "mean") -> torch.Tensor:
        """Cross-entropy of the logits ``output`` (B, C) against ``batch["labels"]`` (B,), in float32."""
        return nn.functional.cross_entropy(output.float(), batch["labels"], label_smoothing=label_smoothing,
                                           reduction=reduction)

    def examples(self, batch: Mapping[str, torch.Tensor]) -> int:
        """The batch's rows."""
        return batch["labels"].numel()

    def new_counts(self, labels: list[str], num_examples: int, device: torch.device) -> torch.Tensor:
        """A (C, C) confusion matrix of zeros."""
        return torch.zeros((len(labels), len(labels)), dtype=torch.long, device=device)

    def count(self, counts: torch.Tensor, output: torch.Tensor, batch: Mapping[str, torch.Tensor]) -> None:
        """Add each row's (gold, argmax of ``output`` (B, C)) to the confusion matrix ``counts`` (C, C)."""
        c = counts.shape[0]
        gold = batch["labels"]  # (B,)
        counts += torch.bincount(gold * c + output.argmax(dim=-1), minlength=c * c).view(c, c)

    summary_metrics: ClassVar[tuple[str, ...]] = ("accuracy", "macro_f1", "micro_f1", "pos_macro_f1", "pos_micro_f1",
                                                  "semeval_macro_f1")
    epoch_metric: ClassVar[tuple[str, str]] = ("acc", "accuracy")

    def metric_names(self, labels: list[str], negative_label: str | None) -> list[str]:
        """:func:`nre_ray.config.metric_names`."""
        return metric_names(labels, negative_label)

    def why_no_metric(self, metric: str, labels: list[str], negative_label: str | None) -> str:
        """A ``--negative-label`` that is not a label, else the ``pos_*``/``semeval_*`` scores' needs; a score of
        another task."""
        if metric not in METRICS:
            return super().why_no_metric(metric, labels, negative_label)
        if negative_label and negative_label not in labels:
            return f"--negative-label {negative_label!r} is not one of the labels"
        return "it needs directed labels such as Cause-Effect(e1,e2) and --negative-label"

    def default_metric(self, negative_label: str | None) -> str:
        """``pos_macro_f1`` with a negative label, else ``macro_f1`` (:attr:`nre_ray.config.Config.select_metric`)."""
        return "pos_macro_f1" if negative_label else "macro_f1"

    def scores(self, counts: Any, labels: list[str], negative_label: str | None) -> dict[str, float]:
        """:func:`nre_ray.tasks.sentence.metrics.scores` of the confusion matrix."""
        return metrics.scores(_matrix(counts), labels, negative_label)

    def write_reports(self, counts: Any, labels: list[str], folder: Path, name: str, title: str) -> None:
        """The per-class table (``{name}_per_class.csv``/``.md``) and the confusion matrix's plot
        (``{name}_confusion_matrix.png``)."""
        from nre_ray.tasks.sentence import reports  # matplotlib: imported when a report is written

        cm = _matrix(counts)
        reports.write_class_report(cm, labels, folder, name)
        reports.plot_confusion_matrix(cm, labels, folder / f"{name}_confusion_matrix.png", title)

    def per_label(self, counts: Any, labels: list[str]) -> list[dict[str, Any]]:
        """:func:`nre_ray.tasks.sentence.metrics.per_class_table`'s rows."""
        return metrics.per_class_table(_matrix(counts), labels).to_dict(orient="records")

    def output_columns(self, top_k: int = 0) -> list[str]:
        """``predicted_relation``, ``score`` (and ``top_k_labels``, ``top_k_scores``)."""
        return list(rows.OUTPUT_COLUMNS) + (list(rows.TOP_K_COLUMNS) if top_k > 0 else [])

    def predict_rows(self, model: nn.Module, frame: pd.DataFrame, settings: PredictSettings,
                     top_k: int = 0) -> pd.DataFrame:
        """:func:`nre_ray.tasks.sentence.rows.predict_rows`: one row per input row."""
        return rows.predict_rows(model, frame, settings, top_k)

    def encode_file(self, path: str, data: DataConfig, vocab: Vocab, labels: list[str],
                    assets: Mapping[str, bytes] | None, fmt: str | None = None, columns: str | None = None,
                    on_bad_rows: str = "error") -> tuple[EncodedSplit, int]:
        """:func:`nre_ray.tasks.sentence.rows.encode_file`."""
        return rows.encode_file(path, data, vocab, labels, assets, fmt, columns, on_bad_rows)

    def plan_input(self, path: str, fmt: str | None, columns: str | None, chunk_rows: int) -> Any:
        """:func:`nre_ray.data.chunks.plan_chunks` (a relation column is not needed)."""
        from nre_ray.data.chunks import plan_chunks
        from nre_ray.data.read import parse_column_map

        return plan_chunks(path, fmt, parse_column_map(columns) if columns else None, chunk_rows,
                           require_relation=False)

    report_metrics: ClassVar[tuple[str, ...] | None] = (
        "accuracy", "macro_precision", "macro_recall", "macro_f1", "micro_f1", "pos_micro_precision",
        "pos_micro_recall", "pos_micro_f1", "pos_macro_f1", "semeval_macro_f1")

    request_hint: ClassVar[str] = ("Fix these rows (head_offset / tail_offset: 0-based character offsets of head and "
                                   "tail in sentence) and send them again.")

    def pyfunc_signature(self) -> Any:
        """:func:`nre_ray.tasks.sentence.rows.signature`."""
        return rows.signature()

    def pyfunc_example(self, vocab: Vocab) -> pd.DataFrame:
        """Two rows of the bundled sample, with entity types for a model that learnt typed markers."""
        return rows.input_example(typed=rows.learnt_types(vocab))


def _matrix(counts: Any) -> np.ndarray:
    """The confusion matrix ``counts`` (a tensor or an array, (C, C)) as an int64 numpy array."""
    if isinstance(counts, torch.Tensor):
        counts = counts.cpu().numpy()
    return np.asarray(counts, dtype=np.int64)


#: The sentence task (stateless: one object serves every caller).
SENTENCE = SentenceTask()

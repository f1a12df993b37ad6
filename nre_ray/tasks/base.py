"""The task interface: what differs between kinds of relation extraction, behind one small class.

A *task* (sentence-level, document-level, bags of sentences) owns exactly this:

* **its data**: whether a data folder is in one of its formats (:meth:`Task.recognises`), and how its encoded examples
  (what the Ray Data preprocessing wrote to the cache, an :class:`nre_ray.data.batches.EncodedSplit` today) become
  model batches (:meth:`Task.dataset`: a torch dataset whose ``__getitems__`` returns one collated batch, a dict of
  tensors);
* **its model**: the head on an encoder of :mod:`nre_ray.models` (or a whole model of its own) and the loss
  (:meth:`Task.build_model`, :meth:`Task.loss`, :meth:`Task.examples`);
* **its metrics**, from per-worker *counts*: a tensor each rank fills from its exact shard (:meth:`Task.new_counts`,
  :meth:`Task.count`), which the ranks all-reduce (sum). The counts of disjoint shards must sum exactly to the
  counts of their union: int64 counts do, and so do per-example values written at the example's index in the split
  with zeros elsewhere (``x + 0`` is exact), for a metric that needs every score (a ranking). Every score
  (:meth:`Task.scores`) and report (:meth:`Task.write_reports`), a function of the summed counts alone, is then the
  same on 1, 2 or 3 workers;
* **its rows**: what ``python -m nre_ray.predict`` writes and the server answers (:meth:`Task.predict_rows`,
  :attr:`Task.input_columns`, :meth:`Task.output_columns`).

Everything else is one spine for every task: paths and storage, Ray, the Ray Data preprocessing and its cache, the
loop's distribution (samplers, DDP, the elastic steps), MLflow, checkpoints, the console, tune, evaluate, predict and
serve. The spine never branches on the task: it asks the task object. A checkpoint records its task's
:attr:`Task.name` in ``meta.json`` (``"task"``), so evaluate, predict and serve build the same task again
(:func:`nre_ray.tasks.lookup.task_of`; a checkpoint without the field is the sentence task's).

How the tasks fill it in (``B`` examples in a batch, ``T`` tokens, ``C`` labels, ``E`` entities, ``M`` mentions,
``P`` candidate pairs, ``N`` examples in the split):

* **sentence** (:mod:`nre_ray.tasks.sentence`, wired): an example is one sentence with one entity pair and one
  label; a batch is (B, T) ``tokens``, ``head_pos``, ``tail_pos``, ``segments``, ``mask`` and (B,) ``labels``; the
  model's output is logits (B, C); the loss cross-entropy; the counts a (C, C) int64 confusion matrix; the rows one
  per input row, the label and its probability.
* **document** (:mod:`nre_ray.tasks.document`, wired into every command; tune searches a space of its own,
  :meth:`Task.search_space`):
  an example is one document, its entities' mentions and every candidate pair's labels; a batch is (B, T)
  ``input_ids`` and ``mask``, (B, E, M) ``mention_pos``, (B, P, 2) ``pairs`` and (B, P, C) multi-hot ``labels``
  (:class:`~nre_ray.tasks.document.split.DocumentDataset`), with what exact scores need (``intra`` (B, P),
  ``in_train`` (B, P, C), ``uncovered`` (B, 2, C)); the output is logits (B, P, C) with the threshold class at 0
  (:class:`~nre_ray.tasks.document.atlop.DocumentModel`); the loss the adaptive-threshold loss, each document's the
  mean over its pairs; the counts (K, C) int64 per relation: true positives, predicted and gold facts, those seen in
  training and the intra-sentence ones (:mod:`~nre_ray.tasks.document.counts`); the rows one per document
  (its id and its facts), answered (:meth:`Task.answer`) as one per predicted fact: document, head entity, tail
  entity, relation, score.
* **bag** (:mod:`nre_ray.tasks.bag`, chosen with ``--bag-aggregator`` and wired into every command): an example is
  one entity pair, the sentences that name it and its labels; a batch is the bags' sentences as a sentence batch
  (N', T), ``scope`` (B + 1,) and (B, C) multi-hot ``labels``; the output is a pair
  (:class:`~nre_ray.tasks.bag.network.BagClassifier`'s): the (bag, label) instances' logits (K, C), whose
  cross-entropy is the loss, and in eval mode the bags' probabilities (B, C); the counts each bag's scores and gold
  labels at its index in the split, (N, 2, C), zeros elsewhere, which :func:`~nre_ray.tasks.bag.heldout.rank` ranks
  into the held-out curve, evaluate's F1 at the checkpoint's validation threshold (:meth:`Task.checkpoint_scores`,
  and the reports: :meth:`Task.checkpoint_reports`); the rows and answers one per bag (its pair, its relation: NA
  below that threshold, its score, and the top k).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

import torch
from torch import nn

if TYPE_CHECKING:  # only for the annotations: the task modules import the spine's types, not the other way round
    import pandas as pd

    from nre_ray.config import DataConfig
    from nre_ray.data.batches import EncodedSplit
    from nre_ray.data.pipeline import Prepared
    from nre_ray.data.vocab import Vocab
    from nre_ray.models.registry import ModelSpec


class Task(ABC):
    """One kind of relation extraction, as the spine sees it (see the module docstring).

    A task object holds no state: one instance per task (``SENTENCE`` in :mod:`nre_ray.tasks.sentence`), shared by
    every rank, the driver, predict and serve. ``name`` is what a checkpoint's ``meta.json`` records.
    """

    name: ClassVar[str]
    unit: ClassVar[str]
    """What the console calls its examples (``rows``, ``documents``)."""
    bad_unit: ClassVar[str | None] = None
    """What predict and ``python -m nre_ray.data inspect`` call the bad input they left out, where it is not
    :attr:`unit` (a bag file's: its bad sentence rows, and bags none of whose sentences encode)."""
    eval_batch_size: ClassVar[int] = 256
    """Examples per batch when scoring a split."""
    eval_blocks: ClassVar[bool] = False
    """Whether a split is scored in fixed batches (examples ``k * eval_batch_size`` on, whatever the number of
    workers: each rank takes whole batches in turn), for a task whose counts hold float scores that must not depend
    on which examples shared a batch (the bag task's); else each rank takes every ``world_size``-th example."""

    # ---------------------------------------------------------------------------------------------------------------
    # data

    @abstractmethod
    def recognises(self, data_dir: str) -> bool:
        """Whether the folder (or URI) ``data_dir`` holds data in one of this task's formats (its files' names and
        first lines only; nothing is read in full). The spine picks the task from the data (:mod:`nre_ray.tasks.
        lookup`)."""

    record_columns: ClassVar[tuple[tuple[str, str], ...]]
    """A record of this task's data as (MLflow type, column name): the schema MLflow shows for a run's datasets."""

    @abstractmethod
    def format_of(self, data: DataConfig) -> str | None:
        """The format of the training file (a run's ``data.format`` parameter), or None when it cannot be told."""

    @abstractmethod
    def check_data(self, data: DataConfig) -> None:
        """Before Ray starts: the data folder holds this task's training file (DataError naming the folder
        otherwise); explicit input files are checked by the spine."""

    @abstractmethod
    def prepare(self, data: DataConfig, seed: int, pretrained: str | None = None, shared_cache: str | None = None,
                on_every_node: bool = False, multi_node: bool | None = None) -> Prepared:
        """Read, check and encode the data with Ray Data into the preprocessing cache (reused when it holds the same
        inputs and settings): a :class:`nre_ray.data.pipeline.Prepared` whose splits :meth:`dataset` takes and whose
        ``cache_dir`` :meth:`open_split` reads on the workers. The arguments are :func:`nre_ray.data.pipeline.
        prepare`'s."""

    def check_inputs(self, data: DataConfig) -> None:
        """Every check of the input files that needs no Ray (``python -m nre_ray.data inspect``, before it starts
        Ray). Default: :meth:`check_data`."""
        self.check_data(data)

    @abstractmethod
    def is_cached(self, data: DataConfig, seed: int, shared_cache: str | None = None,
                  pretrained: str | None = None) -> bool:
        """Whether :meth:`prepare` (with the same ``pretrained``) would reuse a cache (local, or the shared one
        ``shared_cache``), so needs no Ray (``python -m nre_ray.data inspect``)."""

    @abstractmethod
    def audit_markdown(self, audit: Mapping[str, Any]) -> str:
        """The data audit of :meth:`prepare` (``Prepared.audit``) for people: what ``python -m nre_ray.data
        inspect`` prints and a run logs as ``data/audit.md``."""

    @abstractmethod
    def open_split(self, folder: Path, name: str) -> Any:
        """The split ``name`` of the cache folder ``folder`` (what a worker trains on)."""

    @abstractmethod
    def splits_complete(self, folder: Path, names: list[str]) -> bool:
        """Whether the cache folder ``folder`` holds every file of the splits ``names``."""

    @abstractmethod
    def dataset(self, split: EncodedSplit) -> torch.utils.data.Dataset:
        """The encoded examples of ``split`` as a torch dataset whose ``__getitems__(indices)`` returns one collated
        batch: a dict of tensors, each with the batch as its first dimension (the loaders' ``collate_fn`` passes it
        on as it is)."""

    def train_batches(self, split: EncodedSplit, batch_size: int, rank: int, world_size: int, seed: int
                      ) -> torch.utils.data.Sampler[list[int]] | None:
        """This rank's training batches of ``split`` (a batch sampler with ``set_epoch``, the same number of batches
        on every rank), for a task whose examples are not of one size; None (the default): the loop's random
        (distributed) sampler, ``batch_size`` examples a batch. Not used by elastic runs."""
        return None

    # ---------------------------------------------------------------------------------------------------------------
    # model and loss

    default_model: ClassVar[str | None] = None
    """The ``--model`` a run on this task's data trains when none is given (None: ``--model``'s own default)."""

    def search_space(self, model: str) -> dict[str, dict[str, dict[str, list[Any]]]] | None:
        """The space ``python -m nre_ray.tune`` searches on this task's data without ``--search-space``, for
        ``--model`` ``model``, in a space file's shape (``{"train": {"lr": {"loguniform": [1e-4, 1e-2]}}, ...}``:
        :mod:`nre_ray.tune.space`); None: the spine's space of that model (:data:`nre_ray.tune.space.
        DEFAULT_SPACES`), for a task whose models take the options it searches. Default: None."""
        return None

    def check_settings(self, config: Any) -> None:
        """Before Ray starts: ConfigError (one line) for settings this task cannot train with (``config``: the run's
        :class:`nre_ray.config.Config`). Default: every setting the spine accepts."""
        return None

    @abstractmethod
    def build_model(self, model_config: Any, spec: ModelSpec) -> nn.Module:
        """The model (``--model``'s encoder with this task's head), untrained: ``model(batch) -> output``, where
        ``batch`` is what :meth:`dataset` gives and ``output`` (a tensor, or a tuple of them: the task's own) what
        :meth:`loss` and :meth:`count` read. ``spec``: the sizes the data gives (vocabulary, labels, positions)."""

    @abstractmethod
    def loss(self, output: Any, batch: Mapping[str, torch.Tensor], label_smoothing: float = 0.0,
             reduction: str = "mean") -> torch.Tensor:
        """The loss of ``output`` (the model's, on ``batch``) in float32: a scalar, the mean over the batch's
        examples (``reduction="mean"``, what an optimizer step takes) or their sum (``"sum"``: what the loop adds up
        over an epoch and the elastic steps divide by the step's example count)."""

    @abstractmethod
    def examples(self, batch: Mapping[str, torch.Tensor]) -> int:
        """How many examples ``batch`` holds: what a mean loss is over and examples/s counts."""

    # ---------------------------------------------------------------------------------------------------------------
    # metrics

    @abstractmethod
    def new_counts(self, labels: list[str], num_examples: int, device: torch.device) -> torch.Tensor:
        """Empty counts (zeros) for a split of ``num_examples`` examples (all ranks' together) scored against
        ``labels``, on ``device``."""

    @abstractmethod
    def count(self, counts: torch.Tensor, output: Any, batch: Mapping[str, torch.Tensor]) -> None:
        """Add ``batch``'s examples (the model's ``output`` on them; ``batch["index"]``: their indices in the split)
        to ``counts``, in place. Counting is exact and additive: the counts of a split are the sum of its shards'
        counts, in any order."""

    summary_metrics: ClassVar[tuple[str, ...]]
    """The scores train's summary prints for the validation and test splits (those the run has)."""
    epoch_metric: ClassVar[tuple[str, str]]
    """The console's epoch line shows ``valid_<select metric>`` and this one: (its short name, its score's name)."""

    @abstractmethod
    def metric_names(self, labels: list[str], negative_label: str | None) -> list[str]:
        """The names of the scores a run on ``labels`` reports (what ``--select-metric`` may choose)."""

    def why_no_metric(self, metric: str, labels: list[str], negative_label: str | None) -> str:
        """Why a run on ``labels`` has no score ``metric`` (not among :meth:`metric_names`'): a few words."""
        return f"{self.name} models report other scores"

    @abstractmethod
    def default_metric(self, negative_label: str | None) -> str:
        """The score that selects the best checkpoint when ``--select-metric`` is not given."""

    @abstractmethod
    def scores(self, counts: Any, labels: list[str], negative_label: str | None) -> dict[str, float]:
        """The scores (name -> finite float) of the summed ``counts`` (a tensor or the numpy array of one):
        the keys are the task's metric names, what ``--select-metric`` chooses among."""

    def split_scores(self, counted: Mapping[str, Any], labels: list[str], negative_label: str | None
                     ) -> dict[str, dict[str, float]]:
        """The scores of each split's summed counts at the end of a run (``counted``: split name -> counts), for a
        task whose test scores depend on validation (a threshold chosen there). Default: each split's
        :meth:`scores` on its own."""
        return {name: self.scores(c, labels, negative_label) for name, c in counted.items()}

    def checkpoint_scores(self, counts: Any, labels: list[str], negative_label: str | None,
                          trained: Mapping[str, float]) -> dict[str, float]:
        """The scores ``python -m nre_ray.evaluate`` reports for a checkpoint's summed ``counts``; ``trained``: the
        metrics training recorded with the checkpoint (its state's ``metrics``: ``valid_<score>`` ...), for a task
        whose scores use a choice made on validation (the bag task's threshold). Default: :meth:`scores`."""
        return self.scores(counts, labels, negative_label)

    def checkpoint_per_label(self, counts: Any, labels: list[str], trained: Mapping[str, float]
                             ) -> list[dict[str, Any]]:
        """:meth:`per_label` as evaluate reports it for a checkpoint (``trained``: as :meth:`checkpoint_scores`).
        Default: :meth:`per_label`."""
        return self.per_label(counts, labels)

    @abstractmethod
    def write_reports(self, counts: Any, labels: list[str], folder: Path, name: str, title: str) -> None:
        """Write the split ``name``'s reports of the summed ``counts`` into ``folder`` (tables and plots that MLflow
        keeps under ``reports/``; ``title`` heads the plots)."""

    def checkpoint_reports(self, counts: Any, labels: list[str], trained: Mapping[str, float], folder: Path,
                           name: str, title: str) -> None:
        """:meth:`write_reports` for a checkpoint's summed ``counts`` (``trained``: as :meth:`checkpoint_scores`),
        in agreement with its :meth:`checkpoint_scores`: training's final reports (``trained``: the metrics its best
        checkpoint records) and a sweep's final test (:mod:`nre_ray.tune.results`). Default: :meth:`write_reports`."""
        self.write_reports(counts, labels, folder, name, title)

    @abstractmethod
    def per_label(self, counts: Any, labels: list[str]) -> list[dict[str, Any]]:
        """One dict per label of the summed ``counts`` (``label``, ``precision``, ``recall``, ``f1``, ...):
        what ``python -m nre_ray.evaluate`` reports."""

    # ---------------------------------------------------------------------------------------------------------------
    # rows

    input_columns: ClassVar[tuple[str, ...]]
    """The columns an input row to predict on needs (others are kept; a label column is ignored)."""

    def unsupported(self, command: str) -> str | None:
        """None when ``command`` (``train``, ``evaluate``, ``predict``, ``serve``, ``tune``, ``inspect``: ``python -m
        nre_ray.data inspect``, ``pyfunc``: the MLflow model train logs) works for this task's models and data; else
        the one line that says it does not yet. Default: all do."""
        return None

    @abstractmethod
    def output_columns(self, top_k: int = 0) -> list[str]:
        """The columns a prediction adds to its input row (with ``top_k > 0``: the k best labels too)."""

    @abstractmethod
    def predict_rows(self, model: nn.Module, frame: pd.DataFrame, settings: PredictSettings,
                     top_k: int = 0) -> pd.DataFrame:
        """The prediction rows of the raw rows ``frame`` (:attr:`input_columns`) by ``model`` (in eval mode):
        the :meth:`output_columns` and ``problem`` ("" for good rows), index positional."""

    def answer(self, frame: pd.DataFrame) -> pd.DataFrame:
        """What a user gets for good prediction rows ``frame`` (:meth:`output_columns`, beside the input's columns
        where predict keeps them): the rows predict writes, the pyfunc model returns and the server answers, with
        :meth:`answer_columns`. Default: the rows as they are (one answer per input row)."""
        return frame

    def answer_columns(self, top_k: int = 0) -> list[str]:
        """The prediction columns of :meth:`answer`'s rows. Default: :meth:`output_columns`."""
        return self.output_columns(top_k)

    @abstractmethod
    def encode_file(self, path: str, data: DataConfig, vocab: Vocab, labels: list[str],
                    assets: Mapping[str, bytes] | None, fmt: str | None = None, columns: str | None = None,
                    on_bad_rows: str = "error") -> tuple[Any, int]:
        """``python -m nre_ray.evaluate``'s input: the labelled file ``path`` (``--format``, ``--columns``)
        checked and encoded as the checkpoint's training encoded its data (``data``: its settings), and how many bad
        examples were skipped (``on_bad_rows="skip"``; with ``"error"`` a DataError lists them). The split is what
        :meth:`dataset` takes and its ``save(folder, name)`` writes what :meth:`open_split` reads."""

    @abstractmethod
    def plan_input(self, path: str, fmt: str | None, columns: str | None, chunk_rows: int) -> Any:
        """``python -m nre_ray.predict``'s input ``path`` as chunks of rows (:class:`nre_ray.data.chunks.InputPlan`
        or its shape: ``path``, ``chunks``, ``total_rows``, ``read``, ``read_chunk``, ``offset_columns``): each
        chunk's frame holds the input's own columns and the ``_nre_`` columns :meth:`predict_rows` takes."""

    report_metrics: ClassVar[tuple[str, ...] | None] = None
    """The scores ``python -m nre_ray.evaluate`` prints (None: all of :meth:`scores`)."""

    @abstractmethod
    def pyfunc_signature(self) -> Any:
        """The MLflow ``ModelSignature`` of this task's pyfunc model (its request columns, answer columns and
        ``top_k`` param), which MLflow's scoring code and the model server check requests against."""

    @abstractmethod
    def pyfunc_example(self, vocab: Vocab) -> pd.DataFrame:
        """An input example for the pyfunc model of a checkpoint with vocabulary ``vocab``: a few request rows."""

    request_hint: ClassVar[str] = "Fix these rows and send them again."
    """What a client is told to do about bad rows in a request (after their problems)."""

    def parse_request(self, payload: Any) -> pd.DataFrame | None:
        """A server request's JSON ``payload`` in this task's own form (not MLflow's ``dataframe_records`` ...) as
        request rows (:attr:`input_columns`), or None when it is not one. Default: None (MLflow's forms only)."""
        return None


class PredictSettings(Protocol):
    """What a trained model predicts with besides its weights: the checkpoint's data settings, vocabulary, labels,
    positions and pretrained assets, the device and the batch size (the spine's
    :class:`nre_ray.inference.predictor.Predictor` is one)."""

    config: Any
    vocab: Vocab
    labels: list[str]
    num_positions: int
    assets: dict[str, bytes]
    metrics: dict[str, float]
    """What training recorded with the checkpoint (its state's ``metrics``: ``valid_<score>`` ...)."""
    device: torch.device
    batch_size: int

"""The bag task through the task interface (:class:`nre_ray.tasks.base.Task`): one example is one entity pair's bag
of sentences with the pair's label set (distant supervision, OpenNRE's NYT10 setup). Opt-in: ``--bag-aggregator
att|avg|one`` (:func:`nre_ray.tasks.lookup.task_for`); the same sentence files train either way.

* data: NYT10's TSV (detected from the file; ``--format nyt10`` forces it), OpenNRE JSON Lines (``h.id``/``t.id``),
  CSV/TSV/JSON Lines/Parquet with ``head_id``/``tail_id`` (without ids, a bag is a (head, tail) text pair); grouped
  into bags, capped at ``--max-bag-size`` sentences by seeded sampling, and encoded by Ray Data (:mod:`.grouping`)
  into :class:`~.bag_split.BagSplit` files; batches are :class:`~.bag_split.BagDataset`'s: the bags' N sentences as
  the sentence task's (N, T) tensors, ``scope`` (B + 1,), ``labels`` (B, C) bool, ``index`` (B,); the data audit
  (:mod:`.bag_audit`: ``python -m nre_ray.data inspect --bag-aggregator ...`` and a run's ``data/audit.md``)
  describes those bags;
* model: ``--model``'s encoder (cnn, pcnn, bilstm, transformer, or bert: a pretrained ``--pretrained`` model whose
  tokenizer, with entity markers, encodes the bags' sentences) under the aggregator
  (:class:`~.network.BagClassifier`); its output is ``(logits (K, C), query (K,))`` over the (bag, label) instances,
  with the bags' probabilities (B, C) in eval mode; the loss is softmax cross-entropy per instance (OpenNRE's), each
  bag's the mean over its labels, the mean (or sum) over the B bags;
* metrics: each bag's probabilities and gold labels at its index (:mod:`.bag_scores`): OpenNRE's held-out AUC,
  P@100/200/300, and micro/macro F1 at the threshold chosen on validation; exact on any number of workers;
* rows (:mod:`.bag_rows`): evaluate builds a labelled file's bags as training built them (the checkpoint's
  ``--max-bag-size`` and seed) and scores them at the checkpoint's validation threshold (so a split file gets
  training's scores); predict answers one row per bag: head id, tail id, head, tail, relation (NA below that
  threshold), score, and with ``--top-k`` the k most probable labels; the MLflow pyfunc model and serve take a bag
  a row (its pair and its sentences' texts, :data:`.bag_rows.REQUEST_COLUMNS`) and answer the same rows;
* tune searches the space of ``--model`` (:data:`nre_ray.tune.space.DEFAULT_SPACES`: the bag models take the same
  options), selects on validation AUC and scores the best checkpoint's test bags at its validation threshold
  (:meth:`BagTask.checkpoint_scores`, :meth:`BagTask.checkpoint_reports`).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import torch
from torch import nn

from nre_ray.models.registry import ModelSpec
from nre_ray.tasks.bag import bag_scores
from nre_ray.tasks.bag.bag_split import BagBatchSampler, BagDataset, BagSplit
from nre_ray.tasks.bag.network import build_bag_model, instances
from nre_ray.tasks.base import PredictSettings, Task

if TYPE_CHECKING:
    import pandas as pd

    from nre_ray.config import DataConfig
    from nre_ray.data.batches import EncodedSplit
    from nre_ray.data.pipeline import Prepared
    from nre_ray.data.vocab import Vocab

ISSUE = "issue 38"
SUPPORTED = frozenset({"train", "evaluate", "predict", "serve", "pyfunc", "inspect", "tune"})
"""The commands that take bag data and models (:meth:`BagTask.unsupported`)."""


class BagTask(Task):
    """Relation extraction over entity-pair bags (module docstring)."""

    name: ClassVar[str] = "bag"
    unit: ClassVar[str] = "bags"
    bad_unit: ClassVar[str | None] = "sentence rows or bags"  # bad sentence rows; bags none of whose sentences encode
    eval_batch_size: ClassVar[int] = 32
    eval_blocks: ClassVar[bool] = True  # a bag's probabilities come from the same batch on any number of workers
    input_columns: ClassVar[tuple[str, ...]] = ("head_id", "tail_id", "head", "tail", "sentences")  # REQUEST_COLUMNS
    summary_metrics: ClassVar[tuple[str, ...]] = ("auc", "p_at_100", "p_at_200", "p_at_300", "micro_f1", "macro_f1")
    epoch_metric: ClassVar[tuple[str, str]] = ("p_at_100", "p_at_100")
    record_columns: ClassVar[tuple[tuple[str, str], ...]] = (
        ("string", "head_id"), ("string", "tail_id"), ("string", "head"), ("string", "tail"), ("string", "relation"),
        ("string", "sentence"))

    # data

    def recognises(self, data_dir: str) -> bool:
        """Bags are chosen by ``--bag-aggregator``, never from the data alone (:func:`nre_ray.tasks.lookup.
        task_for`)."""
        return False

    def format_of(self, data: DataConfig) -> str | None:
        """``--format``, else the training file's (:func:`.files.detect_bag_format`)."""
        from nre_ray.tasks.bag.files import detect_bag_format
        from nre_ray.tasks.bag.grouping import find_bag_files

        return data.format or detect_bag_format(find_bag_files(data)["train"])

    def check_data(self, data: DataConfig) -> None:
        """The split files (:func:`.grouping.find_bag_files`: a training file at least) and their formats."""
        from nre_ray.tasks.bag.grouping import find_bag_files, formats_of

        formats_of(find_bag_files(data), data.format)

    def prepare(self, data: DataConfig, seed: int, pretrained: str | None = None, shared_cache: str | None = None,
                on_every_node: bool = False, multi_node: bool | None = None) -> Prepared:
        """:func:`.grouping.prepare_bags` (``pretrained``: ``--model bert``'s model), fetched from or published to
        ``shared_cache``. The bags are written into the cache on the driver's node (the placement arguments do not
        apply)."""
        from nre_ray.tasks.bag.grouping import prepare_bags

        return prepare_bags(data, seed, pretrained, shared_cache)

    def is_cached(self, data: DataConfig, seed: int, shared_cache: str | None = None,
                  pretrained: str | None = None) -> bool:
        """:func:`.grouping.is_cached` (the local cache, or ``shared_cache``)."""
        from nre_ray.tasks.bag.grouping import is_cached

        return is_cached(data, seed, pretrained, shared_cache)

    def audit_markdown(self, audit: Mapping[str, Any]) -> str:
        """:func:`.bag_audit.audit_markdown`: sentences and bags per split (keyed by ids or by text), bag sizes and
        what ``--max-bag-size`` leaves out, multi-label and NA bags, facts per relation, sentence lengths against
        ``--max-length``, entity pairs shared between splits."""
        from nre_ray.tasks.bag.bag_audit import audit_markdown  # pandas: when a run starts

        return audit_markdown(audit)

    def open_split(self, folder: Path, name: str) -> BagSplit:
        """:meth:`BagSplit.open`."""
        return BagSplit.open(folder, name)

    def splits_complete(self, folder: Path, names: list[str]) -> bool:
        """Every split's files (:meth:`BagSplit.files`)."""
        return all((Path(folder) / f).is_file() for n in names for f in BagSplit.files(n))

    def dataset(self, split: EncodedSplit) -> BagDataset:
        """Batches of bags (:class:`BagDataset`)."""
        return BagDataset(split)  # type: ignore[arg-type]

    def train_batches(self, split: EncodedSplit, batch_size: int, rank: int, world_size: int, seed: int
                      ) -> BagBatchSampler:
        """Shards that balance sentences, not bags, each cut into the same number of batches
        (:class:`~.bag_split.BagBatchSampler`)."""
        return BagBatchSampler(split.sizes, batch_size, rank, world_size, seed)  # type: ignore[attr-defined]

    # model and loss

    def check_settings(self, config: Any) -> None:
        """Every ``--model`` works inside a bag, and elastic runs take bags: a bag's loss is its own, so an elastic
        step is the same update at any world size (tests/unit/test_bag_rows.py). Nothing to refuse."""

    def build_model(self, model_config: Any, spec: ModelSpec) -> nn.Module:
        """``--model``'s encoder under ``--bag-aggregator`` (:func:`.network.build_bag_model`)."""
        return build_bag_model(model_config, spec, model_config.bag_aggregator)

    def loss(self, output: tuple[torch.Tensor, ...], batch: Mapping[str, torch.Tensor], label_smoothing: float = 0.0,
             reduction: str = "mean") -> torch.Tensor:
        """Softmax cross-entropy of each (bag, label) instance's logits (K, C) against its label; a bag's loss is
        the mean over its instances (one for a bag with one label); the mean or the sum over the B bags."""
        logits, query = output[0], output[1]
        bag_of, _ = instances(batch["labels"])  # (K,)
        per_instance = nn.functional.cross_entropy(logits.float(), query, label_smoothing=label_smoothing,
                                                   reduction="none")  # (K,)
        num_bags = batch["labels"].shape[0]
        sums = torch.zeros(num_bags, dtype=torch.float32, device=logits.device).index_add(0, bag_of, per_instance)
        per_bag = sums / torch.bincount(bag_of, minlength=num_bags).clamp(min=1)  # (B,)
        return per_bag.sum() if reduction == "sum" else per_bag.mean()

    def examples(self, batch: Mapping[str, torch.Tensor]) -> int:
        """The batch's bags."""
        return batch["labels"].shape[0]

    # metrics

    def new_counts(self, labels: list[str], num_examples: int, device: torch.device) -> torch.Tensor:
        """(N, 2, C) float32 zeros (:mod:`.bag_scores`)."""
        return bag_scores.new_counts(num_examples, len(labels), device)

    def count(self, counts: torch.Tensor, output: tuple[torch.Tensor, ...], batch: Mapping[str, torch.Tensor]
              ) -> None:
        """:func:`.bag_scores.count` of the bags' probabilities (the eval-mode output's third part)."""
        bag_scores.count(counts, output[2], batch)

    def metric_names(self, labels: list[str], negative_label: str | None) -> list[str]:
        """:data:`.bag_scores.METRICS`."""
        return list(bag_scores.METRICS)

    def default_metric(self, negative_label: str | None) -> str:
        """``auc``: the area under the held-out PR curve, as OpenNRE selects NYT10 models."""
        return "auc"

    def scores(self, counts: Any, labels: list[str], negative_label: str | None) -> dict[str, float]:
        """:func:`.bag_scores.scores` (F1 at the split's own best threshold)."""
        return bag_scores.scores(counts, labels, negative_label)

    def split_scores(self, counted: Mapping[str, Any], labels: list[str], negative_label: str | None
                     ) -> dict[str, dict[str, float]]:
        """:func:`.bag_scores.split_scores`: the test split's F1 at the threshold chosen on validation."""
        return bag_scores.split_scores(counted, labels, negative_label)

    def write_reports(self, counts: Any, labels: list[str], folder: Path, name: str, title: str) -> None:
        """The held-out PR curve as data and plot, and the per-relation table (:func:`.bag_scores.write_reports`)."""
        bag_scores.write_reports(counts, labels, None, folder, name, title)

    def per_label(self, counts: Any, labels: list[str]) -> list[dict[str, Any]]:
        """:func:`.bag_scores.per_label`."""
        return bag_scores.per_label(counts, labels, None)

    def checkpoint_scores(self, counts: Any, labels: list[str], negative_label: str | None,
                          trained: Mapping[str, float]) -> dict[str, float]:
        """:func:`.bag_scores.scores` with the F1 scores at the checkpoint's validation threshold (what training
        scored its test split at: :func:`.bag_scores.split_scores`)."""
        from nre_ray.tasks.bag.bag_rows import threshold_of

        return bag_scores.scores(counts, labels, negative_label, threshold_of(trained))

    def checkpoint_per_label(self, counts: Any, labels: list[str], trained: Mapping[str, float]
                             ) -> list[dict[str, Any]]:
        """:func:`.bag_scores.per_label` at the checkpoint's validation threshold."""
        from nre_ray.tasks.bag.bag_rows import threshold_of

        return bag_scores.per_label(counts, labels, None, threshold_of(trained))

    def checkpoint_reports(self, counts: Any, labels: list[str], trained: Mapping[str, float], folder: Path,
                           name: str, title: str) -> None:
        """:func:`.bag_scores.write_reports` with the per-relation table at the checkpoint's validation threshold
        (as :meth:`checkpoint_scores` scores its F1)."""
        from nre_ray.tasks.bag.bag_rows import threshold_of

        bag_scores.write_reports(counts, labels, None, folder, name, title, threshold_of(trained))

    report_metrics: ClassVar[tuple[str, ...] | None] = (*summary_metrics, "threshold")

    # rows

    def unsupported(self, command: str) -> str | None:
        """Every command takes bags (:data:`SUPPORTED`)."""
        if command in SUPPORTED:
            return None
        return f"bag models: {command} is not supported yet ({ISSUE})"

    def output_columns(self, top_k: int = 0) -> list[str]:
        """Per bag: its pair, relation and score (:func:`.bag_rows.output_columns`; with ``top_k`` the top-k
        lists)."""
        from nre_ray.tasks.bag import bag_rows

        return bag_rows.output_columns(top_k)

    def answer(self, frame: pd.DataFrame) -> pd.DataFrame:
        """One row per bag, its prediction columns only (:func:`.bag_rows.answer`)."""
        from nre_ray.tasks.bag import bag_rows

        return bag_rows.answer(frame)

    def encode_file(self, path: str, data: DataConfig, vocab: Vocab, labels: list[str],
                    assets: Mapping[str, bytes] | None, fmt: str | None = None, columns: str | None = None,
                    on_bad_rows: str = "error") -> tuple[BagSplit, int]:
        """:func:`.bag_rows.encode_file`: a labelled file's bags, built and encoded as the checkpoint's training built
        them."""
        from nre_ray.tasks.bag import bag_rows

        return bag_rows.encode_file(path, data, vocab, labels, assets, fmt, columns, on_bad_rows)

    def plan_input(self, path: str, fmt: str | None, columns: str | None, chunk_rows: int) -> Any:
        """:func:`.bag_rows.plan_bags`: one row per bag."""
        from nre_ray.tasks.bag import bag_rows

        return bag_rows.plan_bags(path, fmt, columns, chunk_rows)

    def predict_rows(self, model: nn.Module, frame: pd.DataFrame, settings: PredictSettings,
                     top_k: int = 0) -> pd.DataFrame:
        """:func:`.bag_rows.predict_rows`: per bag its pair, its relation (NA below the checkpoint's validation
        threshold) and score, and with ``top_k > 0`` its k most probable labels."""
        from nre_ray.tasks.bag import bag_rows

        return bag_rows.predict_rows(model, frame, settings, top_k)

    request_hint: ClassVar[str] = ("Fix these bags (head_id, tail_id: the pair's ids, \"\" when there are none; head, "
                                   "tail; sentences: a list of texts, each naming the head and the tail as written) "
                                   "and send them again.")

    def pyfunc_signature(self) -> Any:
        """Inputs ``head_id``, ``tail_id``, ``head``, ``tail`` (string) and ``sentences`` (any JSON: a list of
        texts); outputs one row per bag (:data:`.bag_rows.OUTPUT_COLUMNS`); param ``top_k`` (also the k most probable
        labels, ``top_k_labels`` and ``top_k_scores``; default 0)."""
        from mlflow.models import ModelSignature
        from mlflow.types import ColSpec, ParamSchema, ParamSpec, Schema
        from mlflow.types.schema import AnyType

        from nre_ray.tasks.bag import bag_rows

        inputs = Schema([*(ColSpec("string", c) for c in bag_rows.PAIR_COLUMNS), ColSpec(AnyType(), "sentences")])
        outputs = Schema([*(ColSpec("string", c) for c in bag_rows.OUTPUT_COLUMNS if c != "score"),
                          ColSpec("double", "score")])
        return ModelSignature(inputs=inputs, outputs=outputs, params=ParamSchema([ParamSpec("top_k", "long", 0)]))

    def pyfunc_example(self, vocab: Vocab) -> pd.DataFrame:
        """The first bag of the bundled bag sample's test file, as a request row."""
        import json

        import pandas as pd

        from nre_ray.tasks.bag import bag_rows
        from nre_ray.tasks.bag.grouping import sample_dir

        bags, _ = bag_rows.read_bags(str(sample_dir() / "test.tsv"), None, None, None, 0, "NA")
        first = bags.iloc[0]
        return pd.DataFrame([{**{c: first[c] for c in bag_rows.PAIR_COLUMNS},
                              "sentences": [x["sentence"] for x in json.loads(first["sentences"])]}])

    def parse_request(self, payload: Any) -> pd.DataFrame | None:
        """A bag (an object with ``head``, ``tail`` and ``sentences``; ``head_id``/``tail_id`` optional), a list of
        them, or ``{"bags": [...]}``, as request rows (:data:`.bag_rows.REQUEST_COLUMNS`); None for anything else."""
        import pandas as pd

        from nre_ray.tasks.bag import bag_rows

        items = payload.get("bags") if isinstance(payload, dict) and set(payload) <= {"bags", "params"} else payload
        items = [items] if isinstance(items, dict) else items
        if not isinstance(items, list) or not items or not all(
                isinstance(b, dict) and {"head", "tail", "sentences"} <= set(b) for b in items):
            return None
        return pd.DataFrame([{c: b.get(c, "") for c in bag_rows.REQUEST_COLUMNS} for b in items],
                            columns=list(bag_rows.REQUEST_COLUMNS))


#: The bag task (stateless: one object serves every caller).
BAG = BagTask()

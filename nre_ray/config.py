"""One typed configuration tree for a training run.

Every field carries its help text; the CLI (``python -m nre_ray.train``) is generated from these dataclasses, and an
optional TOML file (``--config run.toml`` with ``[data]``, ``[model]``, ``[train]``, ``[run]`` tables) fills the same
fields. Command-line flags override the file. An unknown key or a value of the wrong type is an error with a hint.
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import os
import re
import tomllib
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nre_ray import storage
from nre_ray.core.user_error import ConfigError

#: The encoders of nre_ray.models.registry (kept here so that --help and the parser need not import torch;
#: tests/unit/test_config.py checks that the two agree).
MODELS = ("cnn", "pcnn", "bilstm", "transformer", "bert")
#: The validation scores of the sentence task (nre_ray.tasks.sentence.metrics.scores), any of which can select the
#: best checkpoint (--select-metric). The pos_* scores need --negative-label; semeval_macro_f1 also needs directed
#: labels such as Cause-Effect(e1,e2). tests/unit/test_config.py checks them against nre_ray.tasks.sentence.metrics.
METRICS = ("accuracy", "macro_f1", "macro_precision", "macro_recall", "micro_f1", "micro_precision", "micro_recall",
           "pos_macro_f1", "pos_micro_f1", "pos_micro_precision", "pos_micro_recall", "semeval_macro_f1")
#: The document task's scores besides micro_* and macro_f1 (nre_ray.tasks.document.counts.METRICS; its default is
#: micro_f1, F1 over facts). Which of all these a run may choose is said once its data is read.
DOCUMENT_METRICS = ("ign_f1", "ign_precision", "intra_f1", "inter_f1")
#: The bag task's held-out scores besides micro_* and macro_f1 (nre_ray.tasks.bag.bag_scores.METRICS; its default is
#: auc, the area under the held-out precision-recall curve, as OpenNRE reports NYT10).
BAG_METRICS = ("auc", "p_at_100", "p_at_200", "p_at_300", "max_f1", "mean_precision")
#: --bag-aggregator: how a bag's sentence vectors become its scores (nre_ray.tasks.bag.aggregators.AGGREGATORS).
BAG_AGGREGATORS = ("att", "avg", "one")


#: Settings added after runs had written their configs, with the value that reproduces what those runs did: a stored
#: config without one gets it (:meth:`Config.from_stored`), so an older checkpoint predicts as it was trained.
EARLIER_BEHAVIOUR: dict[tuple[str, str], Any] = {
    ("data", "entity_markers"): False,
}


class CommandParser(argparse.ArgumentParser):
    """The parser of every ``python -m nre_ray...`` command: a usage error is one line, ``error: MESSAGE; did you
    mean ...? See PROG --help``, exit status 2, not argparse's whole usage before it (train's runs to 52 lines
    and hides the line that matters). Subcommands' parsers are of this class too (``add_subparsers``)."""

    def error(self, message: str) -> typing.NoReturn:
        guess = _did_you_mean(message)
        self.exit(2, f"error: {message}{guess}{' ' if guess else '. '}See {self.prog} --help\n")


def _did_you_mean(message: str) -> str:
    """``; did you mean 'cnn'?`` for argparse's ``invalid choice: 'cnnn' (choose from 'cnn', ...)``; else ""."""
    found = re.search(r"invalid choice: '([^']*)' \(choose from (.*)\)$", message)
    if not found:
        return ""
    offered = re.findall(r"'([^']*)'", found[2]) or [c.strip() for c in found[2].split(",")]
    close = difflib.get_close_matches(found[1], offered, n=1)
    return f"; did you mean {close[0]!r}?" if close else ""


#: The help of every command's --address (how nre_ray.cluster.session.resolve_address reads it).
ADDRESS_HELP = ("Ray cluster to join: HOST:PORT (the head's GCS, port 6379 by default), ray://HOST:PORT (Ray Client) "
                "or auto (the Ray `ray start` runs on this machine); default: RAY_ADDRESS if set, else a local Ray "
                "this command starts. Not the dashboard's http:// address: that one is for `ray job submit`.")

#: The least share of a CPU a CPU worker gets unless --cpus-per-worker says otherwise: two workers per CPU, so
#: that ``--num-workers 4`` runs on a 2-core laptop. Below it a run spends its time switching between processes:
#: each worker is a whole torch process (its own interpreter, torch and model: hundreds of MB, started one after
#: another), and every step of DDP ends in gloo's all-reduce, which waits for the slowest rank, that is for every
#: rank sharing a core to have had its turn. 64 workers on 2 CPUs (0.03 each) took 261 s just to start.
MIN_CPUS_PER_WORKER = 0.5
#: The help of --cpus-per-worker, in every command that sizes workers (train, tune, evaluate, predict).
CPUS_PER_WORKER_HELP = (
    "CPUs reserved for each worker; its torch threads are the whole CPUs of it. Default: CPU workers share the "
    f"cluster's CPUs evenly, at most 1 and at least {MIN_CPUS_PER_WORKER:g} each (one thread per process scales best "
    "for these models; more workers than that are refused before Ray starts); GPU workers take their node's CPUs "
    "per GPU, at most 4. A share given here is used as given where the nodes hold it: oversubscription on purpose, "
    "e.g. --num-workers 8 --cpus-per-worker 0.25 on 2 CPUs.")


#: The default of an option that has none: its flag is required (``--model`` of predict, evaluate and serve).
REQUIRED: Any = dataclasses.MISSING


def option(default: Any, help: str, choices: tuple[str, ...] | None = None, flag: str | None = None,
           cli: bool = True, metavar: str | None = None, parse: typing.Callable[[str], Any] | None = None,
           env: str | None = None) -> Any:
    """A field of a command's typed options (a section of :class:`Config`, or the options of predict, evaluate,
    serve, tune's sweep, ``nre_ray.data``'s subcommands, the stand-in, spot_watch): its default (:data:`REQUIRED`:
    none), the help of its flag ``--field-name``, the values it accepts, and ``cli=False`` for a field that has no
    flag. :func:`add_options` makes the flags of a class of them.

    ``flag``: a name in capitals (``"INPUT"``) makes the field a positional argument of that name instead of a flag.
    ``metavar``: the flag's value as its help shows it (default: the field's name in capitals). ``parse``: what turns
    the text given into the value, when not the field's type (a number with a range checked, an ``N`` or
    ``MIN-MAX``); its ``argparse.ArgumentTypeError`` is the usage error. ``env``: the environment variable whose
    value, when set as the parser is made, is the default instead of ``default`` (parsed as given text)."""
    if flag is not None and not re.fullmatch(r"[A-Z][A-Z_]*", flag):
        raise ValueError(f"option flag {flag!r}: a positional argument's name in capitals, such as INPUT")
    meta = {"help": help, "choices": choices, "flag": flag, "cli": cli, "metavar": metavar, "parse": parse,
            "env": env}
    if default is REQUIRED:
        return field(metadata=meta)
    if isinstance(default, (list, dict)):
        return field(default_factory=lambda: type(default)(default), metadata=meta)
    return field(default=default, metadata=meta)


def worker_count(text: str) -> int | str:
    """The argparse type of ``--num-workers``: ``N`` as an int, ``MIN-MAX`` as it is (split by
    :meth:`Config.from_dict`)."""
    return int(text) if text.strip().isdigit() else text


_f = option  # the short name of the many fields below

#: The input formats every command that reads rows accepts (--format).
FORMATS = ("csv", "tsv", "jsonl", "parquet", "deepke", "opennre", "semeval")
#: The formats of bags (--bag-aggregator) alone: NYT10's TSV (nre_ray.tasks.bag.files.NYT10).
BAG_ONLY_FORMATS = ("nyt10",)

#: The options that mean the same in several commands, each with its one default, help and choices; a command's
#: options take one with :func:`shared` (tests/unit/test_config.py checks that each command's flag says the same).
SHARED: dict[str, dict[str, Any]] = {
    "address": {"default": None, "help": ADDRESS_HELP},
    "tracking_uri": {"default": None, "help": "MLflow tracking URI: sqlite:///PATH or a server http://HOST:PORT "
                                              "(default: MLFLOW_TRACKING_URI, else sqlite:///mlflow.db in the "
                                              "working directory)."},
    "cpus_per_worker": {"default": None, "help": CPUS_PER_WORKER_HELP},
    "format": {"default": None, "help": "Input format; detected from the file when not given (nyt10, NYT10's TSV: "
                                        "bags only, --bag-aggregator).", "choices": FORMATS + BAG_ONLY_FORMATS},
    "columns": {"default": None, "help": "Column mapping for files with other column names, e.g. "
                                         "'entity1=head,offset1=head_offset,entity2=tail,offset2=tail_offset'."},
    "trained_model": {"default": REQUIRED,
                      "help": "A checkpoint folder (a local path or a URI such as "
                              "s3://BUCKET/runs/RUN/checkpoint_...), an MLflow model URI runs:/<run_id>/model, or a "
                              "registered model models:/<name>/<version> or models:/<name>@<alias> (an alias is "
                              "pinned to the version it names when the command starts); runs:/ and models:/ are "
                              "looked up at --tracking-uri."},
}


def shared(name: str) -> Any:
    """The field of the option ``name`` of :data:`SHARED` (``"trained_model"``: the ``--model`` of the commands that
    use a trained model), for a command's options class."""
    return option(**SHARED[name])


@dataclass
class DataConfig:
    """Where the data is and how it becomes tensors."""

    data_dir: str | None = _f(None, "Folder with train.csv and optionally valid.csv, test.csv, relation.txt. "
                                    "Default: the sample dataset bundled with nre_ray.")
    train: str | None = _f(None, "Explicit training file (overrides the one in --data-dir).")
    valid: str | None = _f(None, "Explicit validation file.")
    test: str | None = _f(None, "Explicit test file.")
    labels: str | None = _f(None, "Label file (relation.txt: one label per line, in class order).")
    format: str | None = shared("format")
    columns: str | None = shared("columns")
    tokenizer: str = _f("regex", "'regex': words and punctuation for alphabetic scripts, one token per character "
                                 "for Chinese/Japanese/Korean; 'jieba': Chinese word segmentation, each entity kept "
                                 "as one token.", choices=("regex", "jieba"))
    lowercase: bool = _f(True, "Lower-case tokens before building the vocabulary.")
    min_freq: int = _f(2, "Minimum count in the training split for a token to enter the vocabulary.")
    max_length: int = _f(128, "Maximum tokens per sentence; longer sentences keep a window around both entities.")
    position_window: int = _f(50, "Relative positions to the head and tail are clipped to +-this value.")
    valid_fraction: float = _f(0.1, "Without a validation file, this seeded stratified share of train validates.")
    on_bad_rows: str = _f("error", "'error': stop before training and list the bad rows; 'skip': train on the good "
                                   "rows and write the rejected ones next to the run.", choices=("error", "skip"))
    negative_label: str | None = _f(None, "The 'no relation' label (e.g. Other, no_relation, NA); adds the "
                                          "positive-class scores and makes them the default selection metric.")
    cache_dir: str | None = _f(None, "Folder for the preprocessing cache (default: .nre_ray_cache in the working "
                                     "directory; under the storage path with --allow-local-storage; with an "
                                     "s3://... storage path, a copy in the temporary folder of the cache under it).")
    no_cache: bool = _f(False, "Rebuild the preprocessed data even when a cached copy exists.")
    entity_markers: bool = _f(True, "Wrap the head and the tail in marker tokens ([E1] ... [/E1], [E2] ... [/E2]) "
                                    "that the encoders trained from scratch read as words (--model bert always "
                                    "uses markers).")
    typed_markers: bool = _f(True, "Entity markers carry the entity types (<e1:person> ... </e1:person>) where "
                                   "head_type/tail_type are given; else, and with --no-typed-markers, [E1] ... [/E1].")
    max_bag_size: int = _f(100, "--bag-aggregator runs: a bag (an entity pair's sentences) keeps at most this many "
                                "sentences, a uniform sample drawn by --seed (its label still counts every sentence), "
                                "so that one huge bag cannot exhaust a worker.")


@dataclass
class ModelConfig:
    """The encoder and its classifier head."""

    model: str = _f("cnn", "Encoder: cnn, pcnn, bilstm (attention BiLSTM), transformer, bert (a pretrained "
                           "transformer fine-tuned with entity markers: give --pretrained).", choices=MODELS)
    word_dim: int = _f(100, "Word embedding size.")
    pos_dim: int = _f(10, "Size of each of the two relative-position embeddings.")
    hidden_size: int = _f(320, "Encoder size: CNN/PCNN filters, BiLSTM units of both directions together, "
                               "Transformer d_model.")
    kernel_size: int = _f(3, "CNN/PCNN convolution width.")
    dropout: float = _f(0.4, "Dropout before the classifier.")
    embedding_dropout: float = _f(0.2, "Dropout on the word and position embeddings of the encoders trained from "
                                       "scratch.")
    num_layers: int | None = _f(None, "BiLSTM / Transformer layers; when not given: 1 for bilstm, 2 for transformer.")
    num_heads: int | None = _f(None, "Transformer attention heads; must divide --hidden-size. When not given: the "
                                     "largest of 8, 4, 2, 1 that divides it.")
    max_positions: int = _f(512, "Longest input the transformer's learned absolute position embedding covers; must "
                                 "be >= --max-length.")
    pretrained: str | None = _f(None, "--model bert: a pretrained transformer (BERT, RoBERTa, MiniLM, ...) as a local "
                                      "folder written by save_pretrained() or a Hugging Face hub name (needs "
                                      "network access on every node). A folder must be readable on every node.")
    with_cls: bool = _f(False, "--model bert: also feed the first token's state ([CLS]) to the classifier, besides "
                               "the two entity start markers'.")
    gradient_checkpointing: bool = _f(False, "--model bert: recompute activations in the backward pass (less "
                                             "memory, about 30% slower).")
    bag_aggregator: str | None = _f(None, "Train on bags (distant supervision): every sentence of one entity pair "
                                          "(head_id/tail_id, else the head and tail texts) is one example, labelled "
                                          "with all its pair's relations; 'att': selective attention, 'avg': the "
                                          "mean, 'one': the most confident sentence. Default: sentence by sentence.",
                                    choices=BAG_AGGREGATORS)
    embeddings: str | None = _f(None, "Pretrained word vectors in the word2vec/GloVe text format (.txt/.vec, "
                                      "optionally .gz) loaded into the word embedding for vocabulary words; their "
                                      "dimension must equal --word-dim. The file must be readable on every node.")

    def pretrained_source(self) -> str | None:
        """``--pretrained`` as preprocessing and the workers read it: None unless ``--model bert``; a local folder
        made absolute (Ray workers run in another directory); a URI or a hub name as given."""
        if self.model != "bert" or not self.pretrained:
            return None
        if storage.is_uri(self.pretrained) or Path(self.pretrained).expanduser().exists():
            return storage.absolute(self.pretrained)
        return self.pretrained


@dataclass
class TrainConfig:
    """The optimisation loop."""

    epochs: int = _f(100, "The most epochs to train; early stopping (--patience) usually ends training sooner.")
    batch_size: int = _f(32, "Examples per step on each worker (the global batch is this times --num-workers, times "
                             "MAX for --num-workers MIN-MAX at every world size).")
    lr: float = _f(2e-3, "Adam learning rate (--model bert: the classifier head's).")
    weight_decay: float = _f(1e-4, "Weight decay: Adam's L2 penalty (--model bert: AdamW's decoupled decay, not on "
                                   "biases and norms).")
    grad_clip: float = _f(5.0, "Clip the gradient norm to this value (0 disables).")
    label_smoothing: float = _f(0.1, "Label smoothing of the training loss (0: plain cross-entropy).")
    lr_factor: float = _f(0.3, "ReduceLROnPlateau factor, applied when the selection metric stops improving.")
    lr_patience: int = _f(5, "ReduceLROnPlateau patience in epochs.")
    patience: int = _f(10, "Stop early after this many epochs without improvement of the selection metric (0: off).")
    select_metric: str | None = _f(None, "Validation metric that selects the best checkpoint (default: macro_f1, or "
                                         "pos_macro_f1 with --negative-label). The pos_* scores need "
                                         "--negative-label; semeval_macro_f1 also needs directed labels such as "
                                         "Cause-Effect(e1,e2). Document data: micro_f1 (the default), "
                                         "ign_f1, intra_f1, inter_f1, ... Bags: auc (the default), p_at_100, ...",
                                         choices=METRICS + DOCUMENT_METRICS + BAG_METRICS)
    seed: int = _f(1, "Random seed for initialisation, shuffling and the validation split.")
    num_workers: int = _f(2, "Training workers (processes); one per GPU with --use-gpu. MIN-MAX (e.g. 1-3): an "
                             "elastic run, which starts once MIN workers can be placed, grows towards MAX as room "
                             "appears and goes on with fewer when a node goes; its global batch (--batch-size x MAX "
                             "x --grad-accum) and so its learning-rate schedule are the same at every size, and a "
                             "preemption notice makes it save a mid-epoch checkpoint. In a TOML file: \"1-3\".",
                             parse=worker_count)
    min_workers: int | None = _f(None, "The MIN of --num-workers MIN-MAX (None: a fixed number of workers).", cli=False)
    use_gpu: bool = _f(False, "Train on GPUs, one per worker.")
    cpus_per_worker: float | None = shared("cpus_per_worker")
    keep_checkpoints: int = _f(2, "Checkpoints kept besides the latest: the best by the selection metric (an epoch "
                                  "that only ties an earlier best does not count as better).")
    max_failures: int = _f(0, "Restart the worker group from the latest checkpoint up to this many times.")
    max_preemptions: int | None = _f(None, "Restart after a preemption (a node drained with a preemption notice, as "
                                           "a cloud takes back a spot instance) up to this many times, counted apart "
                                           "from --max-failures; default: no limit.")
    placement_timeout: float | None = _f(None, "Seconds to wait for the worker group to be placed (also after a lost "
                                               "node) before the run fails; default 60 on a fixed cluster, 900 where "
                                               "an autoscaler can add nodes.")
    encoder_lr: float = _f(1e-4, "--model bert: AdamW learning rate of the pretrained encoder (--lr is the "
                                 "classifier head's).")
    warmup_ratio: float = _f(0.1, "--model bert: share of the training steps with a linear learning-rate warm-up; "
                                  "the rate then decays linearly to 0.")
    grad_accum: int = _f(1, "Accumulate gradients over this many batches per optimizer step.")
    amp: bool = _f(True, "Automatic mixed precision on GPU (bf16 where supported, else fp16 with loss scaling); "
                         "no effect on CPU.")


@dataclass
class RunConfig:
    """Where the run goes: Ray cluster, storage, MLflow."""

    experiment_name: str = _f("nre_ray", "MLflow experiment.")
    run_name: str | None = _f(None, "Name of the run (Ray Train run and MLflow run); default: model, time and a "
                                    "random suffix.")
    tracking_uri: str | None = shared("tracking_uri")
    storage_path: str | None = _f(None, "Where Ray Train writes checkpoints (shared storage on a cluster, e.g. "
                                        "s3://bucket/path); default ./ray_results.")
    address: str | None = shared("address")
    summary_json: str | None = _f(None, "Write the run id, best checkpoint, best epoch and metrics here as JSON.")
    resume: bool = _f(False, "Continue the interrupted run --run-name in --storage-path from its latest checkpoint, "
                             "logging into the same MLflow run (same data and model settings required).")
    log_model: bool = _f(True, "At the end, log the selected checkpoint as the run's MLflow pyfunc model "
                               "(runs:/<run_id>/model), which labels raw rows and can be served.")
    allow_local_storage: bool = _f(False, "On a cluster of several nodes, accept a --storage-path on this machine's "
                                          "disk or a tracking URI only this machine reaches (with a warning): for a "
                                          "folder mounted at the same path on every node, such as NFS. The "
                                          "preprocessing cache then goes under it (.nre_ray_cache) unless "
                                          "--cache-dir is given.")
    register_model: str | None = _f(None, "Also register that model in the MLflow model registry under this name "
                                          "(models:/NAME/1, 2, ...).")


@dataclass
class Config:
    """The whole run configuration."""

    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    run: RunConfig = field(default_factory=RunConfig)

    def to_dict(self) -> dict[str, dict[str, Any]]:
        """Plain nested dict (JSON-serialisable)."""
        return dataclasses.asdict(self)

    def flat(self) -> dict[str, Any]:
        """``{"section.field": value}`` for MLflow params."""
        return {f"{s}.{k}": v for s, sec in self.to_dict().items() for k, v in sec.items()}

    @classmethod
    def from_stored(cls, raw: dict[str, Any], source: str = "config") -> Config:
        """:meth:`from_dict` of a config written by an earlier run (a checkpoint's ``config.json``): a setting added
        since then gets the value that reproduces what that run did (:data:`EARLIER_BEHAVIOUR`), not today's
        default."""
        raw = {section: dict(values) if isinstance(values, dict) else values for section, values in raw.items()}
        for (section, key), value in EARLIER_BEHAVIOUR.items():
            if isinstance(raw.get(section), dict):
                raw[section].setdefault(key, value)
        return cls.from_dict(raw, source)

    @classmethod
    def from_dict(cls, raw: dict[str, Any], source: str = "config") -> Config:
        """Build from a nested dict, rejecting unknown sections/keys and values of the wrong type."""
        sections = {f.name: f.type for f in dataclasses.fields(cls)}
        unknown = set(raw) - set(sections)
        if unknown:
            raise ConfigError(f"{source}: unknown section(s) {sorted(unknown)}; expected {sorted(sections)}")
        model = (raw.get("model") or {}).get("model") if isinstance(raw.get("model"), dict) else None
        if isinstance(raw.get("train"), dict) and isinstance(raw["train"].get("num_workers"), str):
            raw = {**raw, "train": {**raw["train"], **_worker_range(raw["train"]["num_workers"], source)}}
        kwargs = {}
        for f in dataclasses.fields(cls):
            section_cls = SECTIONS[f.name]
            values = raw.get(f.name, {})
            defaults = MODEL_DEFAULTS.get(model or ModelConfig.model, {}).get(f.name, {})
            if isinstance(values, dict) and defaults:  # the settings not given take the model's own defaults
                values = {**defaults, **{k: v for k, v in values.items() if v is not None}}
            kwargs[f.name] = _build_section(section_cls, values, f"{source}: [{f.name}]")
        cfg = cls(**kwargs)
        cfg.validate()
        return cfg

    def validate(self) -> None:
        """Check value ranges; raise ConfigError with the flag to fix."""
        checks = [
            (self.train.epochs >= 1, "--epochs must be >= 1"),
            (self.train.batch_size >= 1, "--batch-size must be >= 1"),
            (self.train.num_workers >= 1, "--num-workers must be >= 1"),
            (self.train.min_workers is None or 1 <= self.train.min_workers <= self.train.num_workers,
             f"--num-workers {self.train.min_workers}-{self.train.num_workers}: MIN must be >= 1 and <= MAX"),
            (self.train.max_preemptions is None or self.train.max_preemptions >= 0,
             "--max-preemptions must be >= 0"),
            (self.train.cpus_per_worker is None or self.train.cpus_per_worker >= 0.01,
             "--cpus-per-worker must be >= 0.01"),
            (self.train.lr > 0, "--lr must be > 0"),
            (self.data.max_length >= 4, "--max-length must be >= 4"),
            (self.data.position_window >= 1, "--position-window must be >= 1"),
            (0 < self.data.valid_fraction < 1, "--valid-fraction must be between 0 and 1"),
            (self.data.min_freq >= 1, "--min-freq must be >= 1"),
            (self.data.max_bag_size >= 1, "--max-bag-size must be >= 1"),
            (self.data.format not in BAG_ONLY_FORMATS or self.model.bag_aggregator is not None,
             f"--format {self.data.format} is for bags: add --bag-aggregator att, avg or one"),
            (0 <= self.model.dropout < 1, "--dropout must be in [0, 1)"),
            (0 <= self.model.embedding_dropout < 1, "--embedding-dropout must be in [0, 1)"),
            (0 <= self.train.label_smoothing < 1, "--label-smoothing must be in [0, 1)"),
            (self.model.kernel_size >= 1 and self.model.kernel_size % 2 == 1, "--kernel-size must be odd and >= 1"),
            (self.train.keep_checkpoints >= 1, "--keep-checkpoints must be >= 1"),
            (self.train.placement_timeout is None or self.train.placement_timeout > 0,
             "--placement-timeout must be > 0 seconds"),
            (not self.run.resume or bool(self.run.run_name), "--resume needs the --run-name of the run to continue"),
            (self.model.num_layers is None or self.model.num_layers >= 1, "--num-layers must be >= 1"),
            (self.model.num_heads is None or self.model.num_heads >= 1, "--num-heads must be >= 1"),
            (self.model.model != "transformer" or not self.model.num_heads
             or self.model.hidden_size % self.model.num_heads == 0,
             f"--num-heads {self.model.num_heads} must divide --hidden-size {self.model.hidden_size}"),
            (self.train.grad_accum >= 1, "--grad-accum must be >= 1"),
            (0 <= self.train.warmup_ratio < 1, "--warmup-ratio must be in [0, 1)"),
            (self.train.encoder_lr > 0, "--encoder-lr must be > 0"),
            (self.model.model != "bert" or bool(self.model.pretrained),
             "--model bert needs --pretrained PATH_OR_NAME (a local model folder or a hub name)"),
            (self.model.model == "bert" or not self.model.pretrained,
             f"--pretrained is for --model bert (this run trains --model {self.model.model}); for word vectors "
             "use --embeddings"),
            (not (self.train.select_metric or "").startswith(("pos_", "semeval_")) or bool(self.data.negative_label),
             f"--select-metric {self.train.select_metric} needs --negative-label (the 'no relation' label these "
             "scores leave out), e.g. --negative-label Other; without it choose one of "
             f"{', '.join(m for m in METRICS if not m.startswith(('pos_', 'semeval_')))}"),
            (self.model.model != "transformer" or self.model.max_positions >= self.data.max_length,
             f"--max-positions {self.model.max_positions} must be >= --max-length {self.data.max_length}"),
        ]
        for ok, message in checks:
            if not ok:
                raise ConfigError(message)

    @property
    def elastic(self) -> bool:
        """An elastic run (``--num-workers MIN-MAX``): ``train.min_workers`` to ``train.num_workers`` workers."""
        return self.train.min_workers is not None

    @property
    def select_metric(self) -> str:
        """The validation metric used for model selection and the LR schedule."""
        if self.train.select_metric:
            return self.train.select_metric
        return "pos_macro_f1" if self.data.negative_label else "macro_f1"


def _worker_range(text: str, source: str) -> dict[str, int]:
    """``"MIN-MAX"`` (or ``"N"``) as the fields ``min_workers`` and ``num_workers``; ConfigError otherwise."""
    found = re.fullmatch(r"\s*(\d+)\s*(?:-\s*(\d+)\s*)?", text)
    if not found:
        raise ConfigError(f"{source}: --num-workers {text!r} is neither N nor MIN-MAX (e.g. 2, or 1-3 for an elastic "
                          "run)")
    if found.group(2) is None:
        return {"num_workers": int(found.group(1))}
    return {"min_workers": int(found.group(1)), "num_workers": int(found.group(2))}


# as nre_ray.tasks.sentence.metrics tells directed labels
_DIRECTED = re.compile(r"^.+?\s*\((e1\s*,\s*e2|e2\s*,\s*e1)\)\s*$")


def metric_names(labels: list[str], negative_label: str | None) -> list[str]:
    """The validation scores a run on these labels reports (the keys of ``nre_ray.tasks.sentence.metrics.scores``), in
    METRICS order: pos_* with a ``negative_label`` among the labels, semeval_macro_f1 with directed labels too."""
    has_negative = negative_label is not None and negative_label in labels
    directed = any(_DIRECTED.match(label) for label in labels)
    return [m for m in METRICS if not m.startswith(("pos_", "semeval_"))
            or (has_negative and (m.startswith("pos_") or directed))]


SECTIONS: dict[str, type] = {"data": DataConfig, "model": ModelConfig, "train": TrainConfig, "run": RunConfig}

#: Defaults of one model where they differ from the dataclasses' (which suit the encoders trained from scratch): a
#: setting not given (on the command line or in --config) takes its model's value here (:meth:`Config.from_dict`).
#: ``bert`` fine-tunes a pretrained encoder: a few epochs, the whole schedule, small dropout, weight decay and
#: clipping (docs/training.md has the measurements behind them).
MODEL_DEFAULTS: dict[str, dict[str, dict[str, Any]]] = {
    "bert": {"model": {"dropout": 0.1, "embedding_dropout": 0.0},
             "train": {"epochs": 6, "patience": 0, "batch_size": 16, "lr": 1e-3, "label_smoothing": 0.0,
                       "weight_decay": 0.01, "grad_clip": 1.0}},
    "transformer": {"model": {"hidden_size": 256}},
}


def field_types(section_cls: type) -> dict[str, type]:
    """Field name -> its base type (``int | None`` -> int), resolved from the annotations."""
    return {name: _base_type(tp) for name, tp in typing.get_type_hints(section_cls).items()}


def _base_type(tp: Any) -> type:
    """``int | None`` -> int; ``str`` -> str."""
    if isinstance(tp, types.UnionType) or typing.get_origin(tp) is typing.Union:
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        return args[0]
    return tp


def _coerce(value: Any, tp: type, where: str) -> Any:
    if value is None:
        return None
    if tp is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if not isinstance(value, tp) or (tp is int and isinstance(value, bool)):
        raise ConfigError(f"{where}: expected {tp.__name__}, found {type(value).__name__} {value!r}")
    return value


def _build_section(section_cls: type, raw: dict[str, Any], where: str) -> Any:
    known = {f.name: f for f in dataclasses.fields(section_cls)}
    types_ = field_types(section_cls)
    kwargs = {}
    for key, value in raw.items():
        if key not in known:
            close = difflib.get_close_matches(key, known, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise ConfigError(f"{where}: unknown key {key!r}{hint}")
        f = known[key]
        value = _coerce(value, types_[key], f"{where} {key}")
        choices = f.metadata.get("choices")
        if choices and value is not None and value not in choices:
            raise ConfigError(f"{where} {key}: {value!r} is not one of {list(choices)}")
        kwargs[key] = value
    return section_cls(**kwargs)


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def build_parser(
    prog: str = "python -m nre_ray.train",
    description: str | None = None,
    only: dict[str, tuple[str, ...] | None] | None = None,
    parser: argparse.ArgumentParser | None = None,
    helps: dict[str, str] | None = None,
) -> argparse.ArgumentParser:
    """An argparse parser with one flag per config field, grouped by section. Defaults are None (= not given).

    ``only``: the sections (and, per section, the fields; None: all) to make flags for, e.g. ``{"data": None,
    "train": ("seed",)}`` for a command that only preprocesses; default: every field. ``parser``: add the flags to
    this parser (a subcommand's) instead of a new one. ``helps``: the help of flags that mean something else in this
    command, by ``section.field`` (``argparse.SUPPRESS``: left out of the help).
    """
    if parser is None:
        parser = CommandParser(prog=prog, description=description)
        parser.add_argument("--version", action="version", version=f"nre_ray {_version()}")
    parser.add_argument("--config", metavar="FILE.toml",
                        help="TOML file (a local path or a URI) with [data], [model], [train], [run] tables; "
                             "flags given on the command line override it.")
    for section, section_cls in SECTIONS.items():
        if only is not None and section not in only:
            continue
        group = parser.add_argument_group(f"{section} options", section_cls.__doc__)
        add_options(group, section_cls, section=section, names=None if only is None else only[section],
                    helps=helps)
    return parser


def command_parser(prog: str, options_cls: type, description: str, epilog: str) -> CommandParser:
    """The parser of a command whose flags are the fields of ``options_cls`` (:func:`add_options`, defaults the
    fields'), with ``epilog`` (the examples) as written."""
    parser = CommandParser(prog=prog, description=description, epilog=epilog,
                           formatter_class=argparse.RawDescriptionHelpFormatter)
    add_options(parser, options_cls)
    return parser


def add_options(parser: Any, options_cls: type, section: str | None = None, names: tuple[str, ...] | None = None,
                helps: dict[str, str] | None = None, suppress: bool = False, group: str | None = None) -> None:
    """One flag ``--field-name`` per :func:`option` field of the dataclass ``options_cls`` on ``parser`` (a parser or
    an argument group): the only place flags of a typed config are made. Its help is the field's, with ``(default:
    X)`` after it unless the help speaks of the default or there is none to show; a bool field is a switch
    (``--no-...`` too when it is on by default); a field without a default is a required flag. A field whose
    ``flag`` is a name (``INPUT``) is a positional argument, which argparse always requires.

    ``section``: the :class:`Config` section of the fields (train's flags): dests ``section.field``, defaults None (=
    not given: :func:`config_from_args` merges the given ones over a --config file), the models' own defaults in
    the help. Without it: dests the field names and defaults the fields' (``options_cls(**vars(args))``).
    ``names``: only these fields. ``helps``: the help of flags that mean something else in this command, by dest.
    ``suppress``: a flag not given leaves the parsed namespace as it was (a subcommand's copy of a flag that is also
    taken before the subcommand: the value given there, or its default, stays). ``group``: the title of the group
    of the help that lists these flags (default: ``parser``'s own).
    """
    if group is not None:
        parser = parser.add_argument_group(group)
    types_ = field_types(options_cls)
    for f in dataclasses.fields(options_cls):
        if (names is not None and f.name not in names) or not f.metadata.get("cli", True):
            continue
        tp = types_[f.name]
        if f.default_factory is not dataclasses.MISSING:
            default = f.default_factory()
        else:
            default = f.default
        if f.metadata.get("env") and os.environ.get(f.metadata["env"]) is not None:
            default = os.environ[f.metadata["env"]]  # text, which argparse parses as if given
        required = default is REQUIRED
        escaped = f.metadata["help"].replace("%", "%%")  # argparse formats help with %
        # None means "not given": the help says what happens then; an off switch needs no default either
        shown = not required and default is not None and default is not False and "default" not in escaped
        per_model = "".join(f"; {m}: {v[section][f.name]}" for m, v in MODEL_DEFAULTS.items()
                            if section and f.name in v.get(section, {}))
        dest = f"{section}.{f.name}" if section else f.name
        help_text = (helps or {}).get(dest, escaped + (f" (default: {default}{per_model})" if shown else ""))
        parse = f.metadata.get("parse") or tp
        if f.metadata.get("flag"):
            parser.add_argument(dest, metavar=f.metadata["flag"], type=parse, help=help_text)
            continue
        given = ({"default": argparse.SUPPRESS} if suppress else {"default": None} if section else {} if required
                 else {"default": default})
        if tp is bool and default:
            parser.add_argument(_flag(f.name), dest=dest, action=argparse.BooleanOptionalAction, help=help_text,
                                **given)
        elif tp is bool:
            parser.add_argument(_flag(f.name), dest=dest, action="store_const", const=True, help=help_text,
                                **{"default": False, **given})
        else:
            choices = f.metadata.get("choices")
            metavar = f.metadata.get("metavar") or ("{" + ",".join(choices) + "}" if choices else f.name.upper())
            parser.add_argument(_flag(f.name), dest=dest, type=parse, help=help_text, choices=choices,
                                required=required, metavar=metavar, **given)


def options_from(args: argparse.Namespace, options_cls: type) -> Any:
    """The ``options_cls`` (a dataclass of :func:`option` fields) of parsed arguments: its fields' values, the
    other attributes left (a subcommand's name, train's ``section.field`` flags, another class's fields). A field
    without a flag, or one this parser did not make, keeps its default."""
    return options_cls(**{f.name: getattr(args, f.name) for f in dataclasses.fields(options_cls)
                          if hasattr(args, f.name)})


def choices(dest: str) -> tuple[str, ...]:
    """The values the config field ``dest`` (``section.field``, e.g. ``data.format``) accepts: the choices of another
    command's flag of the same meaning."""
    section, name = dest.split(".")
    return next(f.metadata["choices"] for f in dataclasses.fields(SECTIONS[section]) if f.name == name)


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("nre_ray")
    except PackageNotFoundError:  # run from a source tree that is not installed
        return "unknown"


def read_toml(path: str | Path, what: str, error: type[ConfigError] = ConfigError) -> dict[str, Any]:
    """The TOML file ``path``, a local path or a URI (``what`` it is, for the messages); ``error`` when it is
    missing, cannot be read or is not TOML."""
    try:
        text = storage.read_bytes(path).decode("utf-8")
    except storage.StorageError as err:
        if err.kind == storage.NOT_FOUND:
            raise error(f"{path}: {what} not found") from None
        raise error(str(err)) from None
    except UnicodeDecodeError as err:
        raise error(f"{path}: not valid TOML: not UTF-8 text (byte {err.start})") from None
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as err:
        raise error(f"{path}: not valid TOML: {err}") from None


def config_from_args(args: argparse.Namespace,
                     default_model: typing.Callable[[str | None], str | None] | None = None) -> Config:
    """Merge an optional TOML file and the flags that were given into a validated Config. ``default_model``: the
    ``--model`` of a data folder (``--data-dir``, or None) when neither the flags nor the file name one (train's: the
    data's task's, :attr:`nre_ray.tasks.base.Task.default_model`); None from it, or no function: ``--model``'s
    default."""
    raw: dict[str, dict[str, Any]] = {name: {} for name in SECTIONS}
    if getattr(args, "config", None):
        path = args.config  # a local path or a URI
        loaded = read_toml(path, "config file")
        for section, values in loaded.items():
            if not isinstance(values, dict):
                raise ConfigError(f"{path}: top-level key {section!r} must be a table such as [train]")
            raw.setdefault(section, {}).update(values)
        source = str(path)
    else:
        source = "command line"
    for dest, value in vars(args).items():
        if "." in dest and value is not None:
            section, key = dest.split(".", 1)
            raw[section][key] = value
    if default_model is not None and raw.get("model", {}).get("model") is None:
        model = default_model(raw.get("data", {}).get("data_dir"))
        if model:
            raw.setdefault("model", {})["model"] = model
    return Config.from_dict(raw, source=source)

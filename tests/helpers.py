"""Small builders shared by the tests."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Iterator
from pathlib import Path

import pandas as pd
import ray.train
import torch

from nre_ray.data.batches import EncodedSplit, encode_batch, token_counts, tokenize_batch
from nre_ray.data.vocab import Vocab

TEMPLATES = {
    "founded_by": "{h} was founded by {t} in the spring .",
    "born_in": "{h} was born in {t} , a quiet town .",
    "no_relation": "{h} met {t} at a conference .",
}
HEADS = ["Acme", "Globex", "Initech", "Umbrella", "Hooli", "Vandelay"]
TAILS = ["Ann", "Bob", "Cara", "Dan", "Eve", "Finn"]


def tiny_frame(n_per_label: int = 12) -> pd.DataFrame:
    """Canonical rows (with ``problem``) from a few templates: learnable in a couple of epochs."""
    rows = []
    for relation, template in TEMPLATES.items():
        for i in range(n_per_label):
            h, t = HEADS[i % len(HEADS)], TAILS[(i * 5) % len(TAILS)]
            sentence = template.format(h=h, t=t)
            rows.append({"sentence": sentence, "head": h, "head_offset": sentence.index(h), "tail": t,
                         "tail_offset": sentence.index(t), "relation": relation, "problem": ""})
    return pd.DataFrame(rows)


def tiny_data(max_length: int = 32, window: int = 10) -> dict:
    """The ``data`` dict the training loop takes: train/valid/test splits, vocabulary, labels."""
    frame = tokenize_batch(tiny_frame(), "regex", True)
    vocab = Vocab.build(dict(zip(*token_counts(frame).to_dict("list").values(), strict=True)), 1)
    labels = sorted(TEMPLATES)
    encoded = encode_batch(frame, vocab.tokens, labels, max_length, window)
    splits = {"train": EncodedSplit.from_frame(encoded),
              "valid": EncodedSplit.from_frame(encoded.iloc[::3]),
              "test": EncodedSplit.from_frame(encoded.iloc[1::3])}
    return {"splits": {k: v.arrays for k, v in splits.items()}, "vocab": vocab.tokens, "labels": labels,
            "num_positions": 2 * window + 2}


def fit_tiny_cnn(tmp_path, name: str, epochs: int, lr: float, num_workers: int, **run: object) -> ray.train.Result:
    """Train :func:`tiny_data` with a tiny CNN under Ray Train (``num_workers=0``: local mode, in this process);
    ``run``: more RunConfig arguments."""
    from ray.train.torch import TorchTrainer

    from nre_ray.config import Config
    from nre_ray.run.loop import train_loop_per_worker

    cfg = Config.from_dict({"train": {"epochs": epochs, "batch_size": 8, "lr": lr, "seed": 3},
                            "model": {"word_dim": 16, "pos_dim": 4, "hidden_size": 16}})
    return TorchTrainer(
        train_loop_per_worker,
        train_loop_config={"config": cfg.to_dict(), "data": tiny_data(), "tracking_uri": None, "run_id": None},
        scaling_config=ray.train.ScalingConfig(num_workers=num_workers),
        run_config=ray.train.RunConfig(name=name, storage_path=str(tmp_path), **run),
    ).fit()


@contextlib.contextmanager
def served(model: str, name: str, **config: str) -> Iterator[str]:
    """The Serve application of ``model`` (``config``: more of the builder's settings) on the session's Ray, under
    ``name`` at ``/`` on a free port; yields its ``/invocations`` URL and shuts Serve down after."""
    from ray import serve

    from nre_ray.serve.app import build
    from tests import procs

    port = procs.free_port_between(20000, 32000)  # outside the ranges Ray takes ports from
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    try:
        serve.run(build({"model": model, **config}), name=name, route_prefix="/")
        yield f"http://127.0.0.1:{port}/invocations"
    finally:
        serve.shutdown()


def evaluate_report(model: str, data: Path, workers: int, output: Path, capsys, counted: str, metric: str,
                    *extra: str) -> dict:
    """``python -m nre_ray.evaluate`` of ``model`` on ``data`` with ``workers`` Ray workers (``extra``: more of its
    arguments), which must print ``counted`` ("66 bags") and ``metric``; returns its report (written to
    ``output``)."""
    from nre_ray.evaluate import main as evaluate_main

    code = evaluate_main(["--model", model, "--data", str(data), "--output", str(output),
                          "--num-workers", str(workers), *extra])
    printed = capsys.readouterr()
    assert code == 0, printed.err[-2000:]
    assert f"{data}: {counted}, {workers} worker(s)" in printed.out and f"{metric} " in printed.out, printed.out
    return json.loads(output.read_text())


def evaluate_on_1_and_3_workers(summary: dict, data: Path, tmp_path: Path, capsys, counted: str, metric: str) -> dict:
    """:func:`evaluate_report` on ``data`` with the run's best checkpoint folder on 1 Ray worker and its MLflow model
    (``runs:/``) on 3; the two reports' metrics must be equal. Returns the folder's report (the training run scored
    its test split on 2 workers: a caller compares)."""
    reports = [evaluate_report(summary["best_checkpoint"], data, 1, tmp_path / "scores0.json", capsys, counted,
                               metric),
               evaluate_report(summary["model_uri"], data, 3, tmp_path / "scores1.json", capsys, counted, metric,
                               "--tracking-uri", summary["tracking_uri"])]
    assert reports[1]["metrics"] == reports[0]["metrics"]
    return reports[0]


def elastic_step_gradients(task, build: Callable[[], torch.nn.Module], dataset, world: int, step: int, batch: int,
                           micro: int, seed: int) -> list[torch.Tensor]:
    """One elastic step (nre_ray.run.elastic: epoch 1's order from ``seed``, the ``step``-th global batch of
    ``batch`` examples shared among ``world`` simulated ranks in micro-batches of at most ``micro``) on a model
    ``build`` makes after ``torch.manual_seed(0)``: every parameter's gradient summed over the ranks, as the
    all-reduce sums them (zeros where a parameter got none)."""
    from nre_ray.run import elastic

    torch.manual_seed(0)
    model = build()
    order = elastic.epoch_order(len(dataset), seed, 1)
    for rank in range(world):
        parts, count = elastic.step_share(order, step, batch, rank, world, micro)
        elastic.accumulate(task, model, dataset, parts, count, torch.device("cpu"), contextlib.nullcontext,
                           torch.amp.GradScaler("cpu", enabled=False))
    return [p.grad.clone() if p.grad is not None else torch.zeros_like(p) for p in model.parameters()]

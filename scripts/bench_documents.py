#!/usr/bin/env python3
"""Documents are not rows of equal length (issue 37): the padding of the document task's batches, and its training
speed on 1 and 2 workers.

* **padding**: on the run's own encoded training split (the preprocessing cache the runs filled), the share of the
  padded (B, T) tensors that is padding with the task's batches (:class:`nre_ray.tasks.document.batching.
  LengthBatchSampler`: by length, dealt to the ranks by tokens) against plain batches of ``--batch-size`` documents
  drawn at random (what a DistributedSampler's batches pad), on 1 and 2 ranks; and how evenly the ranks' tokens are
  spread;
* **speed**: ``python -m nre_ray.train --num-workers N`` on the same data, its per-epoch ``examples_per_sec``
  (documents a second) read back from its MLflow store, median over the epochs after the first; the 1 -> 2 worker
  speed-up of the same runs (``--repeats`` rounds, medians).

    .venv/bin/python scripts/bench_documents.py --data-dir ../shared/datasets/cdr --epochs 3 --out bench_documents.json
"""

from __future__ import annotations

import argparse
import random
import tempfile
from pathlib import Path
from typing import Any

from bench_common import SHARED, add_run_options, finish, machine, median, run_nre_ray, steady, table, wait_for_quiet


def padding(lengths: list[int], batch_size: int, seed: int) -> dict[str, Any]:
    """The padding share and the ranks' tokens of the task's length batches and of random batches, on 1 and 2
    ranks."""
    from nre_ray.tasks.document.batching import LengthBatchSampler, padding_share

    out: dict[str, Any] = {"documents": len(lengths), "tokens": sum(lengths)}
    for ranks in (1, 2):
        samplers = [LengthBatchSampler(lengths, batch_size, r, ranks, seed) for r in range(ranks)]
        mine = [[i for b in s for i in b] for s in samplers]
        padded = [sum(len(b) * max(lengths[i] for i in b) for b in s) for s in samplers]
        real = [sum(lengths[i] for i in m) for m in mine]
        order = random.Random(seed).sample(range(len(lengths)), len(lengths))
        shards = [order[r::ranks] for r in range(ranks)]  # a DistributedSampler's shards (without its padding)
        plain = [[s[k:k + batch_size] for k in range(0, len(s), batch_size)] for s in shards]
        out[f"{ranks}_ranks"] = {
            "length_batches": {"padding_share": 1 - sum(real) / sum(padded), "batches_per_rank": len(samplers[0]),
                               "rank_tokens": real},
            "random_batches": {"padding_share": padding_share(lengths, [b for p in plain for b in p]),
                               "batches_per_rank": max(len(p) for p in plain),
                               "rank_tokens": [sum(lengths[i] for i in s) for s in shards]},
        }
    return out


def train_lengths(work: Path) -> list[int]:
    """The training split's document lengths in tokens, from the preprocessing cache the first run filled."""
    from nre_ray.tasks.document.split import DocumentSplit

    found = sorted(work.glob("**/train.documents.json"))
    if not found:
        raise SystemExit(f"no cached training split under {work}")
    return [int(n) for n in DocumentSplit.open(found[0].parent, "train").lengths]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data-dir", type=Path, default=SHARED / "cdr", help="document data (default: CDR)")
    parser.add_argument("--epochs", type=int, default=3, help="epochs per run; the first is not counted")
    parser.add_argument("--batch-size", type=int, default=4, help="per worker (default: 4)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--extra", default="", help="more train flags, e.g. '--hidden-size 64 --num-layers 1'")
    add_run_options(parser, 1, "rounds of 1 and 2 workers", "bench_documents.json", timeout=3600)
    args = parser.parse_args()
    work = args.work_dir or Path(tempfile.mkdtemp(prefix="bench_docs_"))
    cache = work / "cache"
    flags = ["--data-dir", str(args.data_dir.absolute()), "--epochs", str(args.epochs), "--batch-size",
             str(args.batch_size), "--seed", str(args.seed), "--cache-dir", str(cache), "--no-log-model",
             *args.extra.split()]
    speed: dict[int, list[float]] = {1: [], 2: []}
    for repeat in range(args.repeats):
        for n in (1, 2):
            wait_for_quiet(args.max_load)
            run = run_nre_ray(work / f"r{repeat}_w{n}", [*flags, "--num-workers", str(n)], timeout=args.timeout,
                              run_name=f"docs-{n}w-{repeat}")
            speed[n].append(steady(run["epochs"], "examples_per_sec"))
    lengths = train_lengths(cache)
    pad = padding(lengths, args.batch_size, args.seed)
    ratios = [b / a for a, b in zip(speed[1], speed[2], strict=True)]
    result = {"machine": machine(), "settings": {k: str(v) for k, v in vars(args).items()}, "padding": pad,
              "documents_per_second": {"1": speed[1], "2": speed[2]}, "speedup_1_to_2": median(ratios)}
    rows = []
    for ranks in (1, 2):
        p = pad[f"{ranks}_ranks"]
        length, plain = p["length_batches"], p["random_batches"]
        rows.append([ranks, f"{length['padding_share']:.3f}", f"{plain['padding_share']:.3f}",
                     length["batches_per_rank"], " / ".join(map(str, length["rank_tokens"])),
                     " / ".join(map(str, plain["rank_tokens"]))])
    tables = table(["ranks", "padding: length batches", "padding: random batches", "batches per rank",
                    "tokens per rank (length)", "tokens per rank (random)"], rows)
    tables += "\n\n" + table(["workers", "documents/s (median)", "speed-up"],
                             [[1, f"{median(speed[1]):.2f}", "1.00"],
                              [2, f"{median(speed[2]):.2f}", f"{median(ratios):.2f}"]])
    finish(result, tables, args, work)


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""A plain torch.distributed DDP trainer of nre_ray's model on nre_ray's encoded data: the torchrun baseline.

This is how the original project ran (see the seed notes): one process per worker started by the launcher,
``init_process_group`` (gloo on CPU), the model wrapped in ``DistributedDataParallel``, the training data sharded by a
``DistributedSampler`` with ``set_epoch`` every epoch, rank 0 alone saving the weights every epoch. Each epoch also
scores the validation split (each rank its exact shard, counts all-reduced). Same model (``nre_ray.models``), same
encoded arrays (``nre_ray.data.pipeline.prepare``, read from its cache), same batch size and step as nre_ray's loop.

    torchrun --standalone --nproc_per_node 2 scripts/ddp_baseline.py --epochs 4 --out ddp.json

``--ddp always`` (the default, as the original project) wraps the model in DDP even for one process; ``--ddp multi``
wraps it only when there are several, as Ray Train's ``prepare_model`` does. ``--use-gpu``: one GPU per process
(``cuda:LOCAL_RANK``, NCCL) with nre_ray's mixed precision (``--no-amp`` to turn it off).

Rank 0 prints one line per epoch and writes the per-epoch timings to ``--out`` (JSON).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
from bench_common import (
    FEWREL_TEST,
    FEWREL_TRAIN,
    accuracy_pass,
    device_for,
    load_data,
    train_config,
    train_pass,
)
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler

from nre_ray.data.encode import EncodedDataset, identity_collate
from nre_ray.models.registry import ModelSpec
from nre_ray.tasks.sentence.classifier import build_model


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--train", type=Path, default=FEWREL_TRAIN, help="training file (default: FewRel train)")
    parser.add_argument("--test", type=Path, default=FEWREL_TEST, help="test file (default: FewRel test)")
    parser.add_argument("--cache-dir", type=Path, default=Path(".nre_ray_cache"),
                        help="nre_ray's preprocessing cache (rank 0 fills it first when it is empty)")
    parser.add_argument("--model", default="cnn")
    parser.add_argument("--batch-size", type=int, default=64, help="examples per step on each process")
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--threads", type=int, default=1, help="torch threads per process (default: 1)")
    parser.add_argument("--ddp", choices=("always", "multi"), default="always", help="wrap the model in DDP "
                        "always (default, the original project), or only with more than one process (as Ray Train)")
    parser.add_argument("--use-gpu", action="store_true", help="one GPU per process (NCCL), mixed precision")
    parser.add_argument("--amp", action=argparse.BooleanOptionalAction, default=True,
                        help="mixed precision with --use-gpu (default: on, as nre_ray)")
    parser.add_argument("--save-dir", type=Path, default=None, help="where rank 0 saves the weights each epoch "
                        "(default: next to --out)")
    parser.add_argument("--out", type=Path, default=Path("ddp_baseline.json"), help="per-epoch timings (rank 0)")
    args = parser.parse_args(argv)

    device = device_for(args.use_gpu)
    dist.init_process_group("nccl" if args.use_gpu else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.set_num_threads(args.threads)
    if rank == 0:  # one preprocessing run at most; the others read the cache it leaves
        prepared = load_data(args.train, args.test, args.cache_dir.absolute(), args.seed)
    dist.barrier()
    if rank != 0:
        prepared = load_data(args.train, args.test, args.cache_dir.absolute(), args.seed)

    cfg = train_config(args.model, args.batch_size, args.epochs, args.seed)
    torch.manual_seed(args.seed)
    spec = ModelSpec(len(prepared.vocab), len(prepared.labels), prepared.num_positions)
    model = build_model(cfg.model, spec).to(device)
    if args.ddp == "always" or world > 1:
        model = DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)
    optimizer = torch.optim.Adam(model.parameters(), lr=cfg.train.lr, weight_decay=cfg.train.weight_decay)
    train_set = EncodedDataset(prepared.splits["train"])
    sampler = DistributedSampler(train_set, num_replicas=world, rank=rank, shuffle=True, seed=args.seed)
    train_loader = DataLoader(train_set, batch_size=args.batch_size, sampler=sampler, collate_fn=identity_collate)
    valid_set = EncodedDataset(prepared.splits["valid"])
    valid_loader = DataLoader(valid_set, batch_size=256, sampler=list(range(rank, len(valid_set), world)),
                              collate_fn=identity_collate)
    save_dir = (args.save_dir or args.out.absolute().parent)
    save_dir.mkdir(parents=True, exist_ok=True)

    epochs = []
    for epoch in range(1, args.epochs + 1):
        sampler.set_epoch(epoch)
        start, cpu_start = time.perf_counter(), time.process_time()
        totals, steps = train_pass(model, train_loader, optimizer, cfg.train.grad_clip, device, args.amp)
        totals = totals.to(device)
        dist.all_reduce(totals)
        totals = totals.cpu()
        train_s, cpu_s = time.perf_counter() - start, time.process_time() - cpu_start
        counts = accuracy_pass(model, valid_loader, device).to(device)
        dist.all_reduce(counts)
        counts = counts.cpu()
        if rank == 0:
            torch.save(getattr(model, "module", model).state_dict(), save_dir / "ddp_baseline_model.pt")
        wall = time.perf_counter() - start
        seen = float(totals[1])
        epochs.append({"epoch": epoch, "examples_per_sec": seen / train_s, "epoch_seconds": train_s,
                       "cpu_seconds": cpu_s, "cpu_examples_per_sec": seen / cpu_s, "wall_seconds": wall,
                       "steps_per_rank": steps, "ended_at": time.time(), "train_loss": float(totals[0] / totals[1]),
                       "valid_acc": float(counts[0]) / max(int(counts[1]), 1)})
        if rank == 0:
            e = epochs[-1]
            print(f"epoch {epoch}/{args.epochs}  train_loss {e['train_loss']:.4f}  valid_acc {e['valid_acc']:.4f}  "
                  f"{e['examples_per_sec']:.0f} ex/s  train {train_s:.2f} s  wall {wall:.2f} s", flush=True)
    if rank == 0:
        args.out.write_text(json.dumps({"world_size": world, "threads": args.threads, "model": args.model,
                                        "ddp": args.ddp, "device": str(device), "amp": args.amp and args.use_gpu,
                                        "batch_size": args.batch_size, "omp_num_threads":
                                        os.environ.get("OMP_NUM_THREADS"), "epochs": epochs}, indent=2),
                            encoding="utf-8")
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())

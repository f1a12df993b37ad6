"""Workers read only their shard: a real 3-worker TorchTrainer run, built by ``nre_ray.train.build_trainer``, whose
workers record every row index their datasets are asked for.

The loop's ``EncodedDataset`` is replaced, inside each worker process, by a subclass that records each batch it
gathers; the run's loop is otherwise the real one. Each rank's training reads must be exactly its
``DistributedSampler``'s indices, epoch after epoch (no other row is touched: the splits are read by rows from the
cache folder and nothing dataset-sized comes through the object store), and each evaluation's reads must be the exact
``ShardSampler`` shard: disjoint across ranks, every row once.
"""

from __future__ import annotations

import json
import pickle
import sys
from pathlib import Path
from typing import Any

import pytest
import ray
from torch.utils.data import DistributedSampler

from nre_ray.cluster.session import Resources
from nre_ray.config import Config
from nre_ray.data.batches import EncodedSplit
from nre_ray.data.pipeline import Prepared, save_prepared
from nre_ray.data.rowfile import RowFile
from nre_ray.data.vocab import Vocab
from nre_ray.run import loop
from nre_ray.run.runner import Target, build_trainer
from nre_ray.tracking import store as tracking
from tests.helpers import tiny_data

pytestmark = pytest.mark.integration
# The worker-side wrapper below is shipped by value: Ray workers cannot import this test module.
ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
WORKERS, EPOCHS, BATCH = 3, 2, 8


def recording_loop(out: str) -> Any:
    """The real ``train_loop_per_worker``, with every dataset it makes recording the rows it reads."""

    def run(loop_config: dict[str, Any]) -> None:
        import ray.train

        from nre_ray.run import loop as worker_loop
        from nre_ray.tasks.sentence import task as sentence_task

        reads: list[dict[str, Any]] = []

        class Recording(sentence_task.EncodedDataset):
            def __init__(self, split: EncodedSplit) -> None:
                super().__init__(split)
                self.record = {"split": split.name, "n": len(split), "indices": [],
                               "from_files": isinstance(split.flat["tokens"], RowFile)}
                reads.append(self.record)

            def __getitems__(self, indices: list[int]) -> dict[str, Any]:
                self.record["indices"].extend(int(i) for i in indices)
                return super().__getitems__(indices)

        sentence_task.EncodedDataset = Recording  # what the sentence task's dataset() builds
        data = ray.get(loop_config["data"]) if isinstance(loop_config["data"], ray.ObjectRef) else loop_config["data"]
        try:
            worker_loop.train_loop_per_worker(loop_config)
        finally:
            rank = ray.train.get_context().get_world_rank()
            sent = {"keys": sorted(data), "bytes": len(pickle.dumps(data)), "cache": data.get("cache")}
            Path(out, f"rank{rank}.json").write_text(json.dumps({"reads": reads, "data": sent}))

    return run


def _prepared(folder: Path) -> Prepared:
    data = tiny_data()
    prepared = Prepared({name: EncodedSplit(arrays, name) for name, arrays in data["splits"].items()},
                        Vocab(data["vocab"]), data["labels"], {})
    save_prepared(prepared, folder)
    return prepared


def test_each_worker_reads_only_its_shard(ray_cluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    prepared = _prepared(tmp_path / "cache" / "key")
    out = tmp_path / "reads"
    out.mkdir()
    monkeypatch.setattr(loop, "train_loop_per_worker", recording_loop(str(out)))  # build_trainer imports it late
    cfg = Config.from_dict({"train": {"epochs": EPOCHS, "batch_size": BATCH, "lr": 0.01, "seed": 3,
                                      "num_workers": WORKERS},
                            "model": {"word_dim": 16, "pos_dim": 4, "hidden_size": 16}})
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    target = Target("shards", str(tmp_path / "storage"), uri)
    run_id = tracking.start_run(uri, "shards", "shards", {})
    trainer = build_trainer(cfg, target, prepared, Resources({"CPU": 0.5}, 1), run_id, 0.0)
    trainer.fit()

    n = {name: len(split) for name, split in prepared.splits.items()}
    records = {r: json.loads((out / f"rank{r}.json").read_text()) for r in range(WORKERS)}
    shards: dict[str, list[list[int]]] = {}  # each evaluation's per-rank reads, by (split, how many before)
    for rank, record in records.items():
        sent = record["data"]
        assert "splits" not in sent["keys"] and sent["bytes"] < 20_000, sent  # where the files are, not the rows
        assert sent["cache"]["dir"] == str(tmp_path / "cache" / "key") and sent["cache"]["shared"] is None
        reads = record["reads"]
        assert all(r["from_files"] for r in reads)  # every split was opened from the cache folder's files
        train = [r for r in reads if r["split"] == "train"]
        assert len(train) == 1
        expected: list[int] = []
        sampler = DistributedSampler(range(n["train"]), num_replicas=WORKERS, rank=rank, shuffle=True)
        for epoch in range(1, EPOCHS + 1):
            sampler.set_epoch(epoch)
            expected.extend(sampler)
        assert train[0]["indices"] == expected, rank  # the sampler's rows, in its order, and no other
        evals = [r for r in reads if r["split"] != "train"]
        # one validation loader for the epochs (read once per epoch), then the final scoring of valid and test
        assert [r["split"] for r in evals] == ["valid", "valid", "test"]
        for i, r in enumerate(evals):
            shard = list(range(rank, n[r["split"]], WORKERS))
            passes = EPOCHS if i == 0 else 1
            assert r["indices"] == shard * passes, (rank, i)
            shards.setdefault(f"{r['split']}#{i}", []).append(r["indices"][:len(shard)])
    for key, per_rank in shards.items():
        every = sorted(i for indices in per_rank for i in indices)
        assert every == list(range(n[key.split("#")[0]])), key  # disjoint, and every row once

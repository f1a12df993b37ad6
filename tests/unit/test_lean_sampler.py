"""The training loop's samplers hand out exactly torch's indices, without a dataset-sized Python list."""

from __future__ import annotations

import tracemalloc

import pytest
import torch
from torch.utils.data import DistributedSampler, RandomSampler

from nre_ray.run import loop
from nre_ray.run.loop import LeanDistributedSampler, LeanRandomSampler


@pytest.mark.parametrize("drop_last", [False, True])
@pytest.mark.parametrize("shuffle", [True, False])
def test_the_same_indices_as_torch_for_every_rank_and_epoch(shuffle: bool, drop_last: bool,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(loop, "INTS_AT_ONCE", 7)  # many chunks, and a short last one
    for n in (1, 2, 5, 7, 64, 101, 1000):
        for replicas in (1, 2, 3, 4, 8):
            if drop_last and n < replicas:
                continue
            for rank in range(replicas):
                lean = LeanDistributedSampler(range(n), num_replicas=replicas, rank=rank, shuffle=shuffle,
                                              drop_last=drop_last, seed=3)
                torch_own = DistributedSampler(range(n), num_replicas=replicas, rank=rank, shuffle=shuffle,
                                               drop_last=drop_last, seed=3)
                for epoch in (0, 1, 5):
                    lean.set_epoch(epoch)
                    torch_own.set_epoch(epoch)
                    got = list(lean)
                    assert got == list(torch_own), (n, replicas, rank, epoch)
                    assert len(got) == len(lean) and all(type(i) is int for i in got)


def test_an_epoch_of_a_million_rows_holds_a_chunk_of_python_ints_not_the_shard() -> None:
    def peak_while_iterating(sampler: DistributedSampler) -> int:
        tracemalloc.start()
        try:
            seen = sum(1 for _ in sampler)
            return tracemalloc.get_traced_memory()[1] if seen == len(sampler) else -1
        finally:
            tracemalloc.stop()

    n = 1_000_000
    torch_own = peak_while_iterating(DistributedSampler(range(n), num_replicas=2, rank=1, shuffle=True))
    lean = peak_while_iterating(LeanDistributedSampler(range(n), num_replicas=2, rank=1, shuffle=True))
    assert torch_own > 30_000_000  # the whole permutation as Python ints, then the shard's half of them
    assert 0 < lean < 5_000_000  # one chunk of 65,536
    one_worker = peak_while_iterating(RandomSampler(range(n), generator=torch.Generator().manual_seed(1)))
    lean_one = peak_while_iterating(LeanRandomSampler(range(n), generator=torch.Generator().manual_seed(1)))
    assert one_worker > 30_000_000 and 0 < lean_one < 5_000_000


@pytest.mark.parametrize("num_samples", [None, 3, 250])
def test_one_workers_shuffle_is_torchs_epoch_after_epoch(num_samples: int | None,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """Same generator, same orders: the generator carries over epochs, so every draw must match torch's."""
    monkeypatch.setattr(loop, "INTS_AT_ONCE", 7)
    for n in (1, 2, 9, 100):
        lean = LeanRandomSampler(range(n), generator=torch.Generator().manual_seed(5), num_samples=num_samples)
        torch_own = RandomSampler(range(n), generator=torch.Generator().manual_seed(5), num_samples=num_samples)
        for _ in range(3):  # epochs
            got = list(lean)
            assert got == list(torch_own) and len(got) == len(torch_own), (n, num_samples)
            assert all(type(i) is int for i in got)
    unseeded = LeanRandomSampler(range(10))  # no generator: torch's own code, a fresh seed each epoch
    assert sorted(unseeded) == list(range(10))

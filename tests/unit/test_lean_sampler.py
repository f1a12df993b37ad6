"""The training loop's DistributedSampler hands out exactly torch's indices, without a dataset-sized Python list."""

from __future__ import annotations

import tracemalloc

import pytest
from torch.utils.data import DistributedSampler

from nre_ray.loop import LeanDistributedSampler


@pytest.mark.parametrize("drop_last", [False, True])
@pytest.mark.parametrize("shuffle", [True, False])
def test_the_same_indices_as_torch_for_every_rank_and_epoch(shuffle: bool, drop_last: bool,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(LeanDistributedSampler, "CHUNK", 7)  # many chunks, and a short last one
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

"""ResumableSampler: DistributedSampler's shards, and a position that survives a restart."""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import DataLoader, DistributedSampler

from trainguard.torch import ResumableSampler


@pytest.mark.parametrize("n", [40, 41, 7])
@pytest.mark.parametrize("replicas", [1, 2, 3])
@pytest.mark.parametrize("shuffle", [True, False])
@pytest.mark.parametrize("drop_last", [True, False])
def test_shards_match_distributed_sampler(n, replicas, shuffle, drop_last):
    for rank in range(replicas):
        ours = ResumableSampler(range(n), replicas, rank, shuffle=shuffle, seed=5, drop_last=drop_last)
        theirs = DistributedSampler(range(n), replicas, rank, shuffle=shuffle, seed=5, drop_last=drop_last)
        for epoch in (0, 3):
            ours.set_epoch(epoch)
            theirs.set_epoch(epoch)
            assert list(ours) == list(theirs)
            assert len(ours) == len(theirs)


def batches(sampler: ResumableSampler, n_batches: int | None = None) -> list[list[int]]:
    loader = DataLoader(list(range(40)), batch_size=4, sampler=sampler, generator=torch.Generator())
    out = []
    for batch in loader:
        out.append(batch.tolist())
        if n_batches is not None and len(out) == n_batches:
            break
    return out


def test_resume_mid_epoch_continues_at_the_exact_batch():
    full = ResumableSampler(range(40), 2, 1, seed=1)
    expected = batches(full)
    first = ResumableSampler(range(40), 2, 1, seed=1)
    head = batches(first, 2)
    assert first.state_dict()["offset"] == 8  # num_workers=0 pulls exactly what was consumed
    resumed = ResumableSampler(range(40), 2, 1, seed=1)
    resumed.load_state_dict(first.state_dict())
    resumed.set_epoch(0)  # the restored epoch: keeps the position
    assert head + batches(resumed) == expected


def test_finishing_an_epoch_moves_to_the_next_one():
    sampler = ResumableSampler(range(40), 2, 0, seed=1)
    batches(sampler)
    assert sampler.state_dict()["epoch"] == 1 and sampler.state_dict()["offset"] == 0
    resumed = ResumableSampler(range(40), 2, 0, seed=1)
    resumed.load_state_dict(sampler.state_dict())
    reference = ResumableSampler(range(40), 2, 0, seed=1)
    reference.set_epoch(1)
    assert list(resumed) == list(reference)


def test_set_epoch_to_another_epoch_restarts_the_position():
    sampler = ResumableSampler(range(40), 1, 0)
    batches(sampler, 3)
    sampler.set_epoch(5)
    assert sampler.state_dict()["offset"] == 0 and sampler.state_dict()["epoch"] == 5


def test_advance_tracks_consumption_explicitly_for_prefetching_loaders():
    sampler = ResumableSampler(range(40), 1, 0, seed=2)
    it = iter(sampler)
    pulled = [next(it) for _ in range(12)]  # a prefetching loader pulled 12
    sampler.advance(4)  # but training consumed 4
    assert sampler.state_dict()["offset"] == 4
    resumed = ResumableSampler(range(40), 1, 0, seed=2)
    resumed.load_state_dict(sampler.state_dict())
    assert list(resumed)[:8] == pulled[4:12]


def test_loading_at_another_world_size_keeps_the_epoch_progress():
    sampler = ResumableSampler(range(40), 2, 0)
    sampler.load_state_dict({"epoch": 2, "offset": 10, "num_replicas": 4})
    assert sampler.epoch == 2 and sampler.offset == 20

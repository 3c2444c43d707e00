"""ShareSampler: the same global batches as DistributedSampler, split by shares that change at a
common step, with a position (and shares) that survive a restart; and the loss weight that keeps
the update equal to uniform DDP's."""

from __future__ import annotations

import logging

import pytest
import torch
from torch.utils.data import DataLoader, DistributedSampler

from trainguard.balance import split
from trainguard.errors import ConfigError
from trainguard.torch import ShareSampler


def ranks(n: int, global_batch: int, world: int, **kw) -> list[ShareSampler]:
    return [ShareSampler(range(n), global_batch, world, r, seed=3, **kw) for r in range(world)]


def global_batches(samplers: list[ShareSampler], steps: int) -> list[list[int]]:
    """Per step, the ranks' batches joined in rank order, epoch after epoch as a training loop
    takes them (``set_epoch`` of the sampler's own epoch keeps its position)."""
    out: list[list[int]] = []
    its = None
    while len(out) < steps:
        if its is None:
            for s in samplers:
                s.set_epoch(s.epoch)
            its = [iter(s) for s in samplers]
        try:
            out.append([i for it in its for i in next(it)])
        except StopIteration:  # every rank's epoch ends at the same step
            its = None
    return out


@pytest.mark.parametrize("n", [40, 41, 64])
@pytest.mark.parametrize("shuffle", [True, False])
def test_uniform_shares_train_on_distributed_samplers_global_batches(n, shuffle):
    world, per_rank = 4, 4
    ours = ranks(n, world * per_rank, world, shuffle=shuffle)
    theirs = [
        list(
            DataLoader(
                range(n), batch_size=per_rank, sampler=DistributedSampler(range(n), world, r, shuffle, 3)
            )
        )
        for r in range(world)
    ]
    full = n // (world * per_rank)  # DistributedSampler's last batches are short: compare the full ones
    expected = [sorted(int(i) for r in range(world) for i in theirs[r][k]) for k in range(full)]
    got = [sorted(b) for b in global_batches(ours, full)]
    assert got == expected


def test_moving_shares_keeps_every_step_on_the_same_samples():
    even = ranks(64, 16, 4)
    moved = ranks(64, 16, 4)
    reference = global_batches(even, 4)
    its = [iter(s) for s in moved]
    got = [[i for it in its for i in next(it)]]
    for s in moved:  # decided after step 0, effective from batch 1 on every rank
        s.schedule(1, (7, 3, 3, 3))
    got += [[i for it in its for i in next(it)] for _ in range(3)]
    assert [sorted(b) for b in got] == [sorted(b) for b in reference]
    assert [len(b) for b in (next(iter(ShareSampler(range(64), 16, 4, r, seed=3))) for r in range(4))] == [
        4
    ] * 4
    assert moved[0].shares == (7, 3, 3, 3)
    assert moved[0].batch(1) == reference[1][:7]  # rank 0 takes the first 7 of the global batch


def test_the_weight_makes_ddp_average_the_mean_over_the_global_batch():
    # Uniform DDP averages the ranks' mean losses; with uneven shares that is only the mean over
    # the global batch once each rank's mean is weighted by W * b / B.
    torch.manual_seed(0)
    w = torch.randn(5, 3)
    x, y = torch.randn(24, 5), torch.randint(0, 3, (24,))

    def grad(rows: list[slice], weights: list[float]) -> torch.Tensor:
        grads = []
        for part, weight in zip(rows, weights, strict=True):
            p = w.clone().requires_grad_()
            (torch.nn.functional.cross_entropy(x[part] @ p, y[part]) * weight).backward()
            grads.append(p.grad)
        return torch.stack(grads).mean(0)  # what DDP's all-reduce computes

    world, total = 3, 24
    uniform = grad([slice(0, 8), slice(8, 16), slice(16, 24)], [1.0] * world)
    shares = split(total, (1.0, 0.5, 0.25))
    cuts = [sum(shares[:i]) for i in range(world + 1)]
    parts = [slice(cuts[i], cuts[i + 1]) for i in range(world)]
    sampler = ShareSampler(range(total), total, world, 0)
    weighted = grad(parts, [sampler.weight(b) for b in shares])
    unweighted = grad(parts, [1.0] * world)
    assert torch.allclose(weighted, uniform, atol=1e-6)
    assert not torch.allclose(unweighted, uniform, atol=1e-3)  # the weight is what makes it so


def test_a_schedule_no_rank_can_honour_is_refused():
    s = ShareSampler(range(64), 16, 4, 0)
    it = iter(s)
    next(it), next(it)
    with pytest.raises(ConfigError, match="handed out batches up to 1"):
        s.schedule(1, (7, 3, 3, 3))
    with pytest.raises(ConfigError, match="sum to the global batch"):
        s.schedule(2, (7, 3, 3, 2))
    with pytest.raises(ConfigError, match="at least one sample"):
        s.schedule(2, (13, 3, 0, 0))


def test_resume_mid_epoch_continues_at_the_exact_batch_with_the_shares_in_effect():
    full = ranks(64, 16, 4)
    for s in full:
        s.schedule(2, (7, 3, 3, 3))
        s.schedule(6, (1, 5, 5, 5))
    expected = global_batches(full, 9)

    first = ranks(64, 16, 4)
    for s in first:
        s.schedule(2, (7, 3, 3, 3))
        s.schedule(6, (1, 5, 5, 5))
    head = global_batches(first, 3)  # checkpoint after 3 steps: the shares from 2 on, and from 6
    saved = [s.state_dict() for s in first]
    assert saved[0]["epoch"] == 0 and saved[0]["step"] == 3
    resumed = ranks(64, 16, 4)
    for s, sd in zip(resumed, saved, strict=True):
        s.load_state_dict(sd)
    assert resumed[0].shares == (7, 3, 3, 3)
    assert head + global_batches(resumed, 6) == expected  # across the end of epoch 0 (4 steps)


def test_the_end_of_an_epoch_moves_to_the_next_and_fills_the_last_global_batch():
    s = ShareSampler(range(40), 16, 2, 0, seed=1)  # 40 = 2 full global batches + 8 samples
    batches = list(s)
    assert len(batches) == 3 and s.epoch == 1 and s.step == 0
    order = s.order(0)
    assert len(order) == 48 and order[40:] == order[:8]
    dropped = ShareSampler(range(40), 16, 2, 0, seed=1, drop_last=True)
    assert len(list(dropped)) == 2


def test_another_world_size_resumes_with_uniform_shares(caplog):
    s = ShareSampler(range(64), 16, 4, 0)
    s.schedule(0, (7, 3, 3, 3))
    next(iter(s))
    other = ShareSampler(range(64), 16, 2, 0)
    with caplog.at_level(logging.WARNING):
        other.load_state_dict(s.state_dict())
    assert other.shares == (8, 8) and other.step == 1
    assert "uniform shares" in caplog.text


def test_prefetching_loaders_track_the_position_by_advance():
    s = ShareSampler(range(64), 16, 4, 1)
    it = iter(s)
    next(it), next(it), next(it)  # a loader with workers pulled three batches ahead
    s.advance()
    assert (s.epoch, s.step) == (0, 1) and s.produced == 3


def test_bad_sizes_are_refused_with_the_fix():
    with pytest.raises(ConfigError, match="each needs a sample"):
        ShareSampler(range(64), 2, 4, 0)
    with pytest.raises(ConfigError, match="fewer than one global batch"):
        ShareSampler(range(10), 16, 2, 0)

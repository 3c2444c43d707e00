"""Splitting a step's global batch among ranks of uneven speed, and the loss weight that keeps
the update what uniform data parallelism would compute.

Pure and stdlib-only. With DDP averaging gradients over ``W`` ranks, a rank that holds ``b`` of
the step's ``B`` samples scales its mean loss by ``W * b / B`` (`loss_weight`): the averaged
gradient is then the mean over all ``B`` samples, whatever the split::

    >>> split(128, (1.0, 1.0, 1.0, 0.5))        # one rank at half speed
    (37, 37, 36, 18)
    >>> split(128, (1.0, 1.0, 1.0, 1.0))
    (32, 32, 32, 32)
    >>> loss_weight(18, 128, 4)
    0.5625

Integers never split exactly: `split` gives each rank the floor of its exact share, then hands
the samples left over one each to the largest remainders (ties to the lower rank), so the shares
always sum to the global batch and every rank computes the same split from the same speeds.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from trainguard.errors import ConfigError

__all__ = ["idle_fraction", "loss_weight", "split", "step_times", "uniform"]


def uniform(total: int, world: int) -> tuple[int, ...]:
    """Equal shares (the first ``total % world`` ranks take one more).

    >>> uniform(10, 4)
    (3, 3, 2, 2)
    """
    return split(total, (1.0,) * world)


def split(
    total: int,
    speeds: Sequence[float],
    floor: int = 1,
    cap: int | None = None,
) -> tuple[int, ...]:
    """``total`` samples in proportion to ``speeds``, each share within ``[floor, cap]``.

    A share held at ``floor`` or ``cap`` leaves the rest to be split among the others in
    proportion again (a capped fast rank's surplus goes to the next fastest). Raises
    `ConfigError` when no split fits (``total`` below ``floor * W`` or above ``cap * W``).

    >>> split(10, (1.0, 0.01))             # every rank keeps at least one sample
    (9, 1)
    >>> split(12, (4.0, 1.0, 1.0), cap=6)  # the fast rank's surplus goes to the others
    (6, 3, 3)
    """
    world = len(speeds)
    if world == 0:
        raise ConfigError("no ranks to split a batch among")
    if any(not math.isfinite(s) or s <= 0 for s in speeds):
        raise ConfigError(f"speeds must be positive numbers, got {tuple(speeds)}")
    hi = total if cap is None else cap
    if total < floor * world or total > hi * world:
        raise ConfigError(
            f"a global batch of {total} cannot be split among {world} ranks with {floor}..{hi} samples each"
        )
    fixed: dict[int, int] = {}
    while True:  # pin the shares that leave [floor, hi], then split the rest again
        free = [i for i in range(world) if i not in fixed]
        left = total - sum(fixed.values())
        weight = sum(speeds[i] for i in free)
        exact = {i: left * speeds[i] / weight for i in free}
        low = [i for i in free if exact[i] < floor]
        high = [i for i in free if exact[i] > hi]
        if not low and not high:
            break
        for i in low:
            fixed[i] = floor
        for i in high:
            fixed[i] = hi
    shares = {i: min(hi, max(floor, math.floor(exact[i]))) for i in free}
    rest = left - sum(shares.values())
    order = sorted(free, key=lambda i: (-(exact[i] - shares[i]), i))
    for i in order:
        if rest <= 0:
            break
        if shares[i] < hi:
            shares[i] += 1
            rest -= 1
    out = tuple(fixed.get(i, shares.get(i, 0)) for i in range(world))
    assert sum(out) == total, (out, total)
    return out


def loss_weight(n: int, total: int, world: int) -> float:
    """The factor on a rank's mean loss over its ``n`` samples of a ``total``-sample step among
    ``world`` ranks: DDP's average of the weighted means is the mean over all samples."""
    return world * n / total


def step_times(shares: Sequence[int], speeds: Sequence[float]) -> tuple[float, ...]:
    """Seconds of compute each rank needs for its share at its speed (samples per second)."""
    return tuple(b / s for b, s in zip(shares, speeds, strict=True))


def idle_fraction(times: Sequence[float]) -> float:
    """The share of the ranks' time spent waiting for the slowest in a synchronous step.

    >>> round(idle_fraction((1.0, 1.0, 1.0, 2.0)), 3)
    0.375
    """
    slowest = max(times)
    return 0.0 if slowest <= 0 else 1.0 - sum(times) / (len(times) * slowest)

"""Load balancing across uneven GPUs: how a step's global batch is split, and when to move it.

Stdlib-only and pure: `shares` splits a global batch by measured speed (and gives the loss weight
that keeps the update equal to uniform data parallelism), `ladder` decides, from agreed
measurements, when to rebalance, restore or exclude. The trainer side (measuring, agreeing,
applying the shares at a common step) is ``trainguard.torch.balance``. See docs/balance.md.
"""

from __future__ import annotations

from trainguard.balance.ladder import LadderConfig, LadderState, Measure, Move, Rung, judge
from trainguard.balance.shares import idle_fraction, loss_weight, split, step_times, uniform

__all__ = [
    "LadderConfig",
    "LadderState",
    "Measure",
    "Move",
    "Rung",
    "idle_fraction",
    "judge",
    "loss_weight",
    "split",
    "step_times",
    "uniform",
]

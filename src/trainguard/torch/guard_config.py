"""The Guard's settings, one frozen value (`GuardConfig`); `Guard` takes it or the same names
as keyword arguments (``Guard(ckpt, state, on_nan="skip")`` is
``Guard(ckpt, state, GuardConfig(on_nan="skip"))``), and a keyword overrides the config's field::

    >>> base = GuardConfig(checkpoint_every=100, hang_floor_s=300.0)
    >>> merged(base, on_nan="skip").on_nan, merged(base, on_nan="skip").checkpoint_every
    ('skip', 100)
    >>> merged(None, hang_floor=1)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    TypeError: Guard() got an unexpected keyword argument 'hang_floor' (settings: attempt, balance, ...)
"""

from __future__ import annotations

import signal
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

from trainguard.balance.ladder import LadderConfig
from trainguard.detect.numerics import Policy, SpikeConfig

__all__ = ["GuardConfig", "merged"]


@dataclass(frozen=True, slots=True)
class GuardConfig:
    # numerics: what a NaN/Inf loss or a loss spike does, and when losses are read
    on_nan: Policy | str = Policy.ROLLBACK  # skip | rollback | stop | warn
    on_spike: Policy | str = Policy.ROLLBACK
    spike: SpikeConfig | None = None  # window / threshold of the robust z-score
    check_every: int | None = None  # read/agree on the losses every N steps (None: see docs)
    check_lag: int | None = None  # ... N steps later (0: at once; 1: no device stall)
    # checkpoints taken by guard.range
    checkpoint_every: int = 0  # guard.range saves every N steps (0: only on preemption/end)
    save_at_end: bool = True  # guard.range saves after the last step
    control_every: int = 10  # look for the supervisor's checkpoint requests every N steps (0: never)
    # where this rank reports (the run-directory protocol)
    run_dir: Path | str | None = None  # default: $TRAINGUARD_RUN_DIR, else no files
    rank: int | None = None  # default: torch.distributed, else $RANK, else 0
    attempt: int | None = None  # default: $TRAINGUARD_ATTEMPT, else 0
    heartbeat_interval_s: float = 0.25  # at most ~4 heartbeat writes per second
    chaos: bool = True  # apply $TRAINGUARD_RUN_DIR/chaos.json
    # preemption
    preempt_signals: tuple[int, ...] = (signal.SIGTERM,)
    preempt_wait_s: float = 3.0  # no step this long (or 3x the slowest) after one: exit by the signal
    # hang watchdog
    watchdog: bool = True
    hang_floor_s: float = 120.0  # never sooner than this...
    hang_factor: float = 10.0  # ... nor sooner than this many times the slowest step
    first_step_s: float = 600.0  # allowance until the first step completes
    checkpoint_s: float = 600.0  # extra allowance while a checkpoint is taken
    # load balancing across uneven GPUs (docs/balance.md): state.sampler must be a ShareSampler
    balance: bool | LadderConfig = False  # move each rank's share by its measured speed
    balance_every: int = 10  # the ranks agree on their speeds every N steps

    def __post_init__(self) -> None:
        object.__setattr__(self, "preempt_signals", tuple(self.preempt_signals))


_NAMES = frozenset(f.name for f in fields(GuardConfig))


def merged(config: GuardConfig | None, **settings: Any) -> GuardConfig:
    """``config`` (default: `GuardConfig()`) with ``settings`` in place of its fields."""
    unknown = sorted(set(settings) - _NAMES)
    if unknown:
        raise TypeError(
            f"Guard() got an unexpected keyword argument {unknown[0]!r} (settings: {', '.join(sorted(_NAMES))})"
        )
    base = config if config is not None else GuardConfig()
    return replace(base, **settings) if settings else base

"""The Guard's balancing, in one process: off by default (nothing hooked), a clear error without a
ShareSampler, the loss weight, and how a rank's own compute is measured."""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import TensorDataset

from trainguard.torch import Guard, ResumableSampler, ShareSampler, TrainState
from trainguard.torch.balance import Balancer


def _state(sampler=None) -> TrainState:
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    return TrainState(model, torch.optim.SGD(model.parameters(), lr=0.1), sampler=sampler)


def _hooks(model: torch.nn.Module) -> int:
    n = sum(len(m._forward_pre_hooks) + len(m._forward_hooks) for m in model.modules())
    return n + sum(len(getattr(p, "_post_accumulate_grad_hooks", None) or {}) for p in model.parameters())


def test_without_balance_nothing_is_hooked_and_the_weight_is_one(tmp_path):
    state = _state(ResumableSampler(range(16), 1, 0))
    with Guard(None, state, run_dir=tmp_path) as guard:
        assert guard.balancer is None and guard.weight(7) == 1.0
        assert _hooks(state.model) == 0


def test_balance_without_a_share_sampler_says_what_it_needs(tmp_path):
    with pytest.raises(TypeError, match="ShareSampler"):
        Guard(None, _state(ResumableSampler(range(16), 1, 0)), run_dir=tmp_path, balance=True)


def test_one_rank_has_nothing_to_balance_but_keeps_the_weight(tmp_path):
    sampler = ShareSampler(range(16), 8, 1, 0)
    with Guard(None, _state(sampler), run_dir=tmp_path, balance=True) as guard:
        assert guard.balancer is None and guard.weight(8) == 1.0 and guard.weight(4) == 0.5


class _DeviceClock:
    """A device clock the test moves: the rank's compute, as a GPU's events would tell it."""

    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def test_a_ranks_compute_runs_from_its_first_forward_to_its_last_gradient():
    data = TensorDataset(torch.randn(32, 4), torch.randint(0, 2, (32,)))
    sampler = ShareSampler(data, 8, 1, 0)
    state = _state(sampler)
    clock, steps = _DeviceClock(), [0]
    balancer = Balancer(sampler, every=4, progress=lambda: steps[0], device_clock=clock)
    balancer.attach(state.model)
    first = state.model[0]

    def forward_costs(seconds: float):  # the device time of the forward and backward
        return first.register_forward_hook(lambda m, a, o: setattr(clock, "t", clock.t + seconds))

    h = forward_costs(0.25)
    for _ in range(3):
        x = torch.randn(8, 4)
        state.model(x).sum().backward()
        clock.t += 5.0  # waiting for the other ranks, the optimizer...: after the last gradient
        steps[0] += 1  # guard.step
    h.remove()
    balancer._close()
    seconds, samples, n = balancer._window()
    assert (seconds, samples, n) == (pytest.approx(0.75), 24, 3)
    # after the first step only the hook of the gradient that came last is left
    assert (
        sum(len(getattr(p, "_post_accumulate_grad_hooks", None) or {}) for p in state.model.parameters()) == 1
    )
    with torch.no_grad():  # evaluation is not a step
        state.model(torch.randn(8, 4))
    assert balancer._start is None
    balancer.close()
    assert _hooks(state.model) == 0

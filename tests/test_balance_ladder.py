"""The balance ladder and the share split: pure rules over agreed measurements (no torch)."""

from __future__ import annotations

import itertools

import pytest

from trainguard.balance import LadderConfig, LadderState, Measure, Rung, judge, split, uniform
from trainguard.errors import ConfigError

CFG = LadderConfig(persist=3)


def window(*times: float, samples: int = 320, wall: float | None = None, step: int = 0) -> Measure:
    """A 10-step window in which rank i spent ``times[i]`` seconds computing ``samples``."""
    return Measure(step, tuple(times), (samples,) * len(times), wall or max(times) * 1.1, 10)


def run(state: LadderState, windows: list[Measure], cfg: LadderConfig = CFG) -> tuple[LadderState, list]:
    moves = []
    for m in windows:
        state, move = judge(state, m, cfg)
        if move is not None:
            moves.append(move)
    return state, moves


@pytest.mark.parametrize("total", [8, 97, 128, 1000])
@pytest.mark.parametrize("speeds", [(1.0, 1.0), (1.0, 0.5, 0.75, 1.0), (3.0, 0.01, 1.0), (1.0,) * 7])
def test_split_sums_to_the_global_batch_and_follows_speed(total, speeds):
    shares = split(total, speeds)
    assert sum(shares) == total and min(shares) >= 1
    for i, j in itertools.combinations(range(len(speeds)), 2):
        if speeds[i] > speeds[j]:
            assert shares[i] >= shares[j]
    # integer rounding costs at most one sample per rank against the exact split
    exact = [total * s / sum(speeds) for s in speeds]
    assert all(abs(b - e) < 1 or b == 1 for b, e in zip(shares, exact, strict=True))


def test_split_respects_a_cap_and_says_when_nothing_fits():
    assert split(12, (4.0, 1.0, 1.0), cap=6) == (6, 3, 3)
    assert split(10, (1.0, 0.01)) == (9, 1)
    with pytest.raises(ConfigError, match="cannot be split"):
        split(10, (1.0, 1.0), cap=4)
    with pytest.raises(ConfigError, match="positive"):
        split(10, (1.0, 0.0))


def test_one_slow_window_is_not_a_trend():
    state = LadderState.start(uniform(128, 4))
    noisy = [
        window(1, 1, 1, 1),
        window(1, 1, 1, 2),
        window(1, 1, 1, 1),
        window(1, 1, 2, 1),
        window(1, 1, 1, 1),
    ]
    state, moves = run(state, noisy)
    assert moves == [] and state.rung is Rung.UNIFORM and state.shares == (32, 32, 32, 32)


def test_a_persistently_slow_rank_is_rebalanced_by_speed():
    state, moves = run(LadderState.start(uniform(128, 4)), [window(1, 1, 1, 2)] * 3)
    assert [m.verb for m in moves] == ["rebalance"]
    move = moves[0]
    assert move.rank == 3 and move.shares == (37, 37, 36, 18) and move.old_shares == (32,) * 4
    assert move.figures["relative_speed"] == pytest.approx(0.5)
    assert move.figures["idle_before"] > 0.3 and move.figures["idle_after"] < 0.05
    assert state.rung is Rung.REBALANCED and state.shares == move.shares


def test_two_uneven_gpus_get_shares_in_proportion():
    # ranks 1 and 2 at 50% and 75% of their peers: compute seconds for equal samples 2x and 4/3x
    _state, moves = run(LadderState.start(uniform(120, 4)), [window(1, 2, 4 / 3, 1)] * 3)
    assert moves[-1].shares == split(120, (1.0, 0.5, 0.75, 1.0)) == (37, 18, 28, 37)


def test_rebalanced_shares_that_balance_the_steps_are_kept():
    state, _ = run(LadderState.start(uniform(128, 4)), [window(1, 1, 1, 2)] * 3)
    # under the new shares every rank computes for about as long: nothing to do
    balanced = Measure(0, (37 / 320, 37 / 320, 36 / 320, 18 / 160), (37, 37, 36, 18), 0.13, 1)
    state, moves = run(state, [balanced] * 6)
    assert moves == [] and state.rung is Rung.REBALANCED


def test_shares_are_restored_once_the_gpu_recovers_and_not_before():
    state, _ = run(LadderState.start(uniform(128, 4)), [window(1, 1, 1, 2)] * 3)
    # recovering: 8% slower is inside the hysteresis band (no restore, no new move either)
    state, moves = run(state, [window(1, 1, 1, 1.08)] * 5)
    assert [m.verb for m in moves] == ["rebalance"]  # the shares follow the new speed, not uniform
    assert state.rung is Rung.REBALANCED
    state, moves = run(state, [window(1, 1, 1, 1.0)] * 3)
    assert [m.verb for m in moves] == ["restore"]
    assert moves[0].shares == (32, 32, 32, 32) and state.rung is Rung.UNIFORM


def test_a_slow_gpu_that_rebalancing_can_carry_is_kept_not_excluded():
    # at 20% of its peers' speed for a long time: its share shrinks, it still adds throughput
    _state, moves = run(LadderState.start(uniform(128, 4)), [window(1, 1, 1, 5, wall=60.0)] * 30)
    assert {m.verb for m in moves} == {"rebalance"}


def test_a_gpu_too_slow_for_its_smallest_share_is_excluded_once_it_pays_for_the_restart():
    cfg = LadderConfig(persist=3, restart_s=1000.0)
    # rank 3 at 1/64 of its peers: its share falls to the floor, one sample
    slow = Measure(0, (1.0, 1.0, 1.0, 64.0), (320, 320, 320, 320), 66.0, 10)
    state, moves = run(LadderState.start(uniform(128, 4)), [slow] * 3, cfg)
    assert [m.verb for m in moves] == ["rebalance"] and state.shares[3] == 1
    # even its one sample (0.5 s) keeps the others (0.1 s) waiting: keeping it costs throughput,
    # but a restart costs 1000 s: excluding pays only once the slowness has lasted long enough
    at_floor = Measure(0, (1.0, 1.0, 1.0, 5.0), (423, 423, 424, 10), 5.5, 10)
    state, moves = run(state, [at_floor] * 20, cfg)
    assert moves == [] and state.slow_s < 1000
    state, moves = run(state, [at_floor] * 300, cfg)
    assert [m.verb for m in moves] == ["exclude"]
    move = moves[0]
    assert move.rank == 3 and move.figures["x_drop"] > move.figures["x_keep"]
    # the rule as stated: (H - R) * X_drop > H * X_keep, and it held only just now
    h, r = move.figures["slow_for_s"], move.figures["restart_s"]
    assert (h - r) * move.figures["x_drop"] > h * move.figures["x_keep"]
    h = h - 3 * 5.5  # three windows earlier (it must hold for `persist` windows)
    assert (h - r) * move.figures["x_drop"] <= h * move.figures["x_keep"]
    assert state.rung is Rung.EXCLUDING
    state, moves = run(state, [at_floor] * 20, cfg)
    assert moves == []  # asked once


def test_a_gpu_that_keeps_degrading_is_excluded():
    state = LadderState.start(uniform(128, 4))
    moves = []
    before = 1.0
    for t in (2.0, 2.6, 3.4, 4.4, 5.7):  # after each move it runs a window as before, then slower
        state, more = run(state, [window(1, 1, 1, before)] + [window(1, 1, 1, t)] * 3)
        moves += more
        before = t
    # the shares keep following its speed after the exclusion is asked for, which is asked once
    assert [m.verb for m in moves] == ["rebalance"] * 3 + ["exclude", "rebalance"]
    assert moves[3].rank == 3 and "keeps degrading" in moves[3].reason


def test_a_smaller_share_that_is_slower_per_sample_is_not_degrading():
    # per-step costs that do not shrink with the share: each smaller share is slower per sample
    # from its first window on, but at any one share the speed holds: no exclusion
    state = LadderState.start(uniform(128, 4))
    moves = []
    for t in (2.0, 2.6, 3.4, 4.4, 5.7):  # every phase ends with a move (persist=3)
        state, more = run(state, [window(1, 1, 1, t)] * 3)
        moves += more
    assert len(moves) == 5
    assert moves and {m.verb for m in moves} == {"rebalance"}


def test_two_ranks_never_exclude_below_the_minimum():
    cfg = LadderConfig(persist=1, restart_s=1.0)
    _state, moves = run(LadderState.start(uniform(8, 2)), [window(1, 64, wall=70.0)] * 50, cfg)
    assert "exclude" not in {m.verb for m in moves}


def test_a_window_without_measurements_changes_nothing():
    state = LadderState.start(uniform(8, 2))
    state2, move = judge(state, Measure(0, (1.0, 0.0), (8, 0), 1.0, 1), CFG)
    assert move is None and state2 == state


def test_bad_ladder_settings_are_refused():
    with pytest.raises(ConfigError, match="restore < threshold"):
        LadderConfig(threshold=0.05, restore=0.1)
    with pytest.raises(ConfigError, match="persist"):
        LadderConfig(persist=0)

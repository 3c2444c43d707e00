"""benchmarks/paired.py: the statistics of interleaved A/B benchmark rounds and the target check
every benchmark exits on."""

from __future__ import annotations

import math
import random
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parents[1] / "benchmarks"))
from paired import diff_ci, interleave, mean_ci, median_ci, missed, ratio_ci, rotate, t95


def test_mean_ci_matches_the_t_interval_worked_by_hand():
    # mean 2, sd 1, n 3: half-width t(2) * 1 / sqrt(3) = 4.303 / 1.732 = 2.484
    e = mean_ci([1.0, 2.0, 3.0])
    assert e.value == 2.0
    assert e.ci95 == pytest.approx((2 - 2.4843, 2 + 2.4843), abs=1e-3)
    assert e.repeats == 3


def test_one_round_has_no_interval():
    assert mean_ci([5.0]).ci95 is None
    assert ratio_ci([2.0], [1.0]).ci95 is None
    assert ratio_ci([2.0], [1.0]).value == pytest.approx(2.0)


def test_ratio_ci_is_the_geometric_mean_of_the_paired_ratios():
    # ratios 2 and 8: geometric mean 4, whatever the absolute sizes of the rounds
    e = ratio_ci([2.0, 800.0], [1.0, 100.0])
    assert e.value == pytest.approx(4.0)
    lo, hi = e.ci95  # type: ignore[misc]
    assert lo < 4.0 < hi
    assert lo * hi == pytest.approx(16.0)  # symmetric on the log scale


def test_ratio_ci_of_equal_sides_is_exactly_one():
    e = ratio_ci([3.0, 5.0, 7.0], [3.0, 5.0, 7.0])
    assert e.value == pytest.approx(1.0)
    assert e.ci95 == pytest.approx((1.0, 1.0))
    assert not e.resolved_above(1.0)


def test_pairing_removes_the_load_both_sides_share():
    # Round-to-round load swings 1x..3x, trainguard always 10% faster in its own round: paired,
    # the ratio is resolved below 1; an unpaired comparison of the two means would not see it.
    load = [1.0, 3.0, 1.5, 2.5, 1.2, 2.8]
    ours = [0.9 * x for x in load]
    e = ratio_ci(ours, load)
    assert e.value == pytest.approx(0.9)
    assert e.ci95[1] < 1.0  # type: ignore[index]


def test_diff_ci_resolves_a_clear_difference_and_not_noise():
    clear = diff_ci([5.1, 5.0, 4.9, 5.2], [1.0, 1.1, 0.9, 1.0])
    assert clear.resolved_above(0.0)
    noise = diff_ci([1.0, 2.0, 1.0, 2.0], [2.0, 1.0, 2.0, 1.0])
    assert not noise.resolved_above(0.0)


def test_the_interval_covers_the_true_mean_95_percent_of_the_time():
    # A wrong t table (or the normal 1.96 at n=4) fails this in one direction or the other.
    rng = random.Random(0)
    trials, hits = 4000, 0
    for _ in range(trials):
        lo, hi = mean_ci([rng.gauss(10.0, 2.0) for _ in range(4)]).ci95  # type: ignore[misc]
        hits += lo <= 10.0 <= hi
    assert 0.935 < hits / trials < 0.965


def test_t95_is_student_t():
    assert t95(1) == pytest.approx(12.706)
    assert t95(5) == pytest.approx(2.571)
    assert t95(1000) == pytest.approx(1.96)
    with pytest.raises(ValueError):
        t95(0)


def test_median_ci_needs_six_rounds_and_then_spans_the_extremes():
    assert median_ci([1.0, 2.0, 3.0, 4.0, 5.0]).ci95 is None
    e = median_ci([6.0, 1.0, 5.0, 2.0, 4.0, 3.0])
    assert e.value == 3.5
    assert e.ci95 == (1.0, 6.0)


def test_interleave_alternates_the_order_of_the_two_sides():
    order: list[str] = []
    a, b = interleave(4, lambda i: order.append(f"a{i}") or i, lambda i: order.append(f"b{i}") or -i)
    assert order == ["a0", "b0", "b1", "a1", "a2", "b2", "b3", "a3"]
    assert a == [0, 1, 2, 3] and b == [0, -1, -2, -3]


def test_paired_figures_must_pair():
    with pytest.raises(ValueError, match="equal"):
        ratio_ci([1.0, 2.0], [1.0])
    with pytest.raises(ValueError, match="positive"):
        ratio_ci([1.0, 0.0], [1.0, 1.0])


def test_missed_reports_each_target_missed_and_only_those():
    targets = {"ratio": (">=", 1.05), "p99_ms": ("<=", 50.0), "gone": (">=", 1.0)}
    out = {"ratio": 1.2, "p99_ms": 51.0, "gone": None}
    assert missed(out, targets) == [
        "target p99_ms <= 50: 51 MISSED",
        "target gone >= 1: MISSED (not measured: None)",
    ]
    assert missed({"ratio": 1.05, "p99_ms": 50.0, "gone": math.inf}, targets) == []


def test_rotate_runs_each_arm_in_every_position():
    order: list[str] = []
    arms = [lambda i, n=n: order.append(f"{n}{i}") or f"{n}{i}" for n in "abc"]
    out = rotate(3, *arms)
    assert order == ["a0", "b0", "c0", "b1", "c1", "a1", "c2", "a2", "b2"]
    assert out == [["a0", "a1", "a2"], ["b0", "b1", "b2"], ["c0", "c1", "c2"]]
    two: list[str] = []
    rotate(2, lambda i: two.append(f"a{i}"), lambda i: two.append(f"b{i}"))
    assert two == ["a0", "b0", "b1", "a1"]  # interleave's order

"""The goodput ledger: ETTR and the breakdown of lost time, on hand-built ledgers."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trainguard.incidents import Interval, IntervalKind, goodput

K = IntervalKind


def iv(kind: IntervalKind, start: float, end: float, attempt: int = 0) -> Interval:
    return Interval("job", kind, start, end, attempt)


def test_ettr_of_a_run_with_one_failure_is_productive_over_wall_time():
    # 0-30 init, 30-330 steps (ckpt stall 130-140, last ckpt at 230), failure at 330 detected at 360,
    # 360-380 restart, 380-400 init, 400-1000 steps (redoing 230-330's work first).
    ledger = [
        iv(K.INIT, 0, 30),
        iv(K.PRODUCTIVE, 30, 330),
        iv(K.CHECKPOINT, 130, 140),
        iv(K.LOST, 230, 330),
        iv(K.DETECTION, 330, 360),
        iv(K.RESTART, 360, 380, attempt=1),
        iv(K.INIT, 380, 400, attempt=1),
        iv(K.PRODUCTIVE, 400, 1000, attempt=1),
    ]
    s = goodput(ledger, 0, 1000)
    assert s.wall_s == 1000
    assert s.productive_s == pytest.approx(300 - 10 - 100 + 600)  # 30-330 minus the stall and the lost work
    assert s.checkpoint_s == 10 and s.lost_s == 100 and s.detection_s == 30
    assert s.restart_s == 20 and s.init_s == 50
    assert s.unaccounted_s == 0
    assert s.ettr == pytest.approx(0.79)
    assert s.interruptions == 1 and s.attempts == 2
    assert s.badput_s == pytest.approx(210)


def test_every_instant_is_charged_once_so_the_parts_add_up_to_the_wall():
    ledger = [
        iv(K.PRODUCTIVE, 0, 100),
        iv(K.LOST, 50, 120),
        iv(K.DETECTION, 90, 130),
        iv(K.RESTART, 125, 140),
    ]
    s = goodput(ledger, 0, 150)
    parts = s.productive_s + s.lost_s + s.detection_s + s.restart_s + s.unaccounted_s
    assert parts == pytest.approx(150)
    assert (s.productive_s, s.lost_s, s.detection_s, s.restart_s, s.unaccounted_s) == (50, 40, 40, 10, 10)


def test_intervals_are_clipped_to_the_wall_window():
    s = goodput([iv(K.PRODUCTIVE, -50, 50), iv(K.PRODUCTIVE, 90, 200)], 0, 100)
    assert s.productive_s == 60 and s.ettr == pytest.approx(0.6)


def test_a_fault_free_run_has_no_interruptions():
    s = goodput([iv(K.INIT, 0, 10), iv(K.PRODUCTIVE, 10, 100)], 0, 100)
    assert s.interruptions == 0 and s.attempts == 1 and s.ettr == pytest.approx(0.9)


def test_a_final_failure_without_a_restart_still_counts_as_an_interruption():
    s = goodput([iv(K.PRODUCTIVE, 0, 80), iv(K.LOST, 60, 80), iv(K.DETECTION, 80, 90)], 0, 90)
    assert s.interruptions == 1


def test_an_empty_window_has_zero_ettr_not_a_division_error():
    s = goodput([], 10, 10)
    assert s.wall_s == 0 and s.ettr == 0.0 and s.interruptions == 0


def test_the_summary_serialises_to_a_plain_dict():
    d = goodput([iv(K.PRODUCTIVE, 0, 10)], 0, 10).to_dict()
    assert d["ettr"] == 1.0 and d["productive_s"] == 10.0 and "lost_s" in d


kinds = st.sampled_from(list(IntervalKind))
spans = st.tuples(kinds, st.floats(-50, 250), st.floats(0, 120), st.integers(0, 3))


@given(st.lists(spans, max_size=25), st.floats(0, 100), st.floats(0, 200))
@settings(max_examples=150, deadline=None)
def test_charged_time_never_exceeds_the_wall_and_ettr_is_a_ratio(raw, lo, length):
    ledger = [iv(kind, start, start + dur, attempt) for kind, start, dur, attempt in raw]
    s = goodput(ledger, lo, lo + length)
    charged = [s.productive_s, s.checkpoint_s, s.init_s, s.restart_s, s.lost_s, s.detection_s, s.downtime_s]
    charged.append(s.unmeasured_s)
    assert all(c >= 0 for c in charged)
    assert sum(charged) + s.unaccounted_s == pytest.approx(s.wall_s, abs=1e-4)
    assert s.ettr is None if s.unmeasured_s > 0 else 0.0 <= s.ettr <= 1.0 + 1e-9
    productive_total = sum(
        max(0.0, min(i.end, lo + length) - max(i.start, lo))
        for i in ledger
        if i.kind is IntervalKind.PRODUCTIVE
    )
    assert s.productive_s <= productive_total + 1e-4


def test_a_run_without_heartbeats_has_no_ettr_rather_than_zero():
    # Two attempts of a script that reports no steps: the time is accounted, the ETTR unknown.
    ledger = [
        iv(K.UNMEASURED, 0, 40),
        iv(K.DETECTION, 40, 41),
        iv(K.RESTART, 41, 42, attempt=1),
        iv(K.UNMEASURED, 42, 100, attempt=1),
    ]
    s = goodput(ledger, 0, 100)
    assert s.ettr is None
    assert s.unmeasured_s == pytest.approx(98) and s.unaccounted_s == pytest.approx(0)
    assert s.attempts == 2 and s.interruptions == 1

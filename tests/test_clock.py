"""Clocks: the real one tells wall time, the virtual one only moves when told to."""

from __future__ import annotations

import time

import pytest

from trainguard.clock import Clock, RealClock, VirtualClock


def test_virtual_clock_starts_where_asked_and_only_moves_on_advance():
    clock = VirtualClock(start=100.0)
    assert clock.time() == 100.0
    assert clock.time() == 100.0
    assert clock.advance(2.5) == 102.5
    assert clock.time() == 102.5


def test_sleep_on_a_virtual_clock_advances_it_without_waiting(monkeypatch):
    clock = VirtualClock()

    def no_waiting(seconds: float) -> None:
        raise AssertionError(f"a virtual clock slept {seconds} s for real")

    monkeypatch.setattr(time, "sleep", no_waiting)
    clock.sleep(3600)
    assert clock.time() == 3600


def test_virtual_clock_refuses_to_go_backwards():
    clock = VirtualClock(start=5)
    with pytest.raises(ValueError, match="backwards"):
        clock.advance(-1)
    assert clock.advance_to(3) == 5  # a time already passed leaves it where it is
    assert clock.advance_to(9) == 9


def test_real_clock_tells_wall_time():
    assert abs(RealClock().time() - time.time()) < 1.0


def test_both_clocks_satisfy_the_protocol():
    assert isinstance(RealClock(), Clock)
    assert isinstance(VirtualClock(), Clock)

"""The breaker's view for readers (remediate/breaker_view.py): one read at a time however many
ask, the last good state kept through an unreadable file, and a hang said as such."""

from __future__ import annotations

import os
import threading
from pathlib import Path

from trainguard.remediate.breaker import BreakerFile, BreakerState
from trainguard.remediate.breaker_view import BreakerView, SingleFlight


def test_an_unparsable_file_keeps_the_last_good_state_and_says_why(tmp_path: Path) -> None:
    breaker = BreakerFile(tmp_path / "breaker.json")
    breaker.save(BreakerState(tripped="3 nodes in 600s"))
    view = BreakerView(breaker)
    assert view.read().state == BreakerState(tripped="3 nodes in 600s") and view.problem() is None
    breaker.path.write_text("[]")  # not an object: a clear error, never an empty (closed) breaker
    reading = view.read()
    assert reading.stale and reading.state is not None and reading.state.tripped == "3 nodes in 600s"
    problem = view.problem()
    assert problem is not None and "unreadable" in problem and "serving its state read" in problem


def test_a_hung_read_is_one_thread_however_often_it_is_asked(tmp_path: Path) -> None:
    path = tmp_path / "breaker.json"
    os.mkfifo(path)  # no writer: open() blocks, as on a hung NFS mount
    view = BreakerView(BreakerFile(path), timeout_s=0.2)
    try:
        first = view.read()  # waits its timeout once
        assert first.state is None and first.stale and first.hung_s > 0
        for _ in range(20):
            assert view.read().stale  # no wait: the read in flight is known to hang
        readers = [t for t in threading.enumerate() if t.name == "trainguard-breaker-read"]
        assert len(readers) == 1
        problem = view.problem()
        assert problem is not None and "has not returned" in problem and "nothing read yet" in problem
    finally:
        pending = view.refresh()  # the read in flight
        fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK)
        os.write(fd, b'{"tripped": "by hand"}')
        os.close(fd)
    pending.result(30)  # the hung read finishes with what was written
    path.unlink()
    reading = view.latest()
    assert reading.state is not None and reading.state.tripped == "by hand" and not reading.stale


def test_single_flight_hands_back_the_call_in_flight() -> None:
    flight: SingleFlight[int] = SingleFlight("test-flight")
    gate = threading.Event()
    first, started = flight.start(lambda: gate.wait(30) and 1)
    again, started_again = flight.start(lambda: 2)
    assert started and not started_again and again is first
    gate.set()
    assert first.result(30) == 1 and flight.in_flight() is None
    later, started_later = flight.start(lambda: 3)
    assert started_later and later.result(30) == 3

"""A stop signal to `trainguard run` is never lost: not inside a store write (the write completes,
then the signal is raised), not inside a handler that keeps the supervisor alive through errors
(the monitor loop raises it again)."""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Iterator

import pytest

from trainguard.incidents import Incident, IncidentStore, RootCause
from trainguard.procs import signals_deferred
from trainguard.supervisor.record import JobRecorder


class Stop(Exception):  # what trainguard run's handler raises (torch's SignalException is one)
    pass


def _raise(signum: int, _frame: object) -> None:
    raise Stop(signum)


@pytest.fixture
def raising_sigterm() -> Iterator[None]:
    previous = signal.signal(signal.SIGTERM, _raise)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def test_a_signal_inside_the_block_is_raised_once_the_block_is_done(raising_sigterm):
    done = []
    with pytest.raises(Stop), signals_deferred():
        os.kill(os.getpid(), signal.SIGTERM)
        done.append("rest of the write")
    assert done == ["rest of the write"]
    assert signal.getsignal(signal.SIGTERM) is _raise  # the handler in force is back


def test_a_sigterm_during_an_incident_write_keeps_the_incident_and_still_stops(tmp_path, raising_sigterm):
    recorder = JobRecorder("job", tmp_path, tmp_path / "tg.db")
    store = recorder.store
    assert store is not None
    write = store.add

    def add_hit_by_sigterm(incident: Incident) -> Incident:
        os.kill(os.getpid(), signal.SIGTERM)  # lands while the transaction is open
        return write(incident)

    store.add = add_hit_by_sigterm  # type: ignore[method-assign]
    with pytest.raises(Stop):  # not swallowed as "incident store write failed"
        recorder.add(
            Incident(job="job", time=1.0, root_cause=RootCause.UNKNOWN, action="restart", summary="x")
        )
    recorder.close()
    [kept] = IncidentStore(tmp_path / "tg.db").incidents(job="job")
    assert kept.summary == "x"
    assert "x" in (tmp_path / "incidents.jsonl").read_text()


def test_a_swallowed_stop_signal_is_raised_again_by_the_monitor_loop():
    pytest.importorskip("torch")
    from torch.distributed.elastic.multiprocessing.api import SignalException

    from trainguard.supervisor.elastic import _signals_raise, raise_swallowed_signal

    with _signals_raise():
        raise_swallowed_signal()  # nothing received: nothing raised
        with contextlib.suppress(Exception):  # a diagnostic's catch-all, as in the supervisor
            os.kill(os.getpid(), signal.SIGTERM)
        with pytest.raises(SignalException) as caught:
            raise_swallowed_signal()
    assert caught.value.sigval == signal.SIGTERM


def test_an_error_torch_raises_while_handling_a_stop_signal_counts_as_that_signal():
    pytest.importorskip("torch")
    from torch.distributed.elastic.multiprocessing.api import SignalException

    from trainguard.supervisor.elastic import _signal_behind

    def torch_metrics_wrapper() -> None:  # torch's elastic metrics wrapper, hit before `start = ...`
        try:
            raise SignalException("Process 1 got signal: 15", sigval=signal.SIGTERM)
        finally:
            raise UnboundLocalError("cannot access local variable 'start'")

    with pytest.raises(UnboundLocalError) as caught:
        torch_metrics_wrapper()
    assert _signal_behind(caught.value) == signal.SIGTERM
    assert _signal_behind(ValueError("a real launcher error")) is None

"""The hang watchdog: a learned timeout, stack dumps and the flight recorder, WorkerExit.HANG."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from trainguard import rundir
from trainguard.rundir import read_findings
from trainguard.torch.watchdog import HangWatchdog

WORKER = Path(__file__).with_name("test_guard_worker.py")
TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]


class StepClock:
    """The watchdog's clock, moved by the test; ``observed(n)`` waits until the watchdog thread has
    read it ``n`` more times (it reads it once per poll), so each check follows a real poll."""

    def __init__(self) -> None:
        self.now = 1000.0
        self.reads = 0
        self._cond = threading.Condition()

    def __call__(self) -> float:
        with self._cond:
            self.reads += 1
            self._cond.notify_all()
            return self.now

    def observed(self, polls: int = 3) -> None:
        with self._cond:
            target = self.reads + polls
            assert self._cond.wait_for(lambda: self.reads >= target, timeout=60), "watchdog thread stalled"


def _watchdog(clock: StepClock | None = None, **kw: float) -> tuple[HangWatchdog, threading.Event]:
    fired = threading.Event()
    extra = {"clock": clock} if clock is not None else {}
    wd = HangWatchdog(None, 0, on_hang=lambda reason: fired.set(), poll_s=0.01, **extra, **kw)  # type: ignore[arg-type]
    return wd, fired


def test_timeout_is_learned_from_the_slowest_step_with_a_floor():
    wd, _ = _watchdog(floor_s=1.0, factor=10.0, first_step_s=60.0)
    assert wd.timeout() == 60.0  # before the first step: the startup allowance
    wd.beat(30.0)  # the first step (warm-up) is not learned from
    assert wd.timeout() == 1.0
    wd.beat(0.5)
    wd.beat(0.2)
    assert wd.timeout() == 5.0
    with wd.allowance(100.0):
        assert wd.timeout() == 105.0
    assert wd.timeout() == 5.0


def test_the_watchdog_fires_when_steps_stop_and_not_while_they_continue():
    clock = StepClock()
    wd, fired = _watchdog(clock, floor_s=1.0, factor=3.0, first_step_s=1.0)
    wd.start()
    try:
        for _ in range(50):  # 1 s of steady 20 ms steps, each seen by the watchdog: no hang
            clock.now += 0.02
            wd.beat(0.02)
            clock.observed(1)
        clock.now += 0.99  # just under the 1 s floor since the last step
        clock.observed()
        assert not fired.is_set()
        clock.now += 0.02  # past it
        assert fired.wait(60)
    finally:
        wd.stop()


def test_a_checkpoint_allowance_holds_the_watchdog_back():
    clock = StepClock()
    wd, fired = _watchdog(clock, floor_s=0.2, factor=1.0, first_step_s=0.2)
    wd.beat(0.01)
    wd.beat(0.01)
    wd.start()
    try:
        with wd.allowance(5.0):
            clock.now += 5.0  # past the 0.2 s timeout, within the allowance
            clock.observed()
            assert not fired.is_set()
        clock.now += 0.3  # the allowance is over: 0.3 s since it ended
        assert fired.wait(60)
    finally:
        wd.stop()


@pytest.mark.slow
def test_a_hung_ddp_rank_is_dumped_with_its_flight_recorder_trace(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    slow = {"kind": "slow", "rank": 0, "step": 3, "delay_s": 0.4, "steps": 2}  # a straggler first
    (run / "chaos.json").write_text(json.dumps({"faults": [slow, {"kind": "hang", "rank": 1, "step": 20}]}))
    env = {k: v for k, v in os.environ.items() if k != rundir.RUN_DIR_ENV}
    env["OMP_NUM_THREADS"] = "1"
    proc = subprocess.run(
        [*TORCHRUN, str(WORKER), "--run-dir", str(run), "--steps", "1000", "--hang-floor", "2.0"],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert proc.returncode != 0
    traces = sorted(rundir.dumps_dir(run).glob("rank1-*.fr.json"))
    assert traces, proc.stderr[-3000:]
    entries = json.loads(traces[0].read_text())["entries"]
    assert entries and all(e["profiling_name"].startswith("gloo:") for e in entries)
    stacks = next(rundir.dumps_dir(run).glob("rank1-*.txt")).read_text()
    assert "chaos/inject.py" in stacks  # rank 1 is stuck in the injected hang, and the dump shows where
    hangs = [(r, f.rule) for r, _, f in read_findings(run) if f.rule == "hang.watchdog"]
    assert (1, "hang.watchdog") in hangs
    # while rank 0 straggled, both ranks show the slow step time; rank 1 did the waiting. With
    # several ranks the Guard agrees on windows of 8 steps, read one step late: the heartbeat of
    # the window that holds steps 3-4 reports its slowest step and longest wait.
    beats = {r: {b.step: b for b in rundir.read_heartbeats(rundir.heartbeat_path(run, r))} for r in (0, 1)}
    waited = [s for s, b in beats[1].items() if b.wait is not None and b.wait > 0.3 and s in beats[0]]
    assert waited and all(3 <= s <= 4 + 8 for s in waited)
    assert all(beats[0][s].wait is not None and beats[0][s].wait < 0.1 for s in waited)  # type: ignore[operator]
    assert all(beats[r][s].step_time > 0.3 for r in (0, 1) for s in waited)  # type: ignore[operator]

"""Hangs of scripts without heartbeats: judged from process state, never from missing heartbeats."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from trainguard.supervisor.config import LaunchConfig, SupervisorConfig, WatchConfig
from trainguard.supervisor.idle import Activity, IdleWatch, active, idle_since
from trainguard.supervisor.watch import ProgressWatch, watchers


def test_a_rank_that_uses_cpu_writes_output_or_does_io_is_active():
    base = Activity(0.0, 10.0, 100, "S")
    assert active(base, Activity(1.0, 10.5, 100, "S"))  # computing
    assert active(base, Activity(1.0, 10.0, 180, "S"))  # logging
    assert active(base, Activity(1.0, 10.0, 100, "D"))  # a checkpoint on a slow disk
    assert not active(base, Activity(1.0, 10.001, 100, "S"))  # parked in a wait
    assert not active(base, Activity(1.0, 10.0, 100, "T"))  # stopped


def test_the_job_is_hung_only_when_every_rank_has_been_idle_past_the_timeout():
    assert idle_since({0: 10.0, 1: 12.0}, now=20.0, timeout=5.0) == 12.0
    assert idle_since({0: 10.0, 1: 16.0}, now=20.0, timeout=5.0) is None  # rank 1 worked 4s ago
    assert idle_since({}, now=20.0, timeout=5.0) is None


def _cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


_spun: dict[int, float] = {}


def _wait_for_cpu(pid: int, more_s: float = 0.03) -> None:
    """Until ``pid`` used ``more_s`` more CPU than at the last call: on a loaded machine a busy
    process may get no CPU for a while, and a sample must follow real work."""
    start = _spun.get(pid, _cpu_s(pid))
    deadline = time.monotonic() + 120
    while _cpu_s(pid) < start + more_s:
        assert time.monotonic() < deadline, "the spinning process got no CPU"
        time.sleep(0.02)
    _spun[pid] = _cpu_s(pid)


def test_idle_watch_flags_sleeping_ranks_and_not_a_busy_one(tmp_path):
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        _wait_for_cpu(spinner.pid)  # running, past interpreter start
        both, busy = IdleWatch(timeout=3.0), IdleWatch(timeout=3.0)
        both.begin_attempt(0.0)
        busy.begin_attempt(0.0)
        hung_both = hung_busy = None
        for now in range(8):  # one sample per (virtual) second
            hung_both = both.poll(float(now), {0: sleeper.pid}, tmp_path)
            hung_busy = busy.poll(float(now), {0: sleeper.pid, 1: spinner.pid}, tmp_path)
            _wait_for_cpu(spinner.pid)  # the busy rank really worked before the next sample
        assert hung_both == 0.0  # idle since the first sample
        assert hung_busy is None
    finally:
        for p in (sleeper, spinner):
            p.kill()
            p.wait()


def test_no_heartbeats_is_no_hang_however_long_it_lasts(tmp_path):
    watch = ProgressWatch(tmp_path, hang_timeout_floor=1.0, startup_timeout=5.0)
    watch.begin_attempt(0, [0, 1], started=100.0)
    assert not watch.poll(100.0 + 3600).hung
    assert not watch.heartbeats_seen
    beats = tmp_path / "heartbeat"
    beats.mkdir()
    beat = {"rank": 0, "step": 0, "time": 3700.0, "attempt": 0, "phase": "train"}
    (beats / "rank0.jsonl").write_text(json.dumps(beat) + "\n")
    assert not watch.poll(3700.5).hung and watch.heartbeats_seen
    assert watch.poll(3700.0 + 60).hung  # a Guard job that stops stepping is a hang


def test_watchers_say_how_hangs_are_detected_with_and_without_heartbeats():
    launch = LaunchConfig(cmd=("python", "x.py"))
    cfg = SupervisorConfig(launch, watch=WatchConfig(idle_timeout=600.0, startup_timeout=15.0))
    assert "no heartbeats yet" in watchers(cfg, heartbeats=False)
    assert "process state only" in watchers(cfg, heartbeats=False) and "600s" in watchers(cfg, False)
    assert "hangs from heartbeats" in watchers(cfg, heartbeats=True) and "15s" in watchers(cfg, True)
    off = SupervisorConfig(launch, watch=WatchConfig(idle_timeout=0))
    assert "no hang detection" in watchers(off, heartbeats=False)
    assert IdleWatch(timeout=0).poll(1e9, {0: os.getpid()}, Path("/nonexistent")) is None


def _beats(path, rows):
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")


def test_warm_up_after_a_restart_and_checkpoint_steps_are_no_straggler(tmp_path):
    from trainguard.supervisor.watch import straggler

    watch = ProgressWatch(tmp_path)
    hb = tmp_path / "heartbeat"
    t = 0.0
    for attempt, steps in ((0, range(0, 30)), (1, range(25, 45))):
        watch.begin_attempt(attempt, [0, 1], started=t)
        for step in steps:
            warm = step - steps.start < 4  # a restart's first steps are slow
            ckpt = step % 10 == 0  # a checkpoint every 10 steps; the steps after it pay the copy
            dt = 0.5 if warm else 0.02
            for rank in (0, 1):
                rows = []
                if ckpt:
                    rows.append(
                        {"rank": rank, "step": step, "time": t, "attempt": attempt, "phase": "checkpoint"}
                    )
                # rank 0 loads and saves for everyone: rank 1 waits for it then
                step_time = 0.6 if step % 10 <= 3 else dt
                rows.append(
                    {"rank": rank, "step": step, "time": t + dt, "attempt": attempt, "phase": "train",
                     "step_time": step_time, "wait": rank * (step_time - 0.02)}
                )  # fmt: skip
                _beats(hb / f"rank{rank}.jsonl", rows)
            t += dt
            view = watch.poll(t)
            assert straggler(watch.steady_step_times(), watch.baseline_step_time, view.waits) is None
    assert watch.baseline_step_time == 0.02


def test_a_sustained_slowdown_that_one_rank_causes_is_a_straggler():
    from trainguard.supervisor.watch import straggler

    slow = {0: [0.02] * 5 + [0.55] * 3, 1: [0.02] * 5 + [0.55] * 3}
    found = straggler(slow, 0.02, waits={0: 0.5, 1: 0.001})
    assert found is not None and found.rank == 1 and found.step_time == 0.55
    assert straggler(slow, 0.02, waits={0: 0.001, 1: 0.001}) is None  # everyone slow: no one rank
    assert straggler(slow, 0.02, waits={}, degraded_rank=1).rank == 1  # telemetry names it
    blip = {0: [0.02, 0.02, 0.55], 1: [0.02, 0.02, 0.55]}  # one slow step is not sustained
    assert straggler(blip, 0.02, waits={0: 0.5, 1: 0.0}) is None
    tiny = {0: [0.01] * 3, 1: [0.01] * 3}  # 0.01s vs 0.002s: 5x, but 8 ms is noise
    assert straggler(tiny, 0.002, waits={0: 0.008, 1: 0.0}) is None


@pytest.mark.parametrize(
    "name", ["trainguard.supervisor.idle", "trainguard.supervisor.watch", "trainguard.cli.checkpoints"]
)
def test_docstring_examples_run(name):
    import doctest
    import importlib

    result = doctest.testmod(importlib.import_module(name))
    assert result.attempted > 0 and result.failed == 0

"""Hangs of scripts without heartbeats: judged from process state, never from missing heartbeats."""

from __future__ import annotations

import json
import subprocess
import sys
import time

from trainguard.supervisor.config import SupervisorConfig
from trainguard.supervisor.idle import IdleWatch, Sample, active, idle_since
from trainguard.supervisor.watch import ProgressWatch, watchers


def test_a_rank_that_uses_cpu_writes_output_or_does_io_is_active():
    base = Sample(0.0, 10.0, 100, "S")
    assert active(base, Sample(1.0, 10.5, 100, "S"))  # computing
    assert active(base, Sample(1.0, 10.0, 180, "S"))  # logging
    assert active(base, Sample(1.0, 10.0, 100, "D"))  # a checkpoint on a slow disk
    assert not active(base, Sample(1.0, 10.001, 100, "S"))  # parked in a wait
    assert not active(base, Sample(1.0, 10.0, 100, "T"))  # stopped


def test_the_job_is_hung_only_when_every_rank_has_been_idle_past_the_timeout():
    assert idle_since({0: 10.0, 1: 12.0}, now=20.0, timeout=5.0) == 12.0
    assert idle_since({0: 10.0, 1: 16.0}, now=20.0, timeout=5.0) is None  # rank 1 worked 4s ago
    assert idle_since({}, now=20.0, timeout=5.0) is None


def test_idle_watch_flags_sleeping_ranks_and_not_a_busy_one(tmp_path):
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(0.5)  # past interpreter start, which uses CPU
        both, busy = IdleWatch(timeout=3.0), IdleWatch(timeout=3.0)
        both.begin_attempt(0.0)
        busy.begin_attempt(0.0)
        hung_both = hung_busy = None
        for now in range(8):  # one sample per (virtual) second
            hung_both = both.poll(float(now), {0: sleeper.pid}, tmp_path)
            hung_busy = busy.poll(float(now), {0: sleeper.pid, 1: spinner.pid}, tmp_path)
            time.sleep(0.2)
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
    cfg = SupervisorConfig(cmd=("python", "x.py"), idle_timeout=600.0, startup_timeout=15.0)
    assert "no heartbeats yet" in watchers(cfg, heartbeats=False)
    assert "process state only" in watchers(cfg, heartbeats=False) and "600s" in watchers(cfg, False)
    assert "hangs from heartbeats" in watchers(cfg, heartbeats=True) and "15s" in watchers(cfg, True)

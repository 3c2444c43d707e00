"""A TF worker lost to its peers (#37): the coordination service's lines on the survivor name the lost
task, and the incident blames that task's rank, never the survivor's "bug".

The lines are rank 0's, as TF 2.21 printed them when worker 1 was SIGSTOPped under ``trainguard run
--framework tf`` (tests/data/real/tf_coord_dev.tsv, 'this host'; the end-to-end run is
tests/test_tf_run.py). Worker R is TF_CONFIG task R (`supervisor.tf`), so task 1 is rank 1.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

from trainguard.detect.training_log import classify_training_line
from trainguard.incidents import RootCause
from trainguard.supervisor.exits import Exited, exit_trouble
from trainguard.supervisor.hang import proc_state

DATA = Path(__file__).parent / "data" / "real" / "tf_coord_dev.tsv"


def survivor_lines() -> list[str]:
    rows = [raw.split("\t", 3) for raw in DATA.read_text().splitlines() if raw and not raw.startswith("#")]
    return [line for _, _, source, line in rows if source == "this host"]


def judge(lines: list[str], stopped: tuple[int, ...] = ()):
    events = [e for line in lines if (e := classify_training_line(line)) is not None]
    return exit_trouble(
        100.0, [Exited(0, 0, 1, 100.0)], [], events, [], {0: 0, 1: 1}, {0: None, 1: None}, stopped=stopped
    )


def test_the_survivors_lines_name_the_stopped_rank_and_its_state_is_the_evidence():
    trouble = judge(survivor_lines(), stopped=(1,))
    assert (trouble.rank, trouble.gpu) == (1, 1)
    assert trouble.root_cause is RootCause.UNKNOWN  # who stopped it is not in the evidence
    assert "stopped (process state T)" in trouble.summary
    assert any("suspects: dependency" in e for e in trouble.evidence)


def test_without_the_state_the_named_task_is_still_the_rank_blamed_and_the_cause_unknown():
    # the lost task alive and running (slow, its heartbeats late) or on another node: the lines alone
    trouble = judge(survivor_lines())
    assert trouble.rank == 1
    assert trouble.root_cause is RootCause.UNKNOWN
    assert "task:1" in trouble.summary
    assert any("suspects: host" in e for e in trouble.evidence)


def test_the_survivors_own_earlier_error_is_still_its_own():
    # a stopped peer does not take the blame for rank 0's own bug printed before it
    lines = ["ValueError: malformed sample in shard 7"]
    events = [e for line in lines if (e := classify_training_line(line)) is not None]
    trouble = exit_trouble(
        2_000_000_000.0, [Exited(0, 0, 1, 2_000_000_000.0)], [], events, [], {0: 0, 1: 1}, {}, stopped=(1,)
    )
    assert (trouble.rank, trouble.root_cause) == (0, RootCause.SOFTWARE_BUG)


def test_a_sigstopped_process_reads_as_stopped():
    proc = subprocess.Popen(["sleep", "60"])
    try:
        assert proc_state(proc.pid) in ("S", "R")
        os.kill(proc.pid, signal.SIGSTOP)
        deadline = time.monotonic() + 30
        while proc_state(proc.pid) != "T":
            assert time.monotonic() < deadline
            time.sleep(0.01)
    finally:
        proc.kill()
        proc.wait()

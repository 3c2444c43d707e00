"""Re-running a job id after `kill -9` of its supervisor accounts the first run, not forgets it."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from trainguard.incidents import IncidentStore, IntervalKind, goodput
from trainguard.incidents.goodput import JobInfo
from trainguard.incidents.report import job_report
from trainguard.supervisor.lost import find_lost_run, lost_run_record, step_reached_at

WORKER = Path(__file__).parent / "workers" / "ddp_worker.py"


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def _previous_run(run_dir: Path, pid: int, host: str = "h1") -> None:
    logs = run_dir / "logs" / f"{host}-{pid}"
    for attempt in (0, 1):
        (logs / f"attempt{attempt}").mkdir(parents=True)
        (logs / f"attempt{attempt}" / "rank0.stdout").write_text("epoch 3\n")
    beats = run_dir / "heartbeat"
    beats.mkdir()
    rows = [{"rank": 0, "step": s, "time": 1000.0 + s, "attempt": 1, "phase": "train"} for s in range(5, 18)]
    (beats / "rank0.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_a_running_job_whose_supervisor_is_gone_is_a_lost_run(tmp_path):
    pid = _dead_pid()
    _previous_run(tmp_path, pid)
    lost = find_lost_run(JobInfo("j", started=990.0, status="running"), tmp_path, host="h1")
    assert lost is not None
    assert lost.node == f"h1:{pid}" and lost.next_attempt == 2
    assert lost.first_step_time == 1005.0 and lost.furthest_step == 17
    assert lost.last_seen > 1017.0  # the files' modification times: now-ish


def test_a_finished_job_a_live_supervisor_or_another_host_is_no_lost_run(tmp_path):
    _previous_run(tmp_path, os.getpid())  # alive: maybe another supervisor of this job right now
    running = JobInfo("j", started=990.0, status="running")
    assert find_lost_run(running, tmp_path, host="h1") is None
    assert find_lost_run(running, tmp_path, host="h2") is None  # its pids mean nothing here
    done = tmp_path / "done"
    _previous_run(done, _dead_pid())
    assert find_lost_run(JobInfo("j", started=990.0, status="succeeded"), done, host="h1") is None
    assert find_lost_run(None, done, host="h1") is None


def test_the_lost_run_is_one_interruption_with_its_time_accounted(tmp_path):
    pid = _dead_pid()
    _previous_run(tmp_path, pid)
    lost = find_lost_run(JobInfo("j", started=990.0, status="running"), tmp_path, host="h1")
    assert lost is not None
    lost = type(lost)(lost.node, lost.started, 1020.0, lost.next_attempt, lost.first_step_time, 17)
    assert step_reached_at(tmp_path, 13) == 1012.0  # 13 steps done: the beat of step index 12
    incident, intervals = lost_run_record(lost, "j", now=1030.0, resume_at=1012.0)
    assert incident.detected_by == "supervisor_restart" and incident.started == 1020.0
    assert incident.attempt == 1 and "last step reported 17" in incident.summary
    s = goodput(intervals, 990.0, 1030.0)
    assert s.init_s == 15 and s.productive_s == 7 and s.lost_s == 8 and s.downtime_s == 10
    assert s.unaccounted_s == 0 and s.interruptions == 1


@pytest.mark.slow
def test_rerunning_a_job_id_after_kill_9_of_its_supervisor_accounts_the_first_run(tmp_path):
    def command(steps: str) -> list[str]:
        args = [sys.executable, "-m", "trainguard.cli", "run", "--standalone", "--nproc-per-node", "2"]
        args += ["--db", str(tmp_path / "tg.db"), "--runs-dir", str(tmp_path / "runs"), "--no-tee"]
        args += ["--job-id", "again", "--warm-standby", "--json", str(tmp_path / "result.json"), "--"]
        args += [sys.executable, str(WORKER), "--checkpoint-dir", str(tmp_path / "ckpt")]
        return [*args, "--steps", steps, "--checkpoint-every", "5", "--step-sleep", "0.1"]

    first = subprocess.Popen(
        command("400"), cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    beats = tmp_path / "runs" / "again" / "heartbeat" / "rank0.jsonl"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and (not beats.exists() or beats.read_text().count('"train"') < 20):
        time.sleep(0.2)
    first.send_signal(signal.SIGKILL)
    first.wait()
    time.sleep(1.0)
    reached = max(json.loads(line)["step"] for line in beats.read_text().splitlines())
    proc = subprocess.run(
        command(str(reached + 15)), cwd=tmp_path, capture_output=True, text=True, timeout=180
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    with IncidentStore(tmp_path / "tg.db") as store:
        report = job_report(store, "again")
        intervals = store.intervals("again")
    [lost] = [i for i in report["incidents"] if i["category"] == "supervisor_lost"]
    assert lost["resolved"] and lost["time_lost_s"] > 0
    assert socket.gethostname() in lost["summary"]
    assert all(i["t_s"] >= 0 for i in report["incidents"])
    g = report["goodput"]
    assert g["interruptions"] >= 1 and g["attempts"] == 2
    assert g["wall_s"] > max(iv.end for iv in intervals) - min(iv.start for iv in intervals) - 1
    assert any(iv.kind is IntervalKind.DOWNTIME and iv.detail == "no supervisor" for iv in intervals)
    assert g["productive_s"] > 0 and g["lost_s"] > 0 and g["unaccounted_s"] < 0.1 * g["wall_s"]


def test_the_step_a_resume_starts_from_may_show_only_in_its_checkpoints_beat(tmp_path):
    beats = tmp_path / "heartbeat"
    beats.mkdir()
    rows = [(1000.0, 45, "train"), (1001.0, 48, "train"), (1001.5, 49, "checkpoint")]
    (beats / "rank0.jsonl").write_text(
        "".join(json.dumps({"time": t, "step": s, "phase": p, "attempt": 0}) + "\n" for t, s, p in rows)
    )
    assert step_reached_at(tmp_path, 50) == 1001.5  # the save of step-50 said so; no train beat did
    assert step_reached_at(tmp_path, 55) is None

"""`trainguard run` end to end: real workers (tests/workers/ddp_worker.py: DDP over gloo with the
real Guard and Checkpointer), real faults, the incident store read back afterwards."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from trainguard.incidents import IncidentStore
from trainguard.supervisor.hang import collect

WORKER = Path(__file__).parent / "workers" / "ddp_worker.py"
pytestmark = pytest.mark.slow


def trainguard_run(
    tmp_path: Path,
    *flags: str,
    worker_args: tuple[str, ...] = (),
    plan: str | None = None,
    timeout: float = 90,
) -> tuple[int, dict, IncidentStore]:
    args = [
        sys.executable,
        "-m",
        "trainguard.cli",
        "run",
        "--standalone",
        "--nproc-per-node",
        "2",
        "--db",
        str(tmp_path / "tg.db"),
        "--runs-dir",
        str(tmp_path / "runs"),
        "--no-tee",
        "--json",
        str(tmp_path / "result.json"),
        *flags,
    ]
    if "--warm-standby" not in flags:
        args.append("--no-warm-standby")  # spare interpreters cost CPU the other tests need
    if plan is not None:
        (tmp_path / "plan.toml").write_text(plan)
        args += ["--chaos", str(tmp_path / "plan.toml")]
    args += ["--", sys.executable, str(WORKER), "--checkpoint-dir", str(tmp_path / "ckpt"), *worker_args]
    proc = subprocess.run(args, capture_output=True, text=True, timeout=timeout, cwd=tmp_path)
    result = json.loads((tmp_path / "result.json").read_text()) if (tmp_path / "result.json").exists() else {}
    assert result, proc.stderr[-3000:]
    return proc.returncode, result, IncidentStore(tmp_path / "tg.db")


def test_a_clean_run_exits_0_without_incidents(tmp_path):
    code, result, store = trainguard_run(tmp_path, worker_args=("--steps", "12"))
    assert code == 0, result
    assert result["incidents"] == []
    assert result["final_step"] == 11
    assert store.get_job(result["job_id"]).status == "succeeded"


def test_a_sigkilled_rank_is_restarted_from_the_checkpoint_and_recorded(tmp_path):
    plan = '[[fault]]\nkind = "kill"\nrank = 1\nstep = 12\n'
    code, result, store = trainguard_run(tmp_path, "--warm-standby", worker_args=("--steps", "24"), plan=plan)
    assert code == 0, result
    assert result["attempts"] == 2
    assert result["final_step"] == 23
    [incident] = store.incidents(job=result["job_id"])
    assert incident.rank == 1
    assert incident.action == "restart"
    # A SIGKILL with no OOM-killer line or cgroup oom_kill event: no confident label.
    assert incident.root_cause.value == "unknown"
    assert any(str(e).startswith("unknown; suspects: host") for e in incident.evidence)
    assert "SIGKILL" in incident.summary
    assert incident.resolved and incident.time_lost_s is not None
    [recovery] = result["recoveries"]
    assert recovery["resume_step"] >= 10  # checkpoints every 5 steps: resumed, not restarted from 0
    assert 0 < recovery["mttr_s"] < 60
    assert store.goodput(result["job_id"]).interruptions == 1
    # the first start was torchrun's own (the pool fills after the first step), the restarted
    # ranks ran in warm standbys: torch was already imported when their script began
    logs = Path(result["run_dir"]) / "logs"
    assert all("warm=False" in p.read_text() for p in logs.glob("*/attempt0/rank*.stdout"))
    assert all("warm=True" in p.read_text() for p in logs.glob("*/attempt1/rank*.stdout"))
    assert len(list(logs.glob("*/attempt1/rank*.stdout"))) == 2


def test_a_second_fault_before_the_pool_refilled_still_restarts_on_standbys(tmp_path):
    # Once the first attempt settles the pool fills two sets of standbys (--warm-standby-sets,
    # default 2): the first restart takes one, and a second fault before the pool refilled
    # restarts on the other. The refill is put off past the run, so a restart that found the
    # pool empty would start its ranks fresh. Whether a standby had finished importing by then is
    # the CPU its nice 19 left it (on a loaded host, none): timing, for benchmarks/bench_startup.py.
    plan = '[[fault]]\nkind = "kill"\nrank = 1\nstep = 20\n\n[[fault]]\nkind = "kill"\nrank = 1\nstep = 26\n'
    code, result, _ = trainguard_run(
        tmp_path,
        "--warm-standby",
        "--warm-refill-delay",
        "3600",
        worker_args=("--steps", "34", "--step-sleep", "0.5"),
        plan=plan,
        timeout=300,
    )
    assert code == 0, result
    assert len(result["injected"]) == 2 and result["attempts"] == 3
    for recovery in result["recoveries"]:  # the supervisor's own record of each restart
        use = recovery["standbys"]
        assert use["fresh"] == 0 and use["ready"] + use["importing"] == 2, use


@pytest.mark.parametrize("standby", ["--warm-standby", "--no-warm-standby"])
def test_every_attempts_worker_logs_are_kept_through_three_restarts(tmp_path, standby):
    # Rank 1 is killed three times, each at another moment: at once (before the first step: the
    # ranks are starting, a standby may still be importing), mid-run (step 6), and as the save
    # after step 15 is taken (checkpoints every 4 steps). Each attempt keeps its ranks' log files
    # and what they printed.
    plan = "".join(
        f'[[fault]]\nkind = "kill"\nrank = 1\n{trigger}\n\n'
        for trigger in ("at_s = 0", "step = 6", "step = 15")
    )
    args = ("--steps", "24", "--checkpoint-every", "4", "--step-sleep", "0.2")
    code, result, _ = trainguard_run(tmp_path, standby, worker_args=args, plan=plan, timeout=400)
    assert code == 0, result
    assert [i["step"] is None or i["step"] < 15 for i in result["injected"]] == [True, True, False]
    assert result["attempts"] == 4
    [node] = (tmp_path / "runs" / result["job_id"] / "logs").iterdir()
    for attempt in range(4):  # (and the error file of a rank that raised)
        names = {p.name for p in (node / f"attempt{attempt}").iterdir()}
        assert names >= {"rank0.stderr", "rank0.stdout", "rank1.stderr", "rank1.stdout"}, attempt
    for attempt in (1, 2, 3):  # these ranks reached their training loop before the next kill
        for rank in (0, 1):
            printed = (node / f"attempt{attempt}" / f"rank{rank}.stdout").read_text()
            assert f"rank {rank} resumes at step " in printed, (attempt, rank)
    assert "rank 0 done" in (node / "attempt3" / "rank0.stdout").read_text()


def test_the_same_application_error_three_times_stops_with_the_crash_loop_exit_code(tmp_path):
    code, result, store = trainguard_run(
        tmp_path,
        "--backoff-base",
        "0.1",
        "--max-restarts",
        "10",
        worker_args=("--steps", "20", "--bug-at", "2"),
    )
    assert code == 3, result
    assert result["status"] == "crash_loop"
    incidents = store.incidents(job=result["job_id"])
    assert [i.action for i in incidents] == ["restart", "restart", "stop_crash_loop"]
    assert all(i.root_cause.value == "software_bug" and i.rank == 1 for i in incidents)
    assert "ValueError: bad batch at step" in incidents[-1].summary


def test_a_stopped_rank_is_caught_as_a_hang_and_named(tmp_path):
    plan = '[[fault]]\nkind = "stop"\nrank = 1\nstep = 8\n'
    code, result, store = trainguard_run(
        tmp_path, "--hang-timeout-floor", "2", worker_args=("--steps", "16"), plan=plan
    )
    assert code == 0, result
    [incident] = store.incidents(job=result["job_id"])
    assert incident.category == "hang"
    assert incident.rank == 1
    assert "laggard: rank 1" in incident.summary
    assert incident.detected_by == "heartbeat"
    assert incident.detection_delay_s >= 2  # not before the hang floor (how soon after: benchmarks)


def test_a_fatal_xid_on_a_simulated_gpu_excludes_it_and_training_continues_on_fewer(tmp_path):
    plan = '[[fault]]\nkind = "xid"\nrank = 1\nxid = 79\nstep = 8\n'
    code, result, store = trainguard_run(
        tmp_path, "--backend", "sim", worker_args=("--steps", "16"), plan=plan
    )
    assert code == 0, result
    [incident] = store.incidents(job=result["job_id"])
    assert incident.action == "exclude_gpu" and incident.gpu == 1
    assert incident.root_cause.value == "faulty_gpu"
    assert result["world_sizes"] == [2, 1]
    assert result["final_step"] == 15
    kmsg = (Path(result["run_dir"]) / "sim-kmsg.log").read_text()
    assert "NVRM: Xid (PCI:" in kmsg and ": 79, " in kmsg
    # The row names the GPU by its UUID too: the one the kernel log maps the Xid's PCI address to.
    pci = kmsg.split("NVRM: Xid (PCI:")[1].split(")")[0]
    uuid = kmsg.split(f"NVRM: GPU at PCI:{pci}: ")[1].split()[0]
    [row] = store.read("SELECT gpu_uuid FROM incidents WHERE job = ?", (result["job_id"],))
    assert uuid.startswith("GPU-") and row["gpu_uuid"] == uuid


def test_hang_collection_signals_only_the_workers_still_running(tmp_path, monkeypatch):
    hung = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()  # reaped: its pid is free for any new process, e.g. the next attempt's rank
    sent: list[int] = []
    kill = os.kill
    monkeypatch.setattr(os, "kill", lambda pid, sig: (sent.append(pid), kill(pid, sig))[1])
    try:
        collect(tmp_path, {0: hung, 1: gone}, {}, {}, wait_s=30)
        assert hung.poll() == -signal.SIGABRT  # the dump request reached the hung worker...
        assert set(sent) == {hung.pid}  # ... and nothing else
    finally:
        hung.kill()
        hung.wait()


def test_a_hung_gloo_job_gets_its_flight_recorder_judgement_stored_with_the_incident(tmp_path):
    plan = '[[fault]]\nkind = "hang"\nrank = 1\nstep = 8\n'
    code, result, store = trainguard_run(
        tmp_path, "--hang-timeout-floor", "2", worker_args=("--steps", "16"), plan=plan, timeout=180
    )
    assert code == 0, result
    [incident] = store.incidents(job=result["job_id"])
    assert incident.category == "hang" and incident.rank == 1, incident
    # both ranks answered the dump request through the Guard (gloo has no dump of its own)
    [judgement] = [Path(e) for e in incident.evidence if str(e).endswith(".json") and "/flight-" in str(e)]
    verdict = json.loads(judgement.read_text())
    assert verdict["dumps"] == 2, verdict
    # the judgement agrees with the stacks: rank 0 waits in the next all-reduce, rank 1 never issued it
    assert verdict["ranks"] == [1] and verdict["victims"] == [0], verdict
    [evidence] = verdict["evidence"]["1"]
    assert evidence["kind"] == "not_issued" and "outside communication" in evidence["text"], evidence
    assert not verdict["notes"], verdict  # the Guard's writer named the default group's members
    assert "never issued" in incident.summary  # the incident names rank 1 from the dumps
    assert sorted(p.name for p in judgement.parent.glob("fr_rank_*")) == ["fr_rank_0", "fr_rank_1"]

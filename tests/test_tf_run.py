"""``trainguard run --framework tf`` on real TensorFlow: a foreign MultiWorkerMirroredStrategy script
(tests/workers/tf_mwms.py: TF's tutorial, no trainguard in it) with two workers on loopback."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from real_parts import require_module

WORKER = Path(__file__).with_name("workers") / "tf_mwms.py"
JOB = Path(__file__).resolve().parents[1] / "benchmarks" / "tf_job.py"  # bench_tf's job, Keras 2 Guard
TRAINGUARD = [sys.executable, "-m", "trainguard.cli"]
pytestmark = pytest.mark.slow


def need_tf() -> None:
    require_module("tensorflow", install="make install (tensorflow-cpu 2.21)")
    require_module("tf_keras", install="make install (tf-keras 2.21: multi-worker model.fit)")


def run(
    tmp_path: Path, job: str, *worker_args: str, options: tuple[str, ...] = (), script: Path = WORKER
) -> subprocess.Popen[bytes]:
    argv = [
        *TRAINGUARD,
        "run",
        "--framework",
        "tf",
        "--nproc-per-node",
        "2",
        "--job-id",
        job,
        "--no-tee",
        *options,
    ]
    argv += ["--runs-dir", str(tmp_path / "runs"), "--db", str(tmp_path / "tg.db")]
    argv += ["--json", str(tmp_path / f"{job}.json")]
    return subprocess.Popen(
        [*argv, "--", sys.executable, str(script), *worker_args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )


def finish(sup: subprocess.Popen[bytes], timeout: float) -> str:
    """The run's console output once it exits; a run past ``timeout`` is killed, never left behind."""
    try:
        out, _ = sup.communicate(timeout=timeout)
    finally:
        if sup.poll() is None:
            sup.kill()
            sup.wait()
    return out.decode()


def lines(tmp_path: Path, job: str, attempt: int, rank: int) -> str:
    files = list((tmp_path / "runs" / job / "logs").glob(f"*/attempt{attempt}/rank{rank}.stdout"))
    return files[0].read_text() if files else ""


def worker_pid(run_dir: Path, index: int) -> int | None:
    """The pid of TF worker ``index`` of the run (from /proc: its TF_CONFIG and run directory)."""
    mark = f"TRAINGUARD_RUN_DIR={run_dir.resolve()}".encode()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            env = (entry / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        config = next((v[len(b"TF_CONFIG=") :] for v in env if v.startswith(b"TF_CONFIG=")), None)
        if mark in env and config is not None and json.loads(config)["task"]["index"] == index:
            return int(entry.name)
    return None


def signal_worker_1(sup: subprocess.Popen[bytes], tmp_path: Path, job: str, marker: str, sig: int) -> str:
    """Once rank 0 of the first attempt printed ``marker``, send ``sig`` to TF worker 1; the run's
    console output once it exits (`finish`)."""
    try:
        deadline = time.monotonic() + 400
        while marker not in lines(tmp_path, job, 0, 0) and sup.poll() is None:
            assert time.monotonic() < deadline, f"rank 0 never printed {marker!r}"
            time.sleep(0.2)
        pid = worker_pid(tmp_path / "runs" / job, 1)
        assert pid is not None
        os.kill(pid, sig)
    except BaseException:
        sup.kill()
        sup.wait()
        raise
    return finish(sup, 600)


def test_a_foreign_multiworker_script_runs_clean(tmp_path):
    need_tf()
    sup = run(tmp_path, "clean", "--epochs", "2")
    out = finish(sup, 600)
    assert sup.returncode == 0, out[-3000:]
    result = json.loads((tmp_path / "clean.json").read_text())
    assert (result["exit_code"], result["attempts"], result["incidents"]) == (0, 1, [])
    assert all("done step 40" in lines(tmp_path, "clean", 0, r) for r in (0, 1))


def test_a_killed_worker_restarts_both_and_backup_and_restore_resumes(tmp_path):
    need_tf()
    backup = tmp_path / "backup"
    args = ("--epochs", "4", "--step-s", "0.1", "--backup-dir", str(backup), "--save-freq", "10")
    sup = run(tmp_path, "kill", *args)
    out = signal_worker_1(sup, tmp_path, "kill", "Epoch 2/", signal.SIGKILL)  # past the backup of step 20
    assert sup.returncode == 0, out[-3000:]
    result = json.loads((tmp_path / "kill.json").read_text())
    assert result["attempts"] == 2
    (incident,) = result["incidents"]
    assert (incident["rank"], incident["action"]) == (1, "restart")
    assert "killed by SIGKILL" in incident["summary"]
    for rank in (0, 1):
        again = lines(tmp_path, "kill", 1, rank)
        started = int(again.split("start step ")[1].split()[0])
        assert started >= 20 and started % 10 == 0, again[-500:]  # BackupAndRestore's last save, not 0
        assert "done step 80" in again


def test_an_xid_on_a_workers_gpu_restarts_the_job_without_that_gpu(tmp_path):
    # Worker 1's GPU falls off the bus at step 30 (the simulated node logs Xid 79, the worker dies of
    # the CUDA error): the job comes back as one worker on GPU 0 from the Guard's step-30 checkpoint.
    need_tf()
    plan = tmp_path / "xid.toml"
    plan.write_text('[[fault]]\nname = "fatal Xid 79"\nkind = "xid"\nrank = 1\nxid = 79\nstep = 30\n')
    args = ("--trainguard", "--checkpoint-dir", str(tmp_path / "ckpt"), "--epochs", "2")
    args += ("--steps-per-epoch", "40", "--save-every", "10")
    sup = run(tmp_path, "xid", *args, options=("--backend", "sim", "--chaos", str(plan)), script=JOB)
    out = finish(sup, 600)
    assert sup.returncode == 0, out[-3000:]
    result = json.loads((tmp_path / "xid.json").read_text())
    assert (result["attempts"], result["world_sizes"]) == (2, [2, 1])
    (incident,) = result["incidents"]  # no needless second action
    assert (incident["action"], incident["gpu"], incident["rank"]) == ("exclude_gpu", 1, 1)
    assert incident["root_cause"] == "faulty_gpu"
    (recovery,) = result["recoveries"]
    assert recovery["resume_step"] == 30
    run_dir = tmp_path / "runs" / "xid"
    checked = [
        json.loads((run_dir / "diagnostics" / f"preflight-attempt{a}.json").read_text()) for a in (0, 1)
    ]
    assert [[g["index"] for g in c["gpus"]] for c in checked] == [[0, 1], [0]]
    assert "done step 80" in lines(tmp_path, "xid", 1, 0) and not lines(tmp_path, "xid", 1, 1)


def test_a_hung_worker_of_a_job_without_heartbeats_is_caught_from_process_state(tmp_path):
    # bench_tf's job in its TensorFlow-only arm (no trainguard import, BackupAndRestore): worker 1
    # deadlocks in its own code at step 30, alive (TF's heartbeats go on, so TF sees nothing), and
    # worker 0 waits in the collective. Every rank idle is the hang; both restart from
    # BackupAndRestore's step-20 save (a marker keeps the restarted worker from hanging again).
    need_tf()
    progress = tmp_path / "progress"
    args = ("--backup-dir", str(tmp_path / "backup"), "--save-every", "10", "--epochs", "2")
    args += ("--steps-per-epoch", "40", "--step-s", "0.05", "--hang-at-step", "30", "--hang-rank", "1")
    args += ("--hang-marker", str(tmp_path / "hung"), "--progress", str(progress))
    # The idle timeout is longer than TensorFlow's own wait at exit: both workers of a finished job
    # sat idle for over 6 s in a loaded CI run, which a 6 s timeout took for a hang.
    short = ("--startup-timeout", "120", "--hang-timeout-floor", "3", "--idle-timeout", "30")
    sup = run(tmp_path, "hang", *args, options=short, script=JOB)
    out = finish(sup, 900)
    assert sup.returncode == 0, out[-3000:]
    result = json.loads((tmp_path / "hang.json").read_text())
    assert result["attempts"] == 2
    (incident,) = result["incidents"]
    assert (incident["detected_by"], incident["action"]) == ("process_state", "restart")
    assert "every rank idle" in incident["summary"]
    steps = [line.split() for line in progress.read_text().splitlines()]
    first_pid = steps[0][2]
    resumed = next(int(step) for _, step, pid in steps if pid != first_pid)
    assert resumed > 20 and max(int(step) for _, step, _ in steps) == 80  # from the save, to the end


def test_a_stopped_worker_seen_by_tfs_coordination_service_is_blamed_not_its_survivor(tmp_path):
    # Worker 1 is SIGSTOPped in its second epoch: it stops sending TensorFlow's heartbeats, and TF's
    # coordination service ends worker 0 first ("The following tasks are unhealthy (stopped sending
    # heartbeats): /job:worker/replica:0/task:1"), well before trainguard's idle timeout. That line
    # is a consequence naming task 1: the one incident names rank 1, never rank 0's own bug.
    need_tf()
    args = ("--epochs", "4", "--step-s", "0.1", "--backup-dir", str(tmp_path / "backup"), "--save-freq", "10")
    sup = run(tmp_path, "stop", *args, options=("--idle-timeout", "120"))
    out = signal_worker_1(sup, tmp_path, "stop", "Epoch 2/", signal.SIGSTOP)
    assert sup.returncode == 0, out[-3000:]
    result = json.loads((tmp_path / "stop.json").read_text())
    (incident,) = result["incidents"]
    assert (incident["rank"], incident["gpu"], incident["action"]) == (1, 1, "restart"), incident
    assert incident["root_cause"] == "unknown", incident  # who stopped it is not in the evidence
    assert "rank 1 is stopped" in incident["summary"]
    assert result["attempts"] == 2
    assert all("done step 80" in lines(tmp_path, "stop", 1, r) for r in (0, 1))


def test_a_preemption_handlers_save_and_exit_is_a_free_restart_not_a_crash(tmp_path):
    # tests/workers/tf_preempt.py: TF's PreemptionCheckpointHandler in a custom loop, no trainguard
    # in it. A SIGTERM to worker 1 (a scheduler's preemption) makes both workers save and exit 42.
    # Declared with --preemption-exit-code, that is a preempted save: with no restart budget at all
    # (--max-restarts 0) the job still comes back, from the handler's save, and finishes.
    need_tf()
    script = WORKER.with_name("tf_preempt.py")
    options = ("--preemption-exit-code", "42", "--max-restarts", "0")
    sup = run(tmp_path, "pre", str(tmp_path / "ckpt"), options=options, script=script)
    out = signal_worker_1(sup, tmp_path, "pre", "at step 40", signal.SIGTERM)
    assert sup.returncode == 0, out[-3000:]
    result = json.loads((tmp_path / "pre.json").read_text())
    assert result["attempts"] == 2
    (incident,) = result["incidents"]
    assert (incident["category"], incident["action"]) == ("membership", "restart"), incident
    assert any("preemption handler saved" in e for e in incident["evidence"])
    for rank in (0, 1):
        again = lines(tmp_path, "pre", 1, rank)
        assert int(again.split("start step ")[1].split()[0]) >= 40, again[-500:]  # the handler's save
        assert "done step 200" in again

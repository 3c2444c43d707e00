"""An MPI job under faults: `trainguard run --launcher mpirun` against what an MPI user runs instead,
a shell retry loop around `mpirun`, on the same mpi4py job and the same faults, in interleaved rounds.

    python benchmarks/bench_mpi.py [--repeats 3] [--steps 300] [--step-time 0.1] [--seed 0] [--json]

The job is examples/mpi/train_mpi.py: 2 ranks of data-parallel SGD with mpi4py over Open MPI on
loopback, rank 0 checkpointing every 10 steps and resuming from its newest checkpoint. Both arms run
the same command line (it writes trainguard's heartbeat lines only where trainguard set
TRAINGUARD_RUN_DIR; the loop's arm has none of our code). The baseline arm is

    for i in $(seq 50); do mpirun -np 2 python train_mpi.py ... && exit 0; done; exit 1

Each round draws one fault schedule (seed --seed + round), the same for both arms: --kills SIGKILLs
of a random rank at uniform times in the first 60% of the job's work (offsets from its first step),
then one SIGSTOP of rank 1 at 75% of it (a hang: the rank freezes, its peer waits in
MPI_Allreduce). A fault that comes due while the job is restarting waits until the new attempt has
completed a step, so both arms take every fault. MPI has no hang detection: the loop's arm stays
hung until the scheduler's time limit, --cap-factor (3) x the fault-free run, an assumed input (a
real limit is hours, and so is the loss), where the harness kills it as Slurm would. trainguard's
arm runs with --hang-timeout-floor 10 (its default, 30, is sized for real jobs' step times).

ETTR = useful work / wall time, launch to exit (or to the cap): useful work = distinct steps
completed x the reference step time (the fault-free calibration run's median, the same for both
arms). ratio_vs_retry_loop is the geometric mean of the per-round ratios with its 95% interval
(benchmarks/paired.py). MTTR: a kill (or, for trainguard, the hang's SIGSTOP) to the first step of
the next attempt, per fault, both arms (the hang's is mostly the --hang-timeout-floor). Load: the
1-minute load average before and after, and the machine's cores.

Keys (--json): ratio_vs_retry_loop (target >= 1.05) with _ci95 and _repeats; ettr and
retry_loop_ettr (means, _ci95, _samples); mttr_kill_s and retry_loop_mttr_kill_s (medians over every
kill, _samples); hang_recovery_s (SIGSTOP to the next first step, trainguard), retry_loop_hang
("none: hung until the cap"); finished (trainguard's arm ended on its own, exit 0) and
retry_loop_capped; ref_step_s, fault_free_s (the loop's fault-free run: the cap's base) and
fault_free_trainguard_s (the same job under trainguard, no faults: its own cost, one run each), cap_s,
schedules, load.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from arm_procs import descendants, progress, stop, trained_since
from paired import interleave, mean_ci, missed, ratio_ci, targets_json

JOB = Path(__file__).resolve().parents[1] / "examples" / "mpi" / "train_mpi.py"
TARGETS = {"ratio_vs_retry_loop": (">=", 1.05)}
ROOT = os.geteuid() == 0


@dataclass
class Run:
    """One arm's run of one round."""

    launched: float
    ended: float = 0.0
    exit_code: int | None = None
    capped: bool = False
    final_step: int = 0
    faults: list[tuple[str, int, float]] = field(default_factory=list)  # (kind, rank, when)
    recoveries: list[tuple[str, float]] = field(default_factory=list)  # (kind, fault -> next first step)


def job_args(work: Path, steps: int, step_time: float) -> list[str]:
    return [sys.executable, str(JOB), "--steps", str(steps), "--step-time", str(step_time),
            "--checkpoint-dir", str(work / "ckpt"), "--checkpoint-every", "10", "--heartbeats",
            "--progress", str(work / "progress")]  # fmt: skip


def mpirun_options() -> list[str]:
    return ["--oversubscribe", *(["--allow-run-as-root"] if ROOT else [])]


def launch(kind: str, work: Path, steps: int, step_time: float) -> subprocess.Popen[bytes]:
    job = job_args(work, steps, step_time)
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
    env.pop("TRAINGUARD_RUN_DIR", None)
    if kind == "trainguard":
        cmd = [sys.executable, "-m", "trainguard.cli", "run", "--launcher", "mpirun", "-np", "2",
               *mpirun_options(), "--no-tee", "--max-restarts", "50", "--hang-timeout-floor", "10",
               "--db", str(work / "tg.db"), "--runs-dir", str(work / "runs"), "--job-id", "bench",
               "--", *job]  # fmt: skip
    else:
        mpirun = " ".join(["mpirun", "-np", "2", *mpirun_options(), *job])
        cmd = ["sh", "-c", f"for i in $(seq 50); do {mpirun} && exit 0; done; exit 1"]
    log = open(work / f"{kind}.log", "w")  # noqa: SIM115
    return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)


def rank_pid(root: int, rank: int) -> int | None:
    """The job's process of ``rank`` (the python running train_mpi.py, whoever started it)."""
    for pid in descendants(root):
        with contextlib.suppress(OSError):
            if JOB.name not in Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace"):
                continue
            env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
            if (
                f"OMPI_COMM_WORLD_RANK={rank}".encode() in env
                and b"trainguard.mpi.rank" not in Path(f"/proc/{pid}/cmdline").read_bytes()
            ):
                return pid
    return None


def run_arm(kind: str, work: Path, args: argparse.Namespace, schedule: list[tuple[str, int, float]],
            cap_s: float) -> Run:  # fmt: skip
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    proc = launch(kind, work, args.steps, args.step_time)
    run = Run(launched=time.time())
    pending = list(schedule)
    first_step: float | None = None
    last_fault = 0.0
    try:
        while proc.poll() is None:
            now = time.time()
            if now - run.launched > cap_s:
                run.capped = True
                break
            if first_step is None:
                steps = progress(work)
                first_step = steps[0][0] if steps else None
            if first_step is not None and pending:
                what, rank, offset = pending[0]
                due = now - first_step >= offset and (last_fault == 0.0 or trained_since(work, last_fault))
                pid = rank_pid(proc.pid, rank) if due else None
                if pid is not None:
                    os.kill(pid, signal.SIGKILL if what == "kill" else signal.SIGSTOP)
                    last_fault = time.time()
                    run.faults.append((what, rank, last_fault))
                    pending.pop(0)
            time.sleep(0.05)
        run.ended = time.time()  # the job's exit, or the cap
    finally:
        stop(proc)
    run.exit_code = proc.returncode
    steps = progress(work)
    run.final_step = max((s for _, s, _ in steps), default=0)
    for what, _rank, when in run.faults:
        later = [t for t, _, pid in steps if t > when and pid not in {p for t2, _, p in steps if t2 <= when}]
        if later:
            run.recoveries.append((what, min(later) - when))
    return run


def schedule_for(seed: int, kills: int, work_s: float) -> list[tuple[str, int, float]]:
    """``kills`` SIGKILLs of a random rank at uniform times in the first 60% of the job's work,
    then a SIGSTOP of rank 1 at 75% of it (offsets from the first step)."""
    rng = random.Random(seed)
    times = sorted(rng.uniform(2.0, 0.6 * work_s) for _ in range(kills))
    return [*(("kill", rng.randrange(2), round(t, 2)) for t in times), ("stop", 1, round(0.75 * work_s, 2))]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--step-time", type=float, default=0.1)
    p.add_argument("--kills", type=int, default=2)
    p.add_argument("--cap-factor", type=float, default=3.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    if shutil.which("mpirun") is None:
        print(
            "bench_mpi: needs Open MPI's mpirun (apt-get install openmpi-bin libopenmpi-dev)", file=sys.stderr
        )
        return 2
    load_before = os.getloadavg()[0]
    base = Path(tempfile.mkdtemp(prefix="bench-mpi-"))
    try:
        calib = run_arm("retry_loop", base / "calib", args, [], cap_s=3600)
        steps = progress(base / "calib")
        gaps = [b[0] - a[0] for a, b in itertools.pairwise(steps)]
        ref_step = statistics.median(gaps)
        fault_free = calib.ended - calib.launched
        ours_free = run_arm("trainguard", base / "calib-tg", args, [], cap_s=3600)  # trainguard's own cost
        cap_s = args.cap_factor * fault_free
        schedules = [schedule_for(args.seed + i, args.kills, args.steps * args.step_time)
                     for i in range(args.repeats)]  # fmt: skip

        def arm(kind: str) -> Callable[[int], Run]:
            return lambda i: run_arm(kind, base / f"{kind}{i}", args, schedules[i], cap_s)

        ours, theirs = interleave(args.repeats, arm("trainguard"), arm("retry_loop"))
    finally:
        shutil.rmtree(base, ignore_errors=True)
    load_after = os.getloadavg()[0]

    def ettr(r: Run) -> float:
        return r.final_step * ref_step / max(1e-9, r.ended - r.launched)

    a = [ettr(r) for r in ours]
    b = [ettr(r) for r in theirs]
    out: dict[str, object] = {}
    out.update(ratio_ci(a, b).as_json("ratio_vs_retry_loop"))
    out.update(mean_ci(a).as_json("ettr"))
    out.update(mean_ci(b).as_json("retry_loop_ettr"))
    out["ettr_samples"], out["retry_loop_ettr_samples"] = [round(x, 4) for x in a], [round(x, 4) for x in b]
    for key, runs in (("mttr_kill_s", ours), ("retry_loop_mttr_kill_s", theirs)):
        kills = [round(s, 3) for r in runs for what, s in r.recoveries if what == "kill"]
        out[key] = statistics.median(kills) if kills else None
        out[f"{key}_samples"] = kills
    hangs = [round(s, 3) for r in ours for what, s in r.recoveries if what == "stop"]
    out["hang_recovery_s"] = statistics.median(hangs) if hangs else None
    out["hang_recovery_s_samples"] = hangs
    out["retry_loop_hang"] = (
        "none: hung until the cap" if all(r.capped for r in theirs) else "some loop runs ended before the cap"
    )
    out["finished"] = [r.exit_code == 0 for r in ours]
    out["retry_loop_capped"] = [r.capped for r in theirs]
    out["fault_free_trainguard_s"] = round(ours_free.ended - ours_free.launched, 2)
    out.update(ref_step_s=round(ref_step, 4), fault_free_s=round(fault_free, 2), cap_s=round(cap_s, 2),
               schedules=schedules, load={"before": load_before, "after": load_after, "cores": os.cpu_count()},
               targets=targets_json(TARGETS))  # fmt: skip
    lines = missed(out, TARGETS)
    print(json.dumps(out, indent=None if args.json else 1))
    for line in lines:
        print(f"bench_mpi: {line}", file=sys.stderr)
    return 1 if lines else 0


if __name__ == "__main__":
    sys.exit(main())

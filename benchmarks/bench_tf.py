"""A two-worker TensorFlow job under faults: `trainguard run --framework tf` against what a TF user
runs instead, BackupAndRestore in the script and a shell retry loop per worker, on the same job and
the same faults, in interleaved rounds.

    python benchmarks/bench_tf.py [--repeats 3] [--epochs 4] [--steps-per-epoch 50] [--step-s 0.1]
                                  [--collective-timeout 60] [--seed 0] [--json]

The job is benchmarks/tf_job.py: two workers of a tf_keras model on MultiWorkerMirroredStrategy on
loopback, saving every 20 steps. The baseline arm has none of our code: each worker in its own loop,

    export TF_CONFIG='{... "task": {"type": "worker", "index": R}}'
    until python tf_job.py --backup-dir B --collective-timeout T ...; do :; done

(the two loops in one shell that waits for both), TensorFlow's ``BackupAndRestore`` resuming it.
trainguard's arm runs ``trainguard run --framework tf --nproc-per-node 2 --hang-timeout-floor 10
-- python tf_job.py --trainguard --collective-timeout T ...`` (the Guard: checkpoints at the same
steps, heartbeats). Both arms have TF's collective timeout T.

Each round draws one fault schedule (seed --seed + round), the same for both arms: --kills SIGKILLs
of a random worker at uniform times in the first 60% of the job's work (offsets from its first
step; one comes due only after the job trained again since the last), and one hang: worker 1
stops in its own code at 75% of the steps (tf_job.py's ``--hang-at-step``, once; the process stays
alive). A job the hang is not ended in runs until an assumed scheduler limit, --cap-factor (6) x
the loop's fault-free run, where the harness kills it as Slurm would (a real limit is hours; 6, not
bench_mpi's 3, because every TensorFlow start costs its import and cluster set-up, ~45 s on a loaded
2-core machine, and at 3x a short job that restarts twice under trainguard met the cap too); ``retry_loop_hang`` says
which ended the loop's hang (TF's collective timeout and the loop, or the cap).

ETTR = useful work / wall time, launch to exit (or to the cap): useful work = distinct steps x the
reference step time (the fault-free calibration run's median). ratio_vs_retry_loop is the geometric
mean of the per-round ratios with its 95% interval (benchmarks/paired.py). mttr_s: a kill to the
first step of a process started after it, per kill, both arms. hang_detect_s: the hang to the end
of the hung worker's process (trainguard stops it on detection; in the loop only its own death
ends it), both arms. Load: the 1-minute load average before and after, and the machine's cores.

Keys (--json): ratio_vs_retry_loop (target >= 1.05) with _ci95 and _repeats; ettr_tf and
ettr_retry_loop (means, _ci95, _samples); mttr_s and retry_loop_mttr_s (medians, _samples);
hang_detect_s and retry_loop_hang_detect_s (medians, _samples; None where the hang lasted to the
cap); retry_loop_hang; finished (trainguard's arm exit 0) and retry_loop_capped; ref_step_s,
fault_free_s, fault_free_tf_s (trainguard's arm, no faults, one run), cap_s, schedules, load.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import os
import random
import shlex
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

from arm_procs import descendants, free_ports, progress, stop, trained_since
from paired import interleave, mean_ci, ratio_ci
from targets import Target, finish

JOB = Path(__file__).resolve().with_name("tf_job.py")
TARGETS = (Target("ratio_vs_retry_loop", ">=", 1.05),)


@dataclass
class Run:
    """One arm's run of one round."""

    launched: float
    ended: float = 0.0
    exit_code: int | None = None
    capped: bool = False
    final_step: int = 0
    faults: list[tuple[str, int, float]] = field(default_factory=list)  # (kind, rank, when)
    recoveries: list[float] = field(default_factory=list)  # a kill -> the next new process's first step
    hang_detect: float | None = None  # the hang -> the hung process gone


def job_args(work: Path, args: argparse.Namespace, hang_at: int) -> list[str]:
    return [sys.executable, str(JOB), "--epochs", str(args.epochs), "--steps-per-epoch",
            str(args.steps_per_epoch), "--step-s", str(args.step_s), "--save-every", "20",
            "--collective-timeout", str(args.collective_timeout), "--hang-at-step", str(hang_at),
            "--hang-rank", "1", "--hang-marker", str(work / "hung"), "--progress", str(work / "progress")]  # fmt: skip


def launch(kind: str, work: Path, args: argparse.Namespace, hang_at: int) -> subprocess.Popen[bytes]:
    job = job_args(work, args, hang_at)
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    for name in ("TRAINGUARD_RUN_DIR", "TF_CONFIG"):
        env.pop(name, None)
    if kind == "tf":
        cmd = [sys.executable, "-m", "trainguard.cli", "run", "--framework", "tf", "--nproc-per-node", "2",
               "--no-tee", "--max-restarts", "50", "--hang-timeout-floor", "10", "--db", str(work / "tg.db"),
               "--runs-dir", str(work / "runs"), "--job-id", "bench", "--",
               *job, "--trainguard", "--checkpoint-dir", str(work / "ckpt")]  # fmt: skip
    else:
        ports = free_ports(2)
        cluster = {"worker": [f"127.0.0.1:{p}" for p in ports]}
        loops = []
        for rank in range(2):
            config = json.dumps({"cluster": cluster, "task": {"type": "worker", "index": rank}})
            line = shlex.join([*job, "--backup-dir", str(work / "backup")])
            loops.append(f"(export TF_CONFIG={shlex.quote(config)}; until {line}; do :; done) &")
        cmd = ["sh", "-c", " ".join(loops) + " wait"]
    log = open(work / f"{kind}.log", "w")  # noqa: SIM115
    return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)


def worker_pid(root: int, rank: int) -> int | None:
    """The python running tf_job.py as worker ``rank`` (its TF_CONFIG's task), whoever started it."""
    for pid in descendants(root):
        with contextlib.suppress(OSError, ValueError, KeyError):
            if JOB.name not in Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace"):
                continue
            env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
            config = next((v[len(b"TF_CONFIG=") :] for v in env if v.startswith(b"TF_CONFIG=")), None)
            if config is not None and json.loads(config)["task"]["index"] == rank:
                return pid
    return None


def alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def run_arm(kind: str, work: Path, args: argparse.Namespace, schedule: list[tuple[int, float]], hang_at: int,
            cap_s: float) -> Run:  # fmt: skip
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    proc = launch(kind, work, args, hang_at)
    run = Run(launched=time.time())
    pending = list(schedule)
    first_step: float | None = None
    last_kill = 0.0
    hung: tuple[int, float] | None = None  # (pid, when)
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
                rank, offset = pending[0]
                due = now - first_step >= offset and (last_kill == 0.0 or trained_since(work, last_kill))
                pid = worker_pid(proc.pid, rank) if due else None
                if pid is not None:
                    os.kill(pid, signal.SIGKILL)
                    last_kill = time.time()
                    run.faults.append(("kill", rank, last_kill))
                    pending.pop(0)
            if hung is None and (work / "hung").exists():
                pid = worker_pid(proc.pid, 1)
                with contextlib.suppress(OSError, ValueError):
                    when = float((work / "hung").read_text())
                    if pid is not None:
                        hung = (pid, when)
                        run.faults.append(("hang", 1, when))
            if hung is not None and run.hang_detect is None and not alive(hung[0]):
                run.hang_detect = time.time() - hung[1]
            time.sleep(0.05)
        run.ended = time.time()  # the job's exit, or the cap
    finally:
        stop(proc)
    run.exit_code = proc.returncode
    steps = progress(work)
    run.final_step = max((s for _, s, _ in steps), default=0)
    for what, _rank, when in run.faults:
        before = {pid for t, _, pid in steps if t <= when}
        later = [t for t, _, pid in steps if t > when and pid not in before]
        if what == "kill" and later:
            run.recoveries.append(min(later) - when)
    return run


def schedule_for(seed: int, kills: int, work_s: float) -> list[tuple[int, float]]:
    """``kills`` SIGKILLs of a random worker at uniform times in the first 60% of the job's work."""
    rng = random.Random(seed)
    times = sorted(rng.uniform(2.0, 0.6 * work_s) for _ in range(kills))
    return [(rng.randrange(2), round(t, 2)) for t in times]


def median(values: list[float]) -> float | None:
    return round(statistics.median(values), 3) if values else None


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--epochs", type=int, default=4)
    p.add_argument("--steps-per-epoch", type=int, default=50)
    p.add_argument("--step-s", type=float, default=0.1)
    p.add_argument("--kills", type=int, default=2)
    p.add_argument("--collective-timeout", type=float, default=60.0)
    p.add_argument("--cap-factor", type=float, default=6.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    steps_total = args.epochs * args.steps_per_epoch
    hang_at = int(0.75 * steps_total)
    load_before = os.getloadavg()[0]
    base = Path(tempfile.mkdtemp(prefix="bench-tf-"))
    try:
        calib = run_arm("retry_loop", base / "calib", args, [], -1, cap_s=3600)
        gaps = [b[0] - a[0] for a, b in itertools.pairwise(progress(base / "calib"))]
        ref_step = statistics.median(gaps)
        fault_free = calib.ended - calib.launched
        ours_free = run_arm("tf", base / "calib-tg", args, [], -1, cap_s=3600)
        cap_s = args.cap_factor * fault_free
        schedules = [
            schedule_for(args.seed + i, args.kills, steps_total * ref_step) for i in range(args.repeats)
        ]

        def arm(kind: str) -> Callable[[int], Run]:
            return lambda i: run_arm(kind, base / f"{kind}{i}", args, schedules[i], hang_at, cap_s)

        ours, theirs = interleave(args.repeats, arm("tf"), arm("retry_loop"))
    finally:
        shutil.rmtree(base, ignore_errors=True)
    load_after = os.getloadavg()[0]

    def ettr(r: Run) -> float:
        return r.final_step * ref_step / max(1e-9, r.ended - r.launched)

    a, b = [ettr(r) for r in ours], [ettr(r) for r in theirs]
    out: dict[str, object] = {}
    out.update(ratio_ci(a, b).as_json("ratio_vs_retry_loop"))
    out.update(mean_ci(a).as_json("ettr_tf"))
    out.update(mean_ci(b).as_json("ettr_retry_loop"))
    out["ettr_tf_samples"], out["ettr_retry_loop_samples"] = (
        [round(x, 4) for x in a],
        [round(x, 4) for x in b],
    )
    for key, runs in (("mttr_s", ours), ("retry_loop_mttr_s", theirs)):
        samples = [round(s, 3) for r in runs for s in r.recoveries]
        out[key], out[f"{key}_samples"] = median(samples), samples
    for key, runs in (("hang_detect_s", ours), ("retry_loop_hang_detect_s", theirs)):
        samples = [round(r.hang_detect, 3) for r in runs if r.hang_detect is not None]
        out[key], out[f"{key}_samples"] = median(samples), samples
    ended = [r.hang_detect is not None and not r.capped for r in theirs]
    out["retry_loop_hang"] = (
        "ended by TF's collective timeout and the loop" if all(ended)
        else "none ended: hung until the cap (an assumed scheduler limit)" if not any(ended)
        else f"{sum(ended)} of {len(ended)} ended before the cap"
    )  # fmt: skip
    out["finished"] = [r.exit_code == 0 for r in ours]
    out["retry_loop_capped"] = [r.capped for r in theirs]
    out["final_steps"] = {"tf": [r.final_step for r in ours], "retry_loop": [r.final_step for r in theirs]}
    out.update(ref_step_s=round(ref_step, 4), fault_free_s=round(fault_free, 2),
               fault_free_tf_s=round(ours_free.ended - ours_free.launched, 2), cap_s=round(cap_s, 2),
               steps=steps_total, hang_at_step=hang_at, collective_timeout_s=args.collective_timeout,
               schedules=schedules, load={"before": load_before, "after": load_after, "cores": os.cpu_count()})  # fmt: skip
    print(json.dumps(out, indent=None if args.json else 1))
    return finish("bench_tf", TARGETS, out, json_mode=args.json)


if __name__ == "__main__":
    sys.exit(main())

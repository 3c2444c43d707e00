"""Effective training time ratio (ETTR) under faults: `trainguard run` against `torchrun
--max-restarts` (same worker, same seeded fault times), and against the Young/Daly optimum.

    python benchmarks/bench_ettr.py [--minutes 3] [--mtbf-s 20] [--seed 0] [--json]

The job is benchmarks/ddp_worker.py: 2-rank DDP over gloo checkpointing with trainguard's
``Checkpointer``. It runs for --minutes under each launcher in turn while this script SIGKILLs
a rank at exponentially distributed times (mean --mtbf-s: a Poisson fault process, the same
seeded times and ranks for both). A fault that comes due while the job is restarting waits
until the new attempt has completed a step, so both launchers take every fault and each fault
costs one restart. The job checkpoints every
round(tau / step time) steps, tau the Young/Daly interval for the checkpoint stall C measured in
a fault-free calibration run: tau = sqrt(2 * C * MTBF).

Measured ETTR = useful work / wall time = (distinct steps completed x the run's own median step
time) / wall time (start-up, every recovery, recomputation and checkpoint stalls count against
it). Restart cost R = kill to the first step of the new workers (median), measured the same way
for both launchers. The model (Young/Daly, first order):

    ETTR_opt = 1 - C / tau_opt - (tau_opt / 2 + R) / MTBF,   tau_opt = sqrt(2 * C * MTBF)

Keys (--json): ettr, torchrun_ettr, ratio_vs_torchrun (target >= 1.05 at a fault every 20 s),
ettr_optimal and ratio (with trainguard's R), ettr_optimal_torchrun_r and ratio_torchrun_r (the
same model with torchrun's measured R), plus C, both R, tau, faults, ledger_ettr (trainguard's
own goodput ledger of its run).
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import math
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from targets import Target, finish

TARGETS = (Target("ratio_vs_torchrun", ">=", 1.05),)

WORKER = Path(__file__).with_name("ddp_worker.py")


def launch(kind: str, work: Path, every: int, sleep: float) -> subprocess.Popen[bytes]:
    wargs = [str(WORKER), str(work), "--every", str(every), "--sleep", str(sleep)]
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
    if kind == "trainguard":
        cmd = [sys.executable, "-m", "trainguard.cli", "run", "--standalone", "--nproc-per-node", "2",
               "--no-tee", "--max-restarts", "1000", "--db", str(work / "tg.db"), "--runs-dir",
               str(work / "runs"), "--job-id", "ettr", "--json", str(work / "result.json"),
               "--", sys.executable, *wargs]  # fmt: skip
    else:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
               "--max-restarts", "1000", *wargs]  # fmt: skip
        # torchrun shares its rendezvous TCPStore with the workers; a restarted rank can then read
        # the dead attempt's gloo address and time out. torch's own opt-out, as in bench_recovery.
        env["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] = "1"
    log = open(work / f"{kind}.log", "w")  # noqa: SIM115
    return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)


def stop(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM (the launcher stops its workers and writes its result), then SIGKILL the group."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(proc.pid, signal.SIGTERM)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(60)
    with contextlib.suppress(ProcessLookupError):  # whatever of the job is left
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def progress(work: Path) -> list[tuple[float, int, int]]:
    """(time, step, pid) of every step rank 0 completed."""
    try:
        lines = (work / "progress").read_text().splitlines()
    except OSError:
        return []
    out = []
    for line in lines:
        parts = line.split()
        if len(parts) == 3:
            out.append((float(parts[0]), int(parts[1]), int(parts[2])))
    return out


def worker_pid(work: Path, rank: int) -> int | None:
    """The live worker process of ``rank``, or None (between attempts)."""
    # Not by command line: under `trainguard run` a warm standby (a pre-started interpreter)
    # becomes the worker, and its command line is the standby's.
    try:
        pid = int((work / f"pid{rank}").read_text())
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, ValueError, IndexError):
        return None
    return pid if state not in ("Z", "X") else None


def training(work: Path) -> bool:
    """Has the current attempt completed a step (rank 0's last step is by its current pid)?"""
    try:
        pid0 = int((work / "pid0").read_text())
        with open(work / "progress", "rb") as f:
            f.seek(max(0, f.seek(0, os.SEEK_END) - 200))
            last = f.read().splitlines()[-1].split()
    except (OSError, ValueError, IndexError):
        return False
    return len(last) == 3 and int(last[2]) == pid0


@dataclass(frozen=True, slots=True)
class Run:
    wall_s: float
    distinct_steps: int
    step_s: float
    kills: tuple[float, ...]
    restart_s: tuple[float, ...]
    ledger_ettr: float | None

    @property
    def ettr(self) -> float:
        return self.distinct_steps * self.step_s / self.wall_s


def run_with_faults(
    kind: str, seconds: float, every: int, sleep: float, faults: list[tuple[float, int]]
) -> Run:
    work = Path(tempfile.mkdtemp(prefix=f"bench-ettr-{kind}-"))
    try:
        started = time.time()
        proc = launch(kind, work, every, sleep)
        kills: list[float] = []
        pending = list(faults)
        while time.time() < started + seconds:
            if pending and time.time() >= started + pending[0][0]:
                pid = worker_pid(work, pending[0][1])
                if pid is not None and training(work):
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)
                        kills.append(time.time())
                    pending.pop(0)
            time.sleep(0.02)
        ended = time.time()
        stop(proc)
        steps = [p for p in progress(work) if p[0] <= ended]
        ledger = None
        with contextlib.suppress(OSError, ValueError):
            result = json.loads((work / "result.json").read_text())
            ledger = float(result.get("goodput", {}).get("ettr", 0.0))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    gaps = [b[0] - a[0] for a, b in itertools.pairwise(steps) if b[1] == a[1] + 1 and b[2] == a[2]]
    restarts = []
    for t in kills:
        before = [p for p in steps if p[0] < t]
        after = [p for p in steps if p[0] > t and (not before or p[2] != before[-1][2])]
        if after:
            restarts.append(after[0][0] - t)
    return Run(
        wall_s=ended - started,
        distinct_steps=len({s for _, s, _ in steps}),
        step_s=statistics.median(gaps) if gaps else math.nan,
        kills=tuple(kills),
        restart_s=tuple(restarts),
        ledger_ettr=ledger,
    )


def fault_times(seconds: float, mtbf: float, rng: random.Random) -> list[tuple[float, int]]:
    t, out = 0.0, []
    while True:
        t += rng.expovariate(1.0 / mtbf)
        if t >= seconds - 5:
            return out
        out.append((t, rng.randrange(2)))


def calibrate(sleep: float, timeout: float = 240.0) -> tuple[float, float]:
    """Fault-free under torchrun: the step time and the checkpoint stall C (medians), once the
    job has taken 200 steps and 5 checkpoints (start-up on a busy host varies)."""
    work = Path(tempfile.mkdtemp(prefix="bench-ettr-cal-"))
    try:
        proc = launch("torchrun", work, every=20, sleep=sleep)
        deadline = time.time() + timeout
        ckpts: list[float] = []
        while time.time() < deadline:
            time.sleep(1.0)
            with contextlib.suppress(OSError, ValueError):
                ckpts = [float(x) for x in (work / "ckpt_times").read_text().split()]
            if len(ckpts) >= 5 and len(progress(work)) >= 200:
                break
        stop(proc)
        steps = progress(work)
        gaps = [b[0] - a[0] for a, b in itertools.pairwise(steps) if b[1] == a[1] + 1]
        if not ckpts or not gaps:
            raise RuntimeError(f"calibration run did not train within {timeout}s")
        return statistics.median(gaps[len(gaps) // 4 :]), statistics.median(ckpts)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def young_daly(c: float, tau: float, r: float, mtbf: float) -> float:
    return 1 - c / tau - (tau / 2 + r) / mtbf


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--minutes", type=float, default=3.0, help="per launcher")
    p.add_argument("--mtbf-s", type=float, default=20.0)
    p.add_argument("--step-sleep", type=float, default=0.02)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    seconds, mtbf = args.minutes * 60, args.mtbf_s
    step_s, c = calibrate(args.step_sleep)
    c = max(c, 1e-4)  # a stall below the clock's resolution would make tau 0
    tau = math.sqrt(2 * c * mtbf)
    every = max(1, round(tau / step_s))
    faults = fault_times(seconds, mtbf, random.Random(args.seed))
    ours = run_with_faults("trainguard", seconds, every, args.step_sleep, faults)
    theirs = run_with_faults("torchrun", seconds, every, args.step_sleep, faults)
    # No recovery at all (every restart cut short by the next fault): the run's length stands in.
    r_ours = statistics.median(ours.restart_s) if ours.restart_s else seconds
    r_theirs = statistics.median(theirs.restart_s) if theirs.restart_s else seconds
    opt, opt_tr = young_daly(c, tau, r_ours, mtbf), young_daly(c, tau, r_theirs, mtbf)
    out = {
        "ettr": round(ours.ettr, 4),
        "torchrun_ettr": round(theirs.ettr, 4),
        "ratio_vs_torchrun": round(ours.ettr / theirs.ettr, 4) if theirs.ettr > 0 else None,
        "steps_ratio_vs_torchrun": round(ours.distinct_steps / max(1, theirs.distinct_steps), 4),
        "ettr_optimal": round(opt, 4),
        "ratio": round(ours.ettr / opt, 4) if opt > 0 else None,
        "ettr_optimal_torchrun_r": round(opt_tr, 4),
        "ratio_torchrun_r": round(ours.ettr / opt_tr, 4) if opt_tr > 0 else None,
        "torchrun_ratio": round(theirs.ettr / opt_tr, 4) if opt_tr > 0 else None,
        "checkpoint_cost_s": round(c, 4),
        "restart_cost_s": round(r_ours, 3),
        "torchrun_restart_cost_s": round(r_theirs, 3),
        "tau_s": round(tau, 3),
        "checkpoint_every_steps": every,
        "mtbf_s": mtbf,
        "faults": len(faults),
        "kills": len(ours.kills),
        "recoveries": len(ours.restart_s),
        "torchrun_recoveries": len(theirs.restart_s),
        "torchrun_kills": len(theirs.kills),
        "wall_s": round(ours.wall_s, 1),
        "step_s": round(ours.step_s, 4),
        "torchrun_step_s": round(theirs.step_s, 4),
        "calibration_step_s": round(step_s, 4),
        "distinct_steps": ours.distinct_steps,
        "torchrun_distinct_steps": theirs.distinct_steps,
        "ledger_ettr": ours.ledger_ettr,
        "restart_samples_s": [round(r, 2) for r in ours.restart_s],
        "torchrun_restart_samples_s": [round(r, 2) for r in theirs.restart_s],
    }
    if args.json:
        print(json.dumps(out))
        return finish("bench_ettr", TARGETS, out, json_mode=True)
    print(
        f"{seconds / 60:.1f} min per launcher, {len(faults)} SIGKILLs (MTBF {mtbf:.0f} s, seed {args.seed})"
    )
    print(f"  checkpoint stall C = {c * 1000:.1f} ms, a checkpoint every {every} steps ({tau:.2f} s)")
    for name, run, r in (("trainguard run", ours, r_ours), ("torchrun", theirs, r_theirs)):
        print(
            f"  {name:15s} ETTR {run.ettr:.3f}  restart cost R {r:.2f} s (median of {len(run.restart_s)}), "
            f"{run.distinct_steps} steps, {len(run.kills)} kills"
        )
    print(f"  ratio_vs_torchrun {out['ratio_vs_torchrun']} (target >= 1.05)")
    print(f"  Young/Daly optimum with our R {opt:.3f} (ratio {out['ratio']}), with torchrun's R {opt_tr:.3f}")
    print(f"  trainguard's own ledger says ETTR {ours.ledger_ettr}")
    return finish("bench_ettr", TARGETS, out)


if __name__ == "__main__":
    sys.exit(main())

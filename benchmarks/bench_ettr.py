"""Effective training time ratio (ETTR) under faults, against the Young/Daly optimum.

    python benchmarks/bench_ettr.py [--minutes 10] [--mtbf-s 60] [--seed 0] [--json]

A 2-rank DDP job over gloo runs under `trainguard run` (warm standby on) for --minutes while a
chaos plan SIGKILLs a random rank at exponentially distributed times (mean --mtbf-s: a Poisson
fault process). The job checkpoints every round(tau / step time) steps (model + optimizer,
torch.save + fsync, then a barrier),
with tau the Young/Daly interval for the checkpoint cost C measured in a calibration run and the
fault rate: tau = sqrt(2 * C * MTBF).

Measured ETTR = useful work / wall time = (distinct steps completed x the run's own median step
time) / wall time of the whole run (start-up, every recovery, recomputation and checkpoint stalls count
against it). The model (Young/Daly first-order) for the measured costs:

    ETTR_opt = 1 - C / tau_opt - (tau_opt / 2 + R) / MTBF,   tau_opt = sqrt(2 * C * MTBF)

with C the measured checkpoint stall, R the measured restart cost (failure to first step after
restart, median over the run's recoveries) and MTBF the injected mean time between failures.
Keys (--json): ettr, ettr_optimal, ratio (ettr / ettr_optimal), plus C, R, tau, faults, ledger_ettr
(trainguard's own goodput ledger for the same run).
"""

from __future__ import annotations

import argparse
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
from pathlib import Path

WORKER = r"""
import os, sys, time
from pathlib import Path
import torch, torch.distributed as dist
from trainguard import rundir

work = Path(sys.argv[1]); every = int(sys.argv[2]); sleep = float(sys.argv[3]); max_steps = int(sys.argv[4])
dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Sequential(
    torch.nn.Linear(256, 256), torch.nn.ReLU(), torch.nn.Linear(256, 256), torch.nn.ReLU(), torch.nn.Linear(256, 1)))
opt = torch.optim.Adam(model.parameters(), lr=1e-3)
ck = work / "ckpt.pt"
start = 0
if ck.exists():
    blob = torch.load(ck, weights_only=False)
    model.module.load_state_dict(blob["model"]); opt.load_state_dict(blob["opt"]); start = blob["step"]
run_dir = rundir.run_dir_from_env()
hb = rundir.HeartbeatWriter(run_dir, rank, int(os.environ.get("TRAINGUARD_ATTEMPT", "0"))) if run_dir else None
last = time.time()
for step in range(start, max_steps):
    loss = model(torch.randn(64, 256)).pow(2).mean()
    loss.backward(); opt.step(); opt.zero_grad()
    time.sleep(sleep)
    now = time.time()
    if hb: hb.beat(step, float(loss), now - last)
    last = now
    if rank == 0:
        with open(work / "progress", "a") as f:
            f.write(f"{now} {step}\n")
    if (step + 1) % every == 0:  # by step, so every rank enters the barrier at the same step
        t0 = time.time()
        if rank == 0:
            tmp = work / "ckpt.tmp"
            with open(tmp, "wb") as f:
                torch.save({"model": model.module.state_dict(), "opt": opt.state_dict(), "step": step + 1}, f)
                f.flush(); os.fsync(f.fileno())
            os.replace(tmp, ck)
        dist.barrier()
        last = time.time()
        if rank == 0:
            with open(work / "ckpt_times", "a") as f:
                f.write(f"{last - t0}\n")
dist.destroy_process_group()
"""


def run_job(work: Path, every: int, sleep: float, plan: str | None) -> subprocess.Popen:
    (work / "worker.py").write_text(WORKER)
    cmd = [sys.executable, "-m", "trainguard.cli", "run", "--standalone", "--nproc-per-node", "2",
           "--no-tee", "--max-restarts", "1000", "--db", str(work / "tg.db"), "--runs-dir", str(work / "runs"),
           "--job-id", "ettr", "--json", str(work / "result.json")]  # fmt: skip
    if plan is not None:
        (work / "plan.toml").write_text(plan)
        cmd += ["--chaos", str(work / "plan.toml")]
    cmd += ["--", sys.executable, str(work / "worker.py"), str(work), str(every), str(sleep), "100000000"]
    log = open(work / "run.log", "w")  # noqa: SIM115
    return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)


def finish(proc: subprocess.Popen, seconds: float, started: float) -> float:
    time.sleep(max(0.0, started + seconds - time.time()))
    ended = time.time()
    os.kill(proc.pid, signal.SIGTERM)  # the supervisor stops its workers and writes its result
    try:
        proc.wait(60)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
    return ended


def progress(work: Path) -> list[tuple[float, int]]:
    out = []
    for line in (work / "progress").read_text().splitlines() if (work / "progress").exists() else []:
        parts = line.split()
        if len(parts) >= 2:
            out.append((float(parts[0]), int(parts[1])))
    return out


def fault_plan(seconds: float, mtbf: float, rng: random.Random) -> tuple[str, int]:
    t, lines, n = 0.0, [], 0
    while True:
        t += rng.expovariate(1.0 / mtbf)
        if t >= seconds - 5:
            break
        n += 1
        lines.append(f'[[fault]]\nkind = "kill"\nrank = {rng.randrange(2)}\nat_s = {t:.2f}\n')
    return "\n".join(lines), n


def calibrate(sleep: float, timeout: float = 240.0) -> tuple[float, float]:
    """Fault-free: the step time (median) and the checkpoint stall C (median), measured once
    the job has taken 200 steps and 5 checkpoints (start-up time on a busy host varies)."""
    work = Path(tempfile.mkdtemp(prefix="bench-ettr-cal-"))
    try:
        proc = run_job(work, every=20, sleep=sleep, plan=None)
        deadline = time.time() + timeout
        ckpts: list[float] = []
        while time.time() < deadline:
            time.sleep(1.0)
            try:
                ckpts = [float(x) for x in (work / "ckpt_times").read_text().split()]
            except OSError:
                continue
            if len(ckpts) >= 5 and len(progress(work)) >= 200:
                break
        finish(proc, 0, time.time())
        steps = progress(work)
        gaps = [b[0] - a[0] for a, b in itertools.pairwise(steps) if b[1] == a[1] + 1]
        if not ckpts or not gaps:
            raise RuntimeError(f"calibration run did not train within {timeout}s")
        return statistics.median(gaps[len(gaps) // 4 :]), statistics.median(ckpts)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--minutes", type=float, default=10.0)
    p.add_argument("--mtbf-s", type=float, default=60.0)
    p.add_argument("--step-sleep", type=float, default=0.02)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    seconds, mtbf = args.minutes * 60, args.mtbf_s
    step_s, c = calibrate(args.step_sleep)
    tau = math.sqrt(2 * c * mtbf)
    plan, n_faults = fault_plan(seconds, mtbf, random.Random(args.seed))
    work = Path(tempfile.mkdtemp(prefix="bench-ettr-"))
    try:
        started = time.time()
        every = max(1, round(tau / step_s))
        proc = run_job(work, every, args.step_sleep, plan)
        ended = finish(proc, seconds, started)
        steps = [(t, s) for t, s in progress(work) if t <= ended]
        distinct = len({s for _, s in steps})
        # The run's own fault-free pace: consecutive steps of one attempt (a shared, busy host
        # runs at a different speed than during calibration).
        gaps = [b[0] - a[0] for a, b in itertools.pairwise(steps) if b[1] == a[1] + 1]
        run_step_s = statistics.median(gaps)
        result = json.loads((work / "result.json").read_text())
        recoveries = [r["mttr_s"] for r in result.get("recoveries", [])]
        kinds = [f"{i['category']}: {i['summary'][:60]}" for i in result.get("incidents", [])]
    finally:
        shutil.rmtree(work, ignore_errors=True)
    wall = ended - started
    ettr = distinct * run_step_s / wall
    r_cost = statistics.median(recoveries) if recoveries else 0.0
    ettr_opt = 1 - c / tau - (tau / 2 + r_cost) / mtbf
    out = {
        "ettr": round(ettr, 4),
        "ettr_optimal": round(ettr_opt, 4),
        "ratio": round(ettr / ettr_opt, 4),
        "checkpoint_cost_s": round(c, 4),
        "restart_cost_s": round(r_cost, 3),
        "tau_s": round(tau, 3),
        "mtbf_s": mtbf,
        "faults": n_faults,
        "recoveries": len(recoveries),
        "wall_s": round(wall, 1),
        "step_s": round(run_step_s, 4),
        "calibration_step_s": round(step_s, 4),
        "distinct_steps": distinct,
        "ledger_ettr": round(float(result.get("goodput", {}).get("ettr", 0.0)), 4),
        "recovery_samples_s": [round(r, 2) for r in recoveries],
        "incidents": kinds,
    }
    if args.json:
        print(json.dumps(out))
    else:
        print(
            f"{seconds / 60:.1f} min, {n_faults} SIGKILLs (MTBF {mtbf:.0f} s), checkpoint every {tau:.2f} s"
        )
        print(
            f"  checkpoint stall C = {c * 1000:.1f} ms, restart cost R = {r_cost:.2f} s (median of {len(recoveries)})"
        )
        print(f"  measured ETTR {ettr:.3f}  (trainguard's ledger says {out['ledger_ettr']:.3f})")
        print(f"  Young/Daly optimum for these costs: {ettr_opt:.3f}")
        print(f"  ratio {ettr / ettr_opt:.3f} (target >= 0.95)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Recovery time after a worker death (MTTR), trainguard run vs plain torchrun, same script, same fault.

    python benchmarks/bench_recovery.py [--quick] [--repeats 3] [--json]

A 2-rank DDP job over gloo (a small model; the script checkpoints its step every 5 steps and
logs every completed step with its time and pid). After the job has trained for --warmup-s, rank
1 gets SIGKILL. MTTR = from the kill to the first step completed by the restarted workers.
Launchers: `trainguard run --standalone --nproc-per-node 2 --warm-standby` and
`torchrun --standalone --nproc-per-node 2 --max-restarts 1`.

Hang case: rank 1 gets SIGSTOP instead. trainguard's heartbeat watchdog (here the job's own step
heartbeats through trainguard.rundir, floor --hang-floor s) against torchrun with default
settings, which only notices when gloo's collective timeout (30 min by default) ends the
surviving rank; that wait is capped at --hang-cap-s and reported as ">= cap".

Keys (--json): mttr_s, torchrun_mttr_s, ratio (mttr_s / torchrun_mttr_s), hang_detect_s,
torchrun_hang_detect_s, torchrun_hang_capped, plus the individual samples.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
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

work = Path(sys.argv[1]); steps = int(sys.argv[2]); sleep = float(sys.argv[3])
dist.init_process_group("gloo")
rank = dist.get_rank()
(work / f"pid{rank}").write_text(str(os.getpid()))
torch.manual_seed(0)
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1)))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
ck = work / "ckpt_step"
start = int(ck.read_text()) if ck.exists() else 0
run_dir = rundir.run_dir_from_env()
hb = rundir.HeartbeatWriter(run_dir, rank, int(os.environ.get("TRAINGUARD_ATTEMPT", "0"))) if run_dir else None
last = time.time()
for step in range(start, steps):
    loss = model(torch.randn(32, 64)).pow(2).mean()
    loss.backward(); opt.step(); opt.zero_grad()
    time.sleep(sleep)
    now = time.time()
    if hb: hb.beat(step, float(loss), now - last)
    last = now
    if rank == 0:
        with open(work / "progress", "a") as f:
            f.write(f"{now} {step} {os.getpid()}\n")
        if (step + 1) % 5 == 0:
            (work / "ckpt_tmp").write_text(str(step + 1)); os.replace(work / "ckpt_tmp", ck)
dist.destroy_process_group()
"""


def progress(work: Path) -> list[tuple[float, int, int]]:
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


def launch(kind: str, work: Path, steps: int, sleep: float, hang_floor: float) -> subprocess.Popen:
    script = work / "worker.py"
    script.write_text(WORKER)
    wargs = [str(script), str(work), str(steps), str(sleep)]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    if kind == "trainguard":
        cmd = [sys.executable, "-m", "trainguard.cli", "run", "--standalone", "--nproc-per-node", "2",
               "--warm-standby", "--no-tee", "--max-restarts", "3", "--db", str(work / "tg.db"),
               "--runs-dir", str(work / "runs"), "--job-id", "bench", "--hang-timeout-floor", str(hang_floor),
               "--", sys.executable, *wargs]  # fmt: skip
    else:
        torchrun = shutil.which("torchrun", path=str(Path(sys.executable).parent)) or "torchrun"
        cmd = [torchrun, "--standalone", "--nproc-per-node", "2", "--max-restarts", "1", *wargs]
        # torchrun shares its rendezvous TCPStore with the workers; a restarted rank can then read
        # the dead attempt's gloo address and time out (seen here: no recovery within 120 s).
        # Both launchers get torch's own opt-out, so the baseline measures restart, not that bug.
        env["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] = "1"
    log = open(work / f"{kind}.log", "w")  # noqa: SIM115
    return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)


def wait_trained(work: Path, seconds: float, timeout: float = 180) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        p = progress(work)
        if p and p[-1][0] - p[0][0] >= seconds:
            return
        time.sleep(0.1)
    raise RuntimeError(f"the job did not train for {seconds}s; see {work}")


def stop(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(20)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)


def kill_workers(work: Path) -> None:
    for r in (0, 1):
        with contextlib.suppress(OSError, ValueError):
            os.kill(int((work / f"pid{r}").read_text()), signal.SIGKILL)


def measure_mttr(kind: str, warmup_s: float, sleep: float) -> float:
    work = Path(tempfile.mkdtemp(prefix=f"bench-recovery-{kind}-"))
    proc = launch(kind, work, steps=100000, sleep=sleep, hang_floor=30)
    try:
        wait_trained(work, warmup_s)
        old0 = int((work / "pid0").read_text())
        victim = int((work / "pid1").read_text())
        t_kill = time.time()
        os.kill(victim, signal.SIGKILL)
        deadline = t_kill + 120
        while time.time() < deadline:
            after = [p for p in progress(work) if p[0] > t_kill and p[2] != old0]
            if after:
                return after[0][0] - t_kill
            time.sleep(0.02)
        raise RuntimeError(f"{kind} did not recover within 120 s; see {work}")
    finally:
        stop(proc)
        kill_workers(work)
        shutil.rmtree(work, ignore_errors=True)


def measure_hang(
    kind: str, warmup_s: float, sleep: float, hang_floor: float, cap_s: float
) -> tuple[float, bool]:
    """Seconds from SIGSTOP of rank 1 to the launcher noticing (trainguard: its hang incident;
    torchrun: the surviving rank's exit), capped."""
    work = Path(tempfile.mkdtemp(prefix=f"bench-hang-{kind}-"))
    proc = launch(kind, work, steps=100000, sleep=sleep, hang_floor=hang_floor)
    try:
        wait_trained(work, warmup_s)
        survivor = int((work / "pid0").read_text())
        t_stop = time.time()
        os.kill(int((work / "pid1").read_text()), signal.SIGSTOP)
        while time.time() < t_stop + cap_s:
            if kind == "trainguard":
                found = _incident_time(work)
                if found is not None:
                    return found - t_stop, False
            elif not Path(f"/proc/{survivor}").exists() or _zombie(survivor):
                return time.time() - t_stop, False
            time.sleep(0.05)
        return cap_s, True
    finally:
        stop(proc)
        kill_workers(work)
        shutil.rmtree(work, ignore_errors=True)


def _incident_time(work: Path) -> float | None:
    path = work / "runs" / "bench" / "incidents.jsonl"
    try:
        for line in path.read_text().splitlines():
            inc = json.loads(line)
            if inc.get("category") == "hang":
                return float(inc["time"])
    except (OSError, ValueError):
        return None
    return None


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[-1].split()[0] == "Z"
    except OSError:
        return True


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="1 repeat, shorter warm-up, hang cap 30 s")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--warmup-s", type=float, default=15.0, help="train this long before the fault")
    p.add_argument("--step-sleep", type=float, default=0.05)
    p.add_argument("--hang-floor", type=float, default=3.0, help="trainguard --hang-timeout-floor")
    p.add_argument("--hang-cap-s", type=float, default=120.0)
    p.add_argument("--no-hang", action="store_true")
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    repeats = 1 if args.quick else args.repeats
    cap = 30.0 if args.quick else args.hang_cap_s
    tg, tr = [], []
    for _ in range(repeats):  # interleaved, so both see the same machine load
        tg.append(measure_mttr("trainguard", args.warmup_s, args.step_sleep))
        tr.append(measure_mttr("torchrun", args.warmup_s, args.step_sleep))
    mttr, base = statistics.median(tg), statistics.median(tr)
    out: dict[str, object] = {
        "mttr_s": round(mttr, 3),
        "torchrun_mttr_s": round(base, 3),
        "ratio": round(mttr / base, 3),
        "mttr_samples": [round(x, 3) for x in tg],
        "torchrun_mttr_samples": [round(x, 3) for x in tr],
    }
    if not args.no_hang:
        hang, _ = measure_hang("trainguard", args.warmup_s, args.step_sleep, args.hang_floor, cap)
        thang, capped = measure_hang("torchrun", args.warmup_s, args.step_sleep, args.hang_floor, cap)
        out.update(
            hang_detect_s=round(hang, 3),
            torchrun_hang_detect_s=round(thang, 3),
            torchrun_hang_capped=capped,
            hang_timeout_floor_s=args.hang_floor,
        )
    if args.json:
        print(json.dumps(out))
    else:
        print(f"MTTR after SIGKILL of rank 1 (median of {repeats}):")
        print(f"  trainguard run (warm standby): {mttr:6.2f} s   samples {out['mttr_samples']}")
        print(f"  torchrun --max-restarts 1:     {base:6.2f} s   samples {out['torchrun_mttr_samples']}")
        print(f"  ratio: {mttr / base:.2f} (target <= 0.5; mttr target <= 10 s)")
        if not args.no_hang:
            sign = ">=" if out["torchrun_hang_capped"] else ""
            print(
                f"Hang (SIGSTOP of rank 1) detected after: trainguard {out['hang_detect_s']} s "
                f"(floor {args.hang_floor} s), torchrun {sign}{out['torchrun_hang_detect_s']} s"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())

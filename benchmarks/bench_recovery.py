"""Recovery time after a worker death (MTTR), trainguard run vs plain torchrun, same script, same fault.

    python benchmarks/bench_recovery.py [--quick] [--repeats 3] [--json]

A 2-rank DDP job over gloo (a small model; it checkpoints model and optimizer every 5 steps and
logs every completed step with its time and pid). After the job has trained for --warmup-s, rank
1 gets SIGKILL. MTTR = from the kill to the first step completed by the restarted workers.
Launchers: `trainguard run --standalone --nproc-per-node 2 --warm-standby`, the same with
`--no-warm-standby` (the cold path: new interpreters import torch after the failure) and
`torchrun --standalone --nproc-per-node 2 --max-restarts 1`. The job is benchmarks/ddp_worker.py
(trainguard's Checkpointer every 5 steps), the same one bench_ettr.py runs.

Hang case: rank 1 gets SIGSTOP instead. trainguard's heartbeat watchdog (here the job's own step
heartbeats through trainguard.rundir, floor --hang-floor s) against torchrun with default
settings, which only notices when gloo's collective timeout (30 min by default) ends the
surviving rank; that wait is capped at --hang-cap-s and reported as ">= cap". And against
torchrun with the process-group timeout a careful user sets (60 s): the survivor's all-reduce
times out, it exits, and torchrun notices.

Keys (--json): mttr_s, cold_mttr_s, torchrun_mttr_s, ratio (mttr_s / torchrun_mttr_s),
cold_ratio (cold_mttr_s / torchrun_mttr_s), hang_detect_s, torchrun_hang_detect_s,
torchrun_hang_capped, torchrun_pg60_hang_detect_s, hang_ratio_vs_pg60, plus the samples.
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

from targets import Target, finish

TARGETS = (Target("ratio", "<=", 0.5), Target("mttr_s", "<=", 10))

WORKER = Path(__file__).with_name("ddp_worker.py")


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


def launch(
    kind: str, work: Path, sleep: float, hang_floor: float, pg_timeout_s: float | None = None
) -> subprocess.Popen[bytes]:
    """``kind``: trainguard (warm standby), trainguard-cold (--no-warm-standby) or torchrun."""
    wargs = [str(WORKER), str(work), "--every", "5", "--sleep", str(sleep), "--width", "64"]
    if pg_timeout_s is not None:
        wargs += ["--pg-timeout-s", str(pg_timeout_s)]
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
    if kind.startswith("trainguard"):
        standby = "--warm-standby" if kind == "trainguard" else "--no-warm-standby"
        cmd = [sys.executable, "-m", "trainguard.cli", "run", "--standalone", "--nproc-per-node", "2",
               standby, "--no-tee", "--max-restarts", "3", "--db", str(work / "tg.db"),
               "--runs-dir", str(work / "runs"), "--job-id", "bench", "--hang-timeout-floor", str(hang_floor),
               "--", sys.executable, *wargs]  # fmt: skip
    else:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
               "--max-restarts", "1", *wargs]  # fmt: skip
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
    proc = launch(kind, work, sleep=sleep, hang_floor=30)
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
    kind: str,
    warmup_s: float,
    sleep: float,
    hang_floor: float,
    cap_s: float,
    pg_timeout_s: float | None = None,
) -> tuple[float, bool]:
    """Seconds from SIGSTOP of rank 1 to the launcher noticing (trainguard: its hang incident;
    torchrun: the surviving rank's exit), capped."""
    work = Path(tempfile.mkdtemp(prefix=f"bench-hang-{kind}-"))
    proc = launch(kind, work, sleep=sleep, hang_floor=hang_floor, pg_timeout_s=pg_timeout_s)
    try:
        wait_trained(work, warmup_s)
        survivor = int((work / "pid0").read_text())
        t_stop = time.time()
        os.kill(int((work / "pid1").read_text()), signal.SIGSTOP)
        while time.time() < t_stop + cap_s:
            if kind == "trainguard":
                found = _incident_time(work, after=t_stop)
                if found is not None:
                    FALSE_HANGS.append(_hangs_before(work, t_stop))
                    return found - t_stop, False
            elif not Path(f"/proc/{survivor}").exists() or _zombie(survivor):
                return time.time() - t_stop, False
            time.sleep(0.05)
        return cap_s, True
    finally:
        stop(proc)
        kill_workers(work)
        shutil.rmtree(work, ignore_errors=True)


def _incident_time(work: Path, after: float) -> float | None:
    """Time of the first hang incident detected after ``after`` (an earlier one is a false alarm
    of the warm-up, not this fault)."""
    path = work / "runs" / "bench" / "incidents.jsonl"
    try:
        for line in path.read_text().splitlines():
            inc = json.loads(line)
            if inc.get("category") == "hang" and float(inc["time"]) >= after:
                return float(inc["time"])
    except (OSError, ValueError):
        return None
    return None


FALSE_HANGS: list[int] = []  # hang incidents trainguard recorded before the fault, per run


def _hangs_before(work: Path, when: float) -> int:
    try:
        lines = (work / "runs" / "bench" / "incidents.jsonl").read_text().splitlines()
        return sum(1 for x in map(json.loads, lines) if x.get("category") == "hang" and x["time"] < when)
    except (OSError, ValueError, KeyError):
        return 0


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
    tg, cold, tr = [], [], []
    for _ in range(repeats):  # interleaved, so all three see the same machine load
        tg.append(measure_mttr("trainguard", args.warmup_s, args.step_sleep))
        cold.append(measure_mttr("trainguard-cold", args.warmup_s, args.step_sleep))
        tr.append(measure_mttr("torchrun", args.warmup_s, args.step_sleep))
    mttr, cold_mttr, base = statistics.median(tg), statistics.median(cold), statistics.median(tr)
    out: dict[str, object] = {
        "mttr_s": round(mttr, 3),
        "cold_mttr_s": round(cold_mttr, 3),
        "torchrun_mttr_s": round(base, 3),
        "ratio": round(mttr / base, 3),
        "cold_ratio": round(cold_mttr / base, 3),
        "mttr_samples": [round(x, 3) for x in tg],
        "cold_mttr_samples": [round(x, 3) for x in cold],
        "torchrun_mttr_samples": [round(x, 3) for x in tr],
    }
    if not args.no_hang:
        hang, _ = measure_hang("trainguard", args.warmup_s, args.step_sleep, args.hang_floor, cap)
        thang, capped = measure_hang("torchrun", args.warmup_s, args.step_sleep, args.hang_floor, cap)
        # A careful user sets the process group's timeout; 60 s, and a cap that lets it fire.
        pg60, pg60_capped = measure_hang(
            "torchrun", args.warmup_s, args.step_sleep, args.hang_floor, max(cap, 90.0), pg_timeout_s=60.0
        )
        out.update(
            hang_detect_s=round(hang, 3),
            torchrun_hang_detect_s=round(thang, 3),
            torchrun_hang_capped=capped,
            torchrun_pg60_hang_detect_s=round(pg60, 3),
            torchrun_pg60_hang_capped=pg60_capped,
            hang_ratio_vs_pg60=round(hang / pg60, 3),
            hang_false_alarms_before_fault=sum(FALSE_HANGS),
            hang_timeout_floor_s=args.hang_floor,
        )
    if args.json:
        print(json.dumps(out))
    else:
        print(f"MTTR after SIGKILL of rank 1 (median of {repeats}):")
        print(f"  trainguard run (warm standby): {mttr:6.2f} s   samples {out['mttr_samples']}")
        print(f"  trainguard run, cold restart:  {cold_mttr:6.2f} s   samples {out['cold_mttr_samples']}")
        print(f"  torchrun --max-restarts 1:     {base:6.2f} s   samples {out['torchrun_mttr_samples']}")
        print(
            f"  ratio: {mttr / base:.2f} (target <= 0.5; mttr target <= 10 s); cold_ratio {cold_mttr / base:.2f}"
        )
        if not args.no_hang:
            sign = ">=" if out["torchrun_hang_capped"] else ""
            print(
                f"Hang (SIGSTOP of rank 1) detected after: trainguard {out['hang_detect_s']} s "
                f"(floor {args.hang_floor} s), torchrun {sign}{out['torchrun_hang_detect_s']} s, torchrun with "
                f"a 60 s process-group timeout {'>=' if pg60_capped else ''}{out['torchrun_pg60_hang_detect_s']} s"
            )
    return finish("bench_recovery", TARGETS, out, json_mode=args.json)


if __name__ == "__main__":
    sys.exit(main())

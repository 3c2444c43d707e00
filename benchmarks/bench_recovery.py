"""Recovery time after a worker death (MTTR) and after a hang, trainguard run vs plain torchrun,
same script, same fault, interleaved rounds.

    python benchmarks/bench_recovery.py [--quick] [--repeats 3] [--hang-repeats 3] [--json]
    python benchmarks/bench_recovery.py --hang-only [--hang-floors 3,10,30]   # the hang sweep alone

A 2-rank DDP job over gloo (a small model; it checkpoints model and optimizer every 5 steps and
logs every completed step with its time and pid). After the job has trained for --warmup-s, rank
1 gets SIGKILL. MTTR = from the kill to the first step completed by the restarted workers.
Launchers: `trainguard run --standalone --nproc-per-node 2 --warm-standby`, the same with
`--no-warm-standby` (the cold path: new interpreters import torch after the failure) and
`torchrun --standalone --nproc-per-node 2 --max-restarts 1`, in --repeats rounds, the order
reversed every other round. The job is benchmarks/ddp_worker.py (trainguard's Checkpointer every 5
steps), the same one bench_ettr.py runs.

Hang case: rank 1 gets SIGSTOP instead. Both launchers are followed to the same end point, the
first step of the restarted workers (hang recovery), and to the moment each noticed (trainguard:
its hang incident from the step heartbeats, at each --hang-floors value of
--hang-timeout-floor; torchrun: the surviving rank's exit when the process-group timeout a
careful user sets, --pg-timeout-s 60, ends its all-reduce; with gloo's default of 30 minutes
torchrun would wait that long). --hang-repeats rounds, the order reversed every other round; a
recovery that does not come within --hang-cap-s (default: 6x the largest floor, at least 120 s,
so a detection at 5x a floor is never cut off) counts as the cap. Each trainguard sample also
says what each rank last reported on its heartbeat before the detection (phase, step, time from
the fault) and the incident's summary, the evidence of where a detection's time went. A
hang incident trainguard records before the fault is a false alarm: the headline detection time
is the one at the lowest floor with no false alarm over all its runs, next to the default's.

Keys (--json), each with _ci95 and _repeats (mean and 95% t-interval over rounds; ratios are
geometric means of the per-round ratios, benchmarks/paired.py): mttr_s (target <= 10 s),
cold_mttr_s, torchrun_mttr_s, ratio (mttr / torchrun's, target <= 0.5), cold_ratio, the samples
and *_mttr_capped (recoveries that did not come within 120 s, counted as 120 s: a lower bound);
hang_floor_sweep (per floor: false alarms, detect and recover samples, last_beats, summaries),
hang_cap_s, hang_min_clean_floor_s,
hang_detect_s (at that floor), hang_detect_default_s, hang_recover_s (at the
default floor; what `trainguard simulate --from-bench` takes), torchrun_hang_detect_s,
torchrun_hang_recover_s, hang_recover_ratio (target <= 0.5). Exit 1 when a target is missed.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from arm_procs import progress
from paired import mean_ci, missed, ratio_ci, targets_json
from trainguard.rundir import heartbeat_path, read_heartbeats
from trainguard.supervisor.config import WatchConfig

WORKER = Path(__file__).with_name("ddp_worker.py")


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
               standby, "--no-tee", "--max-restarts", "10", "--db", str(work / "tg.db"),
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


MTTR_CAP_S = 120.0
CAPPED: dict[str, int] = {}  # per launcher: recoveries that did not come within MTTR_CAP_S


def measure_mttr(kind: str, warmup_s: float, sleep: float) -> float:
    """Kill to the first step of the new workers; a recovery that does not come within
    MTTR_CAP_S counts as the cap (a lower bound) and is counted in CAPPED."""
    work = Path(tempfile.mkdtemp(prefix=f"bench-recovery-{kind}-"))
    proc = launch(kind, work, sleep=sleep, hang_floor=30)
    try:
        wait_trained(work, warmup_s)
        old0 = int((work / "pid0").read_text())
        victim = int((work / "pid1").read_text())
        t_kill = time.time()
        os.kill(victim, signal.SIGKILL)
        deadline = t_kill + MTTR_CAP_S
        while time.time() < deadline:
            after = [p for p in progress(work) if p[0] > t_kill and p[2] != old0]
            if after:
                return after[0][0] - t_kill
            time.sleep(0.02)
        CAPPED[kind] = CAPPED.get(kind, 0) + 1
        print(f"{kind} did not recover within {MTTR_CAP_S:g} s: counted as {MTTR_CAP_S:g} s", file=sys.stderr)
        return MTTR_CAP_S
    finally:
        stop(proc)
        kill_workers(work)
        shutil.rmtree(work, ignore_errors=True)


@dataclass(frozen=True, slots=True)
class Hang:
    detect_s: float  # SIGSTOP -> the launcher noticed (trainguard: its hang incident; torchrun: the survivor's exit)
    recover_s: float  # SIGSTOP -> the first step of the new workers (the same end point for both)
    false_alarms: int  # hang incidents trainguard recorded before the fault (torchrun: 0)
    capped: bool  # no recovery within the cap; recover_s is the cap
    last_beats: tuple[str, ...] = ()  # trainguard: each rank's last heartbeat before the detection
    summary: str | None = None  # trainguard: the hang incident's summary


def measure_hang(
    kind: str,
    warmup_s: float,
    sleep: float,
    hang_floor: float,
    cap_s: float,
    pg_timeout_s: float | None = None,
) -> Hang:
    """SIGSTOP rank 1 of a job that has trained for ``warmup_s``; follow it until the restarted
    workers complete a step (or ``cap_s``)."""
    work = Path(tempfile.mkdtemp(prefix=f"bench-hang-{kind}-"))
    proc = launch(kind, work, sleep=sleep, hang_floor=hang_floor, pg_timeout_s=pg_timeout_s)
    try:
        wait_trained(work, warmup_s)
        survivor = int((work / "pid0").read_text())
        t_stop = time.time()
        os.kill(int((work / "pid1").read_text()), signal.SIGSTOP)
        detect, recover = None, None
        while time.time() < t_stop + cap_s:
            if detect is None:
                if kind.startswith("trainguard"):
                    found = _incident_time(work, after=t_stop)
                    detect = None if found is None else found - t_stop
                elif not Path(f"/proc/{survivor}").exists() or _zombie(survivor):
                    detect = time.time() - t_stop
            after = [p for p in progress(work) if p[0] > t_stop and p[2] != survivor]
            if after:
                recover = after[0][0] - t_stop
                break
            time.sleep(0.05)
        capped = recover is None
        recover = cap_s if recover is None else recover
        detected = detect if detect is not None else recover
        return Hang(
            detected,
            recover,
            _hangs_before(work, t_stop),
            capped,
            _last_beats(work, t_stop, t_stop + detected),
            _incident_summary(work, t_stop),
        )
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


def _incident_summary(work: Path, after: float) -> str | None:
    try:
        for line in (work / "runs" / "bench" / "incidents.jsonl").read_text().splitlines():
            inc = json.loads(line)
            if inc.get("category") == "hang" and float(inc["time"]) >= after:
                return str(inc.get("summary"))
    except (OSError, ValueError):
        return None
    return None


def _last_beats(work: Path, fault: float, until: float) -> tuple[str, ...]:
    """``rank R: <phase> step S at +T s`` for each rank's last heartbeat of the attempt that hung
    (the last one before ``until``, its detection), T counted from the fault."""
    out = []
    for rank in (0, 1):
        beats = [b for b in read_heartbeats(heartbeat_path(work / "runs" / "bench", rank)) if b.time <= until]
        if beats:
            b = beats[-1]
            out.append(f"rank {rank}: {b.phase} step {b.step} at {b.time - fault:+.2f} s")
    return tuple(out)


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


DEFAULT_FLOOR_S = WatchConfig().hang_timeout_floor
MTTR_TARGETS = {"mttr_s": ("<=", 10.0), "ratio": ("<=", 0.5)}
HANG_TARGETS = {"hang_recover_ratio": ("<=", 0.5)}
TARGETS = {
    "mttr_s": ("<=", 10.0),
    "ratio": ("<=", 0.5),
    "hang_recover_ratio": ("<=", 0.5),
}


def hang_sweep(
    floors: list[float], repeats: int, warmup_s: float, sleep: float, cap_s: float, pg_timeout_s: float
) -> tuple[dict[float, list[Hang]], list[Hang]]:
    """``repeats`` rounds; in each, trainguard at every floor and torchrun with the process-group
    timeout, the order reversed every other round."""
    ours: dict[float, list[Hang]] = {f: [] for f in floors}
    theirs: list[Hang] = []
    for i in range(repeats):
        jobs: list[float | None] = [*floors, None]
        for floor in jobs if i % 2 == 0 else jobs[::-1]:
            if floor is None:
                theirs.append(
                    measure_hang("torchrun", warmup_s, sleep, 0, cap_s + pg_timeout_s, pg_timeout_s)
                )
            else:
                ours[floor].append(measure_hang("trainguard", warmup_s, sleep, floor, cap_s))
    return ours, theirs


def hang_figures(ours: dict[float, list[Hang]], theirs: list[Hang], pg_timeout_s: float) -> dict[str, Any]:
    out: dict[str, Any] = {
        "hang_floor_sweep": [
            {
                "floor_s": f,
                "false_alarms_before_fault": sum(h.false_alarms for h in hs),
                "detect_samples": [round(h.detect_s, 3) for h in hs],
                "recover_samples": [round(h.recover_s, 3) for h in hs],
                "capped": sum(h.capped for h in hs),
                "last_beats": [list(h.last_beats) for h in hs],
                "summaries": [h.summary for h in hs],
            }
            for f, hs in sorted(ours.items())
        ],
        "torchrun_pg_timeout_s": pg_timeout_s,
        "torchrun_hang_detect_samples": [round(h.detect_s, 3) for h in theirs],
        "torchrun_hang_recover_samples": [round(h.recover_s, 3) for h in theirs],
        "torchrun_hang_capped": sum(h.capped for h in theirs),
    }
    out.update(mean_ci([h.detect_s for h in theirs]).as_json("torchrun_hang_detect_s", 3))
    out.update(mean_ci([h.recover_s for h in theirs]).as_json("torchrun_hang_recover_s", 3))
    clean = [f for f, hs in sorted(ours.items()) if not any(h.false_alarms for h in hs)]
    out["hang_min_clean_floor_s"] = clean[0] if clean else None
    # The headline: detection at the lowest floor that raised no false alarm over its runs.
    if clean:
        out.update(mean_ci([h.detect_s for h in ours[clean[0]]]).as_json("hang_detect_s", 3))
        out.update(mean_ci([h.recover_s for h in ours[clean[0]]]).as_json("hang_recover_min_clean_s", 3))
    else:
        out["hang_detect_s"] = None  # every floor tried raised a false alarm: no honest figure
    if DEFAULT_FLOOR_S in ours:
        default = ours[DEFAULT_FLOOR_S]
        out["hang_default_floor_s"] = DEFAULT_FLOOR_S
        out["hang_default_false_alarms"] = sum(h.false_alarms for h in default)
        out.update(mean_ci([h.detect_s for h in default]).as_json("hang_detect_default_s", 3))
        # What bin/simulate --from-bench takes: the default, against torchrun with its timeout.
        out.update(mean_ci([h.recover_s for h in default]).as_json("hang_recover_s", 3))
        if all(h.recover_s > 0 for h in (*default, *theirs)):
            out.update(
                ratio_ci([h.recover_s for h in default], [h.recover_s for h in theirs]).as_json(
                    "hang_recover_ratio"
                )
            )
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="2 repeats, 5 s warm-up")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--warmup-s", type=float, default=15.0, help="train this long before the fault")
    p.add_argument("--step-sleep", type=float, default=0.05)
    p.add_argument(
        "--hang-floors",
        default=f"3,10,{DEFAULT_FLOOR_S:g}",
        help=f"trainguard --hang-timeout-floor values to try (default 3,10,{DEFAULT_FLOOR_S:g}: the default)",
    )
    p.add_argument("--hang-repeats", type=int, default=3)
    p.add_argument("--pg-timeout-s", type=float, default=60.0, help="torchrun's process-group timeout")
    p.add_argument(
        "--hang-cap-s",
        type=float,
        default=None,
        help="give up on a hang's recovery after this (default: 6x the largest floor, at least 120 s)",
    )
    p.add_argument("--no-hang", action="store_true")
    p.add_argument("--hang-only", action="store_true", help="the hang sweep alone (no MTTR rounds)")
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    repeats = 2 if args.quick else args.repeats
    hang_repeats = 2 if args.quick else args.hang_repeats
    warmup = 5.0 if args.quick else args.warmup_s
    if args.hang_only and args.no_hang:
        p.error("--hang-only and --no-hang leave nothing to measure")
    targets = HANG_TARGETS if args.hang_only else MTTR_TARGETS if args.no_hang else TARGETS
    out: dict[str, Any] = {"targets": targets_json(targets)}
    if not args.hang_only:
        out.update(mttr_figures(repeats, warmup, args.step_sleep))
    if not args.no_hang:
        floors = sorted({float(x) for x in args.hang_floors.split(",")})
        cap_s = args.hang_cap_s if args.hang_cap_s is not None else max(MTTR_CAP_S, 6 * max(floors))
        ours, theirs = hang_sweep(floors, hang_repeats, warmup, args.step_sleep, cap_s, args.pg_timeout_s)
        out["hang_cap_s"] = cap_s
        out.update(hang_figures(ours, theirs, args.pg_timeout_s))
    bad = missed(out, targets)
    out["targets_missed"] = bad
    if args.json:
        print(json.dumps(out))
        return 1 if bad else 0
    if not args.hang_only:
        print_mttr(out, repeats)
    if not args.no_hang:
        print_hang(out, args.pg_timeout_s)
    for line in bad:
        print(f"target missed: {line}")
    return 1 if bad else 0


def mttr_figures(repeats: int, warmup: float, sleep: float) -> dict[str, Any]:
    tg, cold, tr = [], [], []
    for i in range(repeats):  # interleaved, the order reversed every other round
        kinds = ["trainguard", "trainguard-cold", "torchrun"]
        got = {k: measure_mttr(k, warmup, sleep) for k in (kinds if i % 2 == 0 else kinds[::-1])}
        tg.append(got["trainguard"])
        cold.append(got["trainguard-cold"])
        tr.append(got["torchrun"])
    out: dict[str, Any] = {}
    out.update(mean_ci(tg).as_json("mttr_s", 3))
    out.update(mean_ci(cold).as_json("cold_mttr_s", 3))
    out.update(mean_ci(tr).as_json("torchrun_mttr_s", 3))
    out.update(ratio_ci(tg, tr).as_json("ratio"))
    out.update(ratio_ci(cold, tr).as_json("cold_ratio"))
    out.update(
        mttr_samples=[round(x, 3) for x in tg],
        cold_mttr_samples=[round(x, 3) for x in cold],
        torchrun_mttr_samples=[round(x, 3) for x in tr],
        mttr_capped=CAPPED.get("trainguard", 0),
        cold_mttr_capped=CAPPED.get("trainguard-cold", 0),
        torchrun_mttr_capped=CAPPED.get("torchrun", 0),
    )
    return out


def print_mttr(out: dict[str, Any], repeats: int) -> None:
    print(f"MTTR after SIGKILL of rank 1 (mean of {repeats}, interleaved):")
    print(f"  trainguard run (warm standby): {out['mttr_s']:6.2f} s   samples {out['mttr_samples']}")
    print(
        f"  trainguard run, cold restart:  {out['cold_mttr_s']:6.2f} s   samples {out['cold_mttr_samples']}"
    )
    print(
        f"  torchrun --max-restarts 1:     {out['torchrun_mttr_s']:6.2f} s   samples {out['torchrun_mttr_samples']}"
    )
    print(
        f"  ratio {out['ratio']} (95% CI {out['ratio_ci95']}; target <= 0.5), cold_ratio {out['cold_ratio']}"
    )


def print_hang(out: dict[str, Any], pg_timeout_s: float) -> None:
    print("Hang (SIGSTOP of rank 1): detected after / recovered (first new step) after, seconds")
    for row in out["hang_floor_sweep"]:
        print(
            f"  trainguard, floor {row['floor_s']:g} s: {row['detect_samples']} / {row['recover_samples']}, "
            f"{row['false_alarms_before_fault']} false alarms before the fault"
        )
    print(
        f"  torchrun, {pg_timeout_s:g} s process-group timeout: {out['torchrun_hang_detect_samples']} / "
        f"{out['torchrun_hang_recover_samples']}"
    )
    print(
        f"  lowest floor without false alarms {out['hang_min_clean_floor_s']} s: detect {out['hang_detect_s']} s; "
        f"default floor: detect {out.get('hang_detect_default_s')} s, recover ratio "
        f"{out.get('hang_recover_ratio')} (95% CI {out.get('hang_recover_ratio_ci95')})"
    )
    for row in out["hang_floor_sweep"]:  # what each rank last reported: where detection time went
        for beats, summary in zip(row["last_beats"], row["summaries"], strict=True):
            print(f"    floor {row['floor_s']:g} s: {'; '.join(beats)} -> {summary}")


if __name__ == "__main__":
    sys.exit(main())

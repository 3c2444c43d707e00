"""Recovery without stopping the job: ``trainguard run --replica-groups 2`` (groups2) against a
plain DDP job restarted whole, by ``torchrun --max-restarts`` (torchrun) and by ``trainguard run``
(restart); the same model, batches, global batch and steps, one fault schedule.

    python benchmarks/bench_no_restart.py [--repeats 3] [--steps 300] [--json]

torchrun and restart run benchmarks/nr_ddp.py: torch's DDP over gloo, 2 ranks, its own
torch.save snapshot every 50 steps, no trainguard import and no Guard. groups2 runs
examples/train_ft.py (torchft's Manager, trainguard's DDP, the Guard) as 2 groups of 1 rank
through benchmarks/nr_ft.py, which only places the two SIGSTOPs. Rank r of the plain job trains on
group r's batch, so both jobs train the same 64 samples a step. The reference (ddp) is the plain
job under torchrun without faults; groups2_clean is --replica-groups 2 without faults.

Faults, in rank 1 (group 1), at fractions of --steps: SIGKILL at 20% and 47%, SIGSTOP between
steps at 60% and SIGSTOP inside the cross-group all-reduce at 75%. The bench sends them all:
kills and the plain job's stops when rank 0 (group 0) reports the step; groups2's stops when
group 1's rank says it is there (nr_ft.py: before the step's quorum; inside the all-reduce, the
peer waiting on it), so the in-collective stop lands in the collective every time. Detection of a
stopped rank: groups2, trainguard's group hang floor (15 s: past torchft's 10 s collective
timeout); restart, ``--idle-timeout 15`` (a plain script writes no heartbeats); torchrun, the
script's 60 s gloo timeout (torchrun has no hang watch; gloo's default is 30 min), then its 30 s
SIGTERM grace for the stopped rank, as a torchrun user gets.

Every run is timed from launch to the job's exit: start-up and every fault's recovery are inside
the clock. Figures (benchmarks/nr_figures.py says how each is computed): ``ettr_<arm>`` = useful
steps per second over the same round's fault-free plain DDP rate (one reference for every arm,
so torchft's per-step cost counts; ``ettr_groups2_clean`` is that cost alone);
``ratio_vs_restart`` and ``ratio_vs_torchrun`` (groups2's rate over theirs, paired per round,
geometric mean); ``steps_lost_per_failure`` (steps the healthy group discarded per fault) and
``steps_redone_per_failure_<arm>``; the healthy group's pause per fault kind
(``pause_kill_s``, ``pause_stop_between_s``: target <= 2 s; ``pause_stop_allreduce_s``, reported
against ``collective_timeout_s``; ``healthy_group_pause_s`` all faults pooled, and
``healthy_group_pause_clean_s``, a fault-free run's longest gap); every fault's recovery:
``heal_s`` (groups2), ``restart_recovery_s``, ``torchrun_recovery_s`` (a fault never healed
counts its seconds to the exit; ``unhealed_<arm>`` counts them), ``kill_heal_s_<arm>`` (kills
alone); ``step_overhead_ms`` (groups2_clean's mean step over ddp's, paired per round) and
``wall_s_<arm>``. Each value is ``{mean, ci95, n}`` (ci95: the t-interval's half-width, Student's
t over the rounds; ratios: their interval's ends), the shape ``trainguard simulate
--from-no-restart`` reads; the arms' order rotates each round (paired.rotate); the commit and
the host's load are in the JSON. Exit 1 when a target is missed.
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
import threading
import time
from pathlib import Path
from typing import Any

from arm_procs import descendants, stop
from nr_figures import Run, figures, rate
from paired import mean_ci, ratio_ci, rotate
from targets import Target, finish

ROOT = Path(__file__).resolve().parent.parent
PLAIN = ROOT / "benchmarks" / "nr_ddp.py"
REPLICA = ROOT / "benchmarks" / "nr_ft.py"
ARMS = ("ddp", "groups2_clean", "torchrun", "restart", "groups2")
FAULTS = (("kill", 0.2), ("kill", 0.47), ("stop_between", 0.6), ("stop_allreduce", 0.75))
PG_TIMEOUT_S = 60.0  # the plain script's gloo timeout: what a careful torchrun user sets
COLLECTIVE_TIMEOUT_S = 10.0  # torchft's, as trainguard run --replica-groups sets it
IDLE_TIMEOUT_S = 15.0  # restart arm: as the groups' hang floor (10 s + trainguard's margin)
TARGETS = (  # on the means (<key>_mean; the intervals are beside them in <key>)
    Target("ratio_vs_restart_mean", ">=", 1.1),
    Target("pause_kill_s_mean", "<=", 2.0),
    Target("pause_stop_between_s_mean", "<=", 2.0),
    Target("steps_lost_per_failure_mean", "<=", 1.0),
)


def schedule(steps: int) -> list[tuple[str, int]]:
    return [(kind, int(steps * f)) for kind, f in FAULTS]


def command(arm: str, steps: int, delay: float, work: Path) -> list[str]:
    py = sys.executable
    if arm in ("groups2", "groups2_clean"):
        hooks = ["--work", str(work)]
        if arm == "groups2":
            at = dict(schedule(steps))
            hooks += [
                "--stop-between",
                str(at.get("stop_between", -1)),
                "--stop-in-allreduce",
                str(at.get("stop_allreduce", -1)),
            ]
        script = [str(REPLICA), *hooks, "--", "--steps", str(steps), "--step-delay", str(delay)]
        script += ["--metrics", str(work / "m{group}.jsonl"), "--checkpoint-dir", str(work / "ckpt")]
        tg = [py, "-m", "trainguard.cli", "run", "--standalone", "--no-tee", "--no-preflight"]
        tg += ["--replica-groups", "2", "--nproc-per-node", "1", "--backoff-base", "0.1"]
        tg += ["--max-restarts", "10", "--db", str(work / "tg.db"), "--runs-dir", str(work / "runs")]
        return [*tg, "--", py, *script]
    script = [str(PLAIN), "--steps", str(steps), "--step-delay", str(delay), "--work", str(work)]
    script += ["--pg-timeout-s", f"{PG_TIMEOUT_S:g}"]
    if arm == "restart":
        tg = [py, "-m", "trainguard.cli", "run", "--standalone", "--no-tee", "--no-preflight"]
        tg += ["--nproc-per-node", "2", "--idle-timeout", f"{IDLE_TIMEOUT_S:g}", "--backoff-base", "0.1"]
        tg += ["--max-restarts", "10", "--db", str(work / "tg.db"), "--runs-dir", str(work / "runs")]
        return [*tg, "--", py, *script]
    torchrun = [py, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
    return [*torchrun, "--max-restarts", "10", *script]


def read_lines(work: Path) -> list[dict[str, Any]]:
    out = []
    for path in sorted(work.glob("m*.jsonl")):
        for line in path.read_text().splitlines():
            with contextlib.suppress(ValueError):
                out.append(json.loads(line))
    return out


def reached(work: Path, step: int) -> bool:
    """Has rank 0 of the job (group 0's) reported ``step``?"""
    try:
        tail = (work / "m0.jsonl").read_text().splitlines()[-3:]
    except OSError:
        return False
    for line in tail:
        with contextlib.suppress(ValueError):
            if json.loads(line).get("step", -1) >= step:
                return True
    return False


def target_pid(work: Path, arm: str, job: int) -> int | None:
    """Rank 1's (group 1's) pid, if it is a live process of this job training now (under
    replica groups: its group's last line a commit beside group 0 made after this process
    started, so a kill never lands in a start or a heal)."""
    path = work / ("pid1.0" if arm == "groups2" else "pid1")
    try:
        pid, born = int(path.read_text()), path.stat().st_mtime
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, ValueError, IndexError):
        return None
    if state in "ZXx" or pid not in descendants(job):  # a zombie takes a signal and ignores it
        return None
    if arm == "groups2":
        try:
            last = json.loads((work / "m1.jsonl").read_text().splitlines()[-1])
        except (OSError, ValueError, IndexError):
            return None
        if not (last.get("ok") and last.get("groups", 1) > 1 and last["t"] > born):
            return None
    return pid


def inject(
    arm: str, steps: int, work: Path, job: int, sent: list[tuple[str, float]], done: threading.Event
) -> None:
    """Send the schedule's faults, each once, in order (see the module docstring)."""
    for kind, step in schedule(steps):
        while not done.is_set():
            if arm == "groups2" and kind.startswith("stop"):
                mark = work / ("stop-between" if kind == "stop_between" else "stop-allreduce")
                with contextlib.suppress(OSError, ValueError):
                    at, held = mark.read_text().split()
                    with contextlib.suppress(ProcessLookupError):  # gone already: sent is short
                        os.kill(int(held), signal.SIGSTOP)
                        sent.append((kind, float(at)))  # from when the rank stood there
                    break
            elif reached(work, step) and (pid := target_pid(work, arm, job)) is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL if kind == "kill" else signal.SIGSTOP)
                    sent.append((kind, time.time()))
                    break
            done.wait(0.02)


def one_run(arm: str, steps: int, delay: float, cap_s: float) -> tuple[Run, bool]:
    """One job of ``arm``; (its record, whether it hit ``cap_s`` and was killed there)."""
    work = Path(tempfile.mkdtemp(prefix=f"norestart-{arm}-"))
    env = {
        k: v for k, v in os.environ.items() if not k.startswith(("TRAINGUARD_", "TORCHELASTIC_", "TORCHFT_"))
    }
    # torchrun: as bench_recovery.py runs it (with the shared store, a restart once failed to
    # reconnect gloo); harmless to the others.
    env["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] = "1"
    log = open(work / "out.log", "wb")  # noqa: SIM115
    launched = time.time()
    proc = subprocess.Popen(
        command(arm, steps, delay, work),
        cwd=work,
        stdout=log,
        stderr=subprocess.STDOUT,
        env=env,
        start_new_session=True,
    )
    sent: list[tuple[str, float]] = []
    done = threading.Event()
    injector = None
    if arm in ("torchrun", "restart", "groups2"):
        injector = threading.Thread(target=inject, args=(arm, steps, work, proc.pid, sent, done), daemon=True)
        injector.start()
    capped, ok = False, False
    try:
        try:
            proc.wait(timeout=cap_s)
        except subprocess.TimeoutExpired:
            capped = True
        exited = time.time()
        done.set()
        if injector is not None:
            injector.join()
        if proc.returncode not in (0, None):
            tail = (work / "out.log").read_text(errors="replace")[-2000:]
            raise RuntimeError(f"{arm} run failed ({proc.returncode}); out.log ends:\n{tail}")
        run = Run(arm, 2 if arm.startswith("groups") else 1, launched, exited, read_lines(work), tuple(sent))
        if len(sent) < (len(FAULTS) if injector is not None else 0) and not capped:
            print(f"{arm}: only {len(sent)} of {len(FAULTS)} faults sent: {sent}", file=sys.stderr)
        ok = True
        return run, capped
    finally:
        done.set()
        stop(proc)  # nothing of the job outlives it (a stopped rank)
        log.close()
        if ok:
            shutil.rmtree(work, ignore_errors=True)
        else:
            print(f"{arm}: failed; its files are in {work}", file=sys.stderr)


def commit() -> str:
    """HEAD, with ``-dirty`` when the worktree has changes (read at launch: what ran)."""
    with contextlib.suppress(OSError, subprocess.CalledProcessError):
        head = subprocess.check_output(["git", "rev-parse", "HEAD"], cwd=ROOT, text=True).strip()
        dirty = subprocess.check_output(["git", "status", "--porcelain"], cwd=ROOT, text=True).strip()
        return head + ("-dirty" if dirty else "")
    return "unknown"


def pooled(samples: list[dict[str, Any]], key: str) -> list[float]:
    return [v for s in samples for v in s.get(key, [])]


def est(values: list[float], digits: int = 3) -> dict[str, Any]:
    """``{mean, ci95: the t-interval's half-width (None with one value), n}``: the shape
    ``trainguard simulate --from-no-restart`` reads; None where nothing was measured."""
    if not values:
        return {"mean": None, "ci95": None, "n": 0}
    e = mean_ci(values)
    half = None if e.ci95 is None else round((e.ci95[1] - e.ci95[0]) / 2, digits)
    return {"mean": round(e.value, digits), "ci95": half, "n": e.repeats}


def ratio(a: list[float], b: list[float]) -> dict[str, Any]:
    """Paired ratios a_i / b_i: ``{mean: their geometric mean, ci95: [low, high], n}``."""
    e = ratio_ci(a, b)
    ci = None if e.ci95 is None else [round(e.ci95[0], 3), round(e.ci95[1], 3)]
    return {"mean": round(e.value, 3), "ci95": ci, "n": e.repeats}


def summarize(runs: dict[str, list[Run]], capped: dict[str, int]) -> dict[str, Any]:
    """The keys from every arm's runs, round i of each arm against round i's reference."""
    ref = [rate(r) for r in runs["ddp"]]
    samples = {a: [figures(r, q) for r, q in zip(rs, ref, strict=True)] for a, rs in runs.items()}
    g2 = samples["groups2"]
    out: dict[str, Any] = {f"ettr_{a}": est([s["ettr"] for s in samples[a]]) for a in ARMS[1:]}
    for base in ("restart", "torchrun"):
        out[f"ratio_vs_{base}"] = ratio([rate(r) for r in runs["groups2"]], [rate(r) for r in runs[base]])
    out["steps_lost_per_failure"] = est([s["lost_per_failure"] for s in g2], 2)
    for base in ("restart", "torchrun"):
        out[f"steps_redone_per_failure_{base}"] = est([s["lost_per_failure"] for s in samples[base]], 2)
    for kind in ("kill", "stop_between", "stop_allreduce"):
        out[f"pause_{kind}_s"] = est(pooled(g2, f"pause_{kind}_s"), 2)
    out["collective_timeout_s"] = COLLECTIVE_TIMEOUT_S
    # What trainguard simulate --from-no-restart reads: every fault's pause and heal, pooled.
    out["healthy_group_pause_s"] = est(
        pooled(g2, "pause_kill_s")
        + pooled(g2, "pause_stop_between_s")
        + pooled(g2, "pause_stop_allreduce_s"),
        2,
    )
    out["healthy_group_pause_clean_s"] = est([s["longest_gap_s"] for s in samples["groups2_clean"]], 2)
    out["heal_s"] = est(pooled(g2, "heal_s"), 2)
    out["restart_recovery_s"] = est(pooled(samples["restart"], "heal_s"), 2)
    out["torchrun_recovery_s"] = est(pooled(samples["torchrun"], "heal_s"), 2)
    for arm in ("groups2", "restart", "torchrun"):
        out[f"kill_heal_s_{arm}"] = est(pooled(samples[arm], "kill_heal_s"), 2)
        out[f"unhealed_{arm}"] = sum(s["unhealed"] for s in samples[arm])
    clean = zip(samples["groups2_clean"], samples["ddp"], strict=True)
    out["step_overhead_ms"] = est([(g["step_s"] - d["step_s"]) * 1000 for g, d in clean], 2)
    for arm in ARMS:
        out[f"wall_s_{arm}"] = est([s["wall_s"] for s in samples[arm]], 1)
        out[f"capped_{arm}"] = capped.get(arm, 0)
    out["samples"] = {a: [{k: _round(v) for k, v in s.items()} for s in ss] for a, ss in samples.items()}
    for t in TARGETS:
        out[t.key] = out[t.key.removesuffix("_mean")]["mean"]
    return out


def _round(v: Any) -> Any:
    return [round(x, 3) for x in v] if isinstance(v, list) else round(v, 3)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--step-delay", type=float, default=0.05, help="sleep per step (a slower model)")
    ap.add_argument("--cap-s", type=float, default=900.0, help="a run still going then is killed (counted)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    load_before, ran = os.getloadavg(), commit()
    capped: dict[str, int] = {}

    def arm(name: str) -> Any:
        def go(i: int) -> Run:
            run, hit = one_run(name, args.steps, args.step_delay, args.cap_s)
            capped[name] = capped.get(name, 0) + hit
            print(
                f"round {i + 1}/{args.repeats} {name}: {run.wall_s:.1f}s, {len(run.faults)} faults"
                + (" (capped)" if hit else ""),
                file=sys.stderr,
                flush=True,
            )
            return run

        return go

    runs = dict(zip(ARMS, rotate(args.repeats, *(arm(a) for a in ARMS)), strict=True))
    out: dict[str, Any] = {"commit": ran, "repeats": args.repeats, "steps": args.steps}
    out["step_delay_s"] = args.step_delay
    out["faults"] = schedule(args.steps)
    out.update(summarize(runs, capped))
    out["load_avg_before"] = [round(x, 2) for x in load_before]
    out["load_avg_after"] = [round(x, 2) for x in os.getloadavg()]
    out["cpus"] = os.cpu_count()
    out["machine"] = "CPU, gloo; shared and loaded"
    if args.json:
        print(json.dumps(out, indent=1))
    else:
        for key, value in out.items():
            if key != "samples" and not key.endswith("_mean"):
                print(f"{key:36} {value}")
    return finish("bench_no_restart", TARGETS, out, json_mode=args.json)


if __name__ == "__main__":
    sys.exit(main())

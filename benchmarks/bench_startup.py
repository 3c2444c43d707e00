"""First-step latency: `trainguard run` against `torchrun` on the same plain script, interleaved.

    python benchmarks/bench_startup.py [--repeats 6] [--no-cold] [--json]

The script (benchmarks/plain_ddp.py) never imports trainguard: 2 ranks, a gloo process group, a
small DDP model, 5 steps; each rank writes the time its first step completed. The clock runs from
just before the launcher's process is started to the later of the two ranks' first step, so the
launcher's own imports, the rendezvous, the workers' start, their imports, the process group and
DDP's construction are all inside it; the launcher's exit is measured too (wall). Arms, each a
fresh process in a fresh directory, in --repeats rounds rotated (A B C, B C A, C A B, ...):
`torchrun --standalone --nproc-per-node 2`, `trainguard run --standalone --nproc-per-node 2` with
its defaults (warm standbys on: the pool must not slow the first start), and for context
`trainguard run --no-warm-standby` (--no-cold leaves it out).

Keys (--json), each with _ci95 and _repeats (benchmarks/paired.py): first_step_s,
torchrun_first_step_s, cold_first_step_s; first_step_ratio_vs_torchrun (geometric mean of the
per-round ratios: target <= 1.1), cold_first_step_ratio_vs_torchrun; wall_s, torchrun_wall_s,
wall_ratio_vs_torchrun (over the rounds where both launchers exited 0); *exit_hangs (runs whose
launcher had not exited EXIT_CAP_S after its start: killed, their first step still counted);
*failed_exits (runs whose launcher exited non-zero after both first steps: a rank aborted in
torch/gloo's teardown; their first step counted, their wall not); the
samples; load (the 1-minute load average before and after, and its
mean over the run, sampled at each launch). Exit 1 when a target is missed.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from paired import mean_ci, ratio_ci, rotate, targets_json
from targets import Target, finish

SCRIPT = Path(__file__).with_name("plain_ddp.py")
TARGETS = (Target("first_step_ratio_vs_torchrun", "<=", 1.1),)
EXIT_CAP_S = 240.0  # a launcher not exited by then is killed (its run counted as an exit hang)
ARMS = {"trainguard": "", "torchrun": "torchrun_", "trainguard-cold": "cold_"}  # arm -> key prefix


def command(arm: str, work: Path) -> list[str]:
    if arm == "torchrun":
        return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                str(SCRIPT), str(work)]  # fmt: skip
    flags = ["--no-warm-standby"] if arm == "trainguard-cold" else []
    return [sys.executable, "-m", "trainguard.cli", "run", "--standalone", "--nproc-per-node", "2",
            "--db", str(work / "tg.db"), "--runs-dir", str(work / "runs"), *flags,
            str(SCRIPT), str(work)]  # fmt: skip


def measure(arm: str, loads: list[float], failed_exits: list[str]) -> tuple[float, float | None]:
    """(seconds to the later rank's first step, seconds to the launcher's exit, None when it had
    not exited EXIT_CAP_S after its start: killed, its first step still counted) of one run. A
    launcher that exits non-zero after both ranks' first step (a rank aborted in torch/gloo's
    interpreter teardown: "terminate called without an active exception", seen under torchrun)
    keeps its first step, its wall left out and its arm named in ``failed_exits``."""
    loads.append(os.getloadavg()[0])
    work = Path(tempfile.mkdtemp(prefix=f"bench-startup-{arm}-"))
    try:
        with open(work / "launcher.log", "w") as log:
            started = time.time()
            proc = subprocess.Popen(
                command(arm, work), cwd=work, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
            try:
                code: int | None = proc.wait(EXIT_CAP_S)
                wall: float | None = time.time() - started
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)  # its workers die with it (parent-death signal)
                proc.wait()
                code, wall = None, None
        firsts = [work / f"first_step.{r}" for r in (0, 1)]
        if not all(f.exists() for f in firsts):
            raise RuntimeError(f"{arm} exited {code}: {(work / 'launcher.log').read_text()[-3000:]}")
        if code not in (0, None):
            failed_exits.append(arm)
            wall = None
        return max(float(f.read_text()) for f in firsts) - started, wall
    finally:
        shutil.rmtree(work, ignore_errors=True)


def figures(repeats: int, cold: bool) -> dict[str, Any]:
    arms = [a for a in ARMS if cold or a != "trainguard-cold"]
    loads: list[float] = []
    failed_exits: list[str] = []
    load_before = os.getloadavg()[0]

    def arm_fn(arm: str) -> Callable[[int], tuple[float, float | None]]:
        return lambda _i: measure(arm, loads, failed_exits)

    got = dict(zip(arms, rotate(repeats, *(arm_fn(a) for a in arms)), strict=True))
    out: dict[str, Any] = {
        "load": {
            "before": round(load_before, 2),
            "after": round(os.getloadavg()[0], 2),
            "mean": round(statistics.fmean(loads), 2),
        }
    }
    theirs_first = [f for f, _ in got["torchrun"]]
    theirs_wall = [w for _, w in got["torchrun"]]
    for arm in arms:
        prefix = ARMS[arm]
        first, wall = [f for f, _ in got[arm]], [w for _, w in got[arm]]
        out.update(mean_ci(first).as_json(f"{prefix}first_step_s", 2))
        out[f"{prefix}first_step_samples"] = [round(f, 2) for f in first]
        out[f"{prefix}wall_samples"] = [None if w is None else round(w, 2) for w in wall]
        out[f"{prefix}failed_exits"] = failed_exits.count(arm)
        out[f"{prefix}exit_hangs"] = wall.count(None) - failed_exits.count(arm)
        if arm != "torchrun":
            out.update(ratio_ci(first, theirs_first).as_json(f"{prefix}first_step_ratio_vs_torchrun", 3))
        # wall: the rounds where both launchers exited
        pairs = [(w, t) for w, t in zip(wall, theirs_wall, strict=True) if w is not None and t is not None]
        if pairs:
            out.update(mean_ci([w for w, _ in pairs]).as_json(f"{prefix}wall_s", 2))
            if arm != "torchrun":
                ratio = ratio_ci([w for w, _ in pairs], [t for _, t in pairs])
                out.update(ratio.as_json(f"{prefix}wall_ratio_vs_torchrun", 3))
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--repeats", type=int, default=6)
    p.add_argument("--no-cold", dest="cold", action="store_false", help="leave out --no-warm-standby")
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    out: dict[str, Any] = {
        "targets": targets_json({t.key: t for t in TARGETS}),
        "repeats": args.repeats,
        **figures(args.repeats, args.cold),
    }
    if args.json:
        print(json.dumps(out))
    else:
        print(f"first step of a 2-rank gloo DDP script, {args.repeats} rotated rounds, load {out['load']}:")
        for arm, prefix in ARMS.items():
            if f"{prefix}first_step_s" in out:
                print(
                    f"  {arm:16s} first step {out[f'{prefix}first_step_s']:6.2f} s "
                    f"{out[f'{prefix}first_step_s_ci95']}  samples {out[f'{prefix}first_step_samples']}  "
                    f"wall {out[f'{prefix}wall_samples']} ({out[f'{prefix}exit_hangs']} exit hangs, "
                    f"{out[f'{prefix}failed_exits']} failed exits)"
                )
        print(
            f"  ratio vs torchrun: {out['first_step_ratio_vs_torchrun']:.3f} "
            f"(95% CI {out['first_step_ratio_vs_torchrun_ci95']})"
        )
    return finish("bench_startup", TARGETS, out, json_mode=args.json)


if __name__ == "__main__":
    sys.exit(main())

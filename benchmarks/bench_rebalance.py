"""Rebalancing uneven GPUs: samples/s of plain DDP with a slow rank, of the slow rank excluded, and
of trainguard rebalancing, on 4 simulated GPUs (gloo on the CPU).

    python benchmarks/bench_rebalance.py [--quick] [--json]

Every arm trains the same model on the same global batches (B = 48) for the same steps, the slow
GPUs made slow the same way (rebalance_worker.py: each sample costs a simulated GPU ``cost_s`` of
device time at full speed, ``cost_s / speed`` on a slow one, slept inside the forward so the host's
CPU stays free). Arms, each a fresh launch of every rank:

- ``ddp``: plain DDP + DistributedSampler with the slow rank(s), no trainguard import (baseline a);
- ``exclude``: plain DDP on the other 3 GPUs, B kept (16 per rank; baseline b): the exclusion as if
  it had happened before the start, its restart not counted (optimistic for the baseline);
- ``balance``: the Guard with ``balance=True``, ShareSampler and the loss weight (trainguard, c),
  the whole cost counted: it starts on uniform shares and measures before it moves them.

Scenarios: one GPU of 4 at 50% (``ratio_vs_ddp``, ideal 1.75, target >= 1.5; ``ratio_vs_exclude``,
ideal 1.17, target >= 1.1); GPUs at 50% and 75% (``*_uneven``); no slow GPU (``overhead_uniform``:
balance over ddp, target <= 0.01). ``loss_gap``: the relative gap of the final evaluation loss,
balance against ddp, which trained on the same samples (the same math: float noise, target <= 0.001).

``ratio_vs_exclude_restart`` (context, no target) projects baseline b with its cost: the slow GPU
kept until found (as soon as balancing finds it), then a new job's start, then the others alone.

Throughput is samples over the training loop's time (from a barrier before the first step to one
after the last, rank 0); ``launch_*`` gives the same ratios from launch to exit (process start,
imports and the process group, the same in every arm, included). Arms are interleaved, the order
rotated each round; each figure is the geometric mean of the per-round ratios with a 95% interval.
``load_*`` is the machine's 1-minute load average before, after and (min, mean, max) after each arm. ``overhead_uniform_cpu``
(context) is the same cost as CPU time: what the rebalancing arm adds to rank 0's training thread,
over the plain step's wall time (a loaded host's scheduling noise is not in it).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))

from paired import mean_ci, ratio_ci
from targets import Target, finish

TARGETS = (
    Target("ratio_vs_ddp", ">=", 1.5),
    Target("ratio_vs_exclude", ">=", 1.1),
    Target("overhead_uniform", "<=", 0.01),
    Target("loss_gap", "<=", 0.001),
)

GLOBAL_BATCH = 48
SCENARIOS = {  # name -> each GPU's speed
    "half": (1.0, 1.0, 1.0, 0.5),
    "uneven": (1.0, 1.0, 0.5, 0.75),
    "uniform": (1.0, 1.0, 1.0, 1.0),
}


def run_arm(arm: str, speeds: tuple[float, ...], steps: int, cost_s: float, folder: Path) -> dict[str, Any]:
    """Launch one job (every rank a fresh process), wait for it; its figures and launch-to-exit time."""
    import rebalance_worker

    out = folder / f"{arm}-{time.monotonic_ns()}.json"
    cfg = {
        "arm": arm,
        "speeds": list(speeds),
        "steps": steps,
        "cost_s": cost_s,
        "global_batch": GLOBAL_BATCH,
        "samples": GLOBAL_BATCH * 20,  # 20 steps per epoch, a multiple of 3 and 4 ranks' batches
    }
    rendezvous, world = folder / f"pg-{time.monotonic_ns()}", len(speeds)  # a file: no port to race for
    ctx = multiprocessing.get_context("forkserver")
    t0 = time.perf_counter()
    procs = [
        ctx.Process(target=rebalance_worker.main, args=(r, world, str(rendezvous), cfg, str(out)))
        for r in range(world)
    ]
    for p in procs:
        p.start()
    for p in procs:
        p.join()
    launch_s = time.perf_counter() - t0
    if any(p.exitcode != 0 for p in procs):
        raise RuntimeError(f"arm {arm} {speeds}: a rank exited with {[p.exitcode for p in procs]}")
    result: dict[str, Any] = json.loads(out.read_text())
    result["launch_s"] = launch_s
    result["samples_per_s"] = result["samples"] / result["loop_s"]
    result["launch_samples_per_s"] = result["samples"] / launch_s
    return result


def arms_for(scenario: str) -> dict[str, tuple[str, tuple[float, ...]]]:
    speeds = SCENARIOS[scenario]
    arms = {"ddp": ("ddp", speeds), "balance": ("balance", speeds)}
    if scenario != "uniform":
        slowest = min(range(len(speeds)), key=lambda i: speeds[i])
        arms["exclude"] = ("ddp", speeds[:slowest] + speeds[slowest + 1 :])
    return arms


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="fewer steps and rounds (a smoke run)")
    p.add_argument("--json", action="store_true", help="one JSON object on stdout")
    p.add_argument("--rounds", type=int, default=None)
    p.add_argument("--steps", type=int, default=None)
    p.add_argument(
        "--cost-ms", type=float, default=10.0, help="simulated device time per sample at full speed"
    )
    args = p.parse_args()
    rounds = args.rounds or (1 if args.quick else 3)
    steps = args.steps or (100 if args.quick else 400)
    cost_s = args.cost_ms / 1000
    multiprocessing.set_forkserver_preload(["torch", "torch.distributed"])  # torch only: not our code
    load_before = os.getloadavg()[0]
    loads: list[float] = []  # the 1-minute load average after each arm
    figures: dict[str, dict[str, list[dict[str, Any]]]] = {s: {} for s in SCENARIOS}
    with tempfile.TemporaryDirectory(prefix="tg-bench-rebalance-") as tmp:
        folder = Path(tmp)
        for i in range(rounds):
            for scenario in SCENARIOS:
                arms = list(arms_for(scenario).items())
                k = i % len(arms)
                for name, (arm, speeds) in arms[k:] + arms[:k]:  # the order rotates every round
                    result = run_arm(arm, speeds, steps, cost_s, folder)
                    figures[scenario].setdefault(name, []).append(result)
                    loads.append(os.getloadavg()[0])
                    print(
                        f"round {i} {scenario:8s} {name:8s} {result['samples_per_s']:8.1f} samples/s "
                        f"(loop {result['loop_s']:.1f}s, launch {result['launch_s']:.1f}s)",
                        file=sys.stderr,
                    )
    out = summarise(figures)
    out.update(
        rounds=rounds,
        steps=steps,
        global_batch=GLOBAL_BATCH,
        cost_ms_per_sample=args.cost_ms,
        load_before=round(load_before, 2),
        load_after=round(os.getloadavg()[0], 2),
        load_during=[round(min(loads), 1), round(sum(loads) / len(loads), 1), round(max(loads), 1)],
        cpus=os.cpu_count(),
    )
    if args.json:
        print(json.dumps(out, indent=1))
    else:
        for key, value in out.items():
            print(f"{key:34s} {value}")
    return finish("bench_rebalance", TARGETS, out, json_mode=args.json)


def summarise(figures: dict[str, dict[str, list[dict[str, Any]]]]) -> dict[str, Any]:
    out: dict[str, Any] = {}

    def rate(scenario: str, arm: str, key: str = "samples_per_s") -> list[float]:
        return [r[key] for r in figures[scenario][arm]]

    for scenario, suffix in (("half", ""), ("uneven", "_uneven")):
        for base in ("ddp", "exclude"):
            r = ratio_ci(rate(scenario, "balance"), rate(scenario, base))
            out.update(r.as_json(f"ratio_vs_{base}{suffix}"))
            launch = ratio_ci(
                rate(scenario, "balance", "launch_samples_per_s"),
                rate(scenario, base, "launch_samples_per_s"),
            )
            out[f"launch_ratio_vs_{base}{suffix}"] = round(launch.value, 4)
        for arm in ("ddp", "exclude", "balance"):
            out[f"samples_per_s_{arm}{suffix}"] = round(mean_ci(rate(scenario, arm)).value, 1)
        out[f"moves{suffix}"] = [m["shares"] for m in figures[scenario]["balance"][-1]["moves"]]
        runs = figures[scenario]
        projected = [
            excluded_after_detection(d, e, b)
            for d, e, b in zip(runs["ddp"], runs["exclude"], runs["balance"], strict=True)
        ]
        out[f"ratio_vs_exclude_restart{suffix}"] = round(
            ratio_ci(rate(scenario, "balance"), projected).value, 4
        )
    over = ratio_ci(rate("uniform", "ddp"), rate("uniform", "balance"))  # > 1: balancing costs time
    out["overhead_uniform"] = round(over.value - 1, 4)
    ci = over.ci95
    out["overhead_uniform_ci95"] = None if ci is None else [round(ci[0] - 1, 4), round(ci[1] - 1, 4)]
    out["overhead_uniform_repeats"] = over.repeats
    # The same cost as CPU time: what trainguard adds to rank 0's training thread per step, over
    # the plain step's wall time (a loaded host's scheduling noise is not in it)
    uniform = figures["uniform"]
    added = [
        (b["cpu_s"] - a["cpu_s"]) / a["loop_s"]
        for a, b in zip(uniform["ddp"], uniform["balance"], strict=True)
    ]
    out.update(mean_ci(added).as_json("overhead_uniform_cpu"))
    out["moves_uniform"] = [m["shares"] for r in figures["uniform"]["balance"] for m in r["moves"]]
    gaps = [
        abs(b["eval_loss"] - a["eval_loss"]) / a["eval_loss"]
        for scenario in SCENARIOS
        for a, b in zip(figures[scenario]["ddp"], figures[scenario]["balance"], strict=True)
    ]
    out["loss_gap"] = float(f"{max(gaps):.3g}")
    out["eval_loss_ddp"] = round(figures["half"]["ddp"][0]["eval_loss"], 6)
    return out


def excluded_after_detection(ddp: dict[str, Any], exclude: dict[str, Any], balance: dict[str, Any]) -> float:
    """samples/s of a job that runs with the slow GPU until it is found (as soon as balancing
    found it), restarts without it (a new job's start: the exclude arm's launch less its loop)
    and finishes on the others. A projection from the round's measured times; a real exclusion
    also loses the steps since the last checkpoint, left out here."""
    steps = ddp["samples"] / GLOBAL_BATCH
    moves = balance["moves"]
    found = min(steps, moves[0]["step"] + 2) if moves else steps  # the first step on new shares
    start = exclude["launch_s"] - exclude["loop_s"]
    seconds = found * ddp["loop_s"] / steps + start + (steps - found) * exclude["loop_s"] / steps
    return float(ddp["samples"] / seconds)


if __name__ == "__main__":
    raise SystemExit(main())

"""Overhead of the Guard on a training step: the same small CNN with and without it, interleaved.

    python benchmarks/bench_guard_overhead.py [--quick] [--json]

Blocks of bare steps and guarded steps alternate (A B, then B A) so that drift of the machine
(thermal, caches, frequency, other jobs) hits both alike. Time is the training thread's CPU time
(``time.thread_time``): on a shared machine wall time mostly measures who else got the core.
A guarded step is the documented loop: ``guard.step`` after backward and ``guard.end_step`` (what
``guard.range`` runs) after the update. Each round gives one ratio (guarded - bare) / bare per
variant; ``overhead`` is the median over rounds for the Guard as constructed with its defaults
(on this CPU, one process: every step read at once). ``overhead_lazy`` is the same with
``check_every=8, check_lag=1``, the default on a GPU or with several ranks (the same code path
runs here on CPU). ``overhead_check_grads`` adds ``guard.check_grads(model)`` to the default.
The Guard runs as in production: a run directory with heartbeats, the hang watchdog thread,
numerics on every step, preemption handlers, an (empty) chaos file.
``overhead_direct`` (and ``_lazy``) is the time spent inside the Guard's calls divided by the
bare step time: the same quantity without the A/B noise, but with the clock reads around the
calls (each a system call, right after backward). ``overhead_ci95`` is a 95% confidence interval
of the A/B median, from its order statistics. Target: ``overhead`` <= 0.005.

``overhead_2rank``: the same A/B on rank 0 of a 2-rank DDP job over gloo, where the default Guard
packs each window's losses and flags and all-reduces them (guard_2rank.py); target <= 0.01.
``overhead_2rank_wall`` is its wall-clock twin (collective waits included), ``overhead_2rank_direct``
the time inside the Guard's calls over the bare step's, as ``overhead_direct``. ``watchdog_cpu_s`` and
``watchdog_cpu_fraction``: CPU time of the Guard's hang-watchdog thread during the 2-rank rounds,
and that divided by their wall time (the share of one core it takes).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import shutil
import statistics
import tempfile
from pathlib import Path
from typing import Any

import torch

import guard_2rank
from guard_loop import bare_steps, guarded_steps
from targets import Target, finish
from trainguard.demo.train_digits import DigitsCNN  # the example's network: the same model
from trainguard.torch.guard import Guard

# The 2-rank A/B runs on the CPU (gloo) only: with --device cuda its figure is absent.
TARGETS = (Target("overhead_direct", "<=", 0.005), Target("overhead_2rank", "<=", 0.01, optional=True))

VARIANTS = {  # name -> (Guard options, check_grads)
    "default": ({}, False),
    "lazy": ({"check_every": 8, "check_lag": 1}, False),
    "check_grads": ({}, True),
}


def median_ci95(values: list[float]) -> tuple[float, float] | None:
    """A distribution-free 95% confidence interval of the median: the order statistics at
    n/2 -+ 1.96 sqrt(n)/2 (rounds are independent: each is its own A/B pair)."""
    n = len(values)
    if n < 10:
        return None
    ranked = sorted(values)
    half = 1.96 * math.sqrt(n) / 2
    return ranked[max(0, math.floor(n / 2 - half))], ranked[min(n - 1, math.ceil(n / 2 + half))]


def two_rank_figures(two: dict[str, Any] | None) -> dict[str, Any]:
    if two is None:
        return {}
    return {
        "overhead_2rank": statistics.median(two["cpu"]),
        "overhead_2rank_wall": statistics.median(two["wall"]),
        "overhead_2rank_direct": two["direct"],
        "overhead_2rank_ci95": median_ci95(two["cpu"]),
        "bare_step_ms_2rank": two["bare_step_ms"],
        "guard_step_2rank_us": two["guard_step_us"],
        "check_mode_2rank": two["mode"],
        "watchdog_cpu_s": two["watchdog_cpu_s"],
        "watchdog_cpu_fraction": (
            two["watchdog_cpu_s"] / two["elapsed_s"] if two["watchdog_cpu_s"] is not None else None
        ),
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rounds", type=int, default=100)
    p.add_argument("--block", type=int, default=24, help="steps per block (a multiple of 8)")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--quick", action="store_true", help="6 rounds of 20 steps")
    p.add_argument("--rounds-2rank", type=int, default=30)
    p.add_argument("--device", default="cpu", help="cpu, or cuda: the step on a GPU (one process)")
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    if args.quick:
        args.rounds, args.block, args.rounds_2rank = 6, 20, 6

    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = DigitsCNN().to(args.device)
    # A small learning rate: the model must not memorise the 16 batches (at losses near 1e-8 every
    # step is a "spike" in log space and takes the slow path, which is not what is measured here).
    opt = torch.optim.Adam(model.parameters(), lr=1e-5)
    data = [
        (
            torch.rand(args.batch_size, 1, 8, 8, device=args.device),
            torch.randint(0, 10, (args.batch_size,), device=args.device),
        )
        for _ in range(16)
    ]
    root = Path(tempfile.mkdtemp(prefix="bench-guard-"))
    inside = [0.0]

    def bare(n: int) -> tuple[float, float]:
        inside[0] = 0.0
        return bare_steps(model, opt, data, n, inside)

    def guarded(guard: Guard, n: int, grads: bool) -> tuple[float, float]:
        inside[0] = 0.0
        return guarded_steps(guard, model, opt, data, n, inside, grads)

    names = list(VARIANTS)
    ratios: dict[str, list[float]] = {name: [] for name in [*names, "wall"]}
    inside_by = dict.fromkeys(names, 0.0)
    bare_total, beats = 0.0, 0
    try:
        with contextlib.ExitStack() as stack:
            guards = {}
            for name, (options, _) in VARIANTS.items():
                run_dir = root / name
                run_dir.mkdir()
                (run_dir / "chaos.json").write_text(json.dumps({"faults": []}))
                guard = Guard(None, None, run_dir=run_dir, on_spike="warn", **options)  # type: ignore[arg-type]
                guards[name] = stack.enter_context(guard)
            bare(args.block)  # warm-up
            for name in names:
                guarded(guards[name], args.block, VARIANTS[name][1])
            for r in range(args.rounds):
                for name in names if r % 2 == 0 else reversed(names):
                    grads = VARIANTS[name][1]
                    if r % 2 == 0:  # A B, then B A next round
                        (b, bw), clocks = bare(args.block), inside[0]
                        (g, gw), spent = guarded(guards[name], args.block, grads), inside[0]
                    else:
                        (g, gw), spent = guarded(guards[name], args.block, grads), inside[0]
                        (b, bw), clocks = bare(args.block), inside[0]
                    ratios[name].append((g - b) / b)
                    if name == "default":
                        ratios["wall"].append((gw - bw) / bw)
                    bare_total += b / len(names)
                    inside_by[name] += spent - clocks  # less what reading the clocks costs
        beats = len((root / "default" / "heartbeat" / "rank0.jsonl").read_text().splitlines())
    finally:
        shutil.rmtree(root, ignore_errors=True)

    # The 2-rank A/B runs over gloo on the CPU; on a GPU the one-process figures are the point.
    two = guard_2rank.run(args.rounds_2rank, args.block, args.batch_size) if args.device == "cpu" else None
    steps = args.rounds * args.block
    bare_step = bare_total / steps
    quartiles = statistics.quantiles(ratios["default"], n=4) if len(ratios["default"]) >= 4 else None
    result = {
        "overhead": statistics.median(ratios["default"]),
        "overhead_lazy": statistics.median(ratios["lazy"]),
        "overhead_check_grads": statistics.median(ratios["check_grads"]),
        "overhead_wall": statistics.median(ratios["wall"]),
        "overhead_direct": inside_by["default"] / bare_total,
        "overhead_direct_lazy": inside_by["lazy"] / bare_total,
        "overhead_direct_check_grads": inside_by["check_grads"] / bare_total,
        "overhead_spread": quartiles[2] - quartiles[0] if quartiles else None,
        "overhead_ci95": median_ci95(ratios["default"]),
        "bare_step_ms": bare_step * 1e3,
        "guard_step_us": inside_by["default"] / steps * 1e6,
        "guard_step_lazy_us": inside_by["lazy"] / steps * 1e6,
        "guard_step_check_grads_us": inside_by["check_grads"] / steps * 1e6,
        **two_rank_figures(two),
        "heartbeats_written": beats,
        "rounds": args.rounds,
        "steps": (1 + len(names)) * steps,
        "device": args.device,
        "target": 0.005,
        "target_2rank": 0.01,
    }
    if args.json:
        print(json.dumps(result))
    else:
        print(
            f"bare step: {result['bare_step_ms']:.2f} ms CPU ({steps} steps per variant, {args.rounds} rounds)"
        )
        print(
            f"Guard calls per step: default {result['guard_step_us']:.1f} us, lazy "
            f"{result['guard_step_lazy_us']:.1f} us, with check_grads {result['guard_step_check_grads_us']:.1f} us "
            f"({beats} heartbeats written by the default Guard)"
        )
        spread, ci = result["overhead_spread"], result["overhead_ci95"]
        print(
            f"overhead (A/B median): default {result['overhead']:+.4f}, lazy {result['overhead_lazy']:+.4f}, "
            f"check_grads {result['overhead_check_grads']:+.4f}  (interquartile spread "
            f"{spread if spread is None else round(spread, 4)}; wall clock: {result['overhead_wall']:+.4f})"
        )
        if ci is not None:
            print(f"  95% confidence interval of the default's median: [{ci[0]:+.4f}, {ci[1]:+.4f}]")
        print(
            f"overhead (time inside the Guard / bare step): default {result['overhead_direct']:.4f}, lazy "
            f"{result['overhead_direct_lazy']:.4f}, check_grads {result['overhead_direct_check_grads']:.4f}  "
            "(target <= 0.005)"
        )
        if two is not None:
            every, lag = result["check_mode_2rank"]
            print(
                f"2 ranks over gloo (check every {every}, lag {lag}): overhead {result['overhead_2rank']:+.4f} "
                f"(target <= 0.01; wall clock {result['overhead_2rank_wall']:+.4f}; inside the Guard's calls "
                f"{result['overhead_2rank_direct']:.4f}: {result['guard_step_2rank_us']:.1f} us of a "
                f"{result['bare_step_ms_2rank']:.2f} ms step); watchdog thread "
                f"{result['watchdog_cpu_s']} s CPU = {result['watchdog_cpu_fraction']} of a core"
            )
    return finish("bench_guard_overhead", TARGETS, result, json_mode=args.json)


if __name__ == "__main__":
    raise SystemExit(main())

"""Overhead of the Guard on a training step: the same small CNN with and without it, interleaved.

    python benchmarks/bench_guard_overhead.py [--quick] [--json]

Blocks of bare steps and guarded steps alternate (A B B A ...) so that drift of the machine
(thermal, caches, frequency) hits both alike. Time is the training thread's CPU time
(``time.thread_time``): on a shared machine wall time mostly measures who else got the core.
Each round gives one ratio (guarded - bare) / bare; ``overhead`` is the median over rounds
(``overhead_wall``: the same from wall-clock time). The Guard runs as in production:
a run directory with heartbeats, the hang watchdog thread, numerics on every step, preemption
handlers, an (empty) chaos file. ``overhead_check_grads`` adds ``guard.check_grads(model)``.
``overhead_direct`` is the time spent inside the Guard's calls divided by the bare step time: the
same quantity measured without the A/B noise. Target: ``overhead`` <= 0.005.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from trainguard.torch.guard import Guard


class DigitsCNN(nn.Module):  # the network of examples/train_digits.py
    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, 16, 3, padding=1)
        self.conv2 = nn.Conv2d(16, 32, 3, padding=1)
        self.fc1 = nn.Linear(32 * 4 * 4, 64)
        self.fc2 = nn.Linear(64, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.conv1(x))
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        return self.fc2(F.relu(self.fc1(x.flatten(1))))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rounds", type=int, default=40)
    p.add_argument("--block", type=int, default=50, help="steps per block")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--quick", action="store_true", help="6 rounds of 20 steps")
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    if args.quick:
        args.rounds, args.block = 6, 20

    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = DigitsCNN()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    data = [
        (torch.rand(args.batch_size, 1, 8, 8), torch.randint(0, 10, (args.batch_size,))) for _ in range(16)
    ]
    run_dir = Path(tempfile.mkdtemp(prefix="bench-guard-"))
    (run_dir / "chaos.json").write_text(json.dumps({"faults": []}))
    inside = [0.0]
    step_no = [0]

    def bare(n: int) -> tuple[float, float]:
        t0, w0 = time.thread_time(), time.perf_counter()
        for i in range(n):
            x, y = data[i % len(data)]
            F.cross_entropy(model(x), y).backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
        return time.thread_time() - t0, time.perf_counter() - w0

    def guarded(guard: Guard, n: int, grads: bool) -> tuple[float, float]:
        t0, w0 = time.thread_time(), time.perf_counter()
        for i in range(n):
            x, y = data[i % len(data)]
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            g0 = time.thread_time()
            if grads:
                guard.check_grads(model)
            action = guard.step(step_no[0], loss)
            inside[0] += time.thread_time() - g0
            step_no[0] += 1
            if action == "proceed":
                opt.step()
            opt.zero_grad(set_to_none=True)
        return time.thread_time() - t0, time.perf_counter() - w0

    try:
        with Guard(None, None, run_dir=run_dir, on_spike="warn") as guard:
            bare(args.block)  # warm-up
            guarded(guard, args.block, True)
            ratios: dict[str, list[float]] = {"loss": [], "grads": [], "wall": []}
            bare_total, inside_by = 0.0, {"loss": 0.0, "grads": 0.0}
            for r in range(args.rounds):
                for variant in ("loss", "grads"):
                    inside[0] = 0.0
                    if r % 2 == 0:  # A B, then B A next round
                        b, bw = bare(args.block)
                        g, gw = guarded(guard, args.block, variant == "grads")
                    else:
                        g, gw = guarded(guard, args.block, variant == "grads")
                        b, bw = bare(args.block)
                    ratios[variant].append((g - b) / b)
                    if variant == "loss":
                        ratios["wall"].append((gw - bw) / bw)
                    bare_total += b / 2
                    inside_by[variant] += inside[0]
            beats = len((run_dir / "heartbeat" / "rank0.jsonl").read_text().splitlines())
    finally:
        shutil.rmtree(run_dir, ignore_errors=True)

    steps = args.rounds * args.block
    bare_step = bare_total / steps
    result = {
        "overhead": statistics.median(ratios["loss"]),
        "overhead_check_grads": statistics.median(ratios["grads"]),
        "overhead_wall": statistics.median(ratios["wall"]),
        "overhead_direct": inside_by["loss"] / bare_total,
        "overhead_direct_check_grads": inside_by["grads"] / bare_total,
        "overhead_spread": statistics.quantiles(ratios["loss"], n=4)[2]
        - statistics.quantiles(ratios["loss"], n=4)[0]
        if len(ratios["loss"]) >= 4
        else None,
        "bare_step_ms": bare_step * 1e3,
        "guard_step_us": inside_by["loss"] / steps * 1e6,
        "guard_step_check_grads_us": inside_by["grads"] / steps * 1e6,
        "heartbeats_written": beats,
        "steps": 2 * steps,
        "target": 0.005,
    }
    if args.json:
        print(json.dumps(result))
    else:
        print(
            f"bare step: {result['bare_step_ms']:.2f} ms CPU ({steps} steps per variant, {args.rounds} rounds)"
        )
        print(
            f"guard.step: {result['guard_step_us']:.1f} us/step; with check_grads: "
            f"{result['guard_step_check_grads_us']:.1f} us/step ({beats} heartbeats written)"
        )
        print(
            f"overhead (A/B median): {result['overhead']:+.4f}  with check_grads: "
            f"{result['overhead_check_grads']:+.4f}  (interquartile spread {result['overhead_spread']:.4f}; "
            f"wall clock: {result['overhead_wall']:+.4f})"
        )
        print(
            f"overhead (time inside the Guard / bare step): {result['overhead_direct']:.4f}  "
            f"with check_grads: {result['overhead_direct_check_grads']:.4f}  (target <= 0.005)"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

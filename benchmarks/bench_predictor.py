"""What the neural failure predictor costs the node agent: CPU time per GPU per call, for a node
of 8 GPUs scored in one batch, against the fixed rules' cost for the same GPUs' readings.

    python benchmarks/bench_predictor.py                 # trains a small MLP and CNN first
    python benchmarks/bench_predictor.py --model FILE    # times a saved model file
    python benchmarks/bench_predictor.py --json

Each round scores 8 GPUs' series of one window (12 h of 10-minute steps) through
``Predictor.predict_many`` twice: quiet GPUs (no alarm: one forward pass) and alarmed ones (the
forward pass plus the backward pass that names the readings), and runs ``RuleState.evaluate``
over one reading of each GPU (what the agent already spends per tick). Rounds are interleaved
(A B, B A ...), timed in this process's CPU time. The predictor runs once per closed series step
(every 10 minutes in the simulated fleet, every minute at most), the rules once per tick.

Keys: ``predict_us_per_gpu`` and ``explain_us_per_gpu`` (target <= 5,000: at a 1-minute step,
an 8-GPU node spends under 0.1% of a core), ``rules_us_per_gpu`` and ``ratio`` (predict /
rules), each with _ci95 and _repeats; ``arch``. Exit 1 when a target is missed.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import random
import sys
import time
from typing import Any

from paired import interleave, mean_ci, missed, ratio_ci, targets_json
from trainguard.detect.rules import RuleState
from trainguard.predictor.predictor import Predictor
from trainguard.predictor.series import GpuSeries, Point
from trainguard.records import Gpu, Sample

TARGETS = {"predict_us_per_gpu": ("<=", 5000.0), "explain_us_per_gpu": ("<=", 5000.0)}
STEP, H = 600.0, 3600.0


def _series(rng: random.Random, gpu: int, failing: bool, hours: float = 30.0) -> tuple[Point, ...]:
    sbe, pts = 0.0, []
    for k in range(int(hours * H / STEP)):
        sbe += 0.2 * rng.random() + (0.5 * math.exp(k * STEP / (3 * H)) if failing and k > hours * 3 else 0.0)
        pts.append(
            Point(
                k * STEP, STEP, n=2, temperature_c=60 + rng.gauss(0, 1), temp_slowdown_c=89.0, util_gpu_pct=95.0,
                power_w=600.0, power_limit_w=700.0, sm_clock_mhz=1900.0, sm_clock_max_mhz=1980.0, throttled=0.0,
                ecc_sbe_aggregate=float(int(sbe)), ecc_dbe_aggregate=0.0, remap_correctable=0.0,
                remap_uncorrectable=0.0, pcie_replay=0.0, nvlink_crc_errors=0.0,
            )
        )  # fmt: skip
    return tuple(pts)


def _trained(arch: str) -> Predictor:
    from trainguard.predictor.store import StoreLife
    from trainguard.predictor.train import train

    rng = random.Random(1)
    lives = []
    for i in range(80):
        pts = _series(rng, i, failing=i % 2 == 0)
        fail = pts[-1].t + 2 * STEP if i % 2 == 0 else None
        lives.append(StoreLife("bench", i, pts, fail, "dbe" if fail else "healthy"))
    t = train(lives, arch=arch, epochs=2)
    return Predictor(t.header, t.net)


def _cpu(fn: Any, repeat: int) -> float:
    t0 = time.process_time()
    for _ in range(repeat):
        fn()
    return (time.process_time() - t0) / repeat


def bench(predictor: Predictor, rounds: int, repeat: int) -> dict[str, Any]:
    rng = random.Random(2)
    quiet = [GpuSeries("bench", g, _series(rng, g, failing=False)) for g in range(8)]
    loud = [GpuSeries("bench", g, _series(rng, g, failing=True)) for g in range(8)]
    # Alarm every GPU for the explain path, whatever this model's threshold.
    alarmed = Predictor(dataclasses.replace(predictor.header, thresholds=(0.0, 0.0)), predictor.net)
    rules = RuleState()
    readings = [[Sample(Gpu(g), float(t), temperature_c=60.0, util_gpu_pct=95.0, pcie_replay=t) for g in range(8)]
                for t in range(repeat * 2 * rounds + 2)]  # fmt: skip
    tick = iter(readings)

    def predict(_: int) -> float:
        return _cpu(lambda: predictor.predict_many(quiet), repeat) / 8 * 1e6

    def rules_tick(_: int) -> float:
        return _cpu(lambda: rules.evaluate(next(tick)), repeat) / 8 * 1e6

    pred, base = interleave(rounds, predict, rules_tick)
    explain = [_cpu(lambda: alarmed.predict_many(loud), repeat) / 8 * 1e6 for _ in range(rounds)]
    assert all(p is not None and p.alarm and p.drivers for p in alarmed.predict_many(loud))
    return {
        "arch": predictor.header.arch,
        **mean_ci(pred).as_json("predict_us_per_gpu", 1),
        **mean_ci(explain).as_json("explain_us_per_gpu", 1),
        **mean_ci(base).as_json("rules_us_per_gpu", 2),
        **ratio_ci(pred, base).as_json("ratio", 1),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", help="a saved model file (default: train a small MLP and CNN first)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--repeat", type=int, default=50, help="calls timed together in a round")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    models = [Predictor.load(args.model)] if args.model else [_trained("mlp"), _trained("cnn")]
    out: dict[str, Any] = {"results": [bench(m, args.rounds, args.repeat) for m in models]}
    out["targets"] = targets_json(TARGETS)
    out["missed"] = [f"{r['arch']}: {m}" for r in out["results"] for m in missed(r, TARGETS)]
    if args.json:
        print(json.dumps(out, indent=1))
    else:
        for r in out["results"]:
            print(
                f"{r['arch']}: predict {r['predict_us_per_gpu']:.0f} us/GPU {r['predict_us_per_gpu_ci95']}, with the "
                f"readings named {r['explain_us_per_gpu']:.0f} us/GPU; the fixed rules {r['rules_us_per_gpu']:.1f} "
                f"us/GPU; ratio {r['ratio']:.0f}x"
            )
        print("missed:", out["missed"] or "none")
    return 1 if out["missed"] else 0


if __name__ == "__main__":
    sys.exit(main())

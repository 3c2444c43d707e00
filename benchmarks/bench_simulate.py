"""How long the cluster failure simulator takes for Llama 3's run: 16,384 GPUs x 54 days x
1,000 trials, on one core.

    python benchmarks/bench_simulate.py            # human summary
    python benchmarks/bench_simulate.py --json     # one JSON object

`trainguard.reliability.simulate.simulate` at its default calibration (~419 failures per trial,
18 root-cause categories, checkpoints every 30 min, 10 min restarts), timed with the process
CPU clock (one core: BLAS and OpenMP pools are pinned to one thread before numpy loads).
Baseline, measured in the same run: a plain numpy draw of the same number of exponential
samples as the simulator's gap matrix (the least any Monte Carlo of these failures must do).
Median of --repeats runs each. Keys: ``seconds`` (target < 5), ``baseline_seconds``, ``ratio``
(seconds / baseline_seconds), ``samples`` (exponential draws), ``interruptions_mean``, ``ettr_mean``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

from targets import Target, finish

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import numpy as np  # noqa: E402

from trainguard.reliability.simulate import SimConfig, simulate  # noqa: E402

TARGET_S = 5.0


def _cpu(fn: object) -> float:
    t0 = time.process_time()
    fn()  # type: ignore[operator]
    return time.process_time() - t0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gpus", type=int, default=16_384)
    ap.add_argument("--days", type=float, default=54.0)
    ap.add_argument("--trials", type=int, default=1000)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    args = ap.parse_args()

    cfg = SimConfig(gpus=args.gpus, days=args.days, trials=args.trials, seed=0)
    result = simulate(cfg)  # warm-up: imports, page faults
    mean_count = cfg.rate_per_s * cfg.days * 86_400.0
    samples = args.trials * int(mean_count + 8.0 * mean_count**0.5 + 16)  # the simulator's gap matrix
    rng = np.random.default_rng(1)
    sim_s, base_s = [], []
    for i in range(args.repeats):  # interleaved, so both see the same machine load
        sim_s.append(
            _cpu(lambda i=i: simulate(SimConfig(gpus=args.gpus, days=args.days, trials=args.trials, seed=i)))
        )
        base_s.append(_cpu(lambda: rng.exponential(1.0, size=samples)))
    seconds, base = statistics.median(sim_s), statistics.median(base_s)
    summary = result.summary()
    out = {
        "seconds": round(seconds, 4),
        "baseline_seconds": round(base, 4),
        "ratio": round(seconds / base, 2),
        "target_seconds": TARGET_S,
        "samples": samples,
        "gpus": args.gpus,
        "days": args.days,
        "trials": args.trials,
        "interruptions_mean": summary["interruptions_mean"],
        "ettr_mean": summary["ettr_mean"],
    }
    targets = (Target("seconds", "<", TARGET_S),)
    if args.json:
        print(json.dumps(out))
        return finish("bench_simulate", targets, out, json_mode=True)
    print(
        f"simulate: {args.gpus:,} GPUs x {args.days:g} days x {args.trials} trials (median of {args.repeats}, CPU time)"
    )
    print(f"  simulator:                       {seconds:.3f} s   (target < {TARGET_S:g} s)")
    print(f"  numpy draw of {samples:,} exponentials: {base:.3f} s")
    print(
        f"  ratio: {out['ratio']}x the bare draw; {summary['interruptions_mean']:.1f} interruptions per trial, ETTR {summary['ettr_mean']:.4f}"
    )
    return finish("bench_simulate", targets, out)


if __name__ == "__main__":
    sys.exit(main())

"""What serving the failure predictor costs the node agent: CPU per GPU per scored step and per
tick, the daemon as `trainguard agent --predictor MODEL` assembles it against the same daemon
without the model.

    python benchmarks/bench_agent_predictor.py                 # trains a small MLP first (10-minute steps)
    python benchmarks/bench_agent_predictor.py --model FILE    # a saved model file
    python benchmarks/bench_agent_predictor.py --json

Three arms, each `assemble(config)` (remediation as its act, a SQLite incident store in a
temporary directory, the telemetry series at the model's step) over a simulated 8-GPU node:
``baseline`` (no model), ``quiet`` (the model: no GPU alarmed, one forward pass per closed step)
and ``alarmed`` (the same weights with thresholds 0: every GPU alarmed at every step, so every
scoring adds the backward pass that names the readings: the worst case). A virtual clock moves
``--tick-s`` per tick (default 10 s: a 600 s step closes every 60 ticks, so a round of 600
ticks scores each GPU 10 times). Each round runs ``--ticks`` ticks of every arm, the order
rotated from round to round; the whole tick is timed in the process's CPU time.

Keys (each with _ci95 and _repeats, benchmarks/paired.py): baseline_tick_cpu_us, and per model
arm (quiet_, alarmed_): tick_cpu_us, extra_cpu_us (the paired difference per tick against the
baseline), per_gpu_step_us (extra_cpu_us x ticks per step / GPUs: what scoring one GPU once costs
the agent, target <= 5,000), per_gpu_tick_1hz_us (per_gpu_step_us / step_s: per GPU per tick
of an agent at 1 Hz, derived from the measured per-step cost), detector_us_per_gpu_step (the
detector's own wall time per GPU scored, FailurePredictor.seconds / scored); scored (GPU steps
scored per arm and round); load (os.getloadavg before and after). Exit 1 when a target is missed.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from paired import diff_ci, mean_ci, missed, targets_json

TARGETS = {"quiet_per_gpu_step_us": ("<=", 5000.0), "alarmed_per_gpu_step_us": ("<=", 5000.0)}
GPUS = 8


class Arm:
    """One daemon and its virtual clock, ticked in blocks."""

    def __init__(self, tmp: Path, name: str, step_s: float, tick_s: float, model: Path | None) -> None:
        from trainguard.agent import AgentConfig
        from trainguard.agent.assemble import assemble
        from trainguard.clock import VirtualClock

        d = tmp / name
        d.mkdir()
        config = AgentConfig(
            backend="sim", gpus=GPUS, db=str(d / "tg.db"), state_dir=str(d), hostname="node-a",
            series_step_s=step_s, series_points=360, predictor=str(model or ""),
        )  # fmt: skip
        self.tick_s, self.clock = tick_s, VirtualClock(1_000_000.0)
        self.daemon = assemble(config, clock=self.clock)
        self.detector = next((d for d in self.daemon.agent.detectors if d.name == "failure_predictor"), None)
        for _ in range(int(13 * 3600 / tick_s)):  # a full window of series before the timing
            self.clock.advance(tick_s)
            self.daemon.step()

    def run(self, ticks: int) -> tuple[float, int, float]:
        """(CPU seconds per tick, GPU steps scored, the detector's wall seconds) over ``ticks``."""
        scored0 = getattr(self.detector, "scored", 0)
        seconds0 = getattr(self.detector, "seconds", 0.0)
        c0 = time.process_time()
        for _ in range(ticks):
            self.clock.advance(self.tick_s)
            self.daemon.step()
        cpu = (time.process_time() - c0) / ticks
        return (
            cpu,
            getattr(self.detector, "scored", 0) - scored0,
            getattr(self.detector, "seconds", 0.0) - seconds0,
        )

    def close(self) -> None:
        self.daemon.close()


def small_model(tmp: Path) -> Path:
    """A small MLP on a simulated fleet's 10-minute steps: the architecture and input the agent
    serves (its accuracy does not matter here)."""
    from trainguard.predictor import modelfile
    from trainguard.predictor.simfleet import simulate_fleet
    from trainguard.predictor.train import train

    t = train(simulate_fleet(nodes=6, hours=36, seed=3), seed=0, arch="mlp", epochs=2, source="bench")
    return modelfile.save(tmp / "model.safetensors", t.header, t.net.state_dict())


def alarming(model: Path, tmp: Path) -> Path:
    """The same model with every threshold 0: every GPU alarmed, its readings named, each step."""
    from trainguard.predictor import modelfile

    header, state = modelfile.load(model)
    zero = dataclasses.replace(header, thresholds=tuple(0.0 for _ in header.thresholds))
    return modelfile.save(tmp / "alarmed.safetensors", zero, state)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", help="a saved model file (default: train a small MLP first)")
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--ticks", type=int, default=600, help="ticks per arm per round (default 600)")
    p.add_argument("--tick-s", type=float, default=10.0, help="virtual seconds per tick (default 10)")
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    from trainguard.predictor.modelfile import read_header

    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        model = Path(args.model) if args.model else small_model(tmp)
        header = read_header(model)
        step_s = header.step_s
        arms = {
            "baseline": Arm(tmp, "baseline", step_s, args.tick_s, None),
            "quiet": Arm(tmp, "quiet", step_s, args.tick_s, model),
            "alarmed": Arm(tmp, "alarmed", step_s, args.tick_s, alarming(model, tmp)),
        }
        runs: dict[str, list[tuple[float, int, float]]] = {k: [] for k in arms}
        try:
            names = list(arms)
            for r in range(args.rounds):
                for name in names[r % 3 :] + names[: r % 3]:  # rotated: drifts of the load hit every arm
                    runs[name].append(arms[name].run(args.ticks))
        finally:
            for arm in arms.values():
                arm.close()
    ticks_per_step = step_s / args.tick_s
    base = [x[0] * 1e6 for x in runs["baseline"]]
    out: dict[str, Any] = {
        "arch": header.arch, "step_s": step_s, "tick_s": args.tick_s, "ticks": args.ticks, "gpus": GPUS,
        **mean_ci(base).as_json("baseline_tick_cpu_us", 1),
    }  # fmt: skip
    for name in ("quiet", "alarmed"):
        cpu = [x[0] * 1e6 for x in runs[name]]
        extra = diff_ci(cpu, base)
        per_step = [(a - b) * ticks_per_step / GPUS for a, b in zip(cpu, base, strict=True)]
        own = [x[2] / x[1] * 1e6 for x in runs[name] if x[1]]
        out.update(mean_ci(cpu).as_json(f"{name}_tick_cpu_us", 1))
        out.update(extra.as_json(f"{name}_extra_cpu_us", 1))
        out.update(mean_ci(per_step).as_json(f"{name}_per_gpu_step_us", 1))
        out.update(mean_ci([x / step_s for x in per_step]).as_json(f"{name}_per_gpu_tick_1hz_us", 3))
        out.update(mean_ci(own).as_json(f"{name}_detector_us_per_gpu_step", 1))
        out[f"{name}_scored"] = [x[1] for x in runs[name]]
    out["load"] = {
        "before": [round(x, 2) for x in load_before],
        "after": [round(x, 2) for x in os.getloadavg()],
    }
    out["targets"] = targets_json(TARGETS)
    out["targets_missed"] = miss = missed(out, TARGETS)
    if args.json:
        print(json.dumps(out))
    else:
        print(f"model: {header.arch}, {step_s:g} s steps; a tick every {args.tick_s:g} s of a virtual clock, "
              f"{args.rounds} rounds of {args.ticks} ticks per arm; load {out['load']}")  # fmt: skip
        print(
            f"baseline tick           {out['baseline_tick_cpu_us']:>9.1f} us CPU  CI {out['baseline_tick_cpu_us_ci95']}"
        )
        for name in ("quiet", "alarmed"):
            print(
                f"{name:<8} tick            {out[f'{name}_tick_cpu_us']:>9.1f} us CPU; extra "
                f"{out[f'{name}_extra_cpu_us']:.1f} us CI {out[f'{name}_extra_cpu_us_ci95']}"
            )
            print(
                f"{name:<8} per GPU step    {out[f'{name}_per_gpu_step_us']:>9.1f} us CPU  CI "
                f"{out[f'{name}_per_gpu_step_us_ci95']} (the detector's own wall time "
                f"{out[f'{name}_detector_us_per_gpu_step']:.1f} us); at 1 Hz "
                f"{out[f'{name}_per_gpu_tick_1hz_us']:.3f} us per GPU per tick"
            )
    for m in miss:
        print(f"bench_agent_predictor: target missed: {m}", file=sys.stderr)
    return 1 if miss else 0


if __name__ == "__main__":
    raise SystemExit(main())

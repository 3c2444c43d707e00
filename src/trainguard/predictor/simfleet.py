"""A simulated fleet to train and score failure predictors on: many GPU lives, each a series of
points read from a simulated node exactly as the agent reads a real one.

    wearout.plan_gpu (per GPU: noise, precursor, failure)  ->  SimNode on a VirtualClock
    -> every reading: Sample -> Fold (the step's point) and the fixed rules (RuleState)
    -> every kernel-log line: parse_kernel_line -> Xid events per GPU
    -> Life(points up to the failure, failure time, kind, the rules' first alarm)

Time is compressed by reading each GPU ``readings_per_step`` times a step instead of once a
second, at the step's start and evenly after it; a step's point is what the agent's
down-sampled series keeps from the same readings (an agent ticking at those times folds the
same readings into the same step: agent/fleet_run.py). The labels are the
planned failure times; the kind is kept for the per-kind report, and the models never see
either (they read `Life.points`). Stdlib only; seeded, so one seed is one fleet::

    >>> lives = simulate_fleet(nodes=1, gpus_per_node=2, hours=2.0, seed=1)
    >>> len(lives), len(lives[0].points) > 0
    (2, True)
"""

from __future__ import annotations

import itertools
import random
from dataclasses import dataclass
from pathlib import Path

from trainguard.clock import VirtualClock
from trainguard.detect.kernel_log import parse_kernel_line
from trainguard.detect.rules import RuleState
from trainguard.errors import ConfigError
from trainguard.predictor.series import Fold, Point
from trainguard.records import EventKind, Health
from trainguard.telemetry.sim import SimNode, wearout

__all__ = ["Life", "NodePlan", "plan_node", "simulate_fleet", "simulate_node"]

ALARM = (Health.DEGRADED, Health.FAILED)


@dataclass(frozen=True, slots=True)
class Life:
    host: str
    gpu: int
    points: tuple[Point, ...]  # the steps that ended before the failure (all of them, if none)
    failure_s: float | None  # seconds after the series began; None: healthy to the end
    kind: str  # "healthy" or a wearout.KINDS key: for the per-kind report only
    rule_alarm_s: float | None  # the fixed rules' first degraded/failed finding before the failure
    rule: str | None  # ... and its rule


@dataclass(frozen=True, slots=True)
class NodePlan:
    host: str
    plans: tuple[wearout.Life, ...]  # per GPU: its kind, failure time and faults (never for a model)
    sim: SimNode  # the node, its faults scheduled
    clock: VirtualClock
    loads: tuple[tuple[float, float], ...]  # (time, load): the node's jobs coming and going
    life_s: float

    def load_until(self, now: float, applied: int) -> int:
        """Apply the load changes due by ``now`` after the first ``applied``; how many are applied."""
        while applied < len(self.loads) and self.loads[applied][0] <= now:
            self.sim.set_load(self.loads[applied][1])
            applied += 1
        return applied


def _kinds(rng: random.Random, n: int, failing_share: float) -> list[str]:
    names = list(wearout.KINDS)
    weights = [k.share for k in wearout.KINDS.values()]
    return [rng.choices(names, weights)[0] if rng.random() < failing_share else "healthy" for _ in range(n)]


def plan_node(
    node: int,
    gpus_per_node: int = 8,
    hours: float = 72.0,
    failing_share: float = 0.4,
    seed: int = 0,
    clock: VirtualClock | None = None,
    kmsg_path: str | Path | None = None,
) -> NodePlan:
    """One node of the fleet of ``seed``: its GPUs' plans, the `SimNode` with their faults
    scheduled (on ``clock``, its kernel log written to ``kmsg_path`` when given) and its load
    changes. The same arguments give the same node, whoever reads it (`simulate_node`, or the
    node agents of agent/fleet_run.py)."""
    rng = random.Random(f"predictor-fleet/{seed}/{node}")
    host = f"sim{seed}-{node:04d}"
    life_s = hours * 3600.0
    plans = [
        wearout.plan_gpu(rng, k, life_s, gpu=g)
        for g, k in enumerate(_kinds(rng, gpus_per_node, failing_share))
    ]
    clock = clock if clock is not None else VirtualClock()
    sim = SimNode(
        n_gpus=gpus_per_node, seed=rng.randrange(2**31), clock=clock, hostname=host, kmsg_path=kmsg_path
    )
    for t, fault in [*wearout.ambient(rng, gpus_per_node), *(f for p in plans for f in p.faults)]:
        sim.schedule(t, fault)
    return NodePlan(host, tuple(plans), sim, clock, tuple(wearout.load_schedule(rng, life_s)), life_s)


def simulate_node(
    node: int,
    gpus_per_node: int = 8,
    hours: float = 72.0,
    step_s: float = 600.0,
    readings_per_step: int = 2,
    failing_share: float = 0.4,
    seed: int = 0,
) -> list[Life]:
    plan = plan_node(node, gpus_per_node, hours, failing_share, seed)
    host, plans, sim, clock, life_s = plan.host, plan.plans, plan.sim, plan.clock, plan.life_s
    applied = 0
    pci = {sim.identity(g).pci: g for g in range(gpus_per_node)}
    rules = RuleState()
    seen = len(sim.kernel_log)
    points: list[list[Point]] = [[] for _ in range(gpus_per_node)]
    alarms: dict[int, tuple[float, str]] = {}
    ends = [p.failure_s if p.failure_s is not None else life_s for p in plans]
    for k in range(int(life_s // step_s)):
        start = k * step_s
        folds = [Fold(start) for _ in range(gpus_per_node)]
        for r in range(readings_per_step):
            now = clock.advance_to(start + r * step_s / readings_per_step)
            applied = plan.load_until(now, applied)
            samples = sim.sample()
            for s in samples:
                folds[s.gpu.index].add(s)
            for f in rules.evaluate(samples):
                if f.gpu is not None and f.health in ALARM and f.gpu not in alarms and now < ends[f.gpu]:
                    alarms[f.gpu] = (now, f.rule)
            lines = list(itertools.islice(sim.kernel_log, seen, None))
            seen += len(lines)
            for line in lines:
                ev = parse_kernel_line(line, now=now)
                if ev is not None and ev.kind is EventKind.XID and ev.pci in pci:
                    folds[pci[ev.pci]].xids += 1
        for g, fold in enumerate(folds):
            if start + step_s <= ends[g]:  # a step that saw the failure is the rules' to judge
                points[g].append(fold.point(step_s))
    return [
        Life(host, g, tuple(points[g]), p.failure_s, p.kind, *alarms.get(g, (None, None)))
        for g, p in enumerate(plans)
    ]


def simulate_fleet(
    nodes: int = 100,
    gpus_per_node: int = 8,
    hours: float = 72.0,
    step_s: float = 600.0,
    readings_per_step: int = 2,
    failing_share: float = 0.4,
    seed: int = 0,
) -> list[Life]:
    """``nodes`` x ``gpus_per_node`` GPU lives of ``hours`` each (see the module docstring)."""
    if nodes < 1 or gpus_per_node < 1 or hours * 3600.0 < step_s or readings_per_step < 1:
        raise ConfigError(
            f"a simulated fleet needs nodes >= 1, GPUs >= 1, hours >= one step and readings >= 1 "
            f"(got {nodes}, {gpus_per_node}, {hours}, step {step_s} s, {readings_per_step})"
        )
    return [
        life
        for node in range(nodes)
        for life in simulate_node(node, gpus_per_node, hours, step_s, readings_per_step, failing_share, seed)
    ]

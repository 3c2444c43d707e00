"""bench_no_restart.py's figures from one run's record (pure: no processes, no clocks), so
tests/test_bench_no_restart.py can check them on made-up runs.

A run is its launch and exit times, the metrics lines its rank 0 (of each group) wrote and the
faults the bench sent (kind, time). The clock runs from launch to exit: start-up, every fault's
recovery and a fault near the end all count.

- useful work: steps of the global batch done, each once: the distinct steps the job completed
  (plain DDP: a redone step counts once), or under replica groups the distinct (group, step)
  commits over the number of groups (a step one of two groups committed is half the batch);
- ETTR: useful work per second of the run over ``ref_rate``, the fault-free plain DDP job's
  (the same steps and global batch, same round), so a replica group's per-step cost counts too;
- heal: fault -> the failed group's first commit beside its peer (replica groups), or -> the
  job's first step by a process started after the fault (restart, torchrun); a fault that never
  healed counts the seconds to the job's exit, and ``unhealed`` says so;
- pause: the healthy group's gap between its last commit before the fault and its first after
  (to the exit where it never committed again);
- lost: steps the healthy group discarded, or steps redone after a restart, per fault.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

KINDS = ("kill", "stop_between", "stop_allreduce")


@dataclass(frozen=True)
class Run:
    """What one job left: ``lines`` as the scripts write them (replica groups: group, step, ok,
    groups, t; plain DDP: step, pid, t), ``faults`` as (kind, time) in the order sent."""

    arm: str
    groups: int  # 1: one plain DDP job; 2: --replica-groups 2 (group 1 is the one that fails)
    launched: float
    exited: float
    lines: Sequence[dict[str, Any]]
    faults: Sequence[tuple[str, float]] = field(default_factory=tuple)

    @property
    def wall_s(self) -> float:
        return self.exited - self.launched

    def steps(self) -> list[dict[str, Any]]:
        return sorted((x for x in self.lines if "step" in x), key=lambda x: x["t"])


def useful(run: Run) -> float:
    if run.groups == 1:
        return float(len({x["step"] for x in run.steps()}))
    done = {(x["group"], x["step"]) for x in run.steps() if x.get("ok")}
    return len(done) / run.groups


def rate(run: Run) -> float:
    return useful(run) / run.wall_s


def heal(run: Run, t: float) -> tuple[float, bool]:
    """Seconds from the fault at ``t`` to the job working again, and whether it did before the
    exit (if not: the seconds to the exit)."""
    steps = run.steps()
    if run.groups > 1:
        after = [x for x in steps if x["group"] == 1 and x.get("ok") and x["t"] > t and x["groups"] > 1]
    else:
        old = {x["pid"] for x in steps if x["t"] <= t}
        after = [x for x in steps if x["t"] > t and x["pid"] not in old]
    return (after[0]["t"] - t, True) if after else (run.exited - t, False)


def pause(run: Run, t: float) -> float:
    """The healthy group's (group 0's) gap across the fault at ``t``."""
    commits = [x["t"] for x in run.steps() if x.get("group", 0) == 0 and x.get("ok", True)]
    before = [c for c in commits if c <= t]
    after = [c for c in commits if c > t]
    start = before[-1] if before else run.launched
    return (after[0] if after else run.exited) - start


def longest_gap(run: Run) -> float:
    commits = [x["t"] for x in run.steps() if x.get("group", 0) == 0 and x.get("ok", True)]
    return max((b - a for a, b in itertools.pairwise(commits)), default=run.wall_s)


def step_s(run: Run, warmup: int = 20) -> float:
    """The mean step of a fault-free run: group 0's commits after the first ``warmup`` (the first
    quorums, DDP's first buckets)."""
    commits = [x["t"] for x in run.steps() if x.get("group", 0) == 0 and x.get("ok", True)][warmup:]
    return (commits[-1] - commits[0]) / (len(commits) - 1) if len(commits) > 1 else float("nan")


def redone(run: Run, t: float) -> int:
    """Plain DDP: steps trained again after the fault at ``t`` (its last step + 1 - the step the
    restarted job began at)."""
    steps = run.steps()
    before: list[int] = [x["step"] for x in steps if x["t"] <= t]
    old = {x["pid"] for x in steps if x["t"] <= t}
    after: list[int] = [x["step"] for x in steps if x["t"] > t and x["pid"] not in old]
    if not before or not after:
        return 0
    return max(0, max(before) + 1 - after[0])


def figures(run: Run, ref_rate: float) -> dict[str, Any]:
    """The run's figures against the round's fault-free plain DDP rate ``ref_rate``."""
    out: dict[str, Any] = {"wall_s": run.wall_s, "useful_steps": useful(run), "ettr": rate(run) / ref_rate}
    if not run.faults:
        out["longest_gap_s"] = longest_gap(run)
        out["step_s"] = step_s(run)
        return out
    heals = [heal(run, t) for _, t in run.faults]
    out["heal_s"] = [h for h, _ in heals]
    out["unhealed"] = sum(not ok for _, ok in heals)
    out["kill_heal_s"] = [h for (k, _), (h, _) in zip(run.faults, heals, strict=True) if k == "kill"]
    if run.groups > 1:
        for kind in KINDS:
            out[f"pause_{kind}_s"] = [pause(run, t) for k, t in run.faults if k == kind]
        discarded = sum(1 for x in run.steps() if x["group"] == 0 and x.get("ok") is False)
        out["lost_per_failure"] = discarded / len(run.faults)
    else:
        out["lost_per_failure"] = sum(redone(run, t) for _, t in run.faults) / len(run.faults)
    return out

"""Chaos drills: a plan of faults (`plan`) and the executor that injects them into a supervised
run (`executor`) so that each leaves the evidence a real fault would. See docs/chaos.md."""

from __future__ import annotations

from trainguard.chaos.executor import ChaosExecutor, Injected, corrupt_newest_checkpoint
from trainguard.chaos.plan import ChaosPlan, Fault, FaultKind, load_plan, parse_plan

__all__ = [
    "ChaosExecutor",
    "ChaosPlan",
    "Fault",
    "FaultKind",
    "Injected",
    "corrupt_newest_checkpoint",
    "load_plan",
    "parse_plan",
]

"""What the supervisor asks of the diagnostics: a quick pre-flight before each (re)start, and
level 2 on a GPU named in an ambiguous incident. Both return a ``Report``: ``report.to_dict()``
is stored with the incident, ``report.summary()`` is the line for the report, and
``report.gpu_health(gpu)`` is the ``Health`` that decides between excluding the GPU and retrying.

    >>> from trainguard.telemetry.sim import SimNode
    >>> sim = SimNode(n_gpus=2, load=0.0)
    >>> _ = sim.now().wrong_products(gpu=1)
    >>> report = preflight([0, 1], backend="sim", sim=sim)
    >>> report.gpu_health(0).value, report.gpu_health(1).value
    ('ok', 'failed')
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from trainguard.diagnose.device import Budget, budget_for
from trainguard.diagnose.result import Report
from trainguard.diagnose.runner import LEVEL2_TESTS, TESTS, run_diagnostics
from trainguard.diagnose.target import open_target
from trainguard.records import Health

__all__ = ["PREFLIGHT_TESTS", "after_incident", "health_hook", "preflight"]

PREFLIGHT_TESTS = (*(n for n, (level, _) in TESTS.items() if level == 1), "sdc")


def preflight(
    gpus: Sequence[int] | None,
    *,
    backend: str = "auto",
    sim: Any = None,
    sdc_rounds: int = 3,
    expect_gpus: int | None = None,
    timeout_s: float = 60.0,
    golden: dict[str, str] | None = None,
) -> Report:
    """Level 1 and a short SDC round (``sdc_rounds``) on ``gpus``: seconds, before a (re)start.
    Keep the first clean report's ``extra["sdc_golden"]`` and pass it as ``golden`` afterwards."""
    target = open_target(backend, gpus, sim=sim)
    try:
        budget = budget_for(2, target.kind, sdc_rounds=sdc_rounds, timeout_s=timeout_s)
        return run_diagnostics(
            target,
            2,
            tests=PREFLIGHT_TESTS,
            budget=budget,
            expect_gpus=expect_gpus,
            extra={"purpose": "preflight"},
            golden=golden,
        )
    finally:
        target.close()


def after_incident(
    gpu: int,
    *,
    gpus: Sequence[int] | None = None,
    backend: str = "auto",
    sim: Any = None,
    tests: Sequence[str] = LEVEL2_TESTS,
    budget: Budget | None = None,
    golden: dict[str, str] | None = None,
) -> Report:
    """Level 2 after an ambiguous incident on ``gpu``. ``gpus`` (the job's, training stopped) are
    its peers: a GPU is judged slow against them. Decide on ``report.gpu_health(gpu)``."""
    chosen = sorted({gpu, *(gpus or [])})
    target = open_target(backend, chosen, sim=sim)
    try:
        extra = {"purpose": "after_incident", "suspect_gpu": gpu}
        return run_diagnostics(
            target, 2, tests=(*PREFLIGHT_TESTS[:-1], *tests), budget=budget, extra=extra, golden=golden
        )
    finally:
        target.close()


def health_hook(
    *,
    backend: str = "auto",
    sim: Any = None,
    peers: Sequence[int] | None = None,
    tests: Sequence[str] = LEVEL2_TESTS,
    budget: Budget | None = None,
    on_report: Callable[[int, Report], object] | None = None,
) -> Callable[[int], Health]:
    """An adapter to the supervisor's ``Diagnose = Callable[[int], Health]`` hook: level 2 on the
    GPU (with ``peers``), its health returned and the full report handed to ``on_report``."""

    def diagnose(gpu: int) -> Health:
        report = after_incident(gpu, gpus=peers, backend=backend, sim=sim, tests=tests, budget=budget)
        if on_report is not None:
            on_report(gpu, report)
        return report.gpu_health(gpu)

    return diagnose

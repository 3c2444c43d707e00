"""Active diagnostics (``trainguard diagnose``): the third stage of the spine.

    telemetry  ->  detect  ->  diagnose  ->  incidents  ->  recover

Passive telemetry misses what matters most to training: a GPU that computes wrong answers, HBM
that corrupts under load, a slow link, a GPU that throttles only when hot. These tests find them,
DCGM-style, on whatever torch runs on: CUDA GPUs, the CPU, or the simulated node.

    >>> from trainguard.diagnose import open_target, run_diagnostics
    >>> target = open_target("sim", [0, 1])
    >>> report = run_diagnostics(target, level=1)
    >>> report.verdict.value, report.exit_code
    ('pass', 0)
    >>> target.close()

The supervisor uses ``preflight`` and ``after_incident`` (``gate.py``). ``import trainguard.diagnose``
imports no torch; the modules that measure import it when a run starts.
"""

from __future__ import annotations

from trainguard.diagnose.device import Budget, Device, budget_for
from trainguard.diagnose.gate import PREFLIGHT_TESTS, after_incident, health_hook, preflight
from trainguard.diagnose.result import GpuReport, Report, TestResult, Verdict
from trainguard.diagnose.runner import LEVEL2_TESTS, TESTS, Progress, run_diagnostics
from trainguard.diagnose.target import BACKENDS, Target, open_target

__all__ = [
    "BACKENDS",
    "LEVEL2_TESTS",
    "PREFLIGHT_TESTS",
    "TESTS",
    "Budget",
    "Device",
    "GpuReport",
    "Progress",
    "Report",
    "Target",
    "TestResult",
    "Verdict",
    "after_incident",
    "budget_for",
    "health_hook",
    "open_target",
    "preflight",
    "run_diagnostics",
]

"""trainguard: keeps large-scale training alive through GPU failures.

    telemetry -> detect -> diagnose -> incidents -> recover

``import trainguard`` is stdlib-only: torch, pynvml, rich and matplotlib are imported only by the
modules that need them (``trainguard.torch``, ``trainguard.telemetry.nvml``, the CLI...).
"""

from __future__ import annotations

from trainguard.records import (
    Action,
    Category,
    Event,
    EventKind,
    Finding,
    Gpu,
    GpuVerdict,
    Health,
    NodeVerdict,
    RecoveryAction,
    Sample,
    Severity,
    Throttle,
)

__version__ = "0.1.0"

__all__ = [
    "Action",
    "Category",
    "Event",
    "EventKind",
    "Finding",
    "Gpu",
    "GpuVerdict",
    "Health",
    "NodeVerdict",
    "RecoveryAction",
    "Sample",
    "Severity",
    "Throttle",
    "__version__",
]

"""trainguard: keeps large-scale training alive through GPU failures.

    telemetry -> detect -> diagnose -> incidents -> recover

``import trainguard`` is stdlib-only: torch, pynvml, prometheus_client and the web stack are
imported only by the modules named after them (``trainguard.torch``, ``trainguard.telemetry.nvml``...).
"""

from __future__ import annotations

from trainguard.actions import Advice
from trainguard.records import (
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
    "Advice",
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

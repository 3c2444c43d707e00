"""The detector seam: what the agent's tick runs over what it saw.

    Window (this tick's readings and kernel-log events, the node's GPUs, the telemetry series)
        -> each Detector in the agent's list: detect(window) -> [Finding] -> detect/verdict.py

A detector has a ``name``, does no I/O, never raises on what it reads (bad input is skipped and
counted in ``skipped``), and ``forget``s a GPU that was reset. Its findings follow from the
windows it has seen. The fixed rules implement it: `RuleState` (detect/rules.py, the readings)
and `XidState` (detect/xid_rules.py, the kernel-log events); `fixed_rules` is the list an agent
runs by default. A learned failure predictor implements it too, reading ``window.series``
(telemetry/series.py: per GPU, one point per step of down-sampled readings and event counts),
and joins the list when the agent's config names a model file (``[agent] predictor``;
predictor/detector.py). Its findings' rule, `PREDICTED_FAILURE`, marks a forecast: the store
records it without a root cause (nothing has failed yet) and remediation acts on it only where
the policy says so (remediate/policy.py).

An example detector, and a window with one hot GPU::

    >>> from trainguard.actions import Advice
    >>> from trainguard.records import Gpu, Health, Sample
    >>> class Hot:
    ...     name, skipped = "hot", 0
    ...     def detect(self, window):
    ...         return [Finding("hot", Health.DEGRADED, Advice.NONE, "hot", gpu=s.gpu.index)
    ...                 for s in window.samples if (s.temperature_c or 0) > 90]
    ...     def forget(self, gpu):
    ...         pass
    >>> w = Window(0.0, (Gpu(0),), (Sample(Gpu(0), 0.0, temperature_c=95.0),), (), Thresholds())
    >>> [(d.name, [f.gpu for f in d.detect(w)]) for d in [*fixed_rules(), Hot()]]
    [('sample_rules', []), ('xid_rules', []), ('hot', [0])]
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from trainguard.detect.rules import RuleState
from trainguard.detect.thresholds import Thresholds
from trainguard.detect.xid_rules import XidState
from trainguard.records import Event, Finding, Gpu, Sample

if TYPE_CHECKING:
    from trainguard.telemetry.series import Series

__all__ = ["PREDICTED_FAILURE", "Detector", "Window", "fixed_rules"]

PREDICTED_FAILURE = "predicted_failure"  # the rule of a failure predictor's findings: a forecast


@dataclass(frozen=True, slots=True)
class Window:
    """What the detectors see at one tick."""

    time: float  # the agent's clock
    gpus: tuple[Gpu, ...]  # the node's GPUs, as last read
    samples: tuple[Sample, ...]  # this tick's readings (none when telemetry failed)
    events: tuple[Event, ...]  # the kernel-log events read this tick
    thresholds: Thresholds  # what the fixed rules compare against (a reload changes them)
    series: Series | None = None  # the recent past, per GPU (None: the agent keeps none)


class Detector(Protocol):
    name: str
    skipped: int  # inputs that could not be used (counted, never raised)

    def detect(self, window: Window) -> list[Finding]:
        """The findings that hold at ``window.time``; never raises on what the window holds."""
        ...

    def forget(self, gpu: int) -> None:
        """A GPU was reset: what it showed before is behind it."""
        ...


def fixed_rules(thresholds: Thresholds | None = None) -> list[Detector]:
    """The fixed rules, as an agent runs them unless it is given a list: readings, then Xids."""
    return [RuleState(thresholds), XidState(thresholds)]

"""The agent's look and judge: one pass of the spine per ``tick()`` (telemetry -> detect -> verdict).

``tick()`` samples every GPU, reads the kernel-log lines written since the last tick, adds both to
the telemetry series (when the agent keeps one), runs its detectors over the ``Window`` of what it
saw (detect/detector.py; by default the fixed rules) and folds their findings into a
``NodeVerdict``. The loop around it (a real 1 Hz loop, or a simulator's virtual clock) belongs to
the caller::

    >>> from trainguard.clock import VirtualClock
    >>> from trainguard.agent.node import open_node
    >>> clock = VirtualClock()
    >>> agent = Agent.of(open_node("sim", n_gpus=2, clock=clock), clock=clock)
    >>> agent.tick().health.value
    'ok'
    >>> agent.close()

The agent owns no thread and never raises because of what it reads: a backend that cannot serve
or a kernel log that cannot be read becomes an UNKNOWN finding for the node, and a detector that
raises (a bug) is logged and counted in ``failures``, its findings of that tick missing.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trainguard.actions import Advice
from trainguard.detect.detector import PREDICTED_FAILURE, Detector, Window, fixed_rules
from trainguard.detect.gpu_index import GpuIndex
from trainguard.detect.thresholds import Thresholds
from trainguard.detect.verdict import node_verdict
from trainguard.errors import TrainguardError
from trainguard.records import Category, Event, Finding, Gpu, Health, NodeVerdict, Sample

if TYPE_CHECKING:
    from trainguard.agent.node import Node
    from trainguard.clock import Clock
    from trainguard.telemetry import TelemetryBackend
    from trainguard.telemetry.lines import LineSource
    from trainguard.telemetry.series import Series

log = logging.getLogger(__name__)

__all__ = ["Agent"]


class Agent:
    """Watches one node: a telemetry backend plus, optionally, its kernel log (a ``LineSource``,
    or a path that ``open_lines`` opens). ``Agent.of(node)`` watches an opened ``Node``.

    After each ``tick()``: ``samples`` holds the readings of that tick, ``events`` the kernel-log
    events read in it, and ``verdict`` the verdict returned. ``detectors``: what judges each
    window (default `fixed_rules`); ``series``: the telemetry series to keep (default none).
    """

    def __init__(
        self,
        backend: TelemetryBackend,
        kernel_log: Path | str | None = None,
        clock: Clock | None = None,
        thresholds: Thresholds | None = None,
        lines: LineSource | None = None,
        *,
        detectors: Iterable[Detector] | None = None,
        series: Series | None = None,
    ) -> None:
        if clock is None:
            from trainguard.clock import RealClock

            clock = RealClock()
        self.backend, self.clock = backend, clock
        self.thresholds = thresholds or Thresholds()
        self.kernel_log = Path(kernel_log) if kernel_log is not None else None
        self.detectors: list[Detector] = (
            fixed_rules(self.thresholds) if detectors is None else list(detectors)
        )
        self.series = series
        self.failures: Counter[str] = Counter()  # detector name -> ticks on which it raised
        # GPUs a detector found FAILED, until they are reset: a forecast of their failure comes
        # too late to be one (the predictor reads the failure's own symptoms) and is dropped.
        self._failed: set[int] = set()
        self._index = GpuIndex()  # which GPU a kernel-log event is about
        self.node: Node | None = None  # closed with the agent when it came from Agent.of
        self._lines: Any = lines
        if lines is None and self.kernel_log is not None:
            from trainguard.telemetry.lines import open_lines

            self._lines = open_lines(self.kernel_log)
        self._gpus: list[Gpu] = []
        self.samples: list[Sample] = []
        self.events: list[Event] = []
        self.verdict: NodeVerdict | None = None
        self.ticks = 0

    @classmethod
    def of(
        cls,
        node: Node,
        *,
        clock: Clock | None = None,
        thresholds: Thresholds | None = None,
        detectors: Iterable[Detector] | None = None,
        series: Series | None = None,
    ) -> Agent:
        """The agent of an opened node; closing the agent closes the node."""
        agent = cls(
            node.backend,
            node.kernel_log,
            clock,
            thresholds,
            lines=node.lines,
            detectors=detectors,
            series=series,
        )
        agent.node = node
        return agent

    def tick(self) -> NodeVerdict:
        now = self.clock.time()
        findings: list[Finding] = []
        try:
            self.samples = self.backend.sample()
        except Exception as exc:  # the whole backend failed: every GPU is unknown, not healthy
            log.warning("telemetry failed: %s", exc)
            self.samples = []
            why = f"telemetry failed: {type(exc).__name__}: {exc}"
            findings += [_unknown("telemetry", why, now, g.index) for g in self._gpus]
            if not self._gpus:
                findings.append(_unknown("telemetry", why, now))
        if self.samples:
            self._gpus = [s.gpu for s in self.samples]
            self._index.set_gpus(self._gpus)
        unreadable: list[Finding] = []
        self.events = self._read_kernel_log(now, unreadable)
        for ev in self.events:
            self._index.learn(ev)
        if self.series is not None:
            self.series.add(now, self.samples, self.events, self._index.gpu_of)
        window = Window(
            now, tuple(self._gpus), tuple(self.samples), tuple(self.events), self.thresholds, self.series
        )
        for detector in self.detectors:
            findings.extend(self._detect(detector, window))
        findings = self._no_forecast_of_a_failure(findings)
        findings.extend(unreadable)
        self.verdict = node_verdict(self._gpus, findings)
        self.ticks += 1
        return self.verdict

    def _no_forecast_of_a_failure(self, findings: list[Finding]) -> list[Finding]:
        self._failed.update(f.gpu for f in findings if f.health is Health.FAILED and f.gpu is not None)
        return [f for f in findings if not (f.rule == PREDICTED_FAILURE and f.gpu in self._failed)]

    def _detect(self, detector: Detector, window: Window) -> list[Finding]:
        try:
            return detector.detect(window)
        except Exception:  # a detector's bug must not blind the others
            log.exception("detector %s failed", detector.name)
            self.failures[detector.name] += 1
            return []

    def _read_kernel_log(self, now: float, findings: list[Finding]) -> list[Event]:
        if self._lines is None:
            return []
        from trainguard.detect.kernel_log import parse_kernel_line

        try:
            lines = self._lines.poll()
        except (OSError, TrainguardError) as exc:
            findings.append(_unknown("kernel_log", f"kernel log {self.kernel_log} unreadable: {exc}", now))
            return []
        events = []
        for line in lines:
            ev = parse_kernel_line(line, now=now)
            if ev is not None:
                events.append(ev)
        return events

    def gpu_was_reset(self, index: int) -> None:
        """Tell the agent a GPU was reset (by a recovery action): its earlier Xids are behind it.

        The driver's own re-initialisation line does this too, when the kernel log has one.
        """
        self._failed.discard(index)
        for detector in self.detectors:
            detector.forget(index)

    def set_thresholds(self, thresholds: Thresholds) -> None:
        """Judge with new thresholds from now on (a config reload); rate windows start afresh."""
        self.thresholds = thresholds

    def gpu_of(self, event: Event) -> int | None:
        """The GPU index a kernel-log event is about (by PCI address or UUID); None when unknown."""
        return self._index.gpu_of(event)

    @property
    def skipped(self) -> dict[str, int]:
        """Inputs each detector could not use, by its name."""
        return {d.name: d.skipped for d in self.detectors}

    def close(self) -> None:
        if self.node is not None:
            self.node.close()
            return
        if self._lines is not None:
            self._lines.close()
        self.backend.close()

    def __enter__(self) -> Agent:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _unknown(rule: str, reason: str, now: float, gpu: int | None = None) -> Finding:
    return Finding(rule, Health.UNKNOWN, Advice.NONE, reason, gpu=gpu, time=now, category=Category.NODE_HOST)

"""The node agent: one pass of the spine per ``tick()`` (telemetry -> detect -> verdict).

``tick()`` samples every GPU, reads the kernel-log lines written since the last tick, runs the
health rules and folds the findings into a ``NodeVerdict``. The loop around it (a real 1 Hz loop,
or a simulator's virtual clock) belongs to the caller::

    >>> from trainguard.clock import VirtualClock
    >>> from trainguard.telemetry.sim import SimFleet
    >>> clock = VirtualClock()
    >>> agent = Agent(SimFleet(n_gpus=2, clock=clock), clock=clock)
    >>> agent.tick().health.value
    'ok'

The agent owns no thread and never raises because of what it reads: a backend that cannot serve
or a kernel log that cannot be read becomes an UNKNOWN finding for the node.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trainguard.detect.rules import RuleState
from trainguard.detect.thresholds import Thresholds
from trainguard.detect.verdict import node_verdict
from trainguard.detect.xid_rules import XidState
from trainguard.errors import TrainguardError
from trainguard.records import Action, Category, Event, Finding, Gpu, Health, NodeVerdict, Sample

if TYPE_CHECKING:
    from trainguard.clock import Clock
    from trainguard.telemetry import TelemetryBackend

log = logging.getLogger(__name__)

__all__ = ["Agent"]


class Agent:
    """Watches one node: a telemetry backend plus, optionally, its kernel log.

    After each ``tick()``: ``samples`` holds the readings of that tick, ``events`` the kernel-log
    events read in it, and ``verdict`` the verdict returned.
    """

    def __init__(
        self,
        backend: TelemetryBackend,
        kernel_log: Path | str | None = None,
        clock: Clock | None = None,
        thresholds: Thresholds | None = None,
        follower: Any = None,
    ) -> None:
        if clock is None:
            from trainguard.clock import RealClock

            clock = RealClock()
        self.backend, self.clock = backend, clock
        self.thresholds = thresholds or Thresholds()
        self.kernel_log = Path(kernel_log) if kernel_log is not None else None
        self._rules = RuleState(self.thresholds)
        self._xids = XidState(self.thresholds)
        # ``follower``: a ready reader of the kernel log (anything with ``poll() -> list[str]``),
        # e.g. the daemon's, which resumes where the previous run stopped.
        self._follower: Any = follower
        if follower is None and self.kernel_log is not None:
            from trainguard.detect.follow import KmsgReader, LogFollower

            # From the start: what the kernel logged before we started watching still counts.
            if self.kernel_log.is_char_device():  # /dev/kmsg: one record per read
                self._follower = KmsgReader(self.kernel_log, from_start=True)
            else:
                self._follower = LogFollower(self.kernel_log, from_start=True)
        self._gpus: list[Gpu] = []
        self.samples: list[Sample] = []
        self.events: list[Event] = []
        self.verdict: NodeVerdict | None = None
        self.ticks = 0

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
            self._xids.set_gpus(self._gpus)
        findings.extend(self._rules.evaluate(self.samples))
        self.events = self._read_kernel_log(now, findings)
        for ev in self.events:
            self._xids.observe(ev, now)
        findings.extend(self._xids.findings(now))
        self.verdict = node_verdict(self._gpus, findings)
        self.ticks += 1
        return self.verdict

    def _read_kernel_log(self, now: float, findings: list[Finding]) -> list[Event]:
        if self._follower is None:
            return []
        from trainguard.detect.kernel_log import parse_kernel_line

        try:
            lines = self._follower.poll()
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
        self._xids.clear(index)
        self._rules.clear(index)

    def set_thresholds(self, thresholds: Thresholds) -> None:
        """Judge with new thresholds from now on (a config reload); rate windows start afresh."""
        self.thresholds = thresholds
        self._rules = RuleState(thresholds)
        self._xids.th = thresholds

    def gpu_of(self, event: Event) -> int | None:
        """The GPU index a kernel-log event is about (by PCI address or UUID); None when unknown."""
        return self._xids.gpu_of(event)

    @property
    def skipped_events(self) -> int:
        """Kernel-log events the Xid rules could not use."""
        return self._xids.skipped

    def close(self) -> None:
        closer = getattr(self._follower, "close", None)
        if closer is not None:
            closer()
        self.backend.close()

    def __enter__(self) -> Agent:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _unknown(rule: str, reason: str, now: float, gpu: int | None = None) -> Finding:
    return Finding(rule, Health.UNKNOWN, Action.NONE, reason, gpu=gpu, time=now, category=Category.NODE_HOST)

"""The demo's live view: training progress, the node's GPUs, injected faults and incidents.

Fed by the supervisor's `RunEvent`s (its ``on_event`` callback, called from the monitor loop)
and by the demo's own notes. On a terminal it is a rich panel redrawn four times a second by
rich's own thread; otherwise (CI, pipes) it prints one plain line per event, so logs stay
readable. Both read one `DemoState`, guarded by a lock.
"""

from __future__ import annotations

import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TextIO

from trainguard.records import Health, NodeVerdict

SPARK = "▁▂▃▄▅▆▇█"


@dataclass
class IncidentRow:
    id: int | None
    t: float
    detected_by: str
    root_cause: str
    action: str
    summary: str


@dataclass
class DemoState:
    total_steps: int
    nproc: int
    started: float = field(default_factory=time.time)
    phase: str = "starting"
    step: int | None = None
    loss: float | None = None
    losses: deque[float] = field(default_factory=lambda: deque(maxlen=32))
    attempt: int = 0
    world_size: int = 0
    gpus: tuple[int, ...] = ()
    resume_step: int | None = None
    faults: dict[str, str] = field(default_factory=dict)  # id -> pending | injected | detected
    fault_labels: dict[str, str] = field(default_factory=dict)
    incidents: list[IncidentRow] = field(default_factory=list)
    log: deque[str] = field(default_factory=lambda: deque(maxlen=6))
    verdict: NodeVerdict | None = None
    waiting_since: float | None = None  # an attempt started and has not completed a step yet


def sparkline(values: list[float]) -> str:
    """Loss history as block characters, scaled between its own min and max."""
    vals = [v for v in values if v == v and abs(v) != float("inf")]
    if not vals:
        return ""
    lo, hi = min(vals), max(vals)
    span = hi - lo or 1.0
    return "".join(SPARK[min(len(SPARK) - 1, int((v - lo) / span * (len(SPARK) - 1) + 0.5))] for v in vals)


def clock(seconds: float) -> str:
    seconds = max(0.0, seconds)
    return f"{int(seconds // 60)}:{int(seconds % 60):02d}"


class Display:
    """Base: keeps the state; subclasses show it. Call `event` / `line` from any thread."""

    log_incidents = True  # also write each incident into the event log

    def __init__(self, state: DemoState, verdict: Callable[[], NodeVerdict | None] | None = None) -> None:
        self.state = state
        self.lock = threading.Lock()
        self._verdict = verdict or (lambda: None)

    def set_verdict_source(self, source: Callable[[], NodeVerdict | None]) -> None:
        self._verdict = source

    def start(self) -> None: ...

    def stop(self) -> None: ...

    def line(self, text: str) -> None:
        """A line worth keeping in the log (printed at once in plain mode)."""
        with self.lock:
            self.state.log.append(f"{clock(time.time() - self.state.started)}  {text}")

    def phase(self, name: str, text: str | None = None) -> None:
        with self.lock:
            if name in ("reference", "chaos"):  # a new training run: its own progress
                self.state.step, self.state.loss = None, None
                self.state.losses.clear()
            self.state.phase = name
        if text:
            self.line(text)

    def fault_injected(self, fault_id: str, text: str) -> None:
        with self.lock:
            if self.state.faults.get(fault_id, "pending") != "pending":
                return
            self.state.faults[fault_id] = "injected"
        self.line(f"injected {fault_id}: {text}")

    def fault_detected(self, fault_id: str) -> None:
        """A provisional match (the report's matching is the one that counts)."""
        with self.lock:
            self.state.faults[fault_id] = "detected"

    def incident(self, inc: dict[str, Any]) -> None:
        row = IncidentRow(
            inc.get("id"),
            float(inc.get("time") or time.time()) - self.state.started,
            str(inc.get("detected_by") or "-"),
            str(inc.get("root_cause") or "unknown"),
            str(inc.get("action") or "-"),
            " ".join(str(inc.get("summary") or "").split()),
        )
        with self.lock:
            self.state.incidents.append(row)
        if not self.log_incidents:
            return
        self.line(
            f"incident #{row.id}: {row.detected_by} -> {row.root_cause} -> {row.action}: {row.summary[:100]}"
        )

    def event(self, ev: Any) -> None:
        """A supervisor `RunEvent`."""
        d = ev.data
        s = self.state
        if ev.kind == "progress":
            with self.lock:
                s.waiting_since = None
                s.step = d.get("step")
                loss = d.get("loss")
                if isinstance(loss, (int, float)):
                    s.loss = float(loss)
                    s.losses.append(float(loss))
                s.verdict = self._verdict()
            self.progressed()
        elif ev.kind == "attempt_started":
            with self.lock:
                s.attempt = int(d.get("attempt", 0))
                s.world_size = int(d.get("world_size") or len(d.get("ranks", ())))
                s.gpus = tuple(d.get("gpus", ()))
                s.resume_step = d.get("resume_step")
                s.waiting_since = ev.time
            gpus = ",".join(map(str, s.gpus))
            frm = f"resuming from step {s.resume_step}" if s.resume_step else "starting from scratch"
            self.line(f"attempt {s.attempt}: world size {s.world_size} on GPUs {gpus}, {frm}")
        elif ev.kind == "incident":
            self.incident(d)
        elif ev.kind == "recovered":
            self.line(
                f"recovered from incident #{d.get('incident')}: training again {d.get('mttr_s', 0):.1f}s after "
                f"the failure (resumed at step {d.get('resume_step') or 0})"
            )
        elif ev.kind == "diagnosis":
            said = f" ({d['summary'][:90]})" if d.get("summary") else ""
            self.line(f"diagnostics on GPU {d.get('gpu')}: {d.get('health')}{said}")
        elif ev.kind == "preflight" and d.get("verdict") == "fail":  # a clean one is no news
            self.line(f"pre-flight before attempt {d.get('attempt')}: {str(d.get('summary'))[:100]}")

    def progressed(self) -> None:
        """Called after each progress event (plain mode prints every tenth of the run)."""


class PlainDisplay(Display):
    """One line per event, for logs and CI (no cursor movement, no colour)."""

    def __init__(self, state: DemoState, out: TextIO | None = None, **kw: Any) -> None:
        super().__init__(state, **kw)
        self.out = out or sys.stdout
        self._next_step = 0

    def line(self, text: str) -> None:
        super().line(text)
        self._print(text)

    def phase(self, name: str, text: str | None = None) -> None:
        super().phase(name, text)
        self._next_step = 0

    def progressed(self) -> None:
        s = self.state
        if s.step is None or s.step < self._next_step:
            return
        self._next_step = s.step + max(1, s.total_steps // 10)
        loss = f"{s.loss:.3f}" if s.loss is not None else "-"
        self._print(
            f"{s.phase}: step {s.step}/{s.total_steps}  loss {loss}  (attempt {s.attempt}, world {s.world_size})"
        )

    def _print(self, text: str) -> None:
        try:
            self.out.write(f"[{clock(time.time() - self.state.started):>5}] {text}\n")
            self.out.flush()
        except (OSError, ValueError):
            pass


class RichDisplay(Display):
    """The live panel (rich.Live, redrawn by rich's refresh thread)."""

    log_incidents = False  # the panel's incident table shows them

    def __init__(self, state: DemoState, console: Any = None, **kw: Any) -> None:
        super().__init__(state, **kw)
        from rich.console import Console

        self.console = console or Console()
        self._live: Any = None

    def start(self) -> None:
        from rich.live import Live

        self._live = Live(
            get_renderable=self.render,
            console=self.console,
            refresh_per_second=4,
            transient=False,
            redirect_stdout=True,
            redirect_stderr=True,
        )
        self._live.start()

    def stop(self) -> None:
        if self._live is not None:
            self._live.refresh()
            self._live.stop()
            self._live = None

    def render(self) -> Any:
        from trainguard.demo.panel import panel

        with self.lock:
            self.state.verdict = self._verdict() or self.state.verdict
            return panel(self.state, self.console.width)


def make_display(state: DemoState, stream: TextIO | None = None, force_plain: bool = False) -> Display:
    """Rich on a terminal (unless NO_COLOR-free plain output is forced), plain lines otherwise."""
    stream = stream or sys.stdout
    if not force_plain and stream.isatty():
        try:
            return RichDisplay(state)
        except ImportError:
            pass
    return PlainDisplay(state, out=stream)


def gpu_health(verdict: NodeVerdict | None, gpu: int) -> tuple[Health, str]:
    if verdict is None:
        return Health.UNKNOWN, ""
    for g in verdict.gpus:
        if g.gpu.index == gpu:
            return g.health, g.reasons[0] if g.reasons else ""
    return Health.UNKNOWN, ""

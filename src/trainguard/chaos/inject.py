"""In-process fault injection: the supervisor's chaos drills, applied by a trainer's Guard at step
boundaries (``trainguard.torch``'s and ``trainguard.keras``'s).

The supervisor writes ``$TRAINGUARD_RUN_DIR/chaos.json``::

    {"faults": [
      {"kind": "nan",   "rank": 1, "step": 40},
      {"kind": "slow",  "rank": 0, "step": 20, "delay_s": 0.5, "steps": 10},
      {"kind": "hang",  "rank": 1, "step": 60},
      {"kind": "raise", "rank": 0, "step": 80, "exc": "RuntimeError",
       "message": "CUDA error: an illegal memory access was encountered"},
      {"kind": "exit",  "rank": 1, "step": 90, "code": 1}
    ]}

Each fault fires at the first step boundary at or after ``step`` on its rank, exactly once per run:
before it takes effect it is recorded in ``chaos-fired/<id>`` (atomically), so a restarted worker
that replays the step does not fire it again. The exception is a "nan" with ``"recurs": true``,
the data's NaN: it poisons that step every time the step runs (a replay after a rollback, a
restarted worker), as a bad batch does. The effects are the real ones: "nan" poisons the
loss the Guard (and, through ``Guard.loss``, backward) sees; "slow" makes a straggler; "hang"
blocks the rank forever, so its peers block inside the next collective; "raise" raises the named
exception; "exit" ends the process with ``os._exit(code)``.

Torch- and TF-free, so either trainer package uses it; the file is read once, when the Guard starts.
"""

from __future__ import annotations

import builtins
import json
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from trainguard.chaos.plan import FaultKind
from trainguard.rundir import atomic_write_bytes

log = logging.getLogger(__name__)

CHAOS_FILE = "chaos.json"
FIRED_DIR = "chaos-fired"


@dataclass(frozen=True, slots=True)
class InProcessFault:
    """One entry of chaos.json armed in this rank (its kind is one of the plan's in-process ones)."""

    kind: FaultKind
    rank: int
    step: int
    index: int = 0  # position in chaos.json: part of the fault's identity
    delay_s: float = 1.0  # slow
    steps: int = 1  # slow
    exc: str = "RuntimeError"  # raise
    message: str = "trainguard chaos: injected fault"  # raise
    code: int = 1  # exit
    recurs: bool = False  # nan: every time the step runs, not once

    @property
    def id(self) -> str:
        return f"{self.index:03d}-{self.kind.value}-rank{self.rank}-step{self.step}"


def load_faults(run_dir: Path, rank: int) -> list[InProcessFault]:
    """This rank's faults that have not fired yet, by step. A bad file or entry is logged, skipped."""
    path = run_dir / CHAOS_FILE
    try:
        raw = json.loads(path.read_text())
    except FileNotFoundError:
        return []
    except (OSError, ValueError) as exc:
        log.warning("ignoring unreadable %s: %s", path, exc)
        return []
    entries = raw.get("faults", []) if isinstance(raw, dict) else []
    faults: list[InProcessFault] = []
    for index, entry in enumerate(entries if isinstance(entries, list) else []):
        try:
            kind = FaultKind(entry["kind"])
            if not kind.in_process:
                raise ValueError(f"{kind.value} is not an in-process fault")
            fault = InProcessFault(
                kind=kind,
                rank=int(entry.get("rank", 0)),
                step=int(entry.get("step", 0)),
                index=index,
                delay_s=float(entry.get("delay_s", 1.0)),
                steps=int(entry.get("steps", 1)),
                exc=str(entry.get("exc", "RuntimeError")),
                message=str(entry.get("message", "trainguard chaos: injected fault")),
                code=int(entry.get("code", 1)),
                recurs=entry.get("recurs") is True,
            )
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            log.warning("ignoring bad chaos fault #%d %r: %s", index, entry, exc)
            continue
        if fault.rank == rank and (fault.recurs or not (run_dir / FIRED_DIR / fault.id).exists()):
            faults.append(fault)
    return sorted(faults, key=lambda f: f.step)


class Chaos:
    """Applies one rank's pending faults. ``next_step`` lets the Guard skip all work until due."""

    def __init__(self, run_dir: Path | None, rank: int, sleep: Callable[[float], None] = time.sleep) -> None:
        self.run_dir, self._sleep = run_dir, sleep
        self._pending = load_faults(run_dir, rank) if run_dir is not None else []
        self._slow_until = -1
        self._slow_delay = 0.0
        # step -> a "nan" that comes with that step's data: it fires whenever that step runs
        self._recurring = {f.step: f for f in self._pending if f.recurs}
        self._pending = [f for f in self._pending if not f.recurs]
        self.next_step: int | None = None
        self._plan_next(-1)

    def at_step(self, step: int) -> bool:
        """Apply the faults due at this step boundary; True when the loss must become NaN."""
        nan = False
        if self._slow_until >= step:
            self._sleep(self._slow_delay)
        while self._pending and self._pending[0].step <= step:
            fault = self._pending.pop(0)
            self._record(fault, step)
            if fault.kind is FaultKind.NAN:
                nan = True
            elif fault.kind is FaultKind.SLOW:
                self._slow_until, self._slow_delay = step + fault.steps - 1, fault.delay_s
                self._sleep(fault.delay_s)
            else:
                _fire(fault)
        if step in self._recurring:  # the bad batch, first run or replay
            self._record_once(self._recurring[step], step)
            nan = True
        self._plan_next(step)
        if self._slow_until >= step + 1:
            self.next_step = step + 1
        return nan

    def _plan_next(self, step: int) -> None:
        # A rollback replays earlier steps: a recurring NaN's step stays due once passed.
        due = [f.step for f in self._pending] + list(self._recurring)
        self.next_step = min(due) if due else None

    def take_nan(self, step: int) -> bool:
        """Fire a due "nan" fault only (for ``Guard.loss``, before backward); True if one fired."""
        if self._pending and self._pending[0].step <= step and self._pending[0].kind is FaultKind.NAN:
            self._record(self._pending.pop(0), step)
            self._plan_next(step)
            return True
        if step in self._recurring:
            self._record_once(self._recurring[step], step)
            return True
        return False

    def _record_once(self, fault: InProcessFault, step: int) -> None:
        if self.run_dir is not None and not (self.run_dir / FIRED_DIR / fault.id).exists():
            self._record(fault, step)

    def _record(self, fault: InProcessFault, step: int) -> None:
        if self.run_dir is None:
            return
        fired = self.run_dir / FIRED_DIR
        fired.mkdir(parents=True, exist_ok=True)
        body = {
            "fault": fault.id,
            "kind": fault.kind.value,
            "step": step,
            "time": time.time(),
            "pid": os.getpid(),
        }
        # Recorded before the effect: "hang", "raise" and "exit" never come back.
        atomic_write_bytes(fired / fault.id, json.dumps(body).encode())
        log.warning("chaos: firing %s at step %d", fault.id, step)


def _fire(fault: InProcessFault) -> None:
    if fault.kind is FaultKind.HANG:
        while True:  # the rank stops participating: its peers block in the next collective
            time.sleep(3600)
    if fault.kind is FaultKind.RAISE:
        exc_type = getattr(builtins, fault.exc, None)
        if not (isinstance(exc_type, type) and issubclass(exc_type, BaseException)):
            exc_type = RuntimeError
        raise exc_type(fault.message)
    if fault.kind is FaultKind.EXIT:
        os._exit(fault.code)

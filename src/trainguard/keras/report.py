"""What a Keras rank tells the supervisor, through the run directory (``trainguard.rundir``).

The same files the torch Guard writes, so the supervisor's watches work unchanged: heartbeats
(step, loss, step time, phase), findings (NaN, spikes, rollbacks) and, when an exception ends
the process, the rank's error file (written by a ``sys.excepthook``: an exception that leaves
``model.fit`` passes no callback). Without a run directory nothing is written.

    >>> rank_from_env({"TF_CONFIG": '{"cluster": {"worker": ["a:1", "b:2"]}, "task": {"type": "worker", "index": 1}}'})
    (1, 2)
    >>> rank_from_env({"RANK": "3", "WORLD_SIZE": "4"})
    (3, 4)
"""

from __future__ import annotations

import functools
import json
import logging
import os
import sys
import time
import traceback
from collections.abc import Mapping
from pathlib import Path
from types import TracebackType
from typing import Any

from trainguard import rundir
from trainguard.records import Finding

__all__ = ["Reporter", "rank_from_env"]

log = logging.getLogger(__name__)


def rank_from_env(env: Mapping[str, str] | None = None) -> tuple[int, int]:
    """(rank, world size) of this process: TF_CONFIG's task (a ``chief`` first, then the
    workers in order), else torchrun's RANK and WORLD_SIZE, else (0, 1)."""
    env = os.environ if env is None else env
    try:
        config = json.loads(env.get("TF_CONFIG") or "{}")
        cluster, task = config.get("cluster") or {}, config.get("task") or {}
        chiefs = len(cluster.get("chief") or ())
        workers = len(cluster.get("worker") or ())
        if task.get("type") == "chief":
            return int(task.get("index", 0)), chiefs + workers
        if task.get("type") == "worker":
            return chiefs + int(task.get("index", 0)), chiefs + workers
    except (ValueError, TypeError, AttributeError):
        log.warning("TF_CONFIG is not a cluster spec; taking the rank from RANK")
    try:
        return int(env.get("RANK", "0")), int(env.get("WORLD_SIZE", "1"))
    except ValueError:
        return 0, 1


class Reporter:
    """One rank's heartbeats, findings and error file (see the module docstring)."""

    def __init__(self, run_dir: Path | None, rank: int, attempt: int, interval_s: float) -> None:
        self.run_dir, self.rank, self.attempt, self.interval_s = run_dir, rank, attempt, interval_s
        self.step: int | None = None  # the step in progress, for the error file
        self._hb: rundir.HeartbeatWriter | None = None
        self._last = -1e9
        self._phase = ""
        self._hook: Any = None

    def beat(self, step: int, loss: float | None, dt: float | None, phase: str = "train") -> None:
        """A heartbeat for step index ``step``; "train" beats at most every ``interval_s``."""
        if self._hb is None:
            return
        now = time.perf_counter()
        if phase != "train" or phase != self._phase or now - self._last >= self.interval_s:
            self._hb.beat(step, loss, dt, phase)
            self._last, self._phase = now, phase

    def finding(self, finding: Finding, step: int) -> None:
        log.warning("rank %d: %s", self.rank, finding.reason)
        if self.run_dir is not None:
            rundir.append_finding(self.run_dir, self.rank, finding, step)

    def error(self, exc: BaseException) -> None:
        """Write this rank's error file for ``exc`` (never raises: the real error goes first)."""
        if self.run_dir is None:
            return
        text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
        record = rundir.ErrorRecord(
            rank=self.rank,
            time=time.time(),
            exc_type=type(exc).__name__,
            message=str(exc),
            traceback=text,
            pid=os.getpid(),
            attempt=self.attempt,
            step=self.step,
        )
        try:
            rundir.write_error(self.run_dir, record)
        except OSError as err:
            print(f"trainguard: could not write the error file: {err}", file=sys.stderr)

    def open(self) -> None:
        """Start reporting (``fit`` begins): the heartbeat file, and the error hook once: an
        exception that ends the process is recorded (chained to the hook in place)."""
        if self._hb is None and self.run_dir is not None:
            self._hb = rundir.HeartbeatWriter(self.run_dir, self.rank, self.attempt)
            self._phase = ""
        if self._hook is None:
            self._hook = sys.excepthook
            sys.excepthook = functools.partial(_excepthook, reporter=self, previous=self._hook)

    def close(self, phase_step: int, loss: float | None) -> None:
        """The last heartbeat ("exit"); the error hook stays: an exception may still end the run."""
        self.beat(phase_step, loss, None, "exit")
        if self._hb is not None:
            self._hb.close()
            self._hb = None


def _excepthook(
    exc_type: type[BaseException],
    exc: BaseException,
    tb: TracebackType | None,
    *,
    reporter: Reporter,
    previous: Any,
) -> None:
    if not isinstance(exc, KeyboardInterrupt):
        reporter.error(exc)
    previous(exc_type, exc, tb)

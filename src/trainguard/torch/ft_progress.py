"""What trainguard records of a torchft Manager's steps (`trainguard.torch.ft` installs it on every
Manager): the steps its group discards, for the job's ledger, and, where no Guard writes the
rank's heartbeats, an ``init`` heartbeat at its first quorum (the worker has started: a
restarted group's heal begins) and one per committed step, so the supervisor sees a torchft
script's progress (its hang watch by steps, its ETTR, the replica loop's heals and capacity)
without a line of trainguard in the script. Written only under ``trainguard run`` (a run directory).
"""

from __future__ import annotations

import logging
import os
import time
import weakref
from typing import Any

from trainguard import rundir
from trainguard.torch.errorfile import guard_active

log = logging.getLogger(__name__)

BEAT_EVERY_S = 0.25  # as the Guard's heartbeat_interval_s


class Progress:
    """One Manager's record: `quorum` when a step's try begins, `verdict` when it is decided."""

    def __init__(self, mgr: Any) -> None:
        self.owner = weakref.ref(mgr)
        self.run_dir = rundir.run_dir_from_env()
        self.rank = int(os.environ.get("RANK", "0"))
        self.attempt = int(os.environ.get(rundir.ATTEMPT_ENV, "0"))
        self.since = time.time()  # the current step's try began here (its quorum)
        self.last_commit = time.time()
        self._writer: rundir.HeartbeatWriter | None = None
        self._beat_at = 0.0
        if self.run_dir is not None and not guard_active():
            try:
                self._write(int(mgr.current_step()), None, "init", time.time())
            except OSError:
                log.debug("could not record the start", exc_info=True)

    def quorum(self) -> None:
        self.since = time.time()

    def verdict(self, step: int, ok: bool) -> None:
        if self.run_dir is None:
            return
        now = time.time()
        try:
            if not ok and self.rank == 0:  # the group's discard, once (its ranks agree on it)
                rundir.append_discarded(self.run_dir, 0, step, self.since, now)
            if ok:
                self._beat(step, now)
        except OSError:
            log.debug("could not record step %d", step, exc_info=True)

    def _beat(self, step: int, now: float) -> None:
        took, self.last_commit = now - self.last_commit, now
        if guard_active() or now < self._beat_at:
            return
        self._write(step, took, "train", now)
        self._beat_at = now + BEAT_EVERY_S

    def _write(self, step: int, took: float | None, phase: str, now: float) -> None:
        if self._writer is None:
            assert self.run_dir is not None
            self._writer = rundir.HeartbeatWriter(self.run_dir, self.rank, self.attempt)
        self._writer.beat(step, None, took, phase, now=now)

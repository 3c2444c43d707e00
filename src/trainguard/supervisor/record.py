"""Bookkeeping of a supervised job: incidents into the store (and the run directory), and the
goodput ledger's intervals (init, productive, detection, restart, downtime, lost, checkpoint).

The store is the source of truth; ``<run_dir>/incidents.jsonl`` is a plain copy for humans and
for the demo's report when no store is configured. A store that cannot be written is logged and
skipped: bookkeeping must never stop training. A fleet store (``postgresql://...``) that is away
spools into ``<run_dir>/store-spool.jsonl`` and gets every record once it returns.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
from dataclasses import replace
from pathlib import Path
from typing import Any

from trainguard.incidents import Incident, IncidentStore, Interval, IntervalKind, goodput
from trainguard.incidents.backend import is_url
from trainguard.incidents.goodput import GoodputSummary, JobInfo
from trainguard.incidents.identity import gpu_uuids
from trainguard.procs import signals_deferred
from trainguard.records import NodeVerdict
from trainguard.supervisor.lost import LostRun, lost_run_record, step_reached_at

log = logging.getLogger(__name__)


class JobRecorder:
    def __init__(self, job: str, run_dir: Path, db: str | Path | None) -> None:
        self.job = job
        self.run_dir = run_dir
        self.incidents: list[Incident] = []
        self.intervals: list[Interval] = []
        self.store: IncidentStore | None = None
        self.job_started: float | None = None  # the job's start (a lost run's, when continuing it)
        self._keys: dict[int | None, str] = {}  # incident id (local ids negative) -> its store key
        if db is not None:
            try:
                spool = run_dir / "store-spool.jsonl" if is_url(os.fspath(db)) else None
                self.store = IncidentStore(db, spool=spool)
            except Exception as exc:
                log.warning("incident store %s unavailable, recording into %s only: %s", db, run_dir, exc)

    def node_gpus(self, verdict: NodeVerdict) -> None:
        """The node's GPU UUIDs from its verdict, stamped on the rows written from now."""
        uuids = gpu_uuids(verdict)
        if self.store is not None and uuids and uuids != self.store.identity.gpu_uuids:
            self.store.identity = self.store.identity.with_gpus(uuids)

    def job_info(self) -> JobInfo | None:
        info: JobInfo | None = self._safe(lambda s: s.get_job(self.job))
        return info

    def start_job(self, started: float, command: str, world_size: int) -> None:
        self.job_started = started
        self._safe(lambda s: s.start_job(self.job, started=started, command=command, world_size=world_size))

    def add(self, incident: Incident) -> Incident:
        with signals_deferred():  # into the store and the run directory, or a signal waits
            stored = self._safe(lambda s: s.add(incident))
            if stored is None or stored.id is None:  # not stored, or spooled for a store that is away
                stored = replace(incident, id=-(len(self.incidents) + 1))  # local ids are negative
            if self.store is not None:
                self._keys[stored.id] = self.store.key_of(incident)
            self.incidents.append(stored)
            self._append_jsonl(stored)
        return stored

    def update(self, incident: Incident, **changes: Any) -> Incident:
        updated = replace(incident, **changes)
        with signals_deferred():
            key = self._keys.get(incident.id)
            if key is not None:  # by key: it also reaches an incident still in the spool
                self._safe(lambda s: s.update_by_key(key, **changes))
            self.incidents = [updated if i.id == incident.id else i for i in self.incidents]
            self._append_jsonl(updated)
        return updated

    def interval(self, kind: IntervalKind, start: float, end: float, attempt: int, detail: str = "") -> None:
        """Kept in memory and written in one transaction at `finish`: a restart should not wait
        for fsyncs of bookkeeping (incidents, which matter more, are written at once)."""
        if end > start:
            self.intervals.append(Interval(self.job, kind, start, end, attempt=attempt, detail=detail))

    def add_intervals(self, intervals: list[Interval]) -> None:
        """Write intervals to the store now, whichever job's ledger they belong to (the replica
        loop adds heals and discarded steps to its groups' ledgers)."""
        if intervals:
            self._safe(lambda s: s.add_intervals(intervals))

    def add_progress(self, job: str, points: list[tuple[float, int]]) -> None:
        """Write (time, step) points to the store now, into ``job``'s progress (a replica group's)."""
        for t, step in points:
            self._safe(lambda s, t=t, step=step: s.add_progress(job, t, step))

    def progress(self, time: float, step: int, loss: float | None, attempt: int) -> None:
        self._safe(lambda s: s.add_progress(self.job, time, step, loss, attempt))

    def lost_run(self, lost: LostRun, now: float, resume_step: int | None) -> Incident:
        """Record the interruption a lost previous supervisor left (see `supervisor.lost`)."""
        resume_at = step_reached_at(self.run_dir, resume_step)
        incident, intervals = lost_run_record(lost, self.job, now, resume_at)
        self.intervals += intervals
        return self.add(incident)

    def finish(self, started: float, ended: float, status: str) -> GoodputSummary:
        started = self.job_started if self.job_started is not None else started
        self._safe(lambda s: s.add_intervals(self.intervals))
        self._safe(lambda s: s.record_attempts(self.job, _attempts(self.intervals, status)))
        self._safe(lambda s: s.end_job(self.job, ended=ended, status=status))
        summary = goodput(self.intervals, started, ended)
        with contextlib.suppress(OSError):
            (self.run_dir / "goodput.json").write_text(json.dumps(summary.to_dict(), indent=1))
        return summary

    def close(self) -> None:
        if self.store is not None:
            self.store.close()

    def _safe(self, fn: Any) -> Any:
        if self.store is None:
            return None
        with signals_deferred():  # outside the try: a deferred signal must not be swallowed
            try:
                return fn(self.store)
            except Exception as exc:
                log.warning("incident store write failed: %s", exc)
            return None

    @property
    def spool_depth(self) -> int:
        return self.store.spool_depth if self.store is not None else 0

    def _append_jsonl(self, incident: Incident) -> None:
        try:
            with open(self.run_dir / "incidents.jsonl", "a") as f:
                f.write(json.dumps(incident.to_dict(), default=str) + "\n")
        except OSError:
            pass


def _attempts(intervals: list[Interval], status: str) -> list[tuple[int, float, float, str | None]]:
    """Each attempt's span on this node from the ledger; the last one ended with the job's status."""
    spans: dict[int, tuple[float, float]] = {}
    for iv in intervals:
        lo, hi = spans.get(iv.attempt, (iv.start, iv.end))
        spans[iv.attempt] = (min(lo, iv.start), max(hi, iv.end))
    last = max(spans, default=None)
    return [(a, lo, hi, status if a == last else "restarted") for a, (lo, hi) in sorted(spans.items())]

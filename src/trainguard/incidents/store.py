"""The incident store: the repository every loop writes and every report reads.

One class, one SQL dialect-neutral code path over two backends (incidents/backend.py): a SQLite
file (the embedded default, WAL) or a PostgreSQL server for a fleet (``postgresql://...``).
Every row carries the writer's node identity (host, rack, group, GPU UUID) and an idempotency
key, so a retried write is not a duplicate. Migrations run on open (incidents/schema.py)::

    >>> import tempfile, os
    >>> from trainguard.incidents import Incident, RootCause
    >>> with IncidentStore(os.path.join(tempfile.mkdtemp(), "tg.db")) as store:
    ...     inc = store.add(Incident(job="j1", time=100.0, root_cause=RootCause.FAULTY_GPU))
    ...     store.get(inc.id).root_cause.value
    'faulty_gpu'

With ``spool=PATH`` a writer never fails for a database that is away: its writes wait in a
bounded local file (incidents/spool.py) and are replayed in order, before anything newer, once
the database answers; ``spool_depth`` says how many wait. Fleet writes (verdict changes,
remediation actions, breaker events) and the fleet readers live in incidents/fleet.py.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from trainguard.errors import StoreError, StoreUnavailable
from trainguard.incidents import series as _series
from trainguard.incidents.backend import DB_ENV as DB_ENV  # which database: read before any opens
from trainguard.incidents.backend import DEFAULT_DB as DEFAULT_DB
from trainguard.incidents.backend import Backend, Row, Tx, is_url, open_backend
from trainguard.incidents.backend import default_db as default_db
from trainguard.incidents.backend import default_db_path as default_db_path
from trainguard.incidents.goodput import GoodputSummary, Interval, JobInfo, ProgressPoint, goodput
from trainguard.incidents.identity import NodeIdentity, row_key
from trainguard.incidents.incident import INCIDENT_FIELDS, Incident
from trainguard.incidents.schema import migrate
from trainguard.incidents.spool import Spool
from trainguard.incidents.stats import IncidentStats, incident_stats
from trainguard.incidents.taxonomy import RootCause
from trainguard.telemetry.series import SeriesPoint

log = logging.getLogger(__name__)

# Aliases: inside the class, `list` is the method IncidentStore.list.
_Incidents = list[Incident]
_Jobs = list[JobInfo]
_Intervals = list[Interval]
_Points = list[ProgressPoint]
_CAUSES = frozenset(c.value for c in RootCause)
_JOB_FIELDS = ("name", "command", "started", "ended", "status", "world_size")
# Root causes that count against the node or GPU they name (a lemon); software and fabric do not.
HARDWARE_CAUSES = frozenset(
    {
        RootCause.FAULTY_GPU.value,
        RootCause.GPU_HBM_MEMORY.value,
        RootCause.GPU_SRAM.value,
        RootCause.GPU_SYSTEM_PROCESSOR.value,
        RootCause.GPU_THERMAL.value,
        RootCause.NIC.value,
        RootCause.HOST.value,
        RootCause.SILENT_DATA_CORRUPTION.value,
    }
)
_REPLAY_BATCH = 500
BACKOFF_MAX_S = 10.0  # the longest wait between tries of a database that is away


class IncidentStore:
    """Incidents, the goodput ledger of every job and the fleet's state, in SQLite or PostgreSQL.

    ``target``: a path or URL. ``create=False`` refuses to create a missing SQLite file (the
    CLI's read commands use it). ``identity``: the node stamped on rows this store writes
    (default: `NodeIdentity.from_env`). ``spool``: a local file for writes the database cannot
    take now (then the store opens even with the database away).
    """

    def __init__(
        self,
        target: str | os.PathLike[str],
        *,
        create: bool = True,
        timeout_s: float = 30.0,
        identity: NodeIdentity | None = None,
        spool: str | os.PathLike[str] | None = None,
        spool_max: int | None = None,
    ) -> None:
        text = os.fspath(target)
        self.backend: Backend = open_backend(text, create=create, timeout_s=timeout_s)
        self.path: Path | str = self.backend.where if is_url(text) else Path(text)
        self.identity = identity or NodeIdentity.from_env()
        self._spool = Spool(spool, **({"max_entries": spool_max} if spool_max else {})) if spool else None
        self._lock = threading.RLock()  # a spooling store writes in order: one write at a time
        self._ready = False
        self._backoff_s = 0.0  # while the database is away: seconds until the next try (doubling)
        self._retry_at = 0.0
        try:
            self._ensure_ready()
        except StoreUnavailable as exc:
            if self._spool is None:
                raise
            self._away(exc)

    def _ensure_ready(self) -> None:
        if not self._ready:
            try:
                migrate(self.backend)
            except ValueError as exc:  # a too-new schema
                raise StoreError(f"incident store {self.backend.where}: {exc}") from exc
            self._ready = True

    def _conn(self) -> Any:
        return self.backend.conn()  # type: ignore[attr-defined]

    def close(self) -> None:
        self.backend.close()

    def __enter__(self) -> IncidentStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- writes: straight to the database, or through the spool --------------------------------

    @property
    def spool_depth(self) -> int:
        """Writes waiting in the spool for the database (0 without a spool)."""
        return len(self._spool) if self._spool is not None else 0

    @property
    def spool_dropped(self) -> int:
        """Verdict changes and series points the full spool dropped (oldest first)."""
        return self._spool.dropped if self._spool is not None else 0

    def _submit(self, op: str, payload: dict[str, Any]) -> Any:
        if self._spool is None:
            self._ensure_ready()
            return self._apply(op, payload)
        with self._lock:
            if self.flush_spool():
                try:
                    self._ensure_ready()
                    result = self._apply(op, payload)
                    self._backoff_s = 0.0
                    return result
                except StoreUnavailable as exc:
                    self._away(exc)
            self._spool.append({"op": op, **payload})
            return None

    def _away(self, exc: StoreError) -> None:
        """Try the database again only after a back-off: a server that does not answer (a connect
        timeout) must not stall every write of the loop that called."""
        if not self._backoff_s:
            log.warning("%s; spooling to %s", exc, self._spool.path if self._spool is not None else None)
        self._backoff_s = min(BACKOFF_MAX_S, max(1.0, 2 * self._backoff_s))
        self._retry_at = time.monotonic() + self._backoff_s

    def flush_spool(self) -> bool:
        """Replay spooled writes in order; True when none are left."""
        spool = self._spool
        if spool is None:
            return True
        with self._lock:
            if len(spool) and time.monotonic() < self._retry_at:
                return False
            while len(spool):
                batch = spool.head(_REPLAY_BATCH)
                done = 0
                try:
                    self._ensure_ready()
                    for entry in batch:
                        entry = dict(entry)
                        op = entry.pop("op")
                        try:
                            self._apply(op, entry)
                        except StoreUnavailable:
                            raise
                        except StoreError as exc:  # a write the store refuses must not block the rest
                            log.error("dropping spooled %s write the store refuses: %s", op, exc)
                        done += 1
                except StoreUnavailable as exc:
                    if done:
                        spool.cut(done)
                    self._away(exc)
                    return False
                spool.cut(done)
                log.info("replayed %d spooled write(s) into %s", done, self.backend.where)
            return True

    def _apply(self, op: str, p: dict[str, Any]) -> Any:
        if op == "incident":
            return self._insert_incidents(p["rows"] if "rows" in p else [p["row"]])
        if op == "incident_update":
            return self._update_by_key(p["key"], p["changes"])
        if op == "job":
            return self._upsert_job(p["job"], p["values"], p["node"])
        if op == "intervals":
            return self._insert_rows("intervals", p["rows"])
        if op == "progress":
            return self._insert_rows("progress", [p["row"]])
        if op == "attempts":
            return self._upsert_attempts(p["rows"])
        if op == "series":
            return _series.insert(self.backend, p["rows"])
        from trainguard.incidents import fleet

        return fleet.apply(self.backend, op, p)

    def node_columns(self, node: NodeIdentity | None = None) -> dict[str, Any]:
        n = node or self.identity
        return {"host": n.host, "rack": n.rack, "node_group": n.group}

    # -- incidents -------------------------------------------------------------------------

    def key_of(self, incident: Incident, node: NodeIdentity | None = None) -> str:
        """The incident's idempotency key: the same facts from the same node are one incident."""
        n = node or self.identity
        i = incident
        return row_key(
            "incident", n.host, i.job, i.time, i.started, i.root_cause.value, i.action, i.gpu, i.rank,
            i.attempt, i.summary, i.detected_by, i.node,
        )  # fmt: skip

    def add(self, incident: Incident, node: NodeIdentity | None = None) -> Incident:
        """Commit an incident (durably) and return it with its id; adding it again returns the
        stored one. Spooled (database away): returned with ``id`` None."""
        return self.add_many([incident], node)[0]

    def add_many(self, incidents: Iterable[Incident], node: NodeIdentity | None = None) -> _Incidents:
        """`add` several incidents in one transaction (one wait for the disk), in order."""
        n = node or self.identity
        incidents = list(incidents)
        rows = []
        for incident in incidents:
            row = _incident_row(incident)
            del row["id"]
            row.update(self.node_columns(n), gpu_uuid=n.uuid_of(incident.gpu), key=self.key_of(incident, n))
            rows.append(row)
        if not rows:
            return []
        ids = self._submit("incident", {"rows": rows}) or [None] * len(rows)
        return [_replace(i, id=new_id) for i, new_id in zip(incidents, ids, strict=True)]

    def _insert_incidents(self, rows: list[dict[str, Any]]) -> list[int]:
        cols = list(rows[0])
        ids: dict[str, int] = {}
        with self.backend.transaction() as tx:
            for chunk in _chunks(list({r["key"]: r for r in rows}.values()), 200):
                got = tx.query(
                    f"INSERT INTO incidents ({', '.join(cols)}) VALUES {_values(len(chunk), len(cols))} "
                    "ON CONFLICT (key) DO NOTHING RETURNING id, key",
                    [r[c] for r in chunk for c in cols],
                )
                new = {g["key"]: int(g["id"]) for g in got}
                ids.update(new)
                _count_failures(tx, [r for r in chunk if r["key"] in new])
            missing = [r["key"] for r in rows if r["key"] not in ids]  # already there: a retry or a replay
            for chunk_keys in _chunks(missing, 200):
                marks = ", ".join("?" * len(chunk_keys))
                for g in tx.query(f"SELECT id, key FROM incidents WHERE key IN ({marks})", chunk_keys):
                    ids[g["key"]] = int(g["id"])
        return [ids[r["key"]] for r in rows]

    def update(self, incident_id: int, **changes: Any) -> Incident:
        """Change fields of a stored incident (e.g. time_lost_s, resolved); returns it updated."""
        _check_changes(self.path, changes)
        self._ensure_ready()
        with self.backend.transaction() as tx:
            current = _fetch_incident(tx, "id", incident_id)
            if current is None:
                raise StoreError(f"incident store {self.path}: no incident {incident_id}")
            updated = _replace(current, **changes)
            _write_changes(tx, "id", incident_id, updated)
        return updated

    def update_by_key(self, key: str, **changes: Any) -> None:
        """`update` by idempotency key (`key_of`); spooled like a write when the database is away."""
        _check_changes(self.path, changes)
        self._submit("incident_update", {"key": key, "changes": changes})

    def _update_by_key(self, key: str, changes: dict[str, Any]) -> None:
        with self.backend.transaction() as tx:
            current = _fetch_incident(tx, "key", key)
            if current is None:
                raise StoreError(f"incident store {self.path}: no incident with key {key}")
            _write_changes(tx, "key", key, _replace(current, **changes))

    def get(self, incident_id: int) -> Incident | None:
        rows = self.read("SELECT * FROM incidents WHERE id = ?", (incident_id,))
        return _incident_from_row(rows[0]) if rows else None

    def read(self, sql: str, params: Iterable[Any] = ()) -> list[Row]:
        """Rows of a read query (``?`` placeholders) as dicts: for the fleet readers."""
        self._ensure_ready()
        return self.backend.read(sql, tuple(params))

    _read = read

    def incidents(
        self,
        job: str | None = None,
        since: float | None = None,
        limit: int | None = None,
        host: str | None = None,
    ) -> _Incidents:
        """Incidents oldest first; ``limit`` keeps the most recent ones."""
        where, params = _where(job=job, since=since, host=host)
        sql = f"SELECT * FROM incidents{where} ORDER BY time DESC, id DESC"
        if limit is not None:
            sql += f" LIMIT {int(limit)}"
        return [_incident_from_row(r) for r in reversed(self.read(sql, params))]

    def stats(self, job: str | None = None) -> IncidentStats:
        """Counts by root cause / category / action, time lost and MTBF over the jobs' wall time."""
        jobs = [j for j in self.list_jobs() if job is None or j.job == job]
        incidents = self.incidents(job=job)
        observed = 0.0
        for j in jobs:
            end = (
                j.ended
                if j.ended is not None
                else max((i.time for i in incidents if i.job == j.job), default=None)
            )
            if j.started is not None and end is not None:
                observed += max(0.0, end - j.started)
        return incident_stats(incidents, observed_s=observed or None)

    # -- jobs --------------------------------------------------------------------------------

    def start_job(
        self,
        job: str,
        *,
        started: float,
        name: str | None = None,
        command: str | None = None,
        world_size: int | None = None,
        status: str = "running",
    ) -> JobInfo:
        """Record (or re-record, e.g. after a supervisor restart) a job's metadata."""
        return self.update_job(
            job, started=started, name=name, command=command, world_size=world_size, status=status
        )

    def end_job(self, job: str, *, ended: float, status: str) -> JobInfo:
        return self.update_job(job, ended=ended, status=status)

    def update_job(self, job: str, **changes: Any) -> JobInfo:
        """Upsert a job; fields passed as None are left as they are. Spooled: returns what was asked."""
        unknown = set(changes) - set(_JOB_FIELDS)
        if unknown:
            raise StoreError(f"incident store {self.path}: unknown job field(s) {sorted(unknown)}")
        values = {k: v for k, v in changes.items() if v is not None}
        got = self._submit("job", {"job": job, "values": values, "node": self.node_columns()})
        return got if got is not None else JobInfo(job=job, **values)

    def _upsert_job(self, job: str, values: dict[str, Any], node: dict[str, Any]) -> JobInfo:
        with self.backend.transaction() as tx:
            node = {k: v for k, v in node.items() if v is not None}
            # The row is made with its node's identity: a writer role may make only its host's rows.
            cols = ["job", *node]
            tx.run(
                f"INSERT INTO jobs ({', '.join(cols)}) VALUES ({', '.join('?' * len(cols))}) "
                "ON CONFLICT (job) DO NOTHING",
                (job, *node.values()),
            )
            values = {**values, **node}
            assign = ", ".join(f"{k} = ?" for k in values)
            tx.run(f"UPDATE jobs SET {assign} WHERE job = ?", (*values.values(), job))
            row = tx.query(f"SELECT job, {', '.join(_JOB_FIELDS)} FROM jobs WHERE job = ?", (job,))[0]
        return JobInfo(**row)

    def get_job(self, job: str) -> JobInfo | None:
        rows = self.read(f"SELECT job, {', '.join(_JOB_FIELDS)} FROM jobs WHERE job = ?", (job,))
        return JobInfo(**rows[0]) if rows else None

    def list_jobs(self) -> _Jobs:
        rows = self.read(f"SELECT job, {', '.join(_JOB_FIELDS)} FROM jobs ORDER BY started, job")
        return [JobInfo(**r) for r in rows]

    def record_attempts(self, job: str, attempts: Iterable[tuple[int, float, float, str | None]]) -> None:
        """Job attempts on this node: (attempt, started, ended, status), upserted."""
        node = self.node_columns()
        rows = [
            {"job": job, "attempt": a, **node, "started": s, "ended": e, "status": st}
            for a, s, e, st in attempts
        ]
        if rows:
            self._submit("attempts", {"rows": rows})

    def _upsert_attempts(self, rows: list[dict[str, Any]]) -> None:
        cols = list(rows[0])
        sql = (
            f"INSERT INTO attempts ({', '.join(cols)}) VALUES ({', '.join('?' * len(cols))}) "
            "ON CONFLICT (job, attempt, host) DO UPDATE SET started = excluded.started, "
            "ended = excluded.ended, status = excluded.status"
        )
        with self.backend.transaction() as tx:
            tx.many(sql, [tuple(r[c] for c in cols) for r in rows])

    # -- goodput ledger ----------------------------------------------------------------------

    def add_interval(self, interval: Interval) -> None:
        self.add_intervals([interval])

    def add_intervals(self, intervals: Iterable[Interval]) -> None:
        node = self.node_columns()
        rows = []
        for i in intervals:
            key = row_key("interval", node["host"], i.job, i.kind.value, i.start, i.end, i.attempt, i.detail)
            rows.append(
                {"job": i.job, "kind": i.kind.value, "start": i.start, "end": i.end, "attempt": i.attempt,
                 "detail": i.detail, **node, "key": key}
            )  # fmt: skip
        if rows:
            self._submit("intervals", {"rows": rows})

    def _insert_rows(self, table: str, rows: list[dict[str, Any]]) -> None:
        cols = list(rows[0])
        quoted = ", ".join(f'"{c}"' for c in cols)
        sql = f"INSERT INTO {table} ({quoted}) VALUES ({', '.join('?' * len(cols))}) ON CONFLICT (key) DO NOTHING"
        with self.backend.transaction() as tx:
            tx.many(sql, [tuple(r[c] for c in cols) for r in rows])

    def intervals(self, job: str) -> _Intervals:
        rows = self.read(
            'SELECT job, kind, start, "end", attempt, detail FROM intervals WHERE job = ? ORDER BY start, id',
            (job,),
        )
        return [Interval(**r) for r in rows]

    def add_progress(
        self, job: str, time: float, step: int, loss: float | None = None, attempt: int = 0
    ) -> None:
        """Record one sampled step (call it every N steps, not every step)."""
        node = self.node_columns()
        key = row_key("progress", node["host"], job, time, step, attempt)
        row = {"job": job, "time": time, "step": step, "loss": loss, "attempt": attempt, **node, "key": key}
        self._submit("progress", {"row": row})

    def progress(self, job: str) -> _Points:
        rows = self.read(
            "SELECT job, time, step, loss, attempt FROM progress WHERE job = ? ORDER BY time", (job,)
        )
        return [ProgressPoint(**r) for r in rows]

    # -- the telemetry series (incidents/series.py) ---------------------------------------------

    def add_series(self, points: Iterable[SeriesPoint]) -> None:
        """Write closed series points (spooled, and the first dropped, when the database is away)."""
        rows = _series.rows_of(points, self.node_columns())
        if rows:
            self._submit("series", {"rows": rows})

    def series(
        self,
        host: str | None = None,
        gpu: int | None = None,
        since: float | None = None,
        until: float | None = None,
    ) -> list[SeriesPoint]:
        """The series points of ``host`` (every host: None), one GPU or all, ``since`` <= t <
        ``until``, ordered by host, GPU and time: what a failure model trains on."""
        sql, params = _series.query(host, gpu, since, until)
        return [_series.point_of(r) for r in self.read(sql, params)]

    def series_hosts(self) -> list[str]:
        """The hosts with series points, sorted (a trainer reads the series one host at a time)."""
        return [str(r["host"]) for r in self.read("SELECT DISTINCT host FROM series ORDER BY host")]

    def prune_series(self, before: float) -> int:
        """Delete series points older than ``before`` (retention); the number deleted."""
        self._ensure_ready()
        with self.backend.transaction() as tx:  # once an hour: a count worth the wait
            return tx.run("DELETE FROM series WHERE t < ?", (before,))

    def goodput(self, job: str, now: float | None = None) -> GoodputSummary:
        """The job's summary over its wall time: started .. ended (or `now`, or the last interval)."""
        info = self.get_job(job)
        ivs = self.intervals(job)
        start = (
            info.started if info and info.started is not None else min((i.start for i in ivs), default=0.0)
        )
        end = info.ended if info and info.ended is not None else now
        if end is None:
            end = max((i.end for i in ivs), default=start)
        return goodput(ivs, start, end)


def _count_failures(tx: Tx, rows: list[dict[str, Any]]) -> None:
    """Keep the per-GPU (or per-node: gpu -1) failure counters the lemons query reads."""
    counts: dict[tuple[str, int], list[Any]] = {}
    for r in rows:
        if r["root_cause"] not in HARDWARE_CAUSES or not r.get("host"):
            continue
        key = (r["host"], r["gpu"] if r.get("gpu") is not None else -1)
        c = counts.setdefault(
            key, [r.get("gpu_uuid"), r.get("rack"), r.get("node_group"), 0, r["time"], r["time"]]
        )
        c[3] += 1
        c[4], c[5] = min(c[4], r["time"]), max(c[5], r["time"])
    if not counts:
        return
    tx.run(
        "INSERT INTO gpu_failures (host, gpu, gpu_uuid, rack, node_group, incidents, first_time, last_time) "
        f"VALUES {_values(len(counts), 8)} ON CONFLICT (host, gpu) DO UPDATE SET "
        "incidents = gpu_failures.incidents + excluded.incidents, "
        "gpu_uuid = COALESCE(excluded.gpu_uuid, gpu_failures.gpu_uuid), "
        "rack = COALESCE(excluded.rack, gpu_failures.rack), "
        "node_group = COALESCE(excluded.node_group, gpu_failures.node_group), "
        "first_time = CASE WHEN excluded.first_time < gpu_failures.first_time "
        "THEN excluded.first_time ELSE gpu_failures.first_time END, "
        "last_time = CASE WHEN excluded.last_time > gpu_failures.last_time "
        "THEN excluded.last_time ELSE gpu_failures.last_time END",
        [v for (host, gpu), c in sorted(counts.items()) for v in (host, gpu, *c)],
    )


def _values(n_rows: int, n_cols: int) -> str:
    """``(?, ?), (?, ?)``: one multi-row VALUES list (one statement instead of n)."""
    row = "(" + ", ".join("?" * n_cols) + ")"
    return ", ".join([row] * n_rows)


def _chunks(items: list[Any], size: int) -> list[list[Any]]:
    return [items[i : i + size] for i in range(0, len(items), size)]


def _check_changes(where: object, changes: dict[str, Any]) -> None:
    unknown = set(changes) - set(INCIDENT_FIELDS) | ({"id"} & set(changes))
    if unknown:
        raise StoreError(f"incident store {where}: cannot update field(s) {sorted(unknown)}")


def _where(
    job: str | None = None, since: float | None = None, host: str | None = None
) -> tuple[str, list[Any]]:
    clauses: list[str] = []
    params: list[Any] = []
    for column, value, op in (("job", job, "="), ("time", since, ">="), ("host", host, "=")):
        if value is not None:
            clauses.append(f"{column} {op} ?")
            params.append(value)
    return (" WHERE " + " AND ".join(clauses) if clauses else ""), params


def _incident_row(inc: Incident) -> dict[str, Any]:
    row = inc.to_dict()
    row["evidence"] = json.dumps(row["evidence"], default=str)
    row["resolved"] = int(inc.resolved)
    return row


def _incident_from_row(row: Row) -> Incident:
    data = dict(row)
    if data["root_cause"] not in _CAUSES:  # written by another tool: keep the row readable
        data["root_cause"] = RootCause.UNKNOWN
    try:
        data["evidence"] = tuple(json.loads(data["evidence"] or "[]"))
    except ValueError:
        data["evidence"] = (data["evidence"],)
    return Incident.from_dict(data)


def _fetch_incident(tx: Tx, column: str, value: Any) -> Incident | None:
    rows = tx.query(f"SELECT * FROM incidents WHERE {column} = ?", (value,))
    return _incident_from_row(rows[0]) if rows else None


def _write_changes(tx: Tx, column: str, value: Any, updated: Incident) -> None:
    row = _incident_row(updated)
    del row["id"]
    assign = ", ".join(f"{k} = ?" for k in row)
    tx.run(f"UPDATE incidents SET {assign} WHERE {column} = ?", (*row.values(), value))


def _replace(inc: Incident, **changes: Any) -> Incident:
    data = inc.to_dict()
    data.update(changes)
    return Incident.from_dict(data)

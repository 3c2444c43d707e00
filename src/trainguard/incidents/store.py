"""The incident store: one SQLite file shared by the supervisor, the node agent and the CLI.

WAL journal (readers never block the writer), ``synchronous=FULL`` (a committed incident
survives a crash or power loss), ``busy_timeout`` plus ``BEGIN IMMEDIATE`` writes (several
processes can write at once; each waits its turn instead of failing). One connection per thread,
so a store object can be shared by the threads of a process. Every sqlite3 error leaves as a
`StoreError` naming the file::

    >>> import tempfile, os
    >>> from trainguard.incidents import Incident, RootCause
    >>> with IncidentStore(os.path.join(tempfile.mkdtemp(), "tg.db")) as store:
    ...     inc = store.add(Incident(job="j1", time=100.0, root_cause=RootCause.FAULTY_GPU))
    ...     store.get(inc.id).root_cause.value
    'faulty_gpu'
"""

from __future__ import annotations

import json
import os
import sqlite3
import threading
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from trainguard.errors import StoreError
from trainguard.incidents.goodput import GoodputSummary, Interval, JobInfo, ProgressPoint, goodput
from trainguard.incidents.incident import INCIDENT_FIELDS, Incident
from trainguard.incidents.schema import migrate
from trainguard.incidents.stats import IncidentStats, incident_stats
from trainguard.incidents.taxonomy import RootCause

DB_ENV = "TRAINGUARD_DB"
DEFAULT_DB = "trainguard.db"
# Aliases: inside the class, `list` is the method IncidentStore.list.
_Incidents = list[Incident]
_Jobs = list[JobInfo]
_Intervals = list[Interval]
_Points = list[ProgressPoint]
_CAUSES = frozenset(c.value for c in RootCause)
_JOB_FIELDS = ("name", "command", "started", "ended", "status", "world_size")


def default_db_path(environ: dict[str, str] | None = None) -> Path:
    """``$TRAINGUARD_DB`` if set, else ``./trainguard.db``."""
    value = (os.environ if environ is None else environ).get(DB_ENV)
    return Path(value) if value else Path(DEFAULT_DB)


class IncidentStore:
    """Incidents and the goodput ledger of every job, in one SQLite file.

    ``create=False`` refuses to create a missing file (the CLI's read commands use it).
    """

    def __init__(self, path: str | os.PathLike[str], *, create: bool = True, timeout_s: float = 30.0) -> None:
        self.path = Path(path)
        self._timeout_s = timeout_s
        self._local = threading.local()
        self._pid = os.getpid()
        self._lock = threading.Lock()
        self._conns: list[sqlite3.Connection] = []
        if not self.path.exists():
            if not create:
                raise StoreError(
                    f"no incident store at {self.path}: `trainguard run` creates it when it records a job; "
                    f"pass --db PATH or set ${DB_ENV} to point at an existing one"
                )
            try:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                # Created private (0600): SQLite gives its -wal and -shm files the same mode.
                os.close(os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
            except FileExistsError:
                pass  # another process created it meanwhile
            except OSError as exc:
                raise StoreError(
                    f"cannot create the directory of incident store {self.path}: {exc}"
                ) from None
        with self._mapped():
            migrate(self._conn())

    # -- connections -----------------------------------------------------------------------

    def _conn(self) -> sqlite3.Connection:
        conn: sqlite3.Connection | None = getattr(self._local, "conn", None)
        if conn is not None and getattr(self._local, "pid", None) != os.getpid():
            conn = None  # inherited through fork(): SQLite connections must not cross it
        if conn is None:
            with self._mapped():
                # check_same_thread=False only so close() can close every thread's connection.
                conn = sqlite3.connect(
                    self.path, timeout=self._timeout_s, isolation_level=None, check_same_thread=False
                )
                conn.execute(f"PRAGMA busy_timeout = {int(self._timeout_s * 1000)}")
                self._enable_wal(conn)
                conn.execute("PRAGMA synchronous = FULL")
            self._local.conn, self._local.pid = conn, os.getpid()
            with self._lock:
                self._conns.append(conn)
        return conn

    def _enable_wal(self, conn: sqlite3.Connection) -> None:
        # Switching a fresh file to WAL needs an exclusive lock and SQLite does not call the busy
        # handler for it: when another process is opening the same new file, retry.
        deadline = time.monotonic() + self._timeout_s
        while True:
            try:
                conn.execute("PRAGMA journal_mode = WAL")
                return
            except sqlite3.OperationalError as exc:
                if "locked" not in str(exc) or time.monotonic() > deadline:
                    raise
                time.sleep(0.02)

    @contextmanager
    def _mapped(self) -> Iterator[None]:
        try:
            yield
        except sqlite3.Error as exc:
            raise StoreError(f"incident store {self.path}: {exc}") from exc
        except ValueError as exc:  # raised by migrate() for a too-new schema
            raise StoreError(f"incident store {self.path}: {exc}") from exc

    @contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        conn = self._conn()
        with self._mapped():
            conn.execute("BEGIN IMMEDIATE")  # take the write lock now: no deadlock on upgrade
            try:
                yield conn
            except BaseException:
                conn.execute("ROLLBACK")
                raise
            conn.execute("COMMIT")

    def _read(self, sql: str, params: Iterable[Any] = ()) -> list[sqlite3.Row]:
        conn = self._conn()
        with self._mapped():
            cur = conn.execute(sql, tuple(params))
            cur.row_factory = sqlite3.Row
            return list(cur.fetchall())

    def close(self) -> None:
        with self._lock:
            for conn in self._conns:
                if self._pid == os.getpid():  # a forked child leaves its parent's connections alone
                    conn.close()
            self._conns.clear()
        self._local = threading.local()

    def __enter__(self) -> IncidentStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- incidents -------------------------------------------------------------------------

    def add(self, incident: Incident) -> Incident:
        """Commit an incident (durably) and return it with its id."""
        row = _incident_row(incident)
        del row["id"]
        sql = f"INSERT INTO incidents ({', '.join(row)}) VALUES ({', '.join('?' * len(row))})"
        with self._write() as conn:
            new_id = conn.execute(sql, tuple(row.values())).lastrowid
        return _replace(incident, id=new_id)

    def update(self, incident_id: int, **changes: Any) -> Incident:
        """Change fields of a stored incident (e.g. time_lost_s, resolved); returns it updated."""
        unknown = set(changes) - set(INCIDENT_FIELDS) | ({"id"} & set(changes))
        if unknown:
            raise StoreError(f"incident store {self.path}: cannot update field(s) {sorted(unknown)}")
        with self._write() as conn:
            current = _fetch_incident(conn, incident_id)
            if current is None:
                raise StoreError(f"incident store {self.path}: no incident {incident_id}")
            updated = _replace(current, **changes)
            row = _incident_row(updated)
            del row["id"]
            assign = ", ".join(f"{k} = ?" for k in row)
            conn.execute(f"UPDATE incidents SET {assign} WHERE id = ?", (*row.values(), incident_id))
        return updated

    def get(self, incident_id: int) -> Incident | None:
        rows = self._read("SELECT * FROM incidents WHERE id = ?", (incident_id,))
        return _incident_from_row(rows[0]) if rows else None

    def incidents(
        self, job: str | None = None, since: float | None = None, limit: int | None = None
    ) -> _Incidents:
        """Incidents oldest first; ``limit`` keeps the most recent ones."""
        where, params = _where(job=job, since=since)
        sql = f"SELECT * FROM incidents{where} ORDER BY time DESC, id DESC"
        if limit is not None:
            sql += f" LIMIT {int(limit)}"
        return [_incident_from_row(r) for r in reversed(self._read(sql, params))]

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
        """Upsert a job; fields passed as None are left as they are."""
        unknown = set(changes) - set(_JOB_FIELDS)
        if unknown:
            raise StoreError(f"incident store {self.path}: unknown job field(s) {sorted(unknown)}")
        values = {k: v for k, v in changes.items() if v is not None}
        with self._write() as conn:
            conn.execute("INSERT OR IGNORE INTO jobs (job) VALUES (?)", (job,))
            if values:
                assign = ", ".join(f"{k} = ?" for k in values)
                conn.execute(f"UPDATE jobs SET {assign} WHERE job = ?", (*values.values(), job))
        info = self.get_job(job)
        assert info is not None
        return info

    def get_job(self, job: str) -> JobInfo | None:
        rows = self._read("SELECT * FROM jobs WHERE job = ?", (job,))
        return JobInfo(**dict(rows[0])) if rows else None

    def list_jobs(self) -> _Jobs:
        return [JobInfo(**dict(r)) for r in self._read("SELECT * FROM jobs ORDER BY started, job")]

    # -- goodput ledger ----------------------------------------------------------------------

    def add_interval(self, interval: Interval) -> None:
        self.add_intervals([interval])

    def add_intervals(self, intervals: Iterable[Interval]) -> None:
        rows = [(i.job, i.kind.value, i.start, i.end, i.attempt, i.detail) for i in intervals]
        with self._write() as conn:
            conn.executemany(
                "INSERT INTO intervals (job, kind, start, end, attempt, detail) VALUES (?, ?, ?, ?, ?, ?)",
                rows,
            )

    def intervals(self, job: str) -> _Intervals:
        rows = self._read(
            "SELECT job, kind, start, end, attempt, detail FROM intervals WHERE job = ? ORDER BY start, id",
            (job,),
        )
        return [Interval(**dict(r)) for r in rows]

    def add_progress(
        self, job: str, time: float, step: int, loss: float | None = None, attempt: int = 0
    ) -> None:
        """Record one sampled step (call it every N steps, not every step)."""
        with self._write() as conn:
            conn.execute(
                "INSERT INTO progress (job, time, step, loss, attempt) VALUES (?, ?, ?, ?, ?)",
                (job, time, step, loss, attempt),
            )

    def progress(self, job: str) -> _Points:
        rows = self._read("SELECT * FROM progress WHERE job = ? ORDER BY time", (job,))
        return [ProgressPoint(**dict(r)) for r in rows]

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


def _where(job: str | None = None, since: float | None = None) -> tuple[str, list[Any]]:
    clauses: list[str] = []
    params: list[Any] = []
    if job is not None:
        clauses.append("job = ?")
        params.append(job)
    if since is not None:
        clauses.append("time >= ?")
        params.append(since)
    return (" WHERE " + " AND ".join(clauses) if clauses else ""), params


def _incident_row(inc: Incident) -> dict[str, Any]:
    row = inc.to_dict()
    row["evidence"] = json.dumps(row["evidence"], default=str)
    row["resolved"] = int(inc.resolved)
    return row


def _incident_from_row(row: sqlite3.Row) -> Incident:
    data = dict(row)
    if data["root_cause"] not in _CAUSES:  # written by another tool: keep the row readable
        data["root_cause"] = RootCause.UNKNOWN
    try:
        data["evidence"] = tuple(json.loads(data["evidence"] or "[]"))
    except ValueError:
        data["evidence"] = (data["evidence"],)
    return Incident.from_dict(data)


def _fetch_incident(conn: sqlite3.Connection, incident_id: int) -> Incident | None:
    cur = conn.execute("SELECT * FROM incidents WHERE id = ?", (incident_id,))
    cur.row_factory = sqlite3.Row
    row = cur.fetchone()
    return _incident_from_row(row) if row else None


def _replace(inc: Incident, **changes: Any) -> Incident:
    data = inc.to_dict()
    data.update(changes)
    return Incident.from_dict(data)

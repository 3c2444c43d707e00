"""The SQLite backend of the incident store: one file, the embedded default for one box.

WAL journal (readers never block the writer), ``synchronous=FULL`` (a committed incident
survives a crash or power loss), ``busy_timeout`` plus ``BEGIN IMMEDIATE`` writes (several
processes can write at once; each waits its turn instead of failing). One connection per thread,
so a store object can be shared by the threads of a process. The schema version is SQLite's
``PRAGMA user_version``.
"""

from __future__ import annotations

import os
import sqlite3
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from trainguard.errors import StoreError, StoreUnavailable
from trainguard.incidents.backend import Row

DB_ENV = "TRAINGUARD_DB"
# Errors of the moment (another writer holds the lock past the timeout, a full or failing disk):
# writers keep what they wanted to write and try again.
_TRANSIENT = ("locked", "busy", "disk i/o", "database or disk is full", "unable to open")


class _SqliteTx:
    def __init__(self, conn: sqlite3.Connection) -> None:
        self.conn = conn

    def query(self, sql: str, params: Sequence[Any] = ()) -> list[Row]:
        cur = self.conn.execute(sql, tuple(params))
        cur.row_factory = sqlite3.Row
        return [dict(r) for r in cur.fetchall()]

    def run(self, sql: str, params: Sequence[Any] = ()) -> int:
        return self.conn.execute(sql, tuple(params)).rowcount

    def many(self, sql: str, rows: Sequence[Sequence[Any]]) -> None:
        self.conn.executemany(sql, rows)


class SqliteBackend:
    dialect = "sqlite"

    def __init__(self, path: str | os.PathLike[str], *, create: bool = True, timeout_s: float = 30.0) -> None:
        self.path = Path(path)
        self.where = str(self.path)
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

    def conn(self) -> sqlite3.Connection:
        conn: sqlite3.Connection | None = getattr(self._local, "conn", None)
        if conn is not None and getattr(self._local, "pid", None) != os.getpid():
            conn = None  # inherited through fork(): SQLite connections must not cross it
        if conn is None:
            with self.mapped():
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
    def mapped(self) -> Iterator[None]:
        try:
            yield
        except sqlite3.OperationalError as exc:
            cls = StoreUnavailable if any(t in str(exc).lower() for t in _TRANSIENT) else StoreError
            raise cls(f"incident store {self.path}: {exc}") from exc
        except sqlite3.Error as exc:
            raise StoreError(f"incident store {self.path}: {exc}") from exc

    @contextmanager
    def transaction(self, *, durable: bool = True) -> Iterator[_SqliteTx]:
        conn = self.conn()
        with self.mapped():
            conn.execute("BEGIN IMMEDIATE")  # take the write lock now: no deadlock on upgrade
            try:
                yield _SqliteTx(conn)
            except BaseException:
                conn.execute("ROLLBACK")
                raise
            conn.execute("COMMIT")

    def read(self, sql: str, params: Sequence[Any] = ()) -> list[Row]:
        conn = self.conn()
        with self.mapped():
            return _SqliteTx(conn).query(sql, params)

    def schema_version(self, tx: Any) -> int:
        return int(tx.query("PRAGMA user_version")[0]["user_version"])

    def set_schema_version(self, tx: Any, version: int) -> None:
        tx.run(f"PRAGMA user_version = {int(version)}")

    def migration_lock(self, tx: Any) -> None:
        pass  # BEGIN IMMEDIATE already holds the only write lock

    def copy_rows(self, table: str, columns: Sequence[str], rows: Iterator[Sequence[Any]]) -> int:
        sql = f"INSERT INTO {table} ({', '.join(columns)}) VALUES ({', '.join('?' * len(columns))})"
        batch = list(rows)
        with self.transaction() as tx:
            tx.many(sql, batch)
        return len(batch)

    def close(self) -> None:
        with self._lock:
            for conn in self._conns:
                if self._pid == os.getpid():  # a forked child leaves its parent's connections alone
                    conn.close()
            self._conns.clear()
        self._local = threading.local()

"""The PostgreSQL backend of the incident store: one store for a fleet. The only importer of psycopg.

    >>> store = IncidentStore("postgresql://trainguard@db.example/fleet")  # doctest: +SKIP

One connection per thread (and per process: a forked child opens its own), autocommit on and each
``transaction()`` one BEGIN .. COMMIT. A connection that breaks is dropped and the error is `StoreUnavailable`,
so a writer spools and the next call connects again. The schema version lives in the table
``trainguard_schema``; migrations hold a transaction-scoped advisory lock, so agents starting at
once cannot apply them twice. Statements are written with ``?`` placeholders (the store's SQL
serves both backends) and translated here.
"""

from __future__ import annotations

import contextlib
import functools
import os
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from trainguard.errors import StoreError, StoreUnavailable
from trainguard.incidents.backend import Row, mask_url

try:
    import psycopg
    from psycopg.rows import dict_row
except ImportError:  # pragma: no cover - depends on the environment
    raise ImportError(
        "a PostgreSQL incident store needs psycopg 3: pip install 'trainguard[fleet]'"
    ) from None

_MIGRATION_LOCK = 0x7467_6462  # "tgdb": the advisory lock key of schema migrations


@functools.lru_cache(maxsize=512)
def _pg(sql: str) -> str:
    return sql.replace("%", "%%").replace("?", "%s")


class _PgTx:
    def __init__(self, cur: psycopg.Cursor[Any]) -> None:
        self.cur = cur

    def query(self, sql: str, params: Sequence[Any] = ()) -> list[Row]:
        self.cur.execute(_pg(sql), tuple(params))
        return list(self.cur.fetchall()) if self.cur.description else []

    def run(self, sql: str, params: Sequence[Any] = ()) -> int:
        self.cur.execute(_pg(sql), tuple(params))
        return self.cur.rowcount

    def many(self, sql: str, rows: Sequence[Sequence[Any]]) -> None:
        if rows:
            self.cur.executemany(_pg(sql), [tuple(r) for r in rows])


class PostgresBackend:
    dialect = "postgresql"

    def __init__(self, url: str, *, timeout_s: float = 30.0) -> None:
        self.url = url
        self.where = mask_url(url)
        self._timeout_s = timeout_s
        self._local = threading.local()
        self._lock = threading.Lock()
        self._conns: list[psycopg.Connection[Any]] = []
        self._pid = os.getpid()

    def conn(self) -> psycopg.Connection[Any]:
        conn: psycopg.Connection[Any] | None = getattr(self._local, "conn", None)
        if conn is not None and (getattr(self._local, "pid", None) != os.getpid() or conn.closed):
            conn = None
        if conn is None:
            with self.mapped():
                conn = psycopg.connect(
                    self.url,
                    row_factory=dict_row,
                    autocommit=True,  # each transaction() block is one BEGIN .. COMMIT
                    connect_timeout=max(1, int(min(self._timeout_s, 10))),
                    application_name="trainguard",
                )
            self._local.conn, self._local.pid = conn, os.getpid()
            with self._lock:
                self._conns.append(conn)
        return conn

    def _drop(self) -> None:
        conn = getattr(self._local, "conn", None)
        self._local.conn = None
        if conn is not None:
            with self._lock:
                if conn in self._conns:
                    self._conns.remove(conn)
            with contextlib.suppress(psycopg.Error):
                conn.close()

    @contextmanager
    def mapped(self) -> Iterator[None]:
        try:
            yield
        except psycopg.OperationalError as exc:
            self._drop()
            # libpq's messages may quote the connection string: never let a password through.
            raise StoreUnavailable(f"incident store {self.where}: {_clean(exc, self.url)}") from None
        except psycopg.Error as exc:
            broken = getattr(self._local, "conn", None)
            if broken is not None and broken.broken:
                self._drop()
                raise StoreUnavailable(f"incident store {self.where}: {_clean(exc, self.url)}") from None
            raise StoreError(f"incident store {self.where}: {_clean(exc, self.url)}") from None

    @contextmanager
    def transaction(self, *, durable: bool = True) -> Iterator[_PgTx]:
        if not durable:
            with self._batch() as tx:
                yield tx
            return
        with self.mapped(), contextlib.ExitStack() as stack:
            conn = self.conn()
            try:
                stack.enter_context(conn.transaction())
            except psycopg.OperationalError:  # closed by a server restart since its last use: once more
                self._drop()
                conn = self.conn()
                stack.enter_context(conn.transaction())
            cur = stack.enter_context(conn.cursor())
            yield _PgTx(cur)

    @contextmanager
    def _batch(self) -> Iterator[_PgTx]:
        """A write-only transaction sent as one pipeline (one round trip, one sync) that does not
        wait for the WAL flush: for rows whose loss in a server crash is acceptable (verdicts)."""
        with self.mapped():
            conn = self.conn()
            if conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
                self._drop()
                conn = self.conn()
            try:
                with conn.pipeline(), conn.cursor() as cur:
                    cur.execute("BEGIN")
                    cur.execute("SET LOCAL synchronous_commit = off")
                    yield _PgTx(cur)
                    cur.execute("COMMIT")
            except BaseException:
                if not conn.closed and conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
                    with contextlib.suppress(psycopg.Error):
                        conn.execute("ROLLBACK")
                raise

    def read(self, sql: str, params: Sequence[Any] = ()) -> list[Row]:
        """One statement in autocommit: one round trip (a read needs no BEGIN .. COMMIT)."""
        with self.mapped():
            conn = self.conn()
            try:
                cur = conn.execute(_pg(sql), tuple(params))
            except psycopg.OperationalError:  # closed by a server restart since its last use: once more
                self._drop()
                cur = self.conn().execute(_pg(sql), tuple(params))
            return list(cur.fetchall()) if cur.description else []

    def schema_version(self, tx: Any) -> int:
        # Created only when missing: a writer role may read the version but not create tables
        # (CREATE TABLE IF NOT EXISTS checks that right before it looks; incidents/roles.py).
        if tx.query("SELECT to_regclass('trainguard_schema') IS NULL AS missing")[0]["missing"]:
            tx.run("CREATE TABLE trainguard_schema (version INTEGER NOT NULL)")
        rows = tx.query("SELECT version FROM trainguard_schema")
        return int(rows[0]["version"]) if rows else 0

    def set_schema_version(self, tx: Any, version: int) -> None:
        tx.run("DELETE FROM trainguard_schema")
        tx.run("INSERT INTO trainguard_schema (version) VALUES (?)", (int(version),))

    def migration_lock(self, tx: Any) -> None:
        tx.query("SELECT pg_advisory_xact_lock(?)", (_MIGRATION_LOCK,))

    def copy_rows(self, table: str, columns: Sequence[str], rows: Iterator[Sequence[Any]]) -> int:
        n = 0
        with self.transaction() as tx, tx.cur.copy(f"COPY {table} ({', '.join(columns)}) FROM STDIN") as copy:
            for row in rows:
                copy.write_row(row)
                n += 1
        return n

    def close(self) -> None:
        with self._lock:
            for conn in self._conns:
                if self._pid == os.getpid():
                    with contextlib.suppress(psycopg.Error):
                        conn.close()
            self._conns.clear()
        self._local = threading.local()


def _clean(exc: BaseException, url: str) -> str:
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    from trainguard.incidents.backend import password_of

    password = password_of(url)
    return text.replace(password, "***") if password else text

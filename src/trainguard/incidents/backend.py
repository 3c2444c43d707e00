"""Where the incident store lives: a SQLite file (one box) or a PostgreSQL server (a fleet).

    IncidentStore (incidents/store.py)  --SQL with ? placeholders-->  Backend
        SqliteBackend  (incidents/sqlite.py, stdlib)
        PostgresBackend (incidents/postgres.py, the only importer of psycopg)

A backend runs the store's SQL in transactions and maps its driver's errors: a database that
cannot be reached now is `StoreUnavailable` (writers spool and replay), anything else is
`StoreError`. Every message names the store by `mask_url` (never a password).

A store is named by a path (``./trainguard.db``, ``sqlite:///abs/path.db``) or a URL
(``postgresql://user@host:5432/db``). The password comes from ``$TRAINGUARD_DB`` (the whole URL),
a libpq passfile (``$PGPASSFILE``, ``~/.pgpass``, ``?passfile=``) or ``$PGPASSWORD``; a URL
with a password given on the command line is refused, since every user of the host can read it
in ``ps``::

    >>> mask_url("postgresql://tg:s3cret@db.example:5432/fleet")
    'postgresql://tg:***@db.example:5432/fleet'
    >>> is_url("postgresql://db/fleet"), is_url("runs/trainguard.db")
    (True, False)
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager
from typing import Any, Protocol
from urllib.parse import urlsplit

from trainguard.errors import ConfigError

POSTGRES_SCHEMES = ("postgresql", "postgres")
Row = dict[str, Any]


class Tx(Protocol):
    """One open transaction: SQL with ``?`` placeholders."""

    def query(self, sql: str, params: Sequence[Any] = ()) -> list[Row]: ...

    def run(self, sql: str, params: Sequence[Any] = ()) -> int:
        """Execute; returns the number of rows changed."""
        ...

    def many(self, sql: str, rows: Sequence[Sequence[Any]]) -> None: ...


class Backend(Protocol):
    dialect: str  # "sqlite" | "postgresql": picks the DDL flavour of the migrations
    where: str  # the store's name for messages, password masked

    def transaction(self, *, durable: bool = True) -> AbstractContextManager[Tx]:
        """A write transaction; ``durable=False`` may skip waiting for the disk (verdicts)."""
        ...

    def read(self, sql: str, params: Sequence[Any] = ()) -> list[Row]: ...

    def schema_version(self, tx: Tx) -> int: ...

    def set_schema_version(self, tx: Tx, version: int) -> None: ...

    def migration_lock(self, tx: Tx) -> None:
        """Serialise concurrent migrations (called first inside the migrating transaction)."""
        ...

    def copy_rows(self, table: str, columns: Sequence[str], rows: Iterator[Sequence[Any]]) -> int:
        """Bulk-load rows (PostgreSQL: COPY) bypassing the writers; for benchmarks and imports."""
        ...

    def close(self) -> None: ...


def is_url(target: str | object) -> bool:
    return isinstance(target, str) and urlsplit(target).scheme in (*POSTGRES_SCHEMES, "sqlite")


def mask_url(url: str) -> str:
    """The URL with its password (in the userinfo or a ``password=`` parameter) replaced by ***."""
    url = re.sub(r"(://[^:/@?#]*):[^@/?#]*@", r"\1:***@", url)
    return re.sub(r"(?i)(password=)[^&\s]*", r"\1***", url)


def url_has_password(url: str) -> bool:
    return mask_url(url) != url


def check_cli_target(target: str | None) -> None:
    """Refuse credentials on the command line (visible to every user in ``ps``)."""
    if target and is_url(target) and url_has_password(target):
        raise ConfigError(
            f"--db {mask_url(target)}: a password on the command line is visible to every user of "
            "this host; put the URL in $TRAINGUARD_DB, or the password in a passfile "
            "($PGPASSFILE or ~/.pgpass, mode 0600)"
        )


def open_backend(target: str, *, create: bool = True, timeout_s: float = 30.0) -> Backend:
    """The backend for a path or URL (see the module docstring)."""
    parts = urlsplit(target) if is_url(target) else None
    if parts is not None and parts.scheme in POSTGRES_SCHEMES:
        from trainguard.incidents.postgres import PostgresBackend

        return PostgresBackend(target, timeout_s=timeout_s)
    from trainguard.incidents.sqlite import SqliteBackend

    path = target
    if parts is not None:  # sqlite:///abs/path or sqlite://rel/path
        path = (parts.netloc + parts.path) if parts.netloc else parts.path
    return SqliteBackend(path, create=create, timeout_s=timeout_s)

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

Any other ``scheme://`` (``mysql://...``) is refused with the schemes that work, never taken for a
file name.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import urlsplit

from trainguard.errors import ConfigError

POSTGRES_SCHEMES = ("postgresql", "postgres")
DB_ENV = "TRAINGUARD_DB"
DEFAULT_DB = "trainguard.db"


def default_db_path(environ: dict[str, str] | None = None) -> Path:
    """``$TRAINGUARD_DB`` if set, else ``./trainguard.db`` (a URL there: see `default_db`)."""
    value = (os.environ if environ is None else environ).get(DB_ENV)
    return Path(value) if value else Path(DEFAULT_DB)


def default_db(environ: dict[str, str] | None = None) -> str:
    """``$TRAINGUARD_DB`` (a path or a ``postgresql://`` URL) if set, else ``./trainguard.db``."""
    return (os.environ if environ is None else environ).get(DB_ENV) or DEFAULT_DB


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
    """The URL with its password (in the userinfo or a ``password=`` parameter) replaced by ***.
    A password with ``#``, ``?`` or ``/`` in it (not percent-encoded, as people type them) is
    masked whole: everything from the user's ``:`` to the last ``@``.

    >>> mask_url("postgresql://tg:pa#ss?w/rd@db/fleet")
    'postgresql://tg:***@db/fleet'
    """
    scheme, sep, rest = url.partition("://")
    if sep and "@" in rest:
        userinfo, _, host = rest.rpartition("@")
        user, colon, _password = userinfo.partition(":")
        if colon:
            url = f"{scheme}://{user}:***@{host}"
    return re.sub(r"(?i)(password\s*=\s*)('[^']*'|[^&\s]*)", r"\1***", url)


def password_of(url: str) -> str | None:
    """The password in a URL's userinfo, as ``mask_url`` finds it (``#`` and all)."""
    _scheme, sep, rest = url.partition("://")
    if not sep or "@" not in rest:
        return None
    _user, colon, password = rest.rpartition("@")[0].partition(":")
    return password if colon and password else None


def url_has_password(url: str) -> bool:
    return mask_url(url) != url


_KEYWORDS = re.compile(
    r"^\s*(host|hostaddr|port|dbname|user|password|passfile|sslmode|service|options)\s*=", re.I
)


def is_keyword_string(target: str | object) -> bool:
    """A libpq ``key=value`` connection string (``host=db dbname=fleet``), not a path."""
    return isinstance(target, str) and _KEYWORDS.match(target) is not None


def check_scheme(target: str | None) -> None:
    """Refuse a URL whose scheme names no backend (``mysql://``), naming the ones that work."""
    scheme, sep, _rest = (target or "").partition("://")
    if sep and re.fullmatch(r"[A-Za-z][A-Za-z0-9+.-]*", scheme) and not is_url(target):
        raise ConfigError(
            f"{mask_url(target or '')}: {scheme}:// is not a store this version can use; the incident "
            "store is a SQLite file (a path, or sqlite:///abs/path.db) or PostgreSQL "
            "(postgresql://user@host:5432/dbname)"
        )


def check_cli_target(target: str | None) -> None:
    """Refuse credentials on the command line (visible to every user in ``ps``) and a URL no
    backend takes."""
    check_scheme(target)
    if target and (is_url(target) or is_keyword_string(target)) and url_has_password(target):
        raise ConfigError(
            f"--db {mask_url(target)}: a password on the command line is visible to every user of "
            "this host; put the URL in $TRAINGUARD_DB, or the password in a passfile "
            "($PGPASSFILE or ~/.pgpass, mode 0600)"
        )


def open_backend(target: str, *, create: bool = True, timeout_s: float = 30.0) -> Backend:
    """The backend for a path or URL (see the module docstring)."""
    if is_keyword_string(target):
        raise ConfigError(
            f"{mask_url(target)}: a libpq key=value connection string is not a store name (it would "
            "become a SQLite file of that name); write it as a URL, postgresql://user@host:5432/dbname"
        )
    check_scheme(target)
    parts = urlsplit(target) if is_url(target) else None
    if parts is not None and parts.scheme in POSTGRES_SCHEMES:
        from trainguard.incidents.postgres import PostgresBackend

        return PostgresBackend(target, timeout_s=timeout_s)
    from trainguard.incidents.sqlite import SqliteBackend

    path = target
    if parts is not None:  # sqlite:///abs/path or sqlite://rel/path
        path = (parts.netloc + parts.path) if parts.netloc else parts.path
    return SqliteBackend(path, create=create, timeout_s=timeout_s)

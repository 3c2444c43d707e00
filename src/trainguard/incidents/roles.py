"""Least privilege in the fleet's PostgreSQL store: the schema owned by one migration role, and
each node writing as a role of its own that may change its own host's rows and nothing else.

    trainguard fleet migrate      --db postgresql://trainguard_owner@db/fleet   # schema changes
    trainguard fleet roles setup  --db postgresql://trainguard_owner@db/fleet   # once, and after each migrate
    trainguard fleet roles add gpu-node-1 --password-file pw.txt --db ...       # login role tg_gpu-node-1

What ``setup`` makes (run as the role that owns the tables; ``add`` needs CREATEROLE too):

* ``trainguard_writer``, a group role without login: SELECT on every table, INSERT, UPDATE and
  DELETE on the tables with a ``host`` column, nothing on the schema (no CREATE, ALTER, DROP,
  TRUNCATE: those belong to the tables' owner);
* ``trainguard_writers`` (role name -> host), readable by the owner alone, and
  ``trainguard_hosts_of(role)``, a SECURITY DEFINER function reading it;
* on every table with a ``host`` column, row-level security: every row is readable (the fleet
  page reads the whole fleet), and a member of ``trainguard_writer`` may insert, change or
  delete a row only while its ``host`` is one the mapping gives the role the statement runs as.

A node's agent and supervisors connect as that node's role (``TRAINGUARD_DB=postgresql://
tg_gpu-node-1@db/fleet``); a row for another host is refused by PostgreSQL (``new row violates
row-level security policy``), another host's row is invisible to an UPDATE or DELETE, and a
schema change is ``permission denied``. A writer opening a store whose schema is older than its
code gets a clear error naming ``trainguard fleet migrate``. People's tools that write for the
whole fleet (``trainguard fleet breaker reset`` from a login node) run as the owner or as a role
mapped to the login node's host.

Passwords never reach the server in clear: ``add`` sends a SCRAM-SHA-256 verifier made here
(what psql's ``\\password`` sends), so no statement log holds the password::

    >>> scram_verifier("correct horse", salt=bytes(16)).split("$")[0]
    'SCRAM-SHA-256'
    >>> quote_ident('tg_gpu-node-1')
    '"tg_gpu-node-1"'
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
import re
from typing import Any

from trainguard.errors import ConfigError, StoreError

__all__ = [
    "GROUP",
    "MAPPING",
    "add_writer",
    "host_tables",
    "is_set_up",
    "quote_ident",
    "role_for",
    "scram_verifier",
    "setup",
]

GROUP = "trainguard_writer"
MAPPING = "trainguard_writers"
_NAME = re.compile(r"[A-Za-z0-9_.-]{1,63}")  # role names and hosts: no quote, no placeholder


def quote_ident(name: str) -> str:
    """``name`` as a quoted SQL identifier (refused unless letters, digits, ``_ . -``)."""
    if not _NAME.fullmatch(name):
        raise ConfigError(f"{name!r} cannot be a role name: use letters, digits, '_', '.', '-' (at most 63)")
    return f'"{name}"'


def role_for(host: str) -> str:
    """The login role of ``host`` by default: ``tg_<host>``."""
    return f"tg_{host}"


def scram_verifier(password: str, *, salt: bytes | None = None, iterations: int = 4096) -> str:
    """PostgreSQL's SCRAM-SHA-256 verifier of ``password`` (RFC 5802/7677, as libpq makes it).
    Printable ASCII only: PostgreSQL runs other passwords through SASLprep first."""
    if not password or not all(" " < c <= "~" for c in password):
        raise ConfigError("the password must be printable ASCII without spaces (e.g. openssl rand -hex 24)")
    salt = os.urandom(16) if salt is None else salt
    salted = hashlib.pbkdf2_hmac("sha256", password.encode(), salt, iterations)
    client_key = hmac.new(salted, b"Client Key", "sha256").digest()
    stored_key = hashlib.sha256(client_key).digest()
    server_key = hmac.new(salted, b"Server Key", "sha256").digest()
    b64 = base64.b64encode
    return f"SCRAM-SHA-256${iterations}:{b64(salt).decode()}${b64(stored_key).decode()}:{b64(server_key).decode()}"


def host_tables(tx: Any) -> list[str]:
    """The tables of the store's schema with a ``host`` column: the rows a node writes (the
    role mapping's own ``host`` column aside)."""
    rows = tx.query(
        "SELECT table_name FROM information_schema.columns WHERE table_schema = current_schema() "
        "AND column_name = 'host' AND table_name <> ? ORDER BY table_name",
        (MAPPING,),
    )
    return [str(r["table_name"]) for r in rows]


def _statements(tables: list[str]) -> list[str]:
    group = quote_ident(GROUP)
    out = [
        f"DO $$ BEGIN IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = '{GROUP}') "
        f"THEN CREATE ROLE {group} NOLOGIN; END IF; END $$",
        "REVOKE CREATE ON SCHEMA public FROM PUBLIC",  # the default since PostgreSQL 15
        f"GRANT USAGE ON SCHEMA public TO {group}",
        f"CREATE TABLE IF NOT EXISTS {MAPPING} (role_name TEXT PRIMARY KEY, host TEXT NOT NULL)",
        f"REVOKE ALL ON {MAPPING} FROM PUBLIC",
        "CREATE OR REPLACE FUNCTION trainguard_hosts_of(who NAME) RETURNS SETOF TEXT LANGUAGE sql "
        "STABLE SECURITY DEFINER SET search_path = pg_catalog, public "
        f"AS $$ SELECT host FROM {MAPPING} WHERE role_name = who $$",
        "REVOKE ALL ON FUNCTION trainguard_hosts_of(NAME) FROM PUBLIC",
        f"GRANT EXECUTE ON FUNCTION trainguard_hosts_of(NAME) TO {group}",
        f"GRANT SELECT ON trainguard_schema TO {group}",
    ]
    own = "host IN (SELECT trainguard_hosts_of(current_user))"
    for table in tables:
        t = quote_ident(table)
        out += [
            f"GRANT SELECT, INSERT, UPDATE, DELETE ON {t} TO {group}",
            f"ALTER TABLE {t} ENABLE ROW LEVEL SECURITY",
            f"DROP POLICY IF EXISTS trainguard_read ON {t}",
            f"CREATE POLICY trainguard_read ON {t} FOR SELECT USING (true)",
            f"DROP POLICY IF EXISTS trainguard_own_host ON {t}",
            f"CREATE POLICY trainguard_own_host ON {t} FOR ALL TO {group} USING ({own}) WITH CHECK ({own})",
        ]
    return out


def setup(backend: Any) -> list[str]:
    """Make (or bring up to date) the writer group, the mapping and the policies, in one
    transaction, as the owner of the store's tables; the tables it covers."""
    _postgres(backend)
    try:
        with backend.transaction() as tx:
            tables = host_tables(tx)
            for statement in _statements(tables):
                tx.run(statement)
    except StoreError as exc:
        raise StoreError(f"{exc} (roles setup runs as the role that owns the store's tables)") from None
    return tables


def add_writer(backend: Any, host: str, role: str | None = None, password: str | None = None) -> str:
    """A login role for ``host`` (default ``tg_<host>``), in the writer group, mapped to that
    host; with ``password`` its SCRAM verifier is set. Needs CREATEROLE. Returns the role."""
    _postgres(backend)
    role = role or role_for(host)
    quote_ident(host)  # hosts follow the same alphabet
    name = quote_ident(role)
    secret = f" PASSWORD '{scram_verifier(password)}'" if password is not None else ""
    try:
        with backend.transaction() as tx:
            exists = tx.query("SELECT 1 FROM pg_roles WHERE rolname = ?", (role,))
            tx.run(f"{'ALTER' if exists else 'CREATE'} ROLE {name} LOGIN{secret}")
            tx.run(f"GRANT {quote_ident(GROUP)} TO {name}")
            tx.run(
                f"INSERT INTO {MAPPING} (role_name, host) VALUES (?, ?) "
                "ON CONFLICT (role_name) DO UPDATE SET host = excluded.host",
                (role, host),
            )
    except StoreError as exc:
        raise StoreError(
            f"{exc} (run `trainguard fleet roles setup` first, as the tables' owner with CREATEROLE)"
        ) from None
    return role


def is_set_up(backend: Any) -> bool:
    """Whether ``setup`` has run on this PostgreSQL store."""
    rows = backend.read("SELECT to_regclass(?) IS NOT NULL AS made", (MAPPING,))
    return bool(rows[0]["made"])


def _postgres(backend: Any) -> None:
    if backend.dialect != "postgresql":
        raise ConfigError(
            f"{backend.where} is a SQLite file: database roles are PostgreSQL's (a node's own SQLite "
            "store is guarded by its file mode, 0600)"
        )

"""`trainguard fleet migrate` and `trainguard fleet roles`: who may change the fleet store's
schema, and who may write which rows (incidents/roles.py says what each makes).

    trainguard fleet migrate [--db URL]                   # as the tables' owner: schema to this version
    trainguard fleet roles setup [--db URL]               # as the owner: writer group, mapping, policies
    trainguard fleet roles add HOST [--role NAME] [--password-file F] [--db URL]   # + CREATEROLE

Exit codes: 0 done, 2 no store, not PostgreSQL, or PostgreSQL refused (the message says why).
"""

from __future__ import annotations

import argparse
import contextlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from trainguard.cli.incidents import add_db_argument


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """The ``migrate`` and ``roles`` verbs of ``trainguard fleet``."""
    m = sub.add_parser(
        "migrate",
        help="bring the store's schema to this trainguard's version (as the role that owns it)",
        description="Bring the store's schema to this trainguard's version, and the roles' policies "
        "with it when `roles setup` has run. Run it as the role that owns the tables: a node's "
        "writer role may not change the schema.",
    )
    add_db_argument(m)
    m.add_argument("--json", action="store_true", help="print JSON")
    m.set_defaults(func=run_migrate)
    r = sub.add_parser(
        "roles",
        help="least privilege in PostgreSQL: a writer role per node that may write only its own rows",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    verbs = r.add_subparsers(dest="roles_command", metavar="{setup,add}", required=True)
    s = verbs.add_parser(
        "setup", help="the writer group, the role->host mapping and row-level security on every table"
    )
    a = verbs.add_parser("add", help="a login role for one node's agent and supervisors, mapped to its host")
    a.add_argument("host", help="the node's host name, as its rows carry it ($TRAINGUARD_HOSTNAME)")
    a.add_argument("--role", help="the role's name (default tg_HOST)")
    a.add_argument(
        "--password-file",
        type=Path,
        help="a file (mode 0600) holding the role's password; sent as a SCRAM verifier, never in clear",
    )
    for q in (s, a):
        add_db_argument(q)
        q.add_argument("--json", action="store_true", help="print JSON")
        q.set_defaults(func=run_roles)


@contextlib.contextmanager
def _backend(db: str | None) -> Iterator[Any]:
    from trainguard.incidents.backend import check_cli_target, open_backend
    from trainguard.incidents.store import default_db

    check_cli_target(db)
    backend = open_backend(db or default_db(), create=False)
    try:
        yield backend
    finally:
        backend.close()


def run_migrate(args: argparse.Namespace) -> int:
    from trainguard.incidents import roles
    from trainguard.incidents.schema import SCHEMA_VERSION, migrate

    with _backend(args.db) as backend:
        found = migrate(backend)
        tables = None
        if backend.dialect == "postgresql" and roles.is_set_up(backend):
            tables = roles.setup(backend)  # policies for any table the migration added
    if args.json:
        print(json.dumps({"schema_version": SCHEMA_VERSION, "was": found, "policies": tables}))
    else:
        was = "" if found == SCHEMA_VERSION else f" (was {found})"
        print(
            f"schema version {SCHEMA_VERSION}{was}"
            + (f"; policies on {len(tables)} tables" if tables else "")
        )
    return 0


def run_roles(args: argparse.Namespace) -> int:
    from trainguard.incidents import roles
    from trainguard.tokens import read_token

    with _backend(args.db) as backend:
        if args.roles_command == "setup":
            tables = roles.setup(backend)
            out: dict[str, Any] = {"group": roles.GROUP, "tables": tables}
            text = f"{roles.GROUP}: own-host rows only on {len(tables)} tables ({', '.join(tables)})"
        else:
            password = read_token(args.password_file) if args.password_file else None
            role = roles.add_writer(backend, args.host, args.role, password)
            out = {"role": role, "host": args.host, "password": password is not None}
            text = f"{role}: writes {args.host}'s rows only" + ("" if password else " (no password set)")
    print(json.dumps(out) if args.json else text)
    return 0

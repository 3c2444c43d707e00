"""`trainguard incidents list|show|stats`: read the incident store.

    trainguard incidents list  [--job J] [--since WHEN] [--limit N] [--json] [--db PATH]
    trainguard incidents show  ID [--json] [--db PATH]
    trainguard incidents stats [--job J] [--json] [--db PATH]

The store is ``--db PATH|URL``, else ``$TRAINGUARD_DB``, else ``./trainguard.db``; a
``postgresql://user@host/db`` URL reads a fleet store (the password from $TRAINGUARD_DB or a
passfile, never from --db). Exit codes:
0 shown, 1 no such incident, 2 no store / unreadable store / bad usage.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from datetime import UTC, datetime
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from trainguard.incidents import Incident, IncidentStore


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = subparsers.add_parser(
        "incidents",
        help="list, show and count recorded incidents",
        description="Read the incident store that `trainguard run` and the node agent write.",
    )
    sub = p.add_subparsers(dest="incidents_command", metavar="{list,show,stats}")
    ls = sub.add_parser("list", help="incidents, oldest first")
    ls.add_argument("--job", help="only this job")
    ls.add_argument(
        "--since",
        type=parse_since,
        metavar="WHEN",
        help="only incidents detected at or after WHEN: unix seconds, an ISO time (UTC unless it says), "
        "or a duration ago such as 90m, 6h, 2d",
    )
    ls.add_argument("--limit", type=int, default=50, help="show the N most recent (default 50; 0 = all)")
    show = sub.add_parser(
        "show",
        help="one incident with its evidence",
        description="One incident: when it started and was detected, its root cause and evidence, "
        "the rank, GPU and node it names, the action taken, whether it was resolved and the time it "
        "cost. IDs come from `trainguard incidents list` or `trainguard report JOB`.",
    )
    show.add_argument("id", type=int, metavar="ID")
    stats = sub.add_parser("stats", help="counts by root cause, category and action; MTBF; time lost")
    stats.add_argument("--job", help="only this job")
    for q in (ls, show, stats):
        add_db_argument(q)
        q.add_argument("--json", action="store_true", help="print JSON")
    ls.set_defaults(func=run_list)
    show.set_defaults(func=run_show)
    stats.set_defaults(func=run_stats)

    def usage(args: argparse.Namespace) -> int:
        p.print_help()
        return 2

    p.set_defaults(func=usage)


def add_db_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--db",
        metavar="PATH|URL",
        help="incident store: a SQLite path or postgresql://user@host/db (default: $TRAINGUARD_DB, "
        "else ./trainguard.db; a password goes in $TRAINGUARD_DB or a passfile, never here)",
    )


def open_store(path: str | None) -> IncidentStore:
    """Open an existing store for reading; a missing file is a StoreError (exit 2) naming it."""
    from trainguard.incidents import IncidentStore
    from trainguard.incidents.backend import check_cli_target
    from trainguard.incidents.store import default_db

    check_cli_target(path)
    return IncidentStore(path or default_db(), create=False)


def run_list(args: argparse.Namespace) -> int:
    with open_store(args.db) as store:
        incidents = store.incidents(job=args.job, since=args.since, limit=args.limit or None)
    if args.json:
        print(json.dumps([i.to_dict() for i in incidents], indent=1, default=str))
        return 0
    if not incidents:
        print("no incidents" + (f" for job {args.job}" if args.job else ""))
        return 0
    from trainguard.incidents.report import format_table

    rows = [["id", "detected (UTC)", "job", "root cause", "action", "where", "lost", "summary"]]
    for i in incidents:
        lost = f"{i.time_lost_s:.1f}s" if i.time_lost_s is not None else "-"
        rows.append(
            [str(i.id), fmt_time(i.time), i.job, i.root_cause.value, i.action, _where(i), lost, i.summary]
        )
    print("\n".join(format_table(rows)))
    return 0


def run_show(args: argparse.Namespace) -> int:
    with open_store(args.db) as store:
        inc = store.get(args.id)
    if inc is None:
        print(f"trainguard incidents: no incident {args.id} in {args.db or 'the store'}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(inc.to_dict(), indent=1, default=str))
        return 0
    d = inc.to_dict()
    d["time"] = f"{fmt_time(inc.time)}  ({inc.time})"
    if inc.started is not None:
        d["started"] = f"{fmt_time(inc.started)}  ({inc.started})"
    evidence = d.pop("evidence")
    print(f"incident {inc.id}: {inc.root_cause.value}")
    for key, value in d.items():
        if key != "id" and value is not None:
            shown = f"{value:.3f}" if isinstance(value, float) else value
            print(f"  {key:<18} {shown}")
    print(f"  evidence ({len(evidence)})")
    for item in evidence:
        print(f"    - {item if isinstance(item, str) else json.dumps(item, default=str)}")
    return 0


def run_stats(args: argparse.Namespace) -> int:
    with open_store(args.db) as store:
        stats = store.stats(job=args.job)
    if args.json:
        print(json.dumps(stats.to_dict(), indent=1))
        return 0
    print(f"incidents: {stats.count}" + (f" (job {args.job})" if args.job else ""))
    if not stats.count:
        return 0
    mtbf = f"{stats.mtbf_s:.1f}s" if stats.mtbf_s is not None else "-"
    print(f"time lost: {stats.time_lost_s:.1f}s   MTBF: {mtbf}   unresolved: {stats.unresolved}")
    for title, counts in (
        ("root cause", stats.by_root_cause),
        ("category", stats.by_category),
        ("action", stats.by_action),
    ):
        print(f"\nby {title}")
        for name, n in counts.items():
            print(f"  {name:<24} {n:>5}  {n / stats.count:6.1%}")
    return 0


_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


def parse_since(text: str, now: float | None = None) -> float:
    """``1700000000`` / ``2026-11-22T08:00`` / ``6h`` (ago) -> unix seconds."""
    text = text.strip()
    try:
        return float(text)
    except ValueError:
        pass
    if text[:-1] and text[-1] in _UNITS:
        try:
            ago = float(text[:-1]) * _UNITS[text[-1]]
        except ValueError:
            pass
        else:
            return (time.time() if now is None else now) - ago
    try:
        when = datetime.fromisoformat(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not unix seconds, an ISO time or a duration like 6h"
        ) from None
    return (when if when.tzinfo else when.replace(tzinfo=UTC)).timestamp()


def fmt_time(t: float) -> str:
    """Unix times as UTC; small (virtual-clock) times as seconds."""
    if t > 1e9:
        return datetime.fromtimestamp(t, tz=UTC).strftime("%Y-%m-%d %H:%M:%S")
    return f"t={t:.1f}s"


def _where(i: Incident) -> str:
    parts = [
        f"node {i.node}" if i.node else "",
        f"gpu {i.gpu}" if i.gpu is not None else "",
        f"rank {i.rank}" if i.rank is not None else "",
    ]
    return ", ".join(p for p in parts if p) or "-"

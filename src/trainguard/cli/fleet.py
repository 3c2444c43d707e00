"""`trainguard fleet status|nodes|lemons|mtbf|incidents|breaker`: read the fleet's store.

    trainguard fleet status    [--group G] [--json] [--db PATH|URL]
    trainguard fleet nodes     [--group G] [--rack R] [--health H] [--json]
    trainguard fleet lemons    [--since WHEN] [--limit N] [--json]
    trainguard fleet mtbf      [--since WHEN] [--json]
    trainguard fleet incidents [--host H] [--group G] [--since WHEN] [--limit N] [--json]
    trainguard fleet breaker   [--since WHEN] [--limit N] [--json]   # held now, events, over the fleet
    trainguard fleet breaker status [--policy P] [--state-dir D] [--json]   # this breaker's live state
    trainguard fleet breaker reset  [--job J] [--db PATH|URL] [--json]      # a person closes it
    trainguard fleet migrate        [--db URL]     # the schema, as the role that owns it
    trainguard fleet roles setup|add HOST [--db URL]   # a writer role per node (cli/fleet_db.py)

The store every agent and supervisor of the fleet writes: ``--db``, else ``$TRAINGUARD_DB``
(``postgresql://user@host/db``; the password from ``$TRAINGUARD_DB`` or a passfile), else
``./trainguard.db`` (one node's SQLite store answers the same questions). Exit codes: 0 shown,
2 no store / unreadable store / bad usage; ``breaker status`` exits 1 while a breaker is open.
A verb's options go after the verb (``fleet breaker reset --json``).
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from trainguard.cli.incidents import add_db_argument, fmt_time, open_store, parse_since

VERBS = ("status", "nodes", "lemons", "mtbf", "incidents", "breaker")


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = subparsers.add_parser(
        "fleet",
        help="the whole fleet from one store: verdicts by group, lemons, MTBF, incidents, breakers",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = p.add_subparsers(dest="fleet_command", metavar="{" + ",".join((*VERBS, "migrate", "roles")) + "}")
    helps = {
        "status": "nodes by verdict per group and rack, stale nodes, incidents of the last 24 h",
        "nodes": "every node with its verdict",
        "lemons": "the GPUs and nodes with the most hardware incidents, with their latest",
        "mtbf": "mean time between failures by root cause and by node group",
        "incidents": "the latest incidents with the node that recorded them",
        "breaker": "what the remediation breakers hold now, and their recent events (status, reset)",
    }
    for verb in VERBS:
        if verb == "breaker":
            from trainguard.cli.remediate import add_breaker_parser

            desc = helps[verb] + " (no VERB); `status`: its live state; `reset`: a person closes it"
            q = add_breaker_parser(sub, required=False, help=helps[verb], description=desc)
        else:
            q = sub.add_parser(verb, help=helps[verb], description=helps[verb])
        add_db_argument(q)
        q.add_argument("--json", action="store_true", help="print JSON")
        if verb in ("status", "nodes", "incidents"):
            q.add_argument("--group", help="only this node group")
        if verb == "nodes":
            q.add_argument("--rack", help="only this rack")
            q.add_argument(
                "--health", choices=["ok", "degraded", "failed", "unknown"], help="only this verdict"
            )
        if verb == "incidents":
            q.add_argument("--host", help="only this node")
        if verb in ("lemons", "mtbf", "incidents", "breaker"):
            q.add_argument(
                "--since",
                type=parse_since,
                metavar="WHEN",
                help="unix seconds, an ISO time, or 90m / 6h / 30d ago",
            )
        if verb in ("lemons", "incidents", "breaker"):
            q.add_argument("--limit", type=int, default=10 if verb == "lemons" else 50, help="at most N rows")
        q.set_defaults(func=run)
    from trainguard.cli import fleet_db

    fleet_db.register(sub)

    def usage(args: argparse.Namespace) -> int:
        p.print_help()
        return 2

    p.set_defaults(func=usage)


def query(store: Any, args: argparse.Namespace) -> Any:
    from trainguard.incidents import fleet_read as fr

    verb = args.fleet_command
    if verb == "status":
        return fr.status(store, group=args.group)
    if verb == "nodes":
        return fr.nodes(store, group=args.group, rack=args.rack, health=args.health)
    if verb == "lemons":
        return fr.lemons(store, limit=args.limit, since=args.since)
    if verb == "mtbf":
        return fr.mtbf(store, since=args.since)
    if verb == "incidents":
        return fr.incidents(store, host=args.host, group=args.group, since=args.since, limit=args.limit)
    return fr.breakers(store, since=args.since, limit=args.limit)


def run(args: argparse.Namespace) -> int:
    with open_store(args.db) as store:
        result = query(store, args)
    if args.json:
        print(json.dumps(result, indent=1, default=str))
    else:
        print(render(args.fleet_command, result))
    return 0


def render(verb: str, r: Any) -> str:
    from trainguard.incidents.report import format_table

    def table(rows: list[list[str]]) -> str:
        return "\n".join(format_table(rows)) if len(rows) > 1 else "(none)"

    if verb == "status":
        h = r["by_health"]
        head = (
            f"{r['nodes']} node(s): {h['ok']} ok, {h['degraded']} degraded, {h['failed']} failed, "
            f"{h['unknown']} unknown; {r['stale']} stale; {r['incidents_24h']} incident(s) in the last 24 h"
        )
        rows = [["group", "rack", "nodes", "ok", "degraded", "failed", "unknown", "stale"]]
        rows += [
            [
                g["group"],
                g["rack"],
                *(str(g[k]) for k in ("nodes", "ok", "degraded", "failed", "unknown", "stale")),
            ]
            for g in r["groups"]
        ]
        return head + "\n" + table(rows)
    if verb == "nodes":
        rows = [["host", "group", "rack", "verdict", "since (UTC)", "last seen (UTC)", "reason"]]
        for n in r:
            seen = fmt_time(n["last_seen"]) + (" (stale)" if n["stale"] else "") if n["last_seen"] else "-"
            since = fmt_time(n["since"]) if n["since"] else "-"
            rows.append(
                [
                    n["host"],
                    n["node_group"] or "-",
                    n["rack"] or "-",
                    n["health"],
                    since,
                    seen,
                    n["reason"][:60],
                ]
            )
        return table(rows)
    if verb == "lemons":
        out = ["GPUs with the most hardware incidents:"]
        rows = [["host", "gpu", "uuid", "group", "incidents", "last (UTC)", "latest root causes"]]
        for g in r["gpus"]:
            causes = ", ".join(i["root_cause"] for i in g["history"])
            rows.append(
                [
                    g["host"],
                    str(g["gpu"]),
                    g["gpu_uuid"] or "-",
                    g["node_group"] or "-",
                    str(g["incidents"]),
                    fmt_time(g["last_time"]),
                    causes,
                ]
            )
        out += [table(rows), "", "nodes with the most hardware incidents:"]
        rows = [["host", "group", "rack", "incidents", "last (UTC)"]]
        rows += [
            [
                n["host"],
                n["node_group"] or "-",
                n["rack"] or "-",
                str(n["incidents"]),
                fmt_time(n["last_time"]),
            ]
            for n in r["nodes"]
        ]
        return "\n".join([*out, table(rows)])
    if verb == "mtbf":

        def hours(v: float | None) -> str:
            return f"{v:,.1f} h" if v is not None else "-"

        out = [f"{r['nodes']} node(s) over {r['span_h']:,.1f} h", "by root cause:"]
        rows = [["root cause", "failures", "MTBF"]]
        rows += [[e["root_cause"], str(e["failures"]), hours(e["mtbf_h"])] for e in r["by_root_cause"]]
        out += [table(rows), "by node group (hardware causes):"]
        rows = [["group", "nodes", "failures", "MTBF"]]
        rows += [[e["group"], str(e["nodes"]), str(e["failures"]), hours(e["mtbf_h"])] for e in r["by_group"]]
        return "\n".join([*out, table(rows)])
    if verb == "incidents":
        rows = [["id", "detected (UTC)", "host", "group", "gpu", "root cause", "action", "summary"]]
        for i in r:
            gpu = str(i["gpu"]) if i["gpu"] is not None else "-"
            rows.append(
                [
                    str(i["id"]),
                    fmt_time(i["time"]),
                    i["host"] or "-",
                    i["node_group"] or "-",
                    gpu,
                    i["root_cause"],
                    i["action"],
                    i["summary"][:60],
                ]
            )
        return table(rows)
    rows = [["breaker", "host", "gpu", "state", "since (UTC)", "reason"]]
    for b in r["held"]:
        rows.append(
            [
                b["breaker"],
                b["host"],
                str(b["gpu"]) if b["gpu"] is not None else "-",
                b["state"],
                fmt_time(b["time"]),
                b["reason"],
            ]
        )
    events = [["time (UTC)", "breaker", "host", "gpu", "state", "reason"]]
    for e in r["events"]:
        events.append(
            [
                fmt_time(e["time"]),
                e["breaker"],
                e["host"],
                str(e["gpu"]) if e["gpu"] is not None else "-",
                e["state"],
                e["reason"],
            ]
        )
    acts = [["time (UTC)", "action", "host", "gpu", "detail"]]
    for a in r.get("held_actions", []):
        gpu = str(a["gpu"]) if a["gpu"] is not None else "-"
        acts.append([fmt_time(a["time"]), a["action"], a["host"], gpu, (a["detail"] or "")[:80]])
    return "\n".join(
        ["held now:", table(rows), "", "recent events:", table(events), "", "actions held:", table(acts)]
    )

"""`trainguard report JOB`: a job's goodput (ETTR), where its time went, and its incidents.

    trainguard report JOB [--db PATH] [--json] [--plot PATH.png]
    trainguard report --fleet [--db PATH] [--json] [--plot PATH.png]

Exit codes: 0 shown, 1 no such job in the store, 2 no store / unreadable store / bad usage.
"""

from __future__ import annotations

import argparse
import json
import sys

from trainguard.cli.incidents import add_db_argument, open_store


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = subparsers.add_parser(
        "report",
        help="a job's ETTR, lost time and incidents (table, JSON, timeline plot)",
        description="Report one job from the incident store: ETTR (productive time / wall time), the "
        "breakdown of lost time, and every incident with its root cause, action and time lost.",
    )
    p.add_argument(
        "job", metavar="JOB", nargs="?", help="job id, as `trainguard run` recorded it (see `incidents list`)"
    )
    p.add_argument(
        "--fleet", action="store_true", help="instead of one job: MTBF per GPU/node/root cause, lemons, trend"
    )
    add_db_argument(p)
    p.add_argument("--json", action="store_true", help="print the report as one JSON object")
    p.add_argument("--plot", metavar="PATH.png", help="also draw the job's timeline to this PNG file")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from trainguard.errors import InputError

    if args.fleet:
        from trainguard.cli.reliability import run_fleet

        return run_fleet(args)
    if args.job is None:
        print("trainguard report: give a JOB, or --fleet for the whole store", file=sys.stderr)
        return 2
    from trainguard.incidents.report import job_report, render_report

    with open_store(args.db) as store:
        try:
            report = job_report(store, args.job)
        except InputError as exc:
            print(f"trainguard report: {exc}", file=sys.stderr)
            return 1
    if args.plot and report.get("groups"):  # a replica job: one line per group
        from trainguard.incidents.groups_plot import plot_groups
        from trainguard.incidents.groups_report import groups_result

        plot_groups(groups_result(report), args.plot)
    elif args.plot:
        from trainguard.incidents.plot import plot_timeline

        plot_timeline(report, args.plot)
    if args.json:
        print(json.dumps(report, indent=1, allow_nan=False, default=str))
    else:
        print(render_report(report))
        if args.plot:
            print(f"\ntimeline plot: {args.plot}")
    return 0

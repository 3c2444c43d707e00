"""`trainguard hosts`: the hosts a job may use now, with their slots, from the fleet's health.

    trainguard hosts --format horovod                       # every healthy host in the store
    trainguard hosts --format hostfile --hostfile all.txt   # of these hosts, the healthy ones
    trainguard hosts --format host --host n1:8,n2:8         # mpirun --host form: n1:8,n2:7
    trainguard hosts --agent n1=http://n1:9410 --agent n2=http://n2:9410 --agent-token-file T

As Horovod's elastic host discovery (called about once a second; a failed call after the first
keeps the hosts it had)::

    printf '#!/bin/sh\\nexec trainguard hosts -q --format horovod --hostfile /etc/job/hosts\\n' > discover.sh
    horovodrun -np 8 --min-np 4 --host-discovery-script ./discover.sh python train.py

Prints the usable hosts on stdout (``horovod``: ``host:slots`` lines; ``hostfile``: Open MPI's
``host slots=N``; ``host``: ``a:8,b:8``; ``json``: every host with why it is left out) and each
left-out host with its reason on stderr (``--quiet``: not; Horovod logs a discovery script's
stderr at every call). Sources: the fleet store (``--db``, else $TRAINGUARD_DB,
else ./trainguard.db), or the agents' own verdicts (``--agent``). Exit codes: 0 printed (maybe
no host), 2 no store / unreadable store / bad usage.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

from trainguard.cli.incidents import add_db_argument

if TYPE_CHECKING:
    from trainguard.incidents.hosts import NodeState


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = subparsers.add_parser(
        "hosts",
        help="the healthy hosts and their slots (Horovod host discovery, MPI host files)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--format",
        default="horovod",
        choices=["horovod", "hostfile", "host", "json"],
        help="horovod: host:slots lines (default); hostfile: host slots=N; host: a:N,b:N; json",
    )
    add_db_argument(p)
    wanted = p.add_mutually_exclusive_group()
    wanted.add_argument(
        "--hostfile",
        type=Path,
        metavar="FILE",
        help="only these hosts (an Open MPI host file or host:slots lines)",
    )
    wanted.add_argument("--host", metavar="LIST", help="only these hosts: a:8,b:8 (mpirun's --host)")
    p.add_argument("--group", help="only this node group (hosts from the store)")
    p.add_argument(
        "--slots",
        type=int,
        default=1,
        metavar="N",
        help="slots of a host whose GPUs are not known and not given (default 1)",
    )
    p.add_argument(
        "--stale",
        type=float,
        default=300.0,
        metavar="S",
        help="leave out a host whose agent has not written for S seconds (default 300)",
    )
    p.add_argument(
        "--agent",
        action="append",
        default=[],
        metavar="HOST=URL",
        help="read HOST's verdict from its agent at URL instead of the store (repeat per host)",
    )
    p.add_argument("--agent-token-file", type=Path, metavar="PATH", help="the agents' token (with --agent)")
    p.add_argument(
        "-q",
        "--quiet",
        action="store_true",
        help="say nothing of the hosts left out (a discovery script's log)",
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from trainguard.errors import ConfigError
    from trainguard.incidents.hosts import choose, parse_host_list, parse_hostfile, render

    if args.slots < 1:
        raise ConfigError(f"--slots {args.slots}: give 1 or more")
    wanted = None
    if args.hostfile is not None:
        try:
            wanted = parse_hostfile(args.hostfile.read_text(encoding="utf-8"))
        except OSError as exc:
            raise ConfigError(f"--hostfile {args.hostfile}: {exc.strerror or exc}") from None
    elif args.host:
        wanted = parse_host_list(args.host)
    states = _from_agents(args) if args.agent else _from_store(args)
    hosts = choose(states, wanted, time.time(), args.stale, args.slots)
    for h in hosts:
        if h.left_out and not args.quiet:
            print(f"trainguard hosts: left out {h.name}: {h.left_out}", file=sys.stderr)
    text = render(hosts, args.format)
    if text:
        print(text)
    return 0


def _from_store(args: argparse.Namespace) -> dict[str, NodeState]:
    from trainguard.cli.incidents import open_store
    from trainguard.incidents.hosts import read_nodes

    with open_store(args.db) as store:
        return read_nodes(store, args.group)


def _from_agents(args: argparse.Namespace) -> dict[str, NodeState]:
    from concurrent.futures import ThreadPoolExecutor

    from trainguard.agent.verdicts import AgentApiVerdicts
    from trainguard.errors import ConfigError
    from trainguard.incidents.hosts import from_verdict

    if args.agent_token_file is None:
        raise ConfigError("--agent needs --agent-token-file (the agents' API token)")
    pairs = []
    for item in args.agent:
        host, sep, url = item.partition("=")
        if not sep or not host or not url.startswith(("http://", "https://")):
            raise ConfigError(f"--agent {item!r}: give HOST=URL, e.g. --agent n1=http://n1:9410")
        pairs.append((host, AgentApiVerdicts.from_token_file(url, args.agent_token_file)))
    with ThreadPoolExecutor(max_workers=min(32, len(pairs))) as pool:
        verdicts = list(pool.map(lambda p: p[1].verdict(), pairs))
    return {host: from_verdict(host, v, src.url) for (host, src), v in zip(pairs, verdicts, strict=True)}

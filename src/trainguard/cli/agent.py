"""`trainguard agent`: the always-on node agent (metrics, API, dashboard, node incidents).

    trainguard agent                                     # this node through NVML on 127.0.0.1:9410
    trainguard agent --backend sim --scenario tour       # a simulated node going through faults
    trainguard agent --config /etc/trainguard/agent.toml # [agent] and [thresholds] sections
    curl -H "Authorization: Bearer $(cat ~/.local/state/trainguard/agent.token)" localhost:9410/api/v1/node

Settings: flags > TRAINGUARD_AGENT_* > the config file > defaults (docs/agent.md lists them).
SIGTERM stops it cleanly, SIGHUP re-reads the config and the token file.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from trainguard.cli.options import add_config_args, add_sim_node_options, thresholds

# flag dest -> [agent] field
FLAGS = {
    "backend": "backend",
    "scenario": "scenario",
    "listen": "listen",
    "interval": "interval_s",
    "kernel_log": "kernel_log",
    "db": "db",
    "token_file": "token_file",
    "gpus": "gpus",
    "seed": "seed",
    "state_dir": "state_dir",
    "policy": "policy",
    "predictor": "predictor",
}


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "agent",
        help="always-on node agent: Prometheus metrics, REST API, live dashboard",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_sim_node_options(p, defaults=False)
    p.add_argument("--listen", metavar="ADDR:PORT", help="HTTP address (default 127.0.0.1:9410)")
    p.add_argument("--interval", type=float, metavar="S", help="seconds between samples (default 1)")
    p.add_argument("--kernel-log", metavar="PATH", help="kernel log to follow (a file or /dev/kmsg)")
    p.add_argument(
        "--db",
        metavar="PATH|URL",
        help="incident store: a path or postgresql://user@host/db (default $TRAINGUARD_DB or ./trainguard.db)",
    )
    p.add_argument(
        "--token-file",
        metavar="PATH",
        help="bearer token file, mode 0600 (default: created in the state dir)",
    )
    p.add_argument(
        "--state-dir",
        metavar="PATH",
        help="token and kernel-log cursor (default $STATE_DIRECTORY or ~/.local/state/trainguard)",
    )
    p.add_argument("--policy", metavar="PATH", help="remediation policy (TOML); see docs/remediation.md")
    p.add_argument("--enforce", action="store_true", help="act on remediation decisions (default: dry run)")
    p.add_argument(
        "--predictor",
        metavar="MODEL",
        help="failure-predictor model file (trainguard reliability train-predictor); see docs/predictor.md",
    )
    add_config_args(p)
    p.set_defaults(func=run)
    from trainguard.cli.remediate import add_set_healthy

    add_set_healthy(p.add_subparsers(dest="agent_verb", metavar="VERB"))


def load_config(args: argparse.Namespace) -> Any:
    from trainguard.agent import AgentConfig
    from trainguard.config import load
    from trainguard.incidents.backend import check_cli_target

    check_cli_target(getattr(args, "db", None))  # a database password on the command line is refused
    for item in args.settings:  # ... whichever flag carries it
        name, _, value = item.partition("=")
        if name.strip() == "agent.db":
            check_cli_target(value.strip())
    flags = [
        f"agent.{field}={getattr(args, dest)}"
        for dest, field in FLAGS.items()
        if getattr(args, dest, None) is not None
    ]
    if args.scenario:
        flags.append("agent.backend=sim")
    if getattr(args, "enforce", False):
        flags.append("agent.enforce=true")
    return load(AgentConfig, "agent", path=args.config, overrides=[*args.settings, *flags])


def run(args: argparse.Namespace) -> int:
    try:
        from trainguard.agent.serve import run_agent
    except ImportError as exc:
        print(f"trainguard agent: {exc}", file=sys.stderr)
        return 3
    from trainguard.errors import BackendUnavailable

    def reload() -> tuple[Any, Any]:
        return load_config(args), thresholds(args)

    try:
        return run_agent(*reload(), reload=reload)
    except BackendUnavailable as exc:
        message = str(exc).rstrip()
        hint = "" if "--backend sim" in message else " (try --backend sim for a simulated node)"
        print(f"trainguard agent: {message}{hint}", file=sys.stderr)
        return 3

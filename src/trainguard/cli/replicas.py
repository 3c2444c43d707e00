"""``trainguard run --replica-groups N``: the CLI end of `supervisor.replicas` (docs/no-restart.md)."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from trainguard.supervisor.config import SupervisorConfig


def run_groups(args: argparse.Namespace, config: SupervisorConfig) -> int:
    from trainguard.supervisor.lighthouse import program
    from trainguard.supervisor.replicas import ReplicaConfig, ReplicaSupervisor

    if args.replica_groups < 1:
        from trainguard.errors import ConfigError

        raise ConfigError(f"--replica-groups {args.replica_groups}: give 1 or more groups")
    program()  # torchft missing: the install hint now, before anything starts
    sup = ReplicaSupervisor(config, ReplicaConfig(groups=args.replica_groups), on_event=_say)
    result = sup.run()
    cap = result["capacity"].get("capacity")
    print(
        f"trainguard run: {result['status']} (exit {result['exit_code']}): {result['reason']}; "
        f"{len(result['incidents'])} incident(s), {args.replica_groups} replica group(s), "
        f"{sum(g['starts'] for g in result['groups'])} group start(s), capacity "
        f"{'n/a' if cap is None else f'{cap:.2f}'}; run dir {result['run_dir']}",
        file=sys.stderr,
    )
    if args.json is not None:
        args.json.write_text(json.dumps(result, indent=1, default=str))
    return int(result["exit_code"])


def _say(event: Any) -> None:
    """Group starts, heals and stops: the lines a user of the plain CLI needs."""
    if event.kind in (
        "group_started",
        "group_healed",
        "group_stopped",
        "lighthouse_restarted",
        "restart_all",
    ):
        detail = " ".join(f"{k}={v}" for k, v in event.data.items())
        print(f"trainguard run: {event.kind} {detail}", file=sys.stderr, flush=True)

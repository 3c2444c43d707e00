"""`trainguard remediate`: the person's side of remediation (breakers, resume, policy, set-healthy).

    trainguard fleet breaker status [--json]              # open? why? how many held?
    trainguard fleet breaker reset [--job J] [--json]     # only a person closes a breaker
    trainguard remediate resume --node N [--json]         # runs `trainguard diagnose`; resumes on pass
    trainguard remediate policy check POLICY.toml [--json]
    trainguard agent set-healthy [--gpu N] [--json]       # take this node out of hardware inspection

Every verb logs what it did as an incident record (who, what) in the store; a breaker reset is
also a ``reset`` event (who, when) in ``breaker_events``, which ``trainguard fleet breaker`` shows.
The breaker verbs live under ``trainguard fleet breaker`` (``add_breaker_parser``);
``trainguard remediate breaker status|reset`` is the same code under its older name.
"""

from __future__ import annotations

import argparse
import getpass
import json
import os
import socket
import sys
import time
from pathlib import Path
from typing import Any

from trainguard.actions import PersonAction

__all__ = ["add_breaker_parser", "add_set_healthy", "register"]


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "remediate",
        help="remediation: breaker status/reset, resume a node, check a policy",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = p.add_subparsers(dest="remediate_verb", metavar="VERB", required=True)
    add_breaker_parser(sub, help="the same as `trainguard fleet breaker status|reset`")
    r = sub.add_parser("resume", help="resume a drained node after `trainguard diagnose` passes")
    r.add_argument("--node", required=True, help="the Slurm node name")
    r.add_argument(
        "--diagnose",
        default="trainguard diagnose",
        metavar="CMD",
        help="the diagnostic to run first (default: trainguard diagnose); it must exit 0",
    )
    _common(r)
    r.set_defaults(func=resume)
    c = sub.add_parser("policy", help="check a policy file and show what it does")
    c.add_argument("check", choices=["check"], help="check")
    c.add_argument("path", help="the policy TOML")
    c.add_argument("--json", action="store_true", help="print one JSON object")
    c.set_defaults(func=policy_check)
    add_set_healthy(sub)


def add_breaker_parser(subparsers: Any, *, required: bool = True, **kw: Any) -> argparse.ArgumentParser:
    """``breaker status|reset`` under a command (``fleet``; ``remediate`` as an alias). With
    ``required=False`` the bare ``breaker`` runs what the caller sets as its ``func``."""
    kw.setdefault("help", "the remediation breakers: status, or reset (a person)")
    b: argparse.ArgumentParser = subparsers.add_parser("breaker", **kw)
    bs = b.add_subparsers(dest="breaker_verb", metavar="VERB", required=required)
    st = bs.add_parser("status", help="whether the fleet and job breakers are open, and why")
    _common(st)
    st.set_defaults(func=breaker_status)
    rs = bs.add_parser("reset", help="close the fleet breaker (or one job's): actions run again")
    rs.add_argument("--job", help="reset only this job's breaker")
    _common(rs)
    rs.set_defaults(func=breaker_reset)
    return b


def add_set_healthy(subparsers: Any) -> None:
    s = subparsers.add_parser("set-healthy", help="take this node (or one GPU) out of hardware inspection")
    s.add_argument("--gpu", type=int, metavar="N", help="only this GPU")
    s.add_argument("--node", help="the node (default: this host)")
    _common(s)
    s.set_defaults(func=set_healthy)


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--state-dir", metavar="PATH", help="the agent's state dir (default as `trainguard agent`)"
    )
    p.add_argument("--policy", metavar="PATH", help="the policy file (for its breaker_file and limits)")
    p.add_argument(
        "--db",
        metavar="PATH|URL",
        help="incident store: a SQLite path or postgresql://user@host/db (default: $TRAINGUARD_DB, else "
        "./trainguard.db; a password goes in $TRAINGUARD_DB or a passfile, never here)",
    )
    p.add_argument("--json", action="store_true", help="print one JSON object")


def _state_dir(args: argparse.Namespace) -> Path:
    from trainguard.agent.daemon import default_state_dir

    return Path(args.state_dir) if args.state_dir else default_state_dir()


def _policy(args: argparse.Namespace) -> Any:
    from trainguard.remediate import Policy, load_policy

    return load_policy(args.policy) if args.policy else Policy()


def _breaker_file(args: argparse.Namespace) -> Any:
    from trainguard.remediate import BreakerFile

    policy = _policy(args)
    return BreakerFile(policy.breaker_file or _state_dir(args) / "breaker.json"), policy


def who() -> str:
    user = os.environ.get("SUDO_USER") or getpass.getuser()
    return f"{user}@{socket.gethostname()}"


def _log(
    args: argparse.Namespace,
    action: PersonAction,
    summary: str,
    node: str | None = None,
    gpu: int | None = None,
    also: Any = None,
) -> int | None:
    """An incident record of what a person did; None when the store cannot be written (said).
    ``also(store)``: more to write in the same store (a breaker reset's fleet events)."""
    from trainguard.errors import StoreError
    from trainguard.incidents import Incident
    from trainguard.incidents.backend import check_cli_target
    from trainguard.incidents.store import IncidentStore, default_db

    check_cli_target(args.db)
    inc = Incident(job=f"node:{node or socket.gethostname()}", time=time.time(), action=action, summary=summary,
                   evidence=(f"by {who()}",), node=node, gpu=gpu, detected_by="person", resolved=True,
                   resolution="done")  # fmt: skip
    try:
        with IncidentStore(args.db or default_db()) as store:
            rec_id = store.add(inc).id
            if also is not None:
                also(store)
            return rec_id
    except StoreError as exc:
        print(f"trainguard: warning: not recorded in the incident store: {exc}", file=sys.stderr)
        return None


def _out(args: argparse.Namespace, obj: dict[str, Any], text: str) -> None:
    print(json.dumps(obj) if args.json else text)


def breaker_status(args: argparse.Namespace) -> int:
    from trainguard.remediate.breaker import fleet_limit

    f, policy = _breaker_file(args)
    s = f.load()
    lim = policy.breaker
    obj = {
        "file": str(f.path),
        "open": s.tripped is not None,
        "why": s.tripped,
        "tripped_at": s.tripped_at,
        "held": s.held,
        "jobs_open": dict(s.jobs_tripped),
        "actioned": [{"time": a.time, "node": a.node, "job": a.job} for a in s.actioned],
        "limit": fleet_limit(lim, lim.fleet_size),
        "window_s": lim.window_s,
    }
    lines = [f"fleet breaker: {'OPEN: ' + str(s.tripped) if s.tripped else 'closed'} ({f.path})"]
    lines += [f"job breaker {j}: OPEN: {w}" for j, w in s.jobs_tripped]
    lines.append(f"{len({a.node for a in s.actioned})} node(s) actioned recently; limit {obj['limit']} "
                 f"per {lim.window_s:g}s; {s.held} action(s) held")  # fmt: skip
    _out(args, obj, "\n".join(lines))
    return 1 if s.tripped or s.jobs_tripped else 0


def breaker_reset(args: argparse.Namespace) -> int:
    from trainguard.incidents.fleet import FleetWriter
    from trainguard.remediate.breaker import reset
    from trainguard.remediate.fleetlog import reset_events

    f, _ = _breaker_file(args)
    with f.update() as box:
        before = box[0]
        box[0] = reset(before, job=args.job)
    what = f"job {args.job}'s breaker" if args.job else "the fleet breaker"
    was = dict(before.jobs_tripped).get(args.job) if args.job else before.tripped
    now, by, events = time.time(), who(), []

    def fleet_events(store: Any) -> None:
        events.extend(reset_events(FleetWriter(store, store.identity), before, args.job, by, time=now))

    inc = _log(
        args, PersonAction.BREAKER_RESET, f"{what} reset by {by} (was: {was or 'closed'})", also=fleet_events
    )
    _out(
        args,
        {"reset": what, "was": was, "by": by, "time": now, "incident": inc, "fleet_events": events},
        f"{what} reset by {by} (was: {was or 'closed'})",
    )
    return 0


def set_healthy(args: argparse.Namespace) -> int:
    from trainguard.remediate.escalation import EscalationFile, in_inspection
    from trainguard.remediate.escalation import set_healthy as clear

    node = args.node or _node_name(args)
    f = EscalationFile(_state_dir(args) / "escalation.json")
    with f.update() as box:
        was = in_inspection(box[0], node, args.gpu)
        box[0] = clear(box[0], node, args.gpu)
    where = f"{node} GPU {args.gpu}" if args.gpu is not None else node
    inc = _log(
        args,
        PersonAction.SET_HEALTHY,
        f"{where} set healthy by {who()} (was: {was or 'not in inspection'})",
        node,
        args.gpu,
    )
    _out(args, {"node": node, "gpu": args.gpu, "was": was, "by": who(), "incident": inc},
         f"{where} set healthy (was: {was or 'not in inspection'})")  # fmt: skip
    return 0


def _node_name(args: argparse.Namespace) -> str:
    return os.environ.get("TRAINGUARD_AGENT_HOSTNAME") or socket.gethostname()


def resume(args: argparse.Namespace) -> int:
    import shlex

    from trainguard.remediate.escalation import EscalationFile
    from trainguard.remediate.providers.slurm import SlurmProvider
    from trainguard.remediate.resume import diagnose_passes, resume_node

    passed, said = diagnose_passes(shlex.split(args.diagnose))
    state = EscalationFile(_state_dir(args) / "escalation.json").load()
    out = resume_node(SlurmProvider(), args.node, passed=passed, evidence=said, escalation=state)
    if out.ok:
        _log(args, PersonAction.RESUME, f"{args.node} resumed after a passing diagnostic ({said})", args.node)
    _out(args, {"node": args.node, "diagnostic": said, "passed": passed, "result": out.status.value,
                "detail": out.detail}, f"{args.node}: {out.status.value}: {out.detail}")  # fmt: skip
    return 0 if out.ok else 1


def policy_check(args: argparse.Namespace) -> int:
    from dataclasses import asdict

    from trainguard.remediate import load_policy
    from trainguard.remediate.breaker import fleet_limit

    p = load_policy(args.path)
    obj = asdict(p)
    obj["fleet_limit"] = fleet_limit(p.breaker, p.breaker.fleet_size)
    lines = [
        f"{args.path}: ok. {'ENFORCING' if p.enforce else 'dry run'}; provider {p.provider}",
        f"breaker: at most {obj['fleet_limit']} node(s) per {p.breaker.window_s:g}s"
        + (f"; a job loses at most {p.breaker.job_spares} per {p.breaker.job_window_s:g}s" if p.breaker.job_spares else ""),
        *(f"  {k} -> {v.value}" for k, v in sorted(p.actions.items())),
        *(f"group {g.name} (nodes {list(g.nodes) or 'any'}, gpu {g.gpu_model or 'any'}): "
          + ", ".join(f"{k} -> {v.value}" for k, v in g.actions.items()) for g in p.groups),
    ]  # fmt: skip
    print(json.dumps(obj, default=str) if args.json else "\n".join(lines))
    return 0

"""`trainguard check`: a one-shot node verdict for Slurm prolog/epilog scripts and Kubernetes probes.

    trainguard check                                  # this node's GPUs through NVML
    trainguard check --backend sim --scenario dbe     # a simulated node through a named fault
    trainguard check --from-nvidia-smi smi.xml        # triage a saved `nvidia-smi -q -x`
    trainguard check --list-scenarios
    trainguard check --slurm-drain                    # as Slurm's HealthCheckProgram: drain on failed

Exit code: 0 ok, 1 degraded, 2 failed, 3 unknown or could not check (also for a bad flag).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from trainguard.cli.options import add_config_args, add_sim_node_options, thresholds, usage_errors_exit
from trainguard.detect.thresholds import Thresholds
from trainguard.errors import BackendUnavailable, TrainguardError
from trainguard.records import Health, NodeVerdict

COULD_NOT_CHECK = Health.UNKNOWN.exit_code  # 3


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "check",
        help="one-shot node health verdict (exit 0 ok, 1 degraded, 2 failed, 3 unknown)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_sim_node_options(p)
    p.add_argument("--kernel-log", type=Path, metavar="PATH", help="kernel log to scan for Xid lines")
    p.add_argument("--from-nvidia-smi", type=Path, metavar="FILE", help="a saved `nvidia-smi -q -x` file")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--list-scenarios", action="store_true", help="list the simulated scenarios and exit")
    p.add_argument(
        "--slurm-drain", action="store_true", help="on failed, drain this Slurm node (HealthCheckProgram)"
    )
    p.add_argument(
        "--interval",
        type=float,
        default=1.0,
        metavar="S",
        help="seconds between the two readings that counter rates need (default 1)",
    )
    add_config_args(p)

    usage_errors_exit(p, COULD_NOT_CHECK)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.list_scenarios:
        return list_scenarios(args.json)
    try:
        verdict, extra = evaluate(args)
    except BackendUnavailable as exc:
        print(f"trainguard check: {exc}".rstrip() + _suggest_sim(str(exc)), file=sys.stderr)
        return COULD_NOT_CHECK
    except (TrainguardError, OSError) as exc:
        print(f"trainguard check: could not check: {exc}", file=sys.stderr)
        return COULD_NOT_CHECK
    if args.json:
        from trainguard.detect.verdict import verdict_to_dict

        print(json.dumps({**verdict_to_dict(verdict), **extra}))
    else:
        from trainguard.cli.render import verdict_text

        if extra.get("scenario"):
            print(f"scenario {extra['scenario']}: {extra['description']} (expected: {extra['expected']})")
        print(verdict_text(verdict))
    if args.slurm_drain:
        from trainguard.remediate.healthcheck import drain_if_failed

        drained = drain_if_failed(verdict)
        if drained is not None:
            print(f"trainguard check: slurm drain {drained.status.value}: {drained.detail}", file=sys.stderr)
    return verdict.health.exit_code


def _suggest_sim(message: str) -> str:
    return "" if "--backend sim" in message else " (try --backend sim for a simulated node)"


def evaluate(args: argparse.Namespace) -> tuple[NodeVerdict, dict[str, Any]]:
    """Run the check the flags ask for; returns the verdict and extra JSON keys."""
    from trainguard.errors import ConfigError

    backend = args.backend or ("sim" if args.scenario else "nvml")
    th = thresholds(args)
    if args.from_nvidia_smi is not None:
        if args.scenario or args.backend:
            raise ConfigError("--from-nvidia-smi reads a file: it takes no --backend or --scenario")
        return _check_snapshot(args.from_nvidia_smi, args.kernel_log, th)
    if args.scenario and backend != "sim":
        raise ConfigError("--scenario runs on the simulated node: use --backend sim")
    if backend == "sim":
        return check_scenario(
            args.scenario or "healthy",
            n_gpus=args.gpus,
            seed=args.seed,
            kernel_log=args.kernel_log,
            thresholds=th,
        )
    return _check_live(args.kernel_log, args.interval, th)


def check_scenario(
    name: str,
    n_gpus: int = 8,
    seed: int = 0,
    kernel_log: Path | None = None,
    thresholds: Thresholds | None = None,
) -> tuple[NodeVerdict, dict[str, Any]]:
    """Play scenario ``name`` on a simulated node on a virtual clock, one agent tick per second."""
    from trainguard.agent import Agent, open_node
    from trainguard.clock import VirtualClock
    from trainguard.telemetry.sim import run_scenario

    sim_kernel_log_is_new(kernel_log)
    clock = VirtualClock()
    node = open_node("sim", kernel_log=kernel_log, n_gpus=n_gpus, seed=seed, clock=clock)
    assert node.sim is not None
    with Agent.of(node, clock=clock, thresholds=thresholds) as agent:
        agent.tick()
        scenario = run_scenario(name, node.sim, step_s=1.0, on_step=lambda _elapsed: agent.tick())
        verdict = agent.tick()
    extra = {
        "backend": "sim",
        "scenario": scenario.name,
        "description": scenario.description,
        "expected": scenario.expected.value,
        "duration_s": scenario.duration_s,
    }
    return verdict, extra


def sim_kernel_log_is_new(path: Path | None) -> None:
    """With --backend sim, --kernel-log is where the simulated kernel lines go: never a real log."""
    from trainguard.errors import ConfigError

    if path is not None and path.exists() and (not path.is_file() or path.stat().st_size > 0):
        raise ConfigError(
            f"--kernel-log {path} exists: with --backend sim it names a new file for the simulated "
            "kernel log (simulated Xid lines must not land in a real log)"
        )


def _require(kernel_log: Path | None) -> None:
    from trainguard.errors import InputError

    if kernel_log is not None and not kernel_log.exists():
        raise InputError(f"kernel log {kernel_log} does not exist (try /dev/kmsg or /var/log/kern.log)")


def _check_live(
    kernel_log: Path | None, interval: float, th: Thresholds
) -> tuple[NodeVerdict, dict[str, Any]]:
    from trainguard.agent import Agent, open_node

    _require(kernel_log)

    with Agent.of(open_node("nvml", kernel_log=kernel_log), thresholds=th) as agent:
        agent.tick()
        time.sleep(max(interval, 0.0))  # rates (PCIe replays, NVLink errors) need two readings
        verdict = agent.tick()
    return verdict, {"backend": "nvml"}


def _check_snapshot(
    path: Path, kernel_log: Path | None, th: Thresholds
) -> tuple[NodeVerdict, dict[str, Any]]:
    from trainguard.agent import Agent, open_node

    _require(kernel_log)
    with Agent.of(open_node("smi-xml", kernel_log=kernel_log, path=path), thresholds=th) as agent:
        verdict = agent.tick()  # one snapshot: no counter rates
    return verdict, {"backend": "smi-xml", "source": str(path)}


def list_scenarios(as_json: bool) -> int:
    from trainguard.telemetry.sim import SCENARIOS

    rows = [(s.name, s.expected.value, s.duration_s, s.description) for s in SCENARIOS.values()]
    if as_json:
        keys = ("name", "expected", "duration_s", "description")
        print(json.dumps([dict(zip(keys, row, strict=True)) for row in rows]))
        return 0
    width = max(len(r[0]) for r in rows)
    print(f"{'SCENARIO'.ljust(width)}  EXPECTED  SECONDS  DESCRIPTION")
    for name, expected, duration, description in rows:
        print(f"{name.ljust(width)}  {expected:<8}  {duration:>7g}  {description}")
    print("\nrun one: trainguard check --backend sim --scenario NAME [--json]")
    return 0

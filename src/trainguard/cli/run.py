"""`trainguard run [options] -- python train.py ARGS...`: torchrun, kept alive.

    trainguard run --standalone --nproc-per-node 2 -- python examples/train_digits.py --steps 200
    trainguard run --nproc-per-node 2 train.py --lr 0.1        # as torchrun: python -u train.py
    trainguard run --nnodes 1:2 --rdzv-backend c10d --rdzv-endpoint 10.0.0.1:29400 --rdzv-id job7 \\
        --nproc-per-node 8 --backend nvml -- python train.py
    trainguard run --standalone --nproc-per-node 4 --backend sim --chaos examples/chaos/mixed.toml \\
        -- python examples/train_digits.py --checkpoint-dir ckpt

Exit codes: 0 ok, 1 restart budget used up, 2 usage error, 3 crash loop (do not requeue),
4 no healthy capacity left on this node, 130 interrupted. See docs/supervisor.md.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any

from trainguard.cli.options import add_config_args, thresholds
from trainguard.cli.torchrun_args import add_torchrun_options


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "run",
        help="launch distributed training like torchrun and keep it alive through failures",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    t = p.add_argument_group(
        "torchrun's options (all of them, read by torchrun's own parser: docs/supervisor.md)"
    )
    add_torchrun_options(t)
    t.add_argument(
        "--max-restarts",
        "--max_restarts",
        type=int,
        default=None,
        help="restart budget; GPU exclusions and membership changes are free (default 3)",
    )
    g = p.add_argument_group("trainguard options")
    g.add_argument("--job-id", default="", help="default: --rdzv-id, else a timestamp")
    g.add_argument(
        "--runs-dir", type=Path, default=Path("runs"), help="run directories go here (default runs/)"
    )
    g.add_argument(
        "--db",
        default=None,
        help="incident store: a path or postgresql://user@host/db (default $TRAINGUARD_DB or ./trainguard.db)",
    )
    g.add_argument(
        "--checkpoint-dir",
        type=Path,
        default=None,
        help="where the workers checkpoint (default: the command's --checkpoint-dir)",
    )
    g.add_argument(
        "--hang-timeout-floor",
        type=float,
        default=30.0,
        metavar="S",
        help="a hang is no progress for max(FLOOR, factor x slowest recent step) (default 30); under "
        "--replica-groups a group's floor is 15 s: past torchft's collective timeout, under half its quorum timeout",
    )
    g.add_argument("--hang-step-factor", type=float, default=5.0, metavar="K")
    g.add_argument(
        "--startup-timeout",
        type=float,
        default=300.0,
        metavar="S",
        help="first step of an attempt must come within this (default 300)",
    )
    g.add_argument(
        "--idle-timeout",
        type=float,
        default=600.0,
        metavar="S",
        help="a job that writes no heartbeats (no Guard) is hung when every rank used no CPU and "
        "wrote no output for this long (default 600; 0: never)",
    )
    g.add_argument("--backend", default="none", choices=["none", "nvml", "sim"], help="node-health telemetry")
    g.add_argument(
        "--no-preflight",
        action="store_true",
        help="skip the diagnostics (level 1 + a short SDC round) on the GPUs before each start; "
        "they run only with --backend nvml or sim",
    )
    g.add_argument("--kernel-log", type=Path, default=None, help="kernel log the health agent follows")
    g.add_argument(
        "--agent-url",
        default="",
        metavar="URL",
        help="the node agent whose verdict to read instead of opening the node (default with "
        "--backend nvml: http://127.0.0.1:9410 when its token is readable)",
    )
    g.add_argument(
        "--agent-token-file", type=Path, default=None, metavar="PATH", help="the node agent's token"
    )
    add_config_args(g)
    g.add_argument(
        "--chaos", type=Path, default=None, metavar="PLAN.toml", help="inject faults (docs/chaos.md)"
    )
    g.add_argument(
        "--crash-loop-after",
        type=int,
        default=3,
        metavar="N",
        help="stop with exit 3 after the same application error N times in a row (default 3)",
    )
    g.add_argument("--backoff-base", type=float, default=1.0, metavar="S")
    g.add_argument("--min-nproc", type=int, default=1, help="fewest local workers to continue with")
    g.add_argument(
        "--gpus",
        default="",
        metavar="LIST",
        help="physical GPUs the local ranks use, e.g. 2,3 (default 0..N-1)",
    )
    g.add_argument(
        "--replica-groups",
        type=int,
        default=0,
        metavar="N",
        help="N torchft replica groups of --nproc-per-node ranks each, under one Lighthouse: a failed "
        "group is replaced while the others keep training (docs/no-restart.md; needs trainguard[ft])",
    )
    g.add_argument(
        "--warm-standby",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="keep pre-imported spare interpreters, so a restart skips process start and "
        "`import torch` (default on; --no-warm-standby to save the CPU)",
    )
    g.add_argument(
        "--warm-standby-sets",
        type=int,
        default=2,
        metavar="N",
        help="spare interpreters per local rank (default 2: a second fault before the pool has "
        "refilled still restarts warm; 1 saves memory)",
    )
    g.add_argument(
        "--warm-refill-delay",
        type=float,
        default=2.0,
        metavar="SECONDS",
        help="seconds after a (re)start before the pool replaces the standbys it handed out (default 2; "
        "their imports take CPU the restarted ranks may need: docs/supervisor.md)",
    )
    g.add_argument(
        "--warm-refill-nice",
        type=int,
        default=19,
        metavar="N",
        help="nice value the pool's standbys import at (default 19: they take the CPU the ranks leave, "
        "and go back to the job's priority when they become ranks; 0: the job's priority)",
    )
    g.add_argument("--no-tee", action="store_true", help="do not copy worker output to the console")
    g.add_argument("--json", type=Path, default=None, metavar="PATH", help="write the run result as JSON")
    p.add_argument(
        "cmd",
        nargs=argparse.REMAINDER,
        help="-- then the worker command (python train.py ...), or torchrun's: train.py ARGS",
    )
    p.set_defaults(func=run)


def config_from_args(args: argparse.Namespace) -> Any:
    from trainguard.cli.torchrun_args import resolve, split_command
    from trainguard.supervisor.config import SupervisorConfig

    tokens = list(getattr(args, "torchrun_args", None) or [])
    words, full = split_command(list(args.cmd), tokens)
    launch = resolve(tokens, words, full, args.max_restarts)
    if launch.ignored:
        print(
            f"trainguard run: {', '.join(launch.ignored)} do not apply: worker output goes to the run "
            "directory's log files (copied to the console unless --no-tee)",
            file=sys.stderr,
        )
    from trainguard.incidents.backend import check_cli_target

    check_cli_target(args.db)  # a database password on the command line is refused
    if not 0 <= args.warm_refill_delay < math.inf:
        from trainguard.errors import ConfigError

        raise ConfigError(f"--warm-refill-delay {args.warm_refill_delay}: give a number of seconds >= 0")
    if not 0 <= args.warm_refill_nice <= 19:
        from trainguard.errors import ConfigError

        raise ConfigError(f"--warm-refill-nice {args.warm_refill_nice}: give a nice value from 0 to 19")
    if args.warm_standby_sets < 1:
        from trainguard.errors import ConfigError

        raise ConfigError(
            f"--warm-standby-sets {args.warm_standby_sets}: give 1 or more (--no-warm-standby turns them off)"
        )
    return SupervisorConfig(
        cmd=launch.cmd,
        nproc_per_node=launch.nproc_per_node,
        nnodes=launch.nnodes,
        standalone=launch.standalone,
        rdzv_endpoint=launch.rdzv_endpoint,
        rdzv_id=launch.rdzv_id,
        rdzv_backend=launch.rdzv_backend,
        rdzv_conf=launch.rdzv_conf,
        max_restarts=launch.max_restarts,
        monitor_interval=launch.monitor_interval,
        extra_torchrun_args=launch.extra,
        job_id=args.job_id,
        runs_root=args.runs_dir,
        db=args.db,
        checkpoint_dir=args.checkpoint_dir,
        hang_timeout_floor=args.hang_timeout_floor,
        hang_step_factor=args.hang_step_factor,
        startup_timeout=args.startup_timeout,
        idle_timeout=args.idle_timeout,
        preflight=not args.no_preflight,
        backend=args.backend,
        kernel_log=args.kernel_log,
        agent_url=args.agent_url,
        agent_token_file=args.agent_token_file,
        chaos=args.chaos,
        crash_loop_after=args.crash_loop_after,
        backoff_base_s=args.backoff_base,
        min_nproc=args.min_nproc,
        warm_standby=args.warm_standby,
        warm_standby_sets=args.warm_standby_sets,
        warm_refill_delay_s=args.warm_refill_delay,
        warm_refill_nice=args.warm_refill_nice,
        tee=not args.no_tee,
        thresholds=thresholds(args),
        gpus=_gpus(args.gpus),
    )


def _gpus(text: str) -> tuple[int, ...]:
    from trainguard.errors import ConfigError

    try:
        return tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise ConfigError(f"--gpus {text!r}: give GPU indices separated by commas, e.g. --gpus 0,1") from None


def run(args: argparse.Namespace) -> int:
    from trainguard.chaos import load_plan
    from trainguard.chaos.plan import step_triggered
    from trainguard.supervisor import Supervisor

    config = config_from_args(args)
    plan = load_plan(config.chaos) if config.chaos is not None else None  # bad plan: usage error now
    if plan is not None:
        import os

        from trainguard.chaos.plan import GROUP_ENV, for_group

        plan = for_group(plan, os.environ.get(GROUP_ENV))  # a replica group's supervisor: its faults
    if plan is not None and (steps := step_triggered(plan)):
        print(
            f"trainguard run: chaos fault(s) {', '.join(f'#{i + 1}' for i in steps)} fire at a training "
            "step, which only trainguard's Guard reports; if no rank has reported one after "
            f"--startup-timeout ({config.startup_timeout:g}s), they are refused",
            file=sys.stderr,
        )
    if args.replica_groups:
        from trainguard.cli.replicas import run_groups

        return run_groups(args, config)
    result = Supervisor(config, on_event=_say).run()
    if plan is not None:
        fired = {inj.index for inj in result.injected}
        unfired = [f"#{i + 1} ({f.label})" for i, f in enumerate(plan.faults) if i not in fired]
        if unfired:
            print(f"trainguard run: chaos fault(s) never fired: {', '.join(unfired)}", file=sys.stderr)
    ettr = result.goodput.get("ettr")
    print(
        f"trainguard run: {result.exit_code.name.lower()} (exit {int(result.exit_code)}): {result.reason}; "
        f"{len(result.incidents)} incident(s), {result.attempts} attempt(s), "
        f"ETTR {'n/a (no heartbeats: the Guard reports steps)' if ettr is None else f'{ettr:.2f}'}; "
        f"run dir {result.run_dir}",
        file=sys.stderr,
    )
    if args.json is not None:
        args.json.write_text(json.dumps(result_to_dict(result), indent=1, default=str))
    return int(result.exit_code)


def _say(event: Any) -> None:
    """The few events a user of the plain CLI needs to read: what is watched."""
    if "watchers" in event.data:
        print(f"trainguard run: {event.data['watchers']}", file=sys.stderr, flush=True)


def result_to_dict(result: Any) -> dict[str, Any]:
    return {
        "exit_code": int(result.exit_code),
        "status": result.exit_code.name.lower(),
        "reason": result.reason,
        "job_id": result.job_id,
        "run_dir": str(result.run_dir),
        "attempts": result.attempts,
        "final_step": result.final_step,
        "goodput": result.goodput,
        "incidents": [i.to_dict() for i in result.incidents],
        "injected": [i.to_dict() for i in result.injected],
        "recoveries": list(result.recoveries),
        "world_sizes": list(result.world_sizes),
        "diagnostics": list(result.diagnostics),
    }

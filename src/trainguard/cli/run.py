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
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trainguard.cli.mpi_args import add_launcher_options
from trainguard.cli.options import add_config_args, add_gpu_ids, thresholds
from trainguard.cli.torchrun_args import add_torchrun_options
from trainguard.supervisor.config import PRELOAD
from trainguard.supervisor.launch import LAUNCHERS

if TYPE_CHECKING:
    from trainguard.supervisor.config import SupervisorConfig
    from trainguard.supervisor.replicas import ReplicaResult
    from trainguard.supervisor.result import RunEvent, RunResult


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
    g.add_argument(
        "--launcher",
        "--framework",
        default="torch",
        choices=sorted(LAUNCHERS),
        help="how workers start: torch (torch's elastic agent, as torchrun; default), local "
        "(N plain processes with torchrun's per-rank variables; no torch needed), tf (TensorFlow: "
        "N workers with TF_CONFIG each, or with --nproc-per-node 1 one MirroredStrategy process over "
        "the --gpu-ids; across nodes with --nnodes N --node-rank R --rdzv-endpoint HOST:PORT --rdzv-id ID; "
        "docs/tensorflow.md), mpirun (Open MPI's mpirun with its options: -np N, "
        "--host, --hostfile, -x, --mca...) or srun (Slurm's srun, one step per attempt, inside the "
        "allocation: -n N, --mpi, -w, -x...; docs/mpi.md)",
    )
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
        "--health-interval", type=float, default=0.5, metavar="S", help="seconds between node-health ticks"
    )
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
        help="stop with exit 3 after the same application error N times in a row (default 3); "
        "the same failure before any step stops after min(2, N)",
    )
    g.add_argument("--backoff-base", type=float, default=1.0, metavar="S")
    g.add_argument(
        "--backoff-max",
        type=float,
        default=60.0,
        metavar="S",
        help="longest backoff between restarts (default 60)",
    )
    g.add_argument(
        "--kill-grace",
        type=float,
        default=0.0,
        metavar="S",
        help="SIGTERM grace before SIGKILL when stopping failed workers (default 0: SIGKILL at once)",
    )
    g.add_argument(
        "--preemption-exit-code",
        type=int,
        default=None,
        metavar="N",
        help="the script saves on SIGTERM and exits N (TF's PreemptionCheckpointHandler: 42): such an "
        "exit is a preempted save, restarted free, not a crash",
    )
    g.add_argument("--min-nproc", type=int, default=1, help="fewest local workers to continue with")
    add_gpu_ids(g, "physical GPUs the local ranks use, e.g. 2,3 (default 0..N-1)")
    g.add_argument(
        "--replica-groups",
        type=int,
        default=0,
        metavar="N",
        help="N torchft replica groups of --nproc-per-node ranks each, under one Lighthouse: a failed "
        "group is replaced while the others keep training (docs/no-restart.md; needs trainguard[ft])",
    )
    g.add_argument(
        "--replica-group-id",
        type=int,
        default=None,
        metavar="G",
        help="run this node's share of replica group G (0..N-1) that spans nodes: on each of the "
        "group's nodes, with --replica-groups N, --lighthouse, --nnodes M and the group's own "
        "--rdzv-endpoint (docs/no-restart.md)",
    )
    g.add_argument(
        "--lighthouse",
        default="",
        metavar="URL",
        help="with --replica-group-id: the job's torchft Lighthouse (http://HOST:PORT), started once "
        "for the job with torchft_lighthouse",
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
        "--warm-standby-preload",
        default=",".join(PRELOAD),
        metavar="MODULES",
        help=f"modules each standby imports ahead, comma-separated (default {','.join(PRELOAD)})",
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
    g.add_argument(
        "--warm-fill-at-start",
        action=argparse.BooleanOptionalAction,
        default=False,
        help="fill the pool at launch, so a restart before the first step is warm too; its standbys "
        "then import torch beside the first start's ranks, which start on them (default off: the pool "
        "fills after the first step, and the first start is torchrun's own, cold)",
    )
    g.add_argument(
        "--spare",
        action="store_true",
        help="a hot spare node: the job's command plus --spare; it waits warm (imports done) without "
        "joining, and takes the place of a node the job loses at the next rendezvous round (--launcher "
        "torch, c10d rendezvous; with --replica-group-id g: a node group g loses; docs/supervisor.md)",
    )
    g.add_argument("--no-tee", action="store_true", help="do not copy worker output to the console")
    g.add_argument("--json", type=Path, default=None, metavar="PATH", help="write the run result as JSON")
    m = p.add_argument_group(
        "mpirun's and srun's options (--launcher mpirun: -np N, --host, --hostfile, -x, --mca, --map-by...; "
        "--launcher srun: -n N, --mpi, -w, -x, --gpus-per-task...; docs/mpi.md)"
    )
    add_launcher_options(m, set(p._option_string_actions))
    p.add_argument(
        "cmd",
        nargs=argparse.REMAINDER,
        help="-- then the worker command (python train.py ...), or torchrun's: train.py ARGS",
    )
    p.set_defaults(func=run)


def config_from_args(args: argparse.Namespace) -> SupervisorConfig:
    from trainguard.cli.torchrun_args import resolve, resolve_plain, split_command
    from trainguard.supervisor.config import (
        HealthConfig,
        LaunchConfig,
        RecordConfig,
        RecoveryConfig,
        StandbyConfig,
        SupervisorConfig,
        WatchConfig,
    )

    tokens = list(getattr(args, "torchrun_args", None) or [])
    words, full = split_command(list(args.cmd), tokens)
    if args.launcher == "torch":  # torchrun's options, read by torchrun's parser
        launch = resolve(tokens, words, full, args.max_restarts)
    else:
        launch = resolve_plain(tokens, words, full, args.max_restarts, args.launcher)
    if launch.ignored:
        print(
            f"trainguard run: {', '.join(launch.ignored)} do not apply: worker output goes to the run "
            "directory's log files (copied to the console unless --no-tee)",
            file=sys.stderr,
        )
    from trainguard.incidents.backend import check_cli_target, check_scheme, default_db

    check_cli_target(args.db)  # a database password on the command line is refused
    check_scheme(args.db or default_db())  # $TRAINGUARD_DB too: the run must not start unrecorded
    from trainguard.errors import ConfigError

    if not 0 <= args.warm_refill_delay < math.inf:
        raise ConfigError(f"--warm-refill-delay {args.warm_refill_delay}: give a number of seconds >= 0")
    if not 0 <= args.warm_refill_nice <= 19:
        raise ConfigError(f"--warm-refill-nice {args.warm_refill_nice}: give a nice value from 0 to 19")

    if args.warm_standby_sets < 1:
        raise ConfigError(
            f"--warm-standby-sets {args.warm_standby_sets}: give 1 or more (--no-warm-standby turns them off)"
        )
    # A spare for a group that spans nodes joins that group's rendezvous; groups on one node
    # (--replica-groups without --replica-group-id) have no rendezvous a node could join.
    one_node_groups = args.replica_groups and args.replica_group_id is None
    if args.spare and (args.launcher != "torch" or launch.standalone or one_node_groups):
        raise ConfigError(
            "--spare: a spare node joins a multi-node job's c10d rendezvous: use it with --launcher torch "
            "and --rdzv-endpoint (not --standalone; with --replica-groups, a spare for group g of groups "
            "that span nodes: --replica-group-id g, docs/no-restart.md)"
        )
    if args.replica_groups and args.launcher == "tf":
        raise ConfigError(
            "--replica-groups: torchft's replica groups are torch jobs; --framework tf restarts the "
            "whole TensorFlow cluster instead (drop --replica-groups, or use --launcher torch)"
        )
    if args.replica_groups < 0:
        raise ConfigError(f"--replica-groups {args.replica_groups}: give 1 or more groups")
    from trainguard.cli.mpi_args import resolve_mpi

    launcher_args = tuple(args.launcher_args or ())
    nproc, gpus = resolve_mpi(args.launcher, launcher_args, launch.nproc_per_node, _gpus(args.gpu_ids or ""))
    config = SupervisorConfig(
        LaunchConfig(
            cmd=launch.cmd,
            nproc_per_node=nproc,
            nnodes=launch.nnodes,
            standalone=launch.standalone,
            rdzv_endpoint=launch.rdzv_endpoint,
            rdzv_id=launch.rdzv_id,
            rdzv_backend=launch.rdzv_backend,
            rdzv_conf=launch.rdzv_conf,
            monitor_interval=launch.monitor_interval,
            extra_torchrun_args=launch.extra,
            launcher=args.launcher,
            launcher_args=launcher_args,
            gpus=gpus,
            kill_grace_s=args.kill_grace,
            preemption_exit_code=args.preemption_exit_code,
            spare=args.spare,
        ),
        RecordConfig(
            job_id=args.job_id,
            runs_root=args.runs_dir,
            db=args.db,
            checkpoint_dir=args.checkpoint_dir,
            result_file=args.json,
        ),
        WatchConfig(
            hang_timeout_floor=args.hang_timeout_floor,
            hang_step_factor=args.hang_step_factor,
            startup_timeout=args.startup_timeout,
            idle_timeout=args.idle_timeout,
            tee=not args.no_tee,
        ),
        HealthConfig(
            backend=args.backend,
            kernel_log=args.kernel_log,
            health_interval=args.health_interval,
            agent_url=args.agent_url,
            agent_token_file=args.agent_token_file,
            thresholds=thresholds(args),
            config_file=Path(args.config) if args.config else None,
            preflight=not args.no_preflight,
        ),
        RecoveryConfig(
            max_restarts=launch.max_restarts,
            crash_loop_after=args.crash_loop_after,
            backoff_base_s=args.backoff_base,
            backoff_max_s=args.backoff_max,
            min_nproc=args.min_nproc,
        ),
        StandbyConfig(
            enabled=args.warm_standby,
            sets=args.warm_standby_sets,
            preload=tuple(m.strip() for m in args.warm_standby_preload.split(",") if m.strip()),
            refill_delay_s=args.warm_refill_delay,
            refill_nice=args.warm_refill_nice,
            fill_at_start=args.warm_fill_at_start,
        ),
        chaos=args.chaos,
        replica_groups=args.replica_groups,
        replica_group_id=args.replica_group_id,
        lighthouse=args.lighthouse,
    )
    if config.replica_groups or config.replica_group_id is not None or config.lighthouse:
        # only then: the replica package (its loop) is a tenth of a second before any start
        from trainguard.supervisor.replicas.node import node_group_refusal

        refusal = node_group_refusal(config)
        if refusal is not None:
            raise ConfigError(refusal)
    return config


def _gpus(text: str) -> tuple[int, ...]:
    from trainguard.errors import ConfigError

    try:
        return tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise ConfigError(
            f"--gpu-ids {text!r}: give GPU indices separated by commas, e.g. --gpu-ids 0,1"
        ) from None


def run(args: argparse.Namespace) -> int:
    config = config_from_args(args)
    if config.replica_group_id is not None:  # this node's share of a group that spans nodes
        from trainguard.supervisor.replicas import ReplicaConfig
        from trainguard.supervisor.replicas.node import node_group

        config, env = node_group(config, ReplicaConfig(groups=config.replica_groups))
        # This process is the group's supervisor, as a one-node group's `trainguard run` is: its
        # plan's faults, its warm standbys and its workers see the group's environment.
        os.environ.update(env)
    plan = None
    if config.chaos is not None:
        from trainguard.chaos import load_plan
        from trainguard.chaos.plan import for_this_group, step_triggered

        plan = for_this_group(load_plan(config.chaos))  # a bad plan: a usage error now
    if plan is not None and (steps := step_triggered(plan)):
        print(
            f"trainguard run: chaos fault(s) {', '.join(f'#{i + 1}' for i in steps)} fire at a training "
            "step, which only trainguard's Guard reports; if no rank has reported one after "
            f"--startup-timeout ({config.watch.startup_timeout:g}s), they are refused",
            file=sys.stderr,
        )
    result: RunResult | ReplicaResult
    if config.replica_groups:
        from trainguard.supervisor.replicas import ReplicaConfig, ReplicaSupervisor, program

        program()  # torchft missing: the install hint now, before anything starts
        result = ReplicaSupervisor(config, ReplicaConfig(groups=config.replica_groups), on_event=_say).run()
    else:
        from trainguard.supervisor import Supervisor

        result = Supervisor(config, on_event=_say).run()
        fired = {inj.index for inj in result.injected}
        unfired = (
            [f"#{i + 1} ({f.label})" for i, f in enumerate(plan.faults) if i not in fired] if plan else []
        )
        if unfired:
            print(f"trainguard run: chaos fault(s) never fired: {', '.join(unfired)}", file=sys.stderr)
    print(f"trainguard run: {result.summary()}", file=sys.stderr)
    if config.record.result_file is not None:
        config.record.result_file.write_text(json.dumps(result.to_dict(), indent=1, default=str))
    return int(result.exit_code)


_GROUP_EVENTS = ("group_started", "group_healed", "group_stopped", "lighthouse_restarted", "restart_all")


def _say(event: RunEvent) -> None:
    """The few events a user of the plain CLI needs to read: what is watched; with replica
    groups, group starts, heals and stops."""
    if "watchers" in event.data:
        print(f"trainguard run: {event.data['watchers']}", file=sys.stderr, flush=True)
    elif event.kind in _GROUP_EVENTS:
        detail = " ".join(f"{k}={v}" for k, v in event.data.items())
        print(f"trainguard run: {event.kind} {detail}", file=sys.stderr, flush=True)

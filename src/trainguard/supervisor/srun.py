"""``--launcher srun``: the job as Slurm's srun runs it, one job step per attempt, rank by rank.

    salloc -N 2 --ntasks-per-node 4 trainguard run --launcher srun -n 8 --mpi=pmix -- python train.py

Inside the user's allocation (salloc, an sbatch script; outside one, srun asks for its own) each
attempt is one step::

    srun [the user's options] --kill-on-bad-exit=1 -n N [-N M --distribution=arbitrary] \\
        python -m trainguard.mpi.rank -- CMD        (SLURM_HOSTFILE=<attempt dir>/hostfile)

Every task runs behind the per-rank wrapper, as under mpirun (`supervisor.mpirun.MpiWorkers` does
the rest: rank files, exit codes, stop); the wrapper takes its rank from SLURM_PROCID/LOCALID/NTASKS
and names its node as Slurm does. ``--kill-on-bad-exit=1`` makes srun end the step when one task
fails. The nodes (the user's ``--nodelist``, else the allocation's) are re-planned before every
start with `supervisor.mpi_hosts.plan_hosts`: less those Slurm holds out (drained, down, not
responding: ``sinfo``), those the fleet store rules out, and those srun lost in an earlier attempt
("Node failure on X"); this node's tasks at most its GPUs in use. The plan reaches srun as a
host file with one line per task (``--distribution=arbitrary``), which places each rank where the
plan says, unless the user chose a ``--distribution``: then ``--exclude`` and ``-N`` carry it.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from trainguard.errors import ConfigError, MissingDependency
from trainguard.mpi.identity import tasks_per_node
from trainguard.supervisor.launch import LaunchJob
from trainguard.supervisor.mpi_hosts import HostPlan, plan_hosts
from trainguard.supervisor.mpirun import MpirunLauncher, MpiWorkers, here

__all__ = ["SrunArgs", "SrunLauncher", "SrunWorkers", "held_out", "srun_argv"]

log = logging.getLogger(__name__)

INSTALL_HINT = "apt-get install slurm-client (Debian/Ubuntu), or load your site's Slurm module"
_VALUED = {"-n": "ntasks", "--ntasks": "ntasks", "-N": "nodes", "--nodes": "nodes", "-w": "nodelist",
           "--nodelist": "nodelist", "-x": "exclude", "--exclude": "exclude", "--export": "export",
           "-m": "distribution", "--distribution": "distribution"}  # fmt: skip
_SHORT = ("-n", "-N", "-w", "-x", "-m")
# Slurm node states (sinfo %T) a step must not use; "*" after a state: the node does not respond
_OUT_STATES = ("drain", "down", "fail", "maint", "reboot", "power", "inval", "future")


@dataclass(frozen=True, slots=True)
class SrunArgs:
    """The user's srun options, as written: the few trainguard reads, and the rest."""

    ntasks: int | None = None
    nodes: str = ""  # -N as written: "2" or "1-2"
    nodelist: str = ""  # -w: a Slurm host list (tg[1-4])
    exclude: str = ""
    export: str = ""
    distribution: str = ""
    rest: tuple[str, ...] = ()  # every other option, passed on to srun unchanged

    @classmethod
    def parse(cls, tokens: Sequence[str]) -> SrunArgs:
        read: dict[str, str] = {}
        rest: list[str] = []
        it = iter(tokens)
        for tok in it:
            name, eq, value = tok.partition("=")
            if name in ("-K", "--kill-on-bad-exit"):
                continue  # trainguard's own: srun ends the step when a task fails
            if name in _VALUED and name.startswith("--") and eq:
                arg = value
            elif tok in _VALUED:
                name, arg = tok, next(it, "")
            elif tok[:2] in _SHORT and len(tok) > 2:
                name, arg = tok[:2], tok[2:]
            else:
                rest.append(tok)
                continue
            if not arg:
                raise ConfigError(f"srun option {name}: needs a value")
            read[_VALUED[name]] = arg
        ntasks = read.pop("ntasks", None)
        if ntasks is not None and (not ntasks.isdigit() or int(ntasks) < 1):
            raise ConfigError(f"srun -n {ntasks}: give the number of tasks, 1 or more")
        return cls(int(ntasks) if ntasks else None, rest=tuple(rest), **read)


def srun_argv(
    args: SrunArgs, plan: HostPlan | None, np: int, cmd: Sequence[str], export: Sequence[str]
) -> list[str]:
    """The srun command line of one attempt (``plan``: the nodes, when they are known)."""
    argv = ["srun", *args.rest, "--kill-on-bad-exit=1", "-n", str(np)]
    if args.export and args.export.upper() != "ALL":  # the user's list, and the wrapper's variables
        names = [] if args.export.upper() in ("NONE", "NIL") else [args.export]
        argv.append("--export=" + ",".join([*names, *export]))
    if plan is not None:
        used = [h.name for h in plan.hosts]
        if args.distribution:
            argv += ["-m", args.distribution, "-N", str(len(used)), "--nodelist=" + ",".join(used)]
        else:
            argv += ["-N", str(len(used)), "--distribution=arbitrary"]
    else:
        argv += [f"-N{args.nodes}"] if args.nodes else []
        argv += [f"--nodelist={args.nodelist}"] if args.nodelist else []
        argv += [f"-m{args.distribution}"] if args.distribution else []
    if args.exclude:
        argv.append(f"--exclude={args.exclude}")
    return [*argv, sys.executable, "-m", "trainguard.mpi.rank", "--", *cmd]


def task_file(plan: HostPlan) -> str:
    """SLURM_HOSTFILE for ``--distribution=arbitrary``: one line per task, in rank order."""
    lines = [h.name for h in plan.hosts for _ in range(h.slots)][: plan.np]
    return "".join(f"{n}\n" for n in lines)


def held_out(state: str) -> str:
    """Why Slurm's node state (sinfo's %T) keeps a step off the node, "" when it does not."""
    s = state.strip().lower()
    if s.endswith("*"):
        return f"Slurm: not responding ({s.rstrip('*')})"
    return f"Slurm: {s}" if s.startswith(_OUT_STATES) else ""


def _slurm(*argv: str) -> str:
    try:
        r = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise ConfigError(f"--launcher srun: {argv[0]} failed: {exc}") from None
    if r.returncode != 0:
        raise ConfigError(f"--launcher srun: {' '.join(argv)}: {r.stderr.strip() or r.returncode}")
    return r.stdout


class SrunWorkers(MpiWorkers):
    """`MpiWorkers` over one srun (a job step) instead of one mpirun."""

    launcher, log = "srun", "srun.log"

    def __init__(self, job: LaunchJob, args: SrunArgs) -> None:
        super().__init__(job, args)
        self.srun_args = args
        self.hostnames: dict[str, str] = {}  # Slurm node name -> its host name (sinfo %n)

    def is_here(self, name: str) -> bool:
        return here(name) or name == os.environ.get("SLURMD_NODENAME") or here(self.hostnames.get(name, ""))

    def nodes(self) -> tuple[list[tuple[str, int | None]], dict[str, str]]:
        """The candidate nodes with their task slots (None: not known), and why Slurm holds
        any of them out."""
        a, env = self.srun_args, os.environ
        listed = a.nodelist or (env.get("SLURM_JOB_NODELIST", "") if env.get("SLURM_JOB_ID") else "")
        if not listed:
            return [], {}
        names = _slurm("scontrol", "show", "hostnames", listed).split()
        excluded = set(_slurm("scontrol", "show", "hostnames", a.exclude).split()) if a.exclude else set()
        counts = tasks_per_node(env.get("SLURM_TASKS_PER_NODE", "")) if not a.nodelist else []
        slots = [counts[i] if len(counts) == len(names) else None for i in range(len(names))]
        wanted = [(n, s) for n, s in zip(names, slots, strict=True) if n not in excluded]
        out: dict[str, str] = {}
        for line in _slurm("sinfo", "-h", "-N", "-n", ",".join(names), "-o", "%N|%n|%T").splitlines():
            node, _, tail = line.partition("|")
            host, _, state = tail.partition("|")
            self.hostnames[node] = host
            if why := held_out(state):
                out[node] = why
        return wanted, out

    def command(
        self, directory: Path, gpus: tuple[int, ...], np: int, env: dict[str, str]
    ) -> tuple[list[str], int]:
        launch, a = self.job.config.launch, self.srun_args
        wanted, slurm_out = self.nodes()
        plan: HostPlan | None = None
        if wanted:
            total = a.ntasks or launch.nproc_per_node
            plan = self.announce(plan_hosts(wanted, total, self.states(), {**slurm_out, **self.lost}, gpus,
                                            is_here=self.is_here, now=time.time(), default_slots=total), env)  # fmt: skip
            np = plan.np
            if not a.distribution:
                (directory / "hostfile").write_text(task_file(plan))
                env["SLURM_HOSTFILE"] = str(directory / "hostfile")
        elif self.lost:  # nodes not known here: srun still leaves out the ones it lost
            a = replace(a, exclude=",".join(filter(None, [a.exclude, *self.lost])))
        if np < 1:
            raise ConfigError("srun: no node is left to run on (every one is out: see the warnings)")
        env.pop("TRAINGUARD_HOST", None)  # srun copies the environment to every node: each names itself
        export = sorted(k for k, v in env.items() if os.environ.get(k) != v)
        return srun_argv(a, plan, np, launch.cmd, export), np

    def reap(self) -> None:
        """End the step's tasks on every node when srun did not (it was killed): ``scancel`` the
        step the wrappers recorded."""
        steps = {
            str(rec["step"]) for r in range(self.files.np) if (rec := self.files.proc(r)) and rec.get("step")
        }
        live = [r for r in range(self.files.np) if self.files.proc(r) and self.files.recorded_exit(r) is None]
        if steps and live:
            with contextlib.suppress(OSError, subprocess.TimeoutExpired):
                subprocess.run(["scancel", "--signal=KILL", *sorted(steps)], capture_output=True,
                               timeout=60, check=False)  # fmt: skip


class SrunLauncher(MpirunLauncher):
    name = "srun"

    def check(self) -> None:
        for tool in ("srun", "scontrol", "sinfo"):
            if shutil.which(tool) is None:
                raise MissingDependency(f"--launcher srun needs Slurm's {tool} on PATH: {INSTALL_HINT}")

    def workers(self, job: LaunchJob) -> MpiWorkers:
        return SrunWorkers(job, SrunArgs.parse(job.config.launch.launcher_args))

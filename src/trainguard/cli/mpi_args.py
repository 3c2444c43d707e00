"""mpirun's and srun's options on `trainguard run`'s command line, kept as written for the launcher.

    trainguard run --launcher mpirun -np 4 --hostfile hosts --map-by slot -x NCCL_DEBUG -- python train.py
    trainguard run --launcher srun -n 8 --mpi=pmix --gpus-per-task 1 -- python train.py

``add_launcher_options`` registers the mpirun and srun options training jobs use
(``LAUNCHER_OPTIONS``, with how many values each takes; a name both use, such as ``-n``, ``-N``,
``-x``, ``-c``, takes one value in both); each is collected, in order and as written, into
``launcher_args``, which the launcher reads (`supervisor.mpirun.MpirunArgs`,
`supervisor.srun.SrunArgs`) and passes on.
``--launcher-arg=ARG`` passes any other one (``--launcher-arg=--display-devel-map``). A name
`trainguard run` already uses keeps its trainguard (or torchrun) meaning.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Any

__all__ = ["LAUNCHER_OPTIONS", "MPI_LAUNCHERS", "add_launcher_options", "resolve_mpi"]

MPI_LAUNCHERS = ("mpirun", "srun")

# (option strings, number of values): Open MPI 4.1's mpirun options that training jobs use
LAUNCHER_OPTIONS: list[tuple[tuple[str, ...], int]] = [
    (("-np", "--np", "-n", "-c"), 1),
    (("-H", "-host", "--host"), 1),
    (("-hostfile", "--hostfile", "-machinefile", "--machinefile", "--default-hostfile"), 1),
    (("-x",), 1),
    (("-mca", "--mca", "-gmca", "--gmca"), 2),
    (("--map-by", "--rank-by", "--bind-to", "-npernode", "--npernode", "-N", "--npersocket"), 1),
    (("--cpus-per-proc", "--cpus-per-rank", "--prefix", "--wdir", "--path", "--timeout", "--tune"), 1),
    (("--oversubscribe", "--allow-run-as-root", "--tag-output", "--timestamp-output", "--report-bindings",
      "--display-map", "--display-allocation", "--nolocal", "--noprefix", "--use-hwthread-cpus",
      "--get-stack-traces", "--report-state-on-timeout"), 0),
    # Slurm 22.05's srun options that training jobs use
    (("--ntasks", "--nodes", "-w", "--nodelist", "--exclude", "--ntasks-per-node", "--cpus-per-task",
      "--gpus-per-task", "--gpus-per-node", "--gpu-bind", "--cpu-bind", "--mpi", "--export", "-m",
      "--distribution", "--mem", "--mem-per-cpu", "-p", "--partition", "--time", "-J", "--job-name",
      "--network"), 1),
    (("-O", "--overcommit", "-l", "--label", "-u", "--unbuffered", "--overlap"), 0),
]  # fmt: skip


class Collect(argparse.Action):
    """Appends the option and its values, as written, to ``launcher_args``."""

    def __call__(self, parser: Any, namespace: Any, values: Any, option_string: str | None = None) -> None:
        given = list(getattr(namespace, "launcher_args", None) or [])
        if option_string == "--launcher-arg":
            given.append(str(values))
        else:
            given += [str(option_string)] + [str(v) for v in (values if isinstance(values, list) else [])]
        namespace.launcher_args = given


def add_launcher_options(group: Any, taken: set[str]) -> None:
    """Register the launcher options whose names ``taken`` (the parser's own) leaves free."""
    for names, n in LAUNCHER_OPTIONS:
        free = [name for name in names if name not in taken]
        if free:
            group.add_argument(
                *free, action=Collect, nargs=n, dest="launcher_args", default=[],
                metavar=("V",) * n if n > 1 else "V", help=argparse.SUPPRESS,
            )  # fmt: skip
    group.add_argument(
        "--launcher-arg",
        action=Collect,
        dest="launcher_args",
        metavar="ARG",
        help="pass ARG on to mpirun or srun (repeat; --launcher-arg=--flag for one that starts with -)",
    )


def resolve_mpi(
    launcher: str, launcher_args: Sequence[str], nproc: int, gpus: tuple[int, ...]
) -> tuple[int, tuple[int, ...]]:
    """(ranks, this node's GPUs) of an MPI launch: ``-np``/``-n`` if given (else ``--nproc-per-node``);
    with hosts and no ``--gpus``, GPUs 0..(the most slots a host has)-1; under srun in an
    allocation, 0..(the most tasks a node has)-1."""
    from trainguard.errors import ConfigError

    if launcher not in MPI_LAUNCHERS:
        if launcher_args:
            raise ConfigError(
                f"{launcher_args[0]}: an option of mpirun or srun, which --launcher {launcher} does not "
                "take (use --launcher mpirun or srun)"
            )
        return nproc, gpus
    if launcher == "srun":
        import os

        from trainguard.mpi.identity import tasks_per_node
        from trainguard.supervisor.srun import SrunArgs

        n = SrunArgs.parse(launcher_args).ntasks or nproc
        per_node = tasks_per_node(os.environ.get("SLURM_TASKS_PER_NODE", ""))
        return n, gpus or (tuple(range(min(n, max(per_node)))) if per_node else ())
    from trainguard.supervisor.mpirun import MpirunArgs

    parsed = MpirunArgs.parse(launcher_args)
    np = parsed.np or nproc
    if parsed.hosts and not gpus:
        gpus = tuple(range(max((s for _, s in parsed.hosts if s), default=np)))
    return np, gpus

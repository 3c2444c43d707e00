"""The launcher seam: how workers come to life, and the handle the monitor loop drives them by.

A `Launcher` starts the workers of one job and runs the supervisor's monitor loop over them::

    launcher.check()                    # before anything starts: a missing dependency, with its hint
    launcher.launch(job, monitor)       # -> None when the loop returned, else the stop signal's name

The loop (`Supervisor.monitor`) sees the workers only through `Workers`: exit codes, process
handles, ranks, stop and restart. Five launchers ship (`LAUNCHERS`, chosen by ``--launcher``):

    torch   torch's elastic agent, as torchrun runs it (`supervisor.torchrun` -> `supervisor.elastic`)
    local   N local processes, a per-rank environment, no torch (`supervisor.local.LocalLauncher`)
    tf      TensorFlow: N workers with TF_CONFIG each, or one MirroredStrategy process (`supervisor.tf`)
    mpirun  Open MPI's mpirun: one launcher process for every rank on every host, each rank behind
            a small wrapper that records its pid and exit (`supervisor.mpirun`, `trainguard.mpi`)
    srun    Slurm's srun: one job step per attempt, each task behind the same wrapper
            (`supervisor.srun`, on mpirun's `MpiWorkers`)

A new framework or launcher is one more
`Launcher` (most build on `LocalLauncher`: a per-rank environment hook and a command factory; a
launcher that is one process for all ranks, as mpirun and srun, on `MpiWorkers`) and one name in
`LAUNCHERS`; the loops do not learn its name.

    >>> launcher_for("local").name
    'local'
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from trainguard.errors import ConfigError

if TYPE_CHECKING:
    from trainguard.supervisor.config import SupervisorConfig

__all__ = [
    "LAUNCHERS",
    "LaunchJob",
    "Launcher",
    "Monitor",
    "SpareReleased",
    "WorkerEnv",
    "Workers",
    "launcher_for",
]


class SpareReleased(Exception):
    """A hot spare node (``--spare``) was never needed: the job ended (its rendezvous closed, or
    the store that held it went away) while the spare waited to be admitted."""


class Workers(Protocol):
    """The running workers of one node, as the monitor loop drives them."""

    def start(self, local_world_size: int | None = None) -> None:
        """Start (after the rendezvous, if any) ``local_world_size`` workers (default: all). A hot
        spare's start waits until the job needs it; `SpareReleased` when it never does."""

    def restart(self, counts_as_retry: bool, local_world_size: int) -> None:
        """Start the stopped workers again, ``local_world_size`` of them."""

    def stop(self) -> None:
        """Stop every worker; returns once they are reaped."""

    def ranks(self) -> dict[int, int]:
        """local rank -> global rank of the running workers."""

    def world_size(self) -> int: ...

    def exit_codes(self) -> dict[int, int | None]:
        """Exit code per local rank (None while running; negative: killed by that signal)."""

    def procs(self) -> dict[int, Any]:
        """A process handle (``Popen``-like) per local rank: signal workers through these."""

    def pids(self) -> dict[int, int]: ...

    def nodes_waiting(self) -> int:
        """Nodes waiting to join the rendezvous (0 without one)."""

    def peers(self) -> tuple[str | None, dict[str, tuple[int, ...]]]:
        """This node's rendezvous name and the other nodes' -> their global ranks."""

    def drop_peers(self, nodes: Sequence[str]) -> list[str]:
        """Take peer nodes this node saw fail out of the rendezvous now, rather than once their
        keep-alive expires; the ones it took out ([] without a rendezvous)."""

    def interrupted(self) -> None:
        """Raise the stop signal the supervisor received, if a handler swallowed it."""

    def standbys(self) -> dict[str, int] | None:
        """How the last start's ranks started (ready/importing/fresh standbys); None: cold."""

    def settled(self) -> None:
        """The attempt is past its start-up (its first step; without heartbeats, its workers
        running a while): what helps a later restart (warm standbys) may take CPU now, not
        beside the ranks' own start. Called once per attempt; most launchers do nothing."""


Monitor = Callable[[Workers], bool]  # the loop: True when every worker finished, False when stopped
WorkerEnv = Callable[[int, dict[str, str]], None]  # (local rank, env): adds the supervisor's variables


@dataclass(frozen=True, slots=True)
class LaunchJob:
    """What a launcher gets from the supervisor for one job."""

    config: SupervisorConfig
    job_id: str
    worker_env: WorkerEnv
    attempt_dir: Callable[[], Path]  # the current attempt's log directory: rank<R>.stdout|.stderr


class Launcher(Protocol):
    name: str

    def check(self) -> None:
        """Raise `MissingDependency` (with the install hint) when this launcher cannot run here."""

    def launch(self, job: LaunchJob, monitor: Monitor) -> str | None:
        """Start the workers and run ``monitor`` over them until it returns (then None) or a
        stop signal (SIGTERM, SIGINT, SIGHUP) ends the run (then its name); the workers are
        stopped either way."""


LAUNCHERS: dict[str, str] = {
    "torch": "trainguard.supervisor.torchrun:TorchElastic",
    "local": "trainguard.supervisor.local:LocalLauncher",
    "tf": "trainguard.supervisor.tf:TfLauncher",
    "mpirun": "trainguard.supervisor.mpirun:MpirunLauncher",
    "srun": "trainguard.supervisor.srun:SrunLauncher",
}


def launcher_for(name: str) -> Launcher:
    """The launcher called ``name`` (``--launcher``), imported only now."""
    try:
        module, _, cls = LAUNCHERS[name].partition(":")
    except KeyError:
        raise ConfigError(f"--launcher {name!r}: use one of {', '.join(sorted(LAUNCHERS))}") from None
    launcher: Launcher = getattr(importlib.import_module(module), cls)()
    return launcher

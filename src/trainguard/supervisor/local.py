"""``--launcher local``: N local processes, one per rank, with no torch in the supervisor.

    trainguard run --launcher local --nproc-per-node 2 -- python train.py

`LocalLauncher` starts rank R as the worker command with the supervisor's environment and
torchrun's per-rank variables (RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, MASTER_ADDR,
MASTER_PORT: a fresh private port per start, TORCHELASTIC_RESTART_COUNT), its output in the same
per-attempt files as under torch (``<run_dir>/logs/<node>/attempt<A>/rank<R>.stdout|.stderr``),
and a parent-death signal. Its `LocalWorkers` is the `Workers` handle the monitor loop drives.

Other frameworks build on it with two hooks: ``rank_env(local_rank, world_size, env)`` adds a
framework's own variables (TensorFlow's TF_CONFIG), ``command(cmd, local_rank, world_size)``
builds a rank's command line (a wrapper such as mpirun's).

    >>> env: dict[str, str] = {}
    >>> rank_vars(1, 2, 29500, 0, env)
    >>> env["RANK"], env["WORLD_SIZE"], env["MASTER_PORT"]
    ('1', '2', '29500')
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Sequence
from typing import Any

from trainguard.procs import DIE_WITH_PARENT_EXEC, parent_death, stop_signals
from trainguard.supervisor.launch import LaunchJob, Monitor
from trainguard.supervisor.ports import private_port

__all__ = ["Command", "LocalLauncher", "LocalWorkers", "NoRendezvous", "RankEnv", "rank_vars"]

log = logging.getLogger(__name__)

REAP_TIMEOUT_S = 30.0  # after SIGKILL: how long a stopped worker may take to be reaped

RankEnv = Callable[[int, int, dict[str, str]], None]  # (local rank, world size, env): edits env
Command = Callable[[Sequence[str], int, int], list[str]]  # (cmd, local rank, world size) -> argv


class Interrupted(BaseException):
    """A stop signal reached the supervisor (a BaseException: ``except Exception`` in the loop
    must not swallow it, as it does not swallow KeyboardInterrupt)."""

    def __init__(self, signum: int) -> None:
        super().__init__(f"signal {signum}")
        self.signum = signum


def rank_vars(local_rank: int, world_size: int, port: int, restarts: int, env: dict[str, str]) -> None:
    """torchrun's per-rank variables for one node (so a script written for torchrun runs as is)."""
    env.update(
        RANK=str(local_rank),
        LOCAL_RANK=str(local_rank),
        GROUP_RANK="0",
        WORLD_SIZE=str(world_size),
        LOCAL_WORLD_SIZE=str(world_size),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        TORCHELASTIC_RESTART_COUNT=str(restarts),
    )
    if world_size > 1:
        env.setdefault("OMP_NUM_THREADS", "1")  # as torchrun: N ranks must not each take every core


class LocalLauncher:
    """Starts ``--nproc-per-node`` local processes; ``rank_env`` and ``command`` are the hooks."""

    name = "local"

    def __init__(self, rank_env: RankEnv | None = None, command: Command | None = None) -> None:
        self.rank_env, self.command = rank_env, command

    def check(self) -> None:
        """Nothing to import: a plain process launcher runs anywhere."""

    def workers(self, job: LaunchJob) -> LocalWorkers:
        """The `Workers` handle this launcher drives (a framework's launcher may start them its way)."""
        return LocalWorkers(job, self.rank_env, self.command)

    def launch(self, job: LaunchJob, monitor: Monitor) -> str | None:
        workers = self.workers(job)

        def interrupt(signum: int, _frame: Any) -> None:
            workers.received.append(signum)
            raise Interrupted(signum)

        try:
            with stop_signals(interrupt):
                try:
                    monitor(workers)
                finally:
                    workers.stop()
        except Interrupted as exc:
            return signal.Signals(exc.signum).name
        return None


class NoRendezvous:
    """What workers that no rendezvous joins answer (a process per rank, mpirun, srun): no node
    waits and no peer is known or dropped, no standby takes a rank; a stop signal the launcher
    received (``received``) ends the monitor loop, as torch's agent's does."""

    received: list[int]

    def nodes_waiting(self) -> int:
        return 0

    def peers(self) -> tuple[str | None, dict[str, tuple[int, ...]]]:
        return None, {}

    def drop_peers(self, nodes: Sequence[str]) -> list[str]:
        return []

    def interrupted(self) -> None:
        if self.received:
            raise Interrupted(self.received[-1])

    def standbys(self) -> dict[str, int] | None:
        return None


class LocalWorkers(NoRendezvous):
    """The `Workers` handle over one node's local processes (local rank = global rank)."""

    def __init__(self, job: LaunchJob, rank_env: RankEnv | None, command: Command | None) -> None:
        self.job = job
        self.rank_env, self.command = rank_env, command
        self.received: list[int] = []  # stop signals that reached the supervisor
        self.restarts = 0
        self._procs: dict[int, subprocess.Popen[bytes]] = {}
        self._world = 0

    def start(self, local_world_size: int | None = None) -> None:
        launch = self.job.config.launch
        world = local_world_size if local_world_size is not None else launch.nproc_per_node
        directory = self.job.attempt_dir()
        directory.mkdir(parents=True, exist_ok=True)
        port, self._world, self._procs = private_port(), world, {}
        for lr in range(world):
            env = {**os.environ}
            rank_vars(lr, world, port, self.restarts, env)
            if self.rank_env is not None:
                self.rank_env(lr, world, env)
            self.job.worker_env(lr, env)
            argv = self.command(launch.cmd, lr, world) if self.command is not None else list(launch.cmd)
            with (
                open(directory / f"rank{lr}.stdout", "ab") as out,
                open(directory / f"rank{lr}.stderr", "ab") as err,
            ):
                # Through the exec shim: a program that cannot run is a rank that exits 127 (126)
                # naming it in its stderr, as under torch's launcher, not an error in this process.
                shim = [sys.executable, "-S", "-c", DIE_WITH_PARENT_EXEC, str(os.getpid())]
                self._procs[lr] = subprocess.Popen(
                    [*shim, *argv],
                    env=env,
                    stdout=out,
                    stderr=err,
                    stdin=subprocess.DEVNULL,
                    preexec_fn=parent_death(),
                )

    def restart(self, counts_as_retry: bool, local_world_size: int) -> None:
        self.stop()
        if counts_as_retry:
            self.restarts += 1
        self.start(local_world_size)

    def stop(self) -> None:
        running = [p for p in self._procs.values() if p.poll() is None]
        grace = self.job.config.launch.kill_grace_s
        for p in running:
            p.send_signal(signal.SIGTERM if grace > 0 else signal.SIGKILL)
        for p in running:
            try:
                p.wait(grace if grace > 0 else REAP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                p.kill()
                try:
                    p.wait(REAP_TIMEOUT_S)
                except subprocess.TimeoutExpired:
                    log.error("pid %s survived SIGKILL; starting without it", p.pid)

    def ranks(self) -> dict[int, int]:
        return {lr: lr for lr in self._procs}

    def world_size(self) -> int:
        return self._world

    def exit_codes(self) -> dict[int, int | None]:
        return {lr: p.poll() for lr, p in self._procs.items()}

    def procs(self) -> dict[int, Any]:
        return dict(self._procs)

    def pids(self) -> dict[int, int]:
        return {lr: p.pid for lr, p in self._procs.items()}

    def settled(self) -> None:
        pass  # every start is cold: nothing to prepare

"""``--launcher mpirun``: the job as Open MPI's mpirun runs it, watched rank by rank.

    trainguard run --launcher mpirun -np 4 --hostfile hosts --map-by slot -- python train.py

mpirun is the job's one launcher process: it starts every rank, here and on the other hosts
(through its daemons), and ends the whole job when one rank dies. Each attempt runs

    mpirun [the user's options] -np N [--hostfile <attempt dir>/hostfile] -x VAR ... \\
        python -m trainguard.mpi.rank -- CMD

The per-rank wrapper (`trainguard.mpi.rank`) gives each rank its variables and GPU and records
its pid and exit in the attempt's log folder; `MpiWorkers`, the monitor loop's `Workers` handle,
reads them: one exit code and one process per rank, as under torch (ranks on other hosts: where
the run directory is shared). Hosts are re-planned before every start (`supervisor.mpi_hosts`):
the user's ``--host``/``--hostfile`` hosts less those the fleet store rules out (drained,
cordoned, failed, silent: ``trainguard hosts``' judgement) and those mpirun reported lost in an
earlier attempt; this node's slots are the GPUs the loop still uses, so an excluded GPU costs a
rank. Without hosts the job runs here and ``-np`` is the GPUs in use. As root, mpirun gets
``--allow-run-as-root`` (it refuses root otherwise).
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trainguard.errors import ConfigError, MissingDependency
from trainguard.mpi.rank import GPUS_ENV, HOST_GPUS_ENV, LOG_DIR_ENV
from trainguard.procs import parent_death, stop_signals
from trainguard.supervisor.launch import LaunchJob, Monitor
from trainguard.supervisor.local import Interrupted, NoRendezvous
from trainguard.supervisor.mpi_hosts import HostPlan, plan_hosts
from trainguard.supervisor.mpi_procs import RankFiles

__all__ = ["MpiWorkers", "MpirunArgs", "MpirunLauncher", "mpirun_argv"]

log = logging.getLogger(__name__)

INSTALL_HINT = "apt-get install openmpi-bin (Debian/Ubuntu), or load your site's Open MPI module"
STOP_GRACE_S = 5.0  # after SIGTERM: mpirun's own teardown (it ends the ranks on every host)
ABORT_WAIT_S = 10.0  # after a rank failed: mpirun ends the job by itself (about 1 s on loopback)
_NP = ("-np", "--np", "-n", "--n", "-c")
_HOST = ("-H", "-host", "--host")
_HOSTFILE = ("-hostfile", "--hostfile", "-machinefile", "--machinefile", "--default-hostfile")


@dataclass(frozen=True, slots=True)
class MpirunArgs:
    """The user's mpirun options, as written: the few trainguard reads, and the rest."""

    np: int | None = None
    hosts: tuple[tuple[str, int | None], ...] = ()  # --host / --hostfile entries, in order
    rest: tuple[str, ...] = ()  # every other option, passed on to mpirun unchanged

    @classmethod
    def parse(cls, tokens: Sequence[str], read: Any = None) -> MpirunArgs:
        """``read(path) -> text`` reads a host file (default: the file system)."""
        from trainguard.incidents.hosts import parse_host_list, parse_hostfile

        np, hosts, rest = None, [], []
        it = iter(tokens)
        for tok in it:
            name, eq, value = tok.partition("=")
            if name in (*_NP, *_HOST, *_HOSTFILE) and name.startswith("--") and eq:
                arg = value
            elif tok in (*_NP, *_HOST, *_HOSTFILE):
                arg = next(it, "")
                name = tok
            else:
                rest.append(tok)
                continue
            if not arg:
                raise ConfigError(f"mpirun option {name}: needs a value")
            if name in _NP:
                if not arg.isdigit() or int(arg) < 1:
                    raise ConfigError(f"mpirun {name} {arg}: give the number of ranks, 1 or more")
                np = int(arg)
            elif name in _HOST:
                hosts += parse_host_list(arg)
            else:
                try:
                    text = read(arg) if read is not None else Path(arg).read_text(encoding="utf-8")
                except OSError as exc:
                    raise ConfigError(f"mpirun {name} {arg}: {exc.strerror or exc}") from None
                hosts += parse_hostfile(text)
        return cls(np, tuple(hosts), tuple(rest))


def mpirun_argv(
    args: MpirunArgs, plan: HostPlan | None, np: int, hostfile: Path | None, export: Sequence[str],
    cmd: Sequence[str], *, root: bool,
) -> list[str]:  # fmt: skip
    """The mpirun command line of one attempt."""
    argv = ["mpirun", *args.rest]
    if root and "--allow-run-as-root" not in args.rest:
        argv.append("--allow-run-as-root")
    argv += ["-np", str(plan.np if plan is not None else np)]
    if hostfile is not None:
        argv += ["--hostfile", str(hostfile)]
    for name in export:
        argv += ["-x", name]
    return [*argv, sys.executable, "-m", "trainguard.mpi.rank", "--", *cmd]


class MpirunLauncher:
    name = "mpirun"

    def check(self) -> None:
        if shutil.which("mpirun") is None:
            raise MissingDependency(f"--launcher mpirun needs Open MPI's mpirun on PATH: {INSTALL_HINT}")

    def workers(self, job: LaunchJob) -> MpiWorkers:
        return MpiWorkers(job, MpirunArgs.parse(job.config.launch.launcher_args))

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


def here(name: str) -> bool:
    host = socket.gethostname()
    return name in ("localhost", "127.0.0.1", host, host.split(".", 1)[0], os.environ.get("TRAINGUARD_HOST"))


class MpiWorkers(NoRendezvous):
    """The `Workers` handle over one MPI launcher process (mpirun here; srun in `supervisor.srun`,
    which overrides `command` and `is_here`): its ranks, as the wrapper records them."""

    launcher, log = "mpirun", "mpirun.log"

    def __init__(self, job: LaunchJob, args: Any) -> None:
        self.job, self.args = job, args
        self.received: list[int] = []
        self.restarts = 0
        self.lost: dict[str, str] = {}  # nodes the launcher lost in an earlier attempt -> its line
        self.mpirun: subprocess.Popen[bytes] | None = None  # the launcher process (mpirun, srun)
        self.files = RankFiles(Path("."), 0, here)
        self.plan: HostPlan | None = None
        self.told = False  # the launcher's failure was logged

    def start(self, local_world_size: int | None = None) -> None:
        launch = self.job.config.launch
        every = launch.gpus or tuple(range(launch.nproc_per_node))
        n = local_world_size if local_world_size is not None else len(every)
        gpus = every[:n]
        directory = self.job.attempt_dir()
        directory.mkdir(parents=True, exist_ok=True)
        env = {**os.environ}
        self.job.worker_env(0, env)
        env[LOG_DIR_ENV], env[GPUS_ENV] = str(directory), ",".join(map(str, gpus))
        # one host: the ranks asked for, less one for each GPU the loop excluded
        argv, np = self.command(directory, gpus, launch.nproc_per_node - (len(every) - len(gpus)), env)
        self.files, self.told = RankFiles(directory, np, self.is_here, self.log), False
        log.info("%s: %s", self.launcher, " ".join(argv))
        with open(directory / self.log, "ab") as out:
            self.mpirun = subprocess.Popen(
                argv, env=env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                start_new_session=True, preexec_fn=parent_death(signal.SIGTERM),
            )  # fmt: skip

    def is_here(self, name: str) -> bool:
        return here(name)

    def announce(self, plan: HostPlan, env: dict[str, str]) -> HostPlan:
        """Log the hosts ``plan`` leaves out; tell the wrappers the GPUs of hosts that lost some."""
        self.plan = plan
        for host, why in plan.left_out.items():
            log.warning("%s: attempt without %s: %s", self.launcher, host, why)
        env[HOST_GPUS_ENV] = ";".join(f"{h}={','.join(map(str, g))}" for h, g in plan.host_gpus.items())
        return plan

    def command(
        self, directory: Path, gpus: tuple[int, ...], np: int, env: dict[str, str]
    ) -> tuple[list[str], int]:
        """The attempt's launcher command line and its number of ranks (``np``: the ranks on this
        host alone); may add to ``env``."""
        hostfile, self.plan = None, None
        if self.args.hosts:
            plan = self.announce(plan_hosts(self.args.hosts, self.args.np, self.states(), self.lost,
                                            gpus, is_here=here, now=time.time()), env)  # fmt: skip
            hostfile = directory / "hostfile"
            hostfile.write_text(plan.hostfile())
            np = plan.np
        if np < 1:
            raise ConfigError("mpirun: no host is left to run on (every one is out: see the warnings)")
        export = sorted(k for k, v in env.items() if os.environ.get(k) != v)
        return mpirun_argv(self.args, self.plan, np, hostfile, export, self.job.config.launch.cmd,
                           root=os.geteuid() == 0), np  # fmt: skip

    def states(self) -> dict[str, Any]:
        """The fleet store's view of the hosts (none when there is no store to read)."""
        from trainguard.errors import TrainguardError
        from trainguard.incidents import IncidentStore
        from trainguard.incidents.hosts import read_nodes

        try:
            with IncidentStore(self.job.config.resolved_db(), create=False) as store:
                return read_nodes(store)
        except (TrainguardError, OSError) as exc:
            log.warning("%s: hosts not checked against the fleet store: %s", self.launcher, exc)
            return {}

    def restart(self, counts_as_retry: bool, local_world_size: int) -> None:
        self.stop()
        if counts_as_retry:
            self.restarts += 1
        self.lost.update(self.files.lost_nodes())
        self.start(local_world_size)

    def stop(self) -> None:
        p = self.mpirun
        if p is None:
            return
        if p.poll() is None:
            codes = self.files.exit_codes(None)
            if any(c not in (None, 0) for c in codes.values()) or self.files.all_exited():
                # a rank failed, or every rank ended: the launcher is ending the job itself; a
                # signal now makes it abort its own teardown (Open MPI 4.1 then crashes in
                # PMIx_Finalize; srun cancels a step that was finishing)
                _wait(p, ABORT_WAIT_S)
            else:
                p.send_signal(signal.SIGTERM)  # mpirun ends the ranks on every host
                _wait(p, max(STOP_GRACE_S, self.job.config.launch.kill_grace_s))
            if p.poll() is None:
                log.warning("%s did not end by itself; killing it", self.launcher)
        with_pgroup_kill(p)
        self.files.kill_local()
        self.reap()
        if p.returncode not in (0, None) and not self.files.all_exited() and not self.told:
            self.told = True  # once per attempt: the loop stops, then restarts
            log.warning("%s exited %s:\n%s", self.launcher, p.returncode, self.files.launcher_tail())

    def reap(self) -> None:
        """After the launcher is gone: end what it started elsewhere (mpirun's daemons die with it)."""

    def ranks(self) -> dict[int, int]:
        return {r: r for r in range(self.files.np)}

    def world_size(self) -> int:
        return self.files.np

    def exit_codes(self) -> dict[int, int | None]:
        return self.files.exit_codes(self.mpirun.poll() if self.mpirun is not None else None)

    def procs(self) -> dict[int, Any]:
        return self.files.procs()

    def pids(self) -> dict[int, int]:
        return {r: p.pid for r, p in self.files.procs().items()}

    def settled(self) -> None:
        pass  # mpirun starts every rank: nothing to prepare


def _wait(p: subprocess.Popen[bytes], seconds: float) -> None:
    with contextlib.suppress(subprocess.TimeoutExpired):
        p.wait(seconds)


def with_pgroup_kill(p: subprocess.Popen[bytes]) -> None:
    """SIGKILL mpirun's process group while mpirun lives (its pid names the group only until it
    is reaped), then reap it."""
    if p.poll() is None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(p.pid, signal.SIGKILL)
    p.wait()

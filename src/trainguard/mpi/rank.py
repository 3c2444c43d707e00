"""``python -m trainguard.mpi.rank -- CMD ARGS...``: one MPI rank, as trainguard's MPI launchers start it.

``mpirun`` (or ``srun``) starts this once per rank, before the worker command. It reads which rank
it is from the launcher's environment (`trainguard.mpi.identity`), gives the command torchrun's
per-rank variables (RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE) and its node's GPUs
(CUDA_VISIBLE_DEVICES, TRAINGUARD_GPU: the local rank's), sends its output to the attempt's log
files and records, for the supervisor, the command's pid and how it ended::

    $TRAINGUARD_MPI_LOG_DIR/rank<R>.stdout|.stderr  the command's output (appended, as under torch)
    $TRAINGUARD_MPI_LOG_DIR/rank<R>.proc            {"rank", "local_rank", "host", "pid", "gpu"},
                                                    under srun "step" (JOB.STEP) and Slurm's node name
    $TRAINGUARD_MPI_LOG_DIR/rank<R>.exit            {"rank", "code", "time", "signal"}: code < 0 is
                                                    death by that signal; "signal": the stop signal
                                                    this wrapper passed on (mpirun's teardown), if any
    $TRAINGUARD_RUN_DIR/errors/rank<R>.json         the Python traceback the command died with, if any

The stop signals mpirun sends go on to the command; the wrapper then ends as the command did (the
same exit code, or the same signal), so mpirun reports what it would have reported without it.
The command dies with the wrapper, the wrapper with its parent (mpirun's daemon).
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from trainguard.mpi.identity import RankIdentity, gpu_list, identity
from trainguard.procs import die_of, die_with_parent, install, parent_death
from trainguard.rundir import (
    ATTEMPT_ENV,
    ErrorRecord,
    atomic_write_bytes,
    read_tail,
    run_dir_from_env,
    write_error,
)

__all__ = ["GPUS_ENV", "HOST_ENV", "HOST_GPUS_ENV", "LOG_DIR_ENV", "main", "rank_env", "traceback_of"]

LOG_DIR_ENV = "TRAINGUARD_MPI_LOG_DIR"  # the attempt's log folder
GPUS_ENV = "TRAINGUARD_MPI_GPUS"  # the GPUs each node's local ranks use: "0,1,2,3" ("": none)
HOST_GPUS_ENV = "TRAINGUARD_MPI_HOST_GPUS"  # hosts that differ: "n2=0,2,3;n3=1"
HOST_ENV = "TRAINGUARD_HOST"  # this node's name, where it is not the hostname
FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2)
TAIL_BYTES = 64 * 1024


def rank_env(me: RankIdentity, gpus: tuple[int, ...], env: dict[str, str]) -> list[str]:
    """Add the rank's variables to ``env``; returns warnings for the rank's log."""
    env.update(RANK=str(me.rank), LOCAL_RANK=str(me.local_rank), WORLD_SIZE=str(me.world_size))
    if me.local_world_size is not None:
        env["LOCAL_WORLD_SIZE"] = str(me.local_world_size)
    if not gpus:
        return []
    env.update(CUDA_DEVICE_ORDER="PCI_BUS_ID", CUDA_VISIBLE_DEVICES=",".join(map(str, gpus)))
    if me.local_rank < len(gpus):
        env["TRAINGUARD_GPU"] = str(gpus[me.local_rank])
        return []
    env.pop("TRAINGUARD_GPU", None)
    return [f"trainguard: local rank {me.local_rank} has no GPU of its own (this node's: {env[GPUS_ENV]})"]


_EXC_LINE = re.compile(
    r"^((?:[A-Za-z_]\w*\.)*[A-Za-z_]\w*(?:Error|Exception|Interrupt|Exit|Warning)?)(?:: (.*))?$"
)


def traceback_of(text: str) -> tuple[str, str, str] | None:
    """(exception type, message, traceback) of the last Python traceback in ``text``, if its
    exception line is there; None otherwise."""
    start = text.rfind("Traceback (most recent call last):")
    if start < 0:
        return None
    lines = text[start:].splitlines()
    for i, line in enumerate(lines[1:], 1):
        if line.startswith((" ", "\t")) or not line.strip():
            continue
        m = _EXC_LINE.match(line.strip())
        if m is None:
            return None
        return m.group(1), (m.group(2) or "").strip(), "\n".join(lines[: i + 1])
    return None


def _record(path: Path, data: dict[str, Any]) -> None:
    try:
        atomic_write_bytes(path, json.dumps(data).encode())
    except OSError as exc:  # an unwritable log folder must not change how the rank ends
        print(f"trainguard.mpi.rank: cannot write {path}: {exc}", file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    cmd = argv[1:] if argv[:1] == ["--"] else argv
    me = identity(os.environ)
    if not cmd or me is None:
        what = (
            "no command"
            if not cmd
            else "no MPI launcher's rank variables (OMPI_COMM_WORLD_RANK, PMI_RANK, SLURM_PROCID)"
        )
        print(
            f"trainguard.mpi.rank: {what}: run `mpirun ... python -m trainguard.mpi.rank -- CMD`",
            file=sys.stderr,
        )
        return 2
    die_with_parent(os.getppid())  # mpirun's daemon gone: so is this rank
    env = dict(os.environ)
    # under srun a node is named as Slurm names it (the name srun's --exclude and its errors use)
    slurm_node = env.get("SLURMD_NODENAME") if me.source == "Slurm" else None
    host = slurm_node or env.get(HOST_ENV) or socket.gethostname()
    warnings = rank_env(me, gpu_list(env.get(GPUS_ENV, ""), env.get(HOST_GPUS_ENV, ""), host), env)
    folder = Path(env.get(LOG_DIR_ENV) or ".")
    folder.mkdir(parents=True, exist_ok=True)
    out, err = folder / f"rank{me.rank}.stdout", folder / f"rank{me.rank}.stderr"
    stopped: list[int] = []
    child: subprocess.Popen[bytes] | None = None

    def forward(signum: int, _frame: Any) -> None:
        stopped.append(signum)
        if child is not None and child.poll() is None:
            os.kill(child.pid, signum)

    install(FORWARDED, forward, take_foreign=True)
    with open(out, "ab") as o, open(err, "ab") as e:
        for line in warnings:
            e.write(line.encode() + b"\n")
        e.flush()
        try:
            child = subprocess.Popen(cmd, env=env, stdout=o, stderr=e, preexec_fn=parent_death())
        except OSError as exc:
            e.write(f"trainguard.mpi.rank: cannot start {cmd[0]!r}: {exc}\n".encode())
            return 127
    gpu = env.get("TRAINGUARD_GPU")
    proc: dict[str, Any] = {"rank": me.rank, "local_rank": me.local_rank, "host": host, "pid": child.pid,
                            "gpu": int(gpu) if gpu else None}  # fmt: skip
    if slurm_node and env.get("SLURM_JOB_ID") and env.get("SLURM_STEP_ID"):
        proc["step"] = f"{env['SLURM_JOB_ID']}.{env['SLURM_STEP_ID']}"  # what scancel ends
    _record(folder / f"rank{me.rank}.proc", proc)
    if stopped:  # a stop signal came before the command existed
        os.kill(child.pid, stopped[0])
    code = child.wait()
    now = time.time()
    run_dir = run_dir_from_env(env)
    found = traceback_of(read_tail(err, TAIL_BYTES)) if code > 0 and run_dir is not None else None
    if found is not None and run_dir is not None:
        attempt = int(env.get(ATTEMPT_ENV, "0") or 0)
        try:
            write_error(run_dir, ErrorRecord(me.rank, now, *found, pid=child.pid, attempt=attempt))
        except OSError as exc:
            print(f"trainguard.mpi.rank: cannot write the error file: {exc}", file=sys.stderr)
    _record(
        folder / f"rank{me.rank}.exit",
        {"rank": me.rank, "code": code, "time": now, "signal": stopped[0] if stopped else None},
    )
    if code == -signal.SIGKILL:  # no handler to reset: die of it directly
        os.kill(os.getpid(), signal.SIGKILL)
    if code < 0:
        die_of(-code)
    return code


if __name__ == "__main__":
    sys.exit(main())

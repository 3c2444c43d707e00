"""An MPI attempt's ranks as the supervisor sees them: the files the per-rank wrapper writes.

    <attempt dir>/rank<R>.proc   {"rank", "local_rank", "host", "pid", "gpu"}  (trainguard.mpi.rank)
    <attempt dir>/rank<R>.exit   {"rank", "code", "time", "signal"}
    <attempt dir>/mpirun.log     the launcher's own output (srun.log under srun)

A rank's exit code is its ``.exit`` record; while mpirun runs, a rank without one is running.
Once mpirun has ended: a rank that started and left no record was killed with its wrapper
(-SIGKILL); one that never started shares mpirun's failure (its exit code); with mpirun's exit 0
every rank finished (a record on another host's disk is not readable here). `RankProcess` is the
``Popen``-like handle of a rank on this host (signal it, poll it); ranks on other hosts have
none here.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from trainguard.detect.culprit import lost_node
from trainguard.rundir import read_tail

__all__ = ["RankFiles", "RankProcess"]

TAIL_BYTES = 64 * 1024


class RankProcess:
    """A rank's process on this host (not our child: mpirun's daemon started its wrapper)."""

    def __init__(self, pid: int, exit_code: Callable[[], int | None]) -> None:
        self.pid = pid
        self._exit_code = exit_code
        self.returncode: int | None = None

    def poll(self) -> int | None:
        """Its exit code once its wrapper recorded it, or -SIGKILL once the process is gone."""
        if self.returncode is None:
            self.returncode = self._exit_code()
        if self.returncode is None and not _alive(self.pid):
            return -signal.SIGKILL  # not kept: its wrapper may be writing the record now
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, sig)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while (code := self.poll()) is None:
            if deadline is not None and time.monotonic() > deadline:
                import subprocess

                raise subprocess.TimeoutExpired(str(self.pid), timeout or 0.0)
            time.sleep(0.05)
        return code


def _alive(pid: int) -> bool:
    """The process exists and is not a zombie (its wrapper reaps it)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[-1].split()[:1] not in (["Z"], ["X"])


class RankFiles:
    def __init__(
        self, directory: Path, np: int, is_here: Callable[[str], bool], log: str = "mpirun.log"
    ) -> None:
        self.directory, self.np, self.is_here, self.log = directory, np, is_here, log
        self._exits: dict[int, int] = {}
        self._procs: dict[int, dict[str, Any]] = {}
        self._handles: dict[int, RankProcess] = {}

    def _read(self, rank: int, kind: str) -> dict[str, Any] | None:
        try:
            data = json.loads((self.directory / f"rank{rank}.{kind}").read_text())
        except (OSError, ValueError):
            return None
        return data if isinstance(data, dict) else None

    def proc(self, rank: int) -> dict[str, Any] | None:
        if rank not in self._procs and (rec := self._read(rank, "proc")) is not None:
            self._procs[rank] = rec
        return self._procs.get(rank)

    def recorded_exit(self, rank: int) -> int | None:
        if rank not in self._exits and (rec := self._read(rank, "exit")) is not None:
            with contextlib.suppress(KeyError, TypeError, ValueError):
                self._exits[rank] = int(rec["code"])
        return self._exits.get(rank)

    def exit_codes(self, mpirun_code: int | None) -> dict[int, int | None]:
        out: dict[int, int | None] = {}
        for rank in range(self.np):
            code = self.recorded_exit(rank)
            if code is None and mpirun_code is not None:
                if mpirun_code == 0:
                    code = 0
                elif self.proc(rank) is not None:
                    code = -signal.SIGKILL
                else:
                    code = mpirun_code
            out[rank] = code
        return out

    def all_exited(self) -> bool:
        return all(self.recorded_exit(r) is not None for r in range(self.np))

    def procs(self) -> dict[int, RankProcess]:
        """The handles of the ranks that started on this host."""
        for rank in range(self.np):
            rec = self.proc(rank)
            if rank in self._handles or rec is None or not self.is_here(str(rec.get("host", ""))):
                continue
            with contextlib.suppress(KeyError, TypeError, ValueError):
                self._handles[rank] = RankProcess(
                    int(rec["pid"]), functools.partial(self.recorded_exit, rank)
                )
        return dict(self._handles)

    def kill_local(self) -> None:
        """SIGKILL this host's ranks that outlived mpirun (a stopped one, a wrapper's orphan)."""
        for p in self.procs().values():
            if _alive(p.pid):
                p.kill()

    def launcher_tail(self, lines: int = 20) -> str:
        text = read_tail(self.directory / self.log, TAIL_BYTES)
        return "\n".join(text.splitlines()[-lines:])

    def lost_nodes(self) -> dict[str, str]:
        """Nodes the launcher reported lost in this attempt (mpirun's "Remote daemon: ... on node X",
        srun's "Node failure on X") -> the line."""
        found = {}
        for line in self.launcher_tail(400).splitlines():
            node = lost_node(line)
            if node is not None:
                found[node] = f"{self.log.split('.')[0]} lost it: {line.strip()}"
        return found

"""What the benchmarks that run jobs in arms (bench_mpi, bench_tf, bench_node_loss...) need of an
arm's processes: free loopback ports, its job's progress file, every process below the arm, and
an end to the arm that leaves nothing behind.

The job writes one line per step it completed on rank 0, ``<time> <step> <pid>``, to ``progress``
in the arm's folder; a step by a pid not seen before a time is a new attempt training.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
from pathlib import Path


def free_ports(n: int) -> list[int]:
    """``n`` distinct loopback ports free now (bound together, so none is given twice)."""
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def free_port() -> int:
    return free_ports(1)[0]


def progress(work: Path) -> list[tuple[float, int, int]]:
    """(time, step, pid) of every step rank 0 completed."""
    try:
        lines = (work / "progress").read_text().splitlines()
    except OSError:
        return []
    out = []
    for line in lines:
        parts = line.split()
        if len(parts) == 3:
            out.append((float(parts[0]), int(parts[1]), int(parts[2])))
    return out


def trained_since(work: Path, t: float) -> bool:
    """Has a process started after ``t`` completed a step (a step by a pid not seen before t)?"""
    steps = progress(work)
    before = {pid for when, _, pid in steps if when <= t}
    return any(when > t and pid not in before for when, _, pid in steps)


def descendants(root: int) -> list[int]:
    """Every live process below ``root``."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError, IndexError, ValueError):
                stat = Path(f"/proc/{entry}/stat").read_text()
                ppid = int(stat.rsplit(")", 1)[1].split()[1])
                children.setdefault(ppid, []).append(int(entry))
    out, todo = [], [root]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def stop(proc: subprocess.Popen[bytes]) -> None:
    """End the arm and everything it started (a stopped or hung rank too)."""
    left = descendants(proc.pid)
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(30)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    for pid in [*left, *descendants(proc.pid)]:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    proc.wait()

"""What /proc says of a process on a GPU: its user, command line and scheduler job.

The job is the Slurm job the process runs in (``SLURM_JOB_ID`` in its environment, else a
``job_<id>`` in its cgroup path, as slurmd's cgroup plugins name them), or a Kubernetes pod
(``kubepods`` in its cgroup). Unreadable facts are None: "could not read" is not "no job".
"""

from __future__ import annotations

import contextlib
import pwd
import re
from pathlib import Path

from trainguard.records import GpuProcess

__all__ = ["describe"]

_JOB = re.compile(r"/job_(\d+)")
_POD = re.compile(r"kubepods.*?pod([0-9a-f_-]{8,})")


def describe(pid: int, gpu: int, used_mib: float | None = None, proc: Path = Path("/proc")) -> GpuProcess:
    base = proc / str(pid)
    user = command = job = None
    try:
        uid = next(
            int(line.split()[1])
            for line in (base / "status").read_text().splitlines()
            if line.startswith("Uid:")
        )
        try:
            user = pwd.getpwuid(uid).pw_name
        except KeyError:
            user = str(uid)
    except (OSError, StopIteration, ValueError, IndexError):
        pass
    with contextlib.suppress(OSError):
        command = (base / "cmdline").read_bytes().replace(b"\0", b" ").decode(
            errors="replace"
        ).strip() or None
    try:
        env = (base / "environ").read_bytes().split(b"\0")
        job = next((e.split(b"=", 1)[1].decode() for e in env if e.startswith(b"SLURM_JOB_ID=")), None)
    except OSError:
        pass
    if job is None:
        try:
            cgroup = (base / "cgroup").read_text()
            m = _JOB.search(cgroup)
            pod = _POD.search(cgroup)
            job = m.group(1) if m else (f"pod:{pod.group(1)}" if pod else None)
        except OSError:
            pass
    return GpuProcess(pid, gpu, used_mib, user, command, job)

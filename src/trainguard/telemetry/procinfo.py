"""What /proc says of a process on a GPU: its user, command line and scheduler job.

The job comes from the scheduler's own record, never from the process: the Slurm job whose
cgroup slurmd put the process in (``.../slurmstepd.scope/job_<id>/...`` on cgroup v2,
``/slurm/uid_<uid>/job_<id>/...`` on v1), or the Kubernetes pod whose cgroup the kubelet made
(``kubepods...pod<uid>``). ``SLURM_JOB_ID`` in a process's environment is not read: any process can
set it. Cgroups are root's to create and fill, and a user's delegated cgroups live under
``user.slice``, where the patterns do not look.

When ``/proc/<pid>`` is hidden (systemd's ``ProtectProc=invisible`` hides other users'
processes from the agent), the scheduler's cgroup tree is read instead: ``cgroup.procs`` of every
job and pod cgroup, which stays readable. What neither shows is unknown (``job_known=False``):
"could not read" is not "no job".
"""

from __future__ import annotations

import contextlib
import os
import pwd
import re
from pathlib import Path

from trainguard.records import GpuProcess

__all__ = ["describe", "describe_all", "job_of_cgroup", "scheduler_cgroups"]

_SLURM = re.compile(r"(?:/slurmstepd\.scope|/slurm(?:/uid_\d+)?)/job_(\d+)(?:/|$)")
_POD = re.compile(r"/kubepods[^/]*(?:/[^/]*)*?/[^/]*pod([0-9a-f][0-9a-f_-]{7,})(?:\.slice)?(?:/|$)")
CGROUP_ROOT = Path("/sys/fs/cgroup")
# Where slurmd and the kubelet put their cgroups (v2, and v1 under a controller's hierarchy).
_TREES = ("system.slice/slurmstepd.scope", "kubepods.slice", "kubepods", "memory/slurm", "cpu/slurm",
          "memory/kubepods.slice", "memory/kubepods")  # fmt: skip


def job_of_cgroup(path: str) -> str | None:
    """The job a cgroup path belongs to: a Slurm job id, ``pod:<uid>``, or None."""
    m = _SLURM.search(path)
    if m:
        return m.group(1)
    pod = _POD.search(path)
    return f"pod:{pod.group(1)}" if pod else None


def scheduler_cgroups(root: Path = CGROUP_ROOT) -> dict[int, str] | None:
    """pid -> job for every process in a Slurm job's or a pod's cgroup under ``root``; None when
    no scheduler tree could be read at all."""
    found: dict[int, str] = {}
    readable = False
    for tree in _TREES:
        base = root / tree
        if not base.is_dir():
            continue
        readable = True
        for here, _dirs, files in os.walk(base):
            if "cgroup.procs" not in files:
                continue
            job = job_of_cgroup("/" + os.path.relpath(here, root))
            if job is None:
                continue
            with contextlib.suppress(OSError, ValueError):
                for line in (Path(here) / "cgroup.procs").read_text().split():
                    found[int(line)] = job
    return found if readable else None


def describe(
    pid: int,
    gpu: int,
    used_mib: float | None = None,
    proc: Path = Path("/proc"),
    cgroups: dict[int, str] | None = None,
) -> GpuProcess:
    """``cgroups``: ``scheduler_cgroups()``'s map, for a pid whose /proc entry cannot be read."""
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
    known = False
    try:
        cgroup = (base / "cgroup").read_text()
        known = True
        job = next((j for line in cgroup.splitlines() if (j := job_of_cgroup(line.split(":", 2)[-1]))), None)
    except OSError:
        pass
    if job is None and cgroups is not None:
        job = cgroups.get(pid)
        known = True
    return GpuProcess(pid, gpu, used_mib, user, command, job, job_known=known)


def describe_all(
    running: list[tuple[int, float | None]],
    gpu: int,
    proc: Path = Path("/proc"),
    cgroup_root: Path = CGROUP_ROOT,
) -> list[GpuProcess]:
    """``describe`` for each (pid, used MiB) on ``gpu``; the scheduler's cgroup tree is read once,
    and only when a process's /proc entry cannot be."""
    out = [describe(pid, gpu, used, proc) for pid, used in running]
    if all(p.job_known for p in out):
        return out
    cgroups = scheduler_cgroups(cgroup_root)
    return [p if p.job_known else describe(p.pid, gpu, p.used_mib, proc, cgroups) for p in out]

"""Intrusion detection (pure): a compute process on a training GPU that belongs to no known job.

A stranger's miner, or a job started outside the scheduler, shows up in NVML's running-process
list without a scheduler job (``GpuProcess.job`` is None: no Slurm job's or pod's cgroup holds
it, whatever its environment says) and without being one of the node's allowed services. A
process whose job could not be read (``job_known`` False) is not reported: unknown is not a
stranger. Each is a finding ``unexpected_gpu_process`` naming pid, user and command; the
policy decides what happens (``webhook`` is a good start)::

    >>> from trainguard.records import GpuProcess
    >>> [f.reason for f in unexpected_processes([GpuProcess(4242, 5, 900.0, "mallory", "xmrig -o pool")], 0.0)]
    ["pid 4242 of user mallory on GPU 5 belongs to no job: 'xmrig -o pool'"]
"""

from __future__ import annotations

from collections.abc import Iterable

from trainguard.actions import Advice
from trainguard.records import Category, Finding, GpuProcess, Health

__all__ = ["RULE", "unexpected_processes"]

RULE = "unexpected_gpu_process"


def unexpected_processes(
    procs: Iterable[GpuProcess],
    now: float,
    *,
    known_jobs: Iterable[str] | None = None,
    allowed_commands: Iterable[str] = (),
    allowed_users: Iterable[str] = (),
) -> list[Finding]:
    """Findings for processes with no job (or a job not in ``known_jobs``, when given) that no
    allow-list entry (a command prefix, a user) covers."""
    jobs = None if known_jobs is None else set(known_jobs)
    commands, users = tuple(allowed_commands), set(allowed_users)
    out = []
    for p in procs:
        if not p.job_known or (p.job is not None and (jobs is None or p.job in jobs)):
            continue
        if (p.user is not None and p.user in users) or (
            p.command and p.command.startswith(commands or ("\0",))
        ):
            continue
        whose = f"of user {p.user}" if p.user else "of an unknown user"
        job = "belongs to no job" if p.job is None else f"belongs to job {p.job}, not one of this node's"
        out.append(
            Finding(
                RULE,
                Health.DEGRADED,
                Advice.CONTACT_SUPPORT,
                f"pid {p.pid} {whose} on GPU {p.gpu} {job}: {p.command or '?'!r}",
                gpu=p.gpu,
                time=now,
                category=Category.NODE_HOST,
                evidence=(f"pid={p.pid}", f"user={p.user}", f"command={p.command}", f"used_mib={p.used_mib}"),
            )
        )
    return out

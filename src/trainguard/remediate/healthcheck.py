"""``trainguard check --slurm-drain``: the check as Slurm's HealthCheckProgram.

slurmd ignores a health check's exit code: the program drains the node itself (as LBNL NHC does).
With ``--slurm-drain`` a failed verdict drains this node (``$SLURMD_NODENAME``, which slurmd sets,
else the host name) with the check's reason; ok, degraded and unknown change nothing. As a Prolog or
Epilog the exit code alone is enough (non-zero drains the node). docs/remediation.md has the lines.
"""

from __future__ import annotations

import os
import socket

from trainguard.records import Health, NodeVerdict
from trainguard.remediate.providers import Outcome, Target, with_retry

__all__ = ["drain_if_failed", "verdict_reason"]


def verdict_reason(verdict: NodeVerdict) -> str:
    worst = [f for f in (*verdict.findings, *(f for g in verdict.gpus for f in g.findings))
             if f.health is Health.FAILED]  # fmt: skip
    if not worst:
        return "trainguard check: failed"
    f = worst[0]
    where = f" GPU {f.gpu}" if f.gpu is not None else ""
    return f"trainguard check:{where} {f.reason}"


def drain_if_failed(verdict: NodeVerdict, node: str | None = None) -> Outcome | None:
    """Drain this node through scontrol when the verdict failed; None when nothing was to be done."""
    if verdict.health is not Health.FAILED:
        return None
    from trainguard.remediate.providers.slurm import SlurmProvider

    node = node or os.environ.get("SLURMD_NODENAME") or socket.gethostname().split(".")[0]
    provider = SlurmProvider(timeout_s=10.0)  # well inside slurmd's 60 s kill

    def no_sleep(_: float) -> None:
        return None

    out, _ = with_retry(
        provider, "drain", Target(node, None, verdict_reason(verdict)), attempts=2, sleep=no_sleep
    )
    return out

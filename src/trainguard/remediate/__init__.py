"""Remediation: the node agent's act step (policy -> breakers -> providers -> incident records).

    policy.py      findings -> remedies, per node group / GPU model (TOML; dry run by default)
    breaker.py     fleet-wide and per-job limits; past one, actions are held until a person resets
    escalation.py  too many remediations -> hardware inspection; a half-bad rack -> one incident
    executor.py    ``Remediator``: the one place that acts and records
    providers/     slurm (scontrol), kubernetes (official client), gpu_reset (nvidia-smi / sim), webhook

Everything here but the providers is stdlib-only and pure; see docs/remediation.md.
"""

from __future__ import annotations

from trainguard.actions import NodeAction
from trainguard.remediate.breaker import BreakerFile, BreakerState, admit, reset
from trainguard.remediate.executor import JobInfo, Remediator
from trainguard.remediate.policy import NodeDecision, Policy, choose, load_policy, parse_policy

__all__ = [
    "BreakerFile",
    "BreakerState",
    "JobInfo",
    "NodeAction",
    "NodeDecision",
    "Policy",
    "Remediator",
    "admit",
    "choose",
    "load_policy",
    "parse_policy",
    "reset",
]

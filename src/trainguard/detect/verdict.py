"""Fold findings into verdicts: the last step of detect, what `trainguard check` prints.

Each GPU gets the worst health of its findings and the strongest action; the node gets the worst
over its GPUs and its node-scoped findings (NVSwitch, host)::

    >>> from trainguard.actions import Advice
    >>> from trainguard.records import Finding, Gpu, Health
    >>> v = node_verdict([Gpu(0), Gpu(1)], [Finding("ecc_dbe", Health.FAILED, Advice.RESET_GPU, "2 DBE", gpu=1)])
    >>> v.health.value, v.action.value, [g.health.value for g in v.gpus]
    ('failed', 'reset_gpu', ['ok', 'failed'])
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from trainguard.records import (
    Finding,
    Gpu,
    GpuVerdict,
    Health,
    NodeVerdict,
    strongest_action,
    worst_health,
)


def _order(f: Finding) -> tuple[int, int]:
    return (-f.health.rank, -f.action.rank)  # worst first, so reasons[0] is the headline


def gpu_verdict(gpu: Gpu, findings: Iterable[Finding]) -> GpuVerdict:
    found = tuple(sorted(findings, key=_order))
    health = worst_health([f.health for f in found])
    return GpuVerdict(gpu, health, strongest_action([f.action for f in found]), found)


def node_verdict(gpus: Sequence[Gpu], findings: Iterable[Finding]) -> NodeVerdict:
    """One verdict per GPU in ``gpus`` (in their order) and one for the node.

    Findings naming a GPU that is not in ``gpus``, or none, are node-scoped. A node with no GPU
    at all is UNKNOWN: nothing was checked.
    """
    per_gpu: dict[int, list[Finding]] = {g.index: [] for g in gpus}
    node: list[Finding] = []
    for f in findings:
        bucket = per_gpu.get(f.gpu) if f.gpu is not None else None
        (bucket if bucket is not None else node).append(f)
    verdicts = tuple(gpu_verdict(g, per_gpu[g.index]) for g in gpus)
    node_found = tuple(sorted(node, key=_order))
    healths = [v.health for v in verdicts] + [f.health for f in node_found]
    if not gpus:
        healths.append(Health.UNKNOWN)
    actions = [v.action for v in verdicts] + [f.action for f in node_found]
    return NodeVerdict(worst_health(healths), strongest_action(actions), verdicts, node_found)


def node_reasons(v: NodeVerdict) -> list[str]:
    """Every reason, worst first, each prefixed with the GPU it is about."""
    found = list(v.findings) + [f for g in v.gpus for f in g.findings]
    found.sort(key=_order)
    return [f"GPU {f.gpu}: {f.reason}" if f.gpu is not None else f.reason for f in found]


def finding_to_dict(f: Finding, evidence: bool = False) -> dict[str, Any]:
    """A finding as plain JSON; ``evidence`` adds its evidence lines (the API, webhooks)."""
    out: dict[str, Any] = {
        "rule": f.rule,
        "health": f.health.value,
        "action": f.action.value,
        "reason": f.reason,
        "gpu": f.gpu,
        "time": f.time,
        "category": f.category.value if f.category is not None else None,
    }
    if evidence:
        out["evidence"] = list(f.evidence)
    return out


def verdict_to_dict(v: NodeVerdict) -> dict[str, Any]:
    """The JSON shape of `trainguard check --json` (stable keys; values are plain JSON)."""
    return {
        "verdict": v.health.value,
        "action": v.action.value,
        "exit_code": v.health.exit_code,
        "reasons": node_reasons(v),
        "findings": [finding_to_dict(f) for f in v.findings],
        "gpus": [
            {
                "index": g.gpu.index,
                "uuid": g.gpu.uuid,
                "pci": g.gpu.pci,
                "name": g.gpu.name,
                "verdict": g.health.value,
                "action": g.action.value,
                "reasons": g.reasons,
                "findings": [finding_to_dict(f) for f in g.findings],
            }
            for g in v.gpus
        ],
    }

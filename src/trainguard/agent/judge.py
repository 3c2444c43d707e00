"""The daemon's pure judgement: which findings are new this tick, and the incident each becomes.

Rules re-state a finding on every tick while its condition holds, so the daemon counts a finding
once, when it appears (its key was absent, or present fewer times, on the previous tick)::

    >>> from trainguard.actions import Advice
    >>> from trainguard.records import Finding, Health
    >>> f = Finding("xid", Health.FAILED, Advice.RESET_GPU, "Xid 48 on GPU 2", gpu=2, time=5.0)
    >>> new, active = onsets(Counter(), [f])
    >>> len(new), len(onsets(active, [f])[0])
    (1, 0)
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

from trainguard.incidents import Incident
from trainguard.incidents.correlate import root_cause_for
from trainguard.records import Finding, Health, NodeVerdict

FindingKey = tuple[str, int | None, str, str, str]

__all__ = ["Counter", "FindingKey", "all_findings", "incidents_for", "key", "onsets"]


def key(f: Finding) -> FindingKey:
    """What makes two findings the same one: the reason text may change from tick to tick."""
    category = f.category.value if f.category is not None else ""
    return (f.rule, f.gpu, f.health.value, f.action.value, category)


def all_findings(verdict: NodeVerdict) -> list[Finding]:
    return [*verdict.findings, *(f for g in verdict.gpus for f in g.findings)]


def onsets(
    previous: Counter[FindingKey], findings: Iterable[Finding]
) -> tuple[list[Finding], Counter[FindingKey]]:
    """(the findings that appeared since ``previous``, the active keys to pass next time)."""
    current: Counter[FindingKey] = Counter()
    new: list[Finding] = []
    for f in findings:
        k = key(f)
        current[k] += 1
        if current[k] > previous[k]:
            new.append(f)
    return new, current


def incidents_for(new: Iterable[Finding], node: str, now: float) -> list[Incident]:
    """The node incidents this tick's new findings are. Findings that name the same GPU in one tick
    are one fault seen by several witnesses (an Xid 79 line and NVML losing the GPU): one incident
    whose summary and action are the strongest finding's and whose evidence lists them all."""
    by_gpu: dict[int | None, list[Finding]] = {}
    alone: list[list[Finding]] = []
    for f in new:
        if f.health not in (Health.DEGRADED, Health.FAILED):
            continue
        if f.gpu is None:
            alone.append([f])
        else:
            by_gpu.setdefault(f.gpu, []).append(f)
    return [_incident(group, node, now) for group in [*by_gpu.values(), *alone]]


def _incident(group: list[Finding], node: str, now: float) -> Incident:
    lead = max(group, key=lambda f: (f.health.rank, f.action.rank))
    # Kernel-log findings carry the line's dmesg time (seconds since boot): no delay from that.
    times = [f.time for f in group if f.time is not None and 0 <= now - f.time < 86400]
    started = min(times) if times else None
    others = [f"{f.rule}: {f.reason}" for f in group if f is not lead]
    return Incident(
        job=f"node:{node}",
        time=now,
        started=started,
        root_cause=root_cause_for(group),
        category=lead.category.value if lead.category is not None else None,
        action=lead.action.value,
        summary=lead.reason,
        evidence=(lead.rule, *lead.evidence, *others),
        gpu=lead.gpu,
        node=node,
        detected_by="agent",
        detection_delay_s=now - started if started is not None else None,
    )

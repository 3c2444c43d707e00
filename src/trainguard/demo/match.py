"""Matching a drill's injected faults to the incidents trainguard recorded (pure, stdlib only).

The rule (also printed in the demo's JSON as ``matching_rule``)::

    an incident is a candidate for an injected fault when
      - it names the fault's rank, or the GPU that rank used, or it is job-wide (names neither),
        or both are numerics (the Guard all-reduces the loss: every rank sees a NaN at once,
        so whichever rank reported it first may be named), and
      - it was detected no earlier than 1 s before the injection and at most WINDOW s after it;
    faults are taken in the order they happened; each takes the candidate with the expected
    root cause (then the expected action, then the earliest), and each incident matches at most
    one fault. A left-over incident that is a candidate of matched faults is "related" to the
    latest of them (the same fault seen by a second detector).

A fault is OK when it matched an incident whose root cause is one of the expected ones and
whose action is one of the expected ones (an exclusion: of the GPU the fault hit).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from trainguard.demo.plan import DemoFault
from trainguard.demo.truth import InjectedFault
from trainguard.incidents import Incident

WINDOW_S = 60.0
EARLY_S = 1.0
_RULE_TEXT = (__doc__ or "::").split("::", 1)[1].split("A fault is OK")[0]
MATCHING_RULE = " ".join(_RULE_TEXT.replace("WINDOW s", f"{WINDOW_S:g} s").split())


@dataclass(frozen=True, slots=True)
class Outcome:
    fault_id: str
    incident_id: int | None  # the matched incident (None: unmatched, or a no-incident fault)
    ok: bool
    reason: str  # why it is (not) OK, in words
    detection_delay_s: float | None = None  # incident detection time - injection time
    related: tuple[int, ...] = field(default=())


def match(
    faults: list[DemoFault],
    injected: list[InjectedFault],
    incidents: list[Incident],
    window_s: float = WINDOW_S,
) -> list[Outcome]:
    """One `Outcome` per planned fault, in plan order."""
    plan = {f.id: f for f in faults}
    taken: set[int] = set()
    results: dict[str, Outcome] = {}
    ordered = sorted(injected, key=lambda i: (i.time is None, i.time or 0.0))
    for inj in ordered:
        spec = plan[inj.id]
        if not inj.fired or inj.time is None:
            results[inj.id] = Outcome(inj.id, None, False, "never injected: the run ended before its step")
            continue
        pool = [i for i in candidates(inj, incidents, window_s) if i.id not in taken]
        if not pool:
            results[inj.id] = Outcome(inj.id, None, False, f"no incident on rank {inj.rank} / GPU {inj.gpu}")
            continue
        best = min(pool, key=lambda i: _preference(i, spec))
        assert best.id is not None
        taken.add(best.id)
        reason = _judge(best, spec, inj)
        ok = reason is None
        reason = reason or f"root cause {best.root_cause.value}, action {best.action}"
        results[inj.id] = Outcome(inj.id, best.id, ok, reason, round(best.time - inj.time, 3))
    # Second pass: the same fault seen again by another detector; a left-over incident belongs
    # to the latest matched fault before it.
    related: dict[str, list[int]] = {}
    for inc in incidents:
        if inc.id is None or inc.id in taken:
            continue
        owners = [
            inj
            for inj in ordered
            if results[inj.id].incident_id is not None and inc in candidates(inj, incidents, window_s)
        ]
        if owners:
            owner = max(owners, key=lambda i: i.time or 0.0)
            related.setdefault(owner.id, []).append(inc.id)
    for fid, ids in related.items():
        out = results[fid]
        results[fid] = Outcome(
            out.fault_id, out.incident_id, out.ok, out.reason, out.detection_delay_s, tuple(ids)
        )
    return [results[f.id] for f in faults if f.id in results]


def candidates(inj: InjectedFault, incidents: list[Incident], window_s: float = WINDOW_S) -> list[Incident]:
    """Incidents that could be this fault: same rank or GPU (or job-wide), detected in the window."""
    if inj.time is None:
        return []
    out = []
    for inc in incidents:
        if inc.id is None or not inj.time - EARLY_S <= inc.time <= inj.time + window_s:
            continue
        same_rank = inj.rank is not None and inc.rank == inj.rank
        same_gpu = inj.gpu is not None and inc.gpu == inj.gpu
        job_wide = inc.rank is None and inc.gpu is None
        numerics = inj.kind == "nan" and inc.category == "numerics"
        if same_rank or same_gpu or job_wide or numerics:
            out.append(inc)
    return out


def unmatched(outcomes: list[Outcome], incidents: list[Incident]) -> list[Incident]:
    """Incidents no fault claimed (neither matched nor related): false alarms, or real trouble."""
    used = {o.incident_id for o in outcomes} | {r for o in outcomes for r in o.related}
    return [i for i in incidents if i.id not in used]


def _judge(inc: Incident, spec: DemoFault, inj: InjectedFault) -> str | None:
    """What is wrong with the matched incident (None: nothing)."""
    problems = []
    if inc.root_cause.value not in spec.expected_causes:
        problems.append(f"root cause {inc.root_cause.value}, expected {' or '.join(spec.expected_causes)}")
    if spec.expected_actions and inc.action not in spec.expected_actions:
        problems.append(f"action {inc.action}, expected {' or '.join(spec.expected_actions)}")
    elif inc.action == "exclude_gpu" and inj.gpu is not None and inc.gpu != inj.gpu:
        problems.append(f"excluded GPU {inc.gpu}, not GPU {inj.gpu} that the fault hit")
    return "; ".join(problems) or None


def _preference(inc: Incident, spec: DemoFault) -> tuple[int, int, float]:
    return (
        0 if inc.root_cause.value in spec.expected_causes else 1,
        0 if inc.action in spec.expected_actions else 1,
        inc.time,
    )

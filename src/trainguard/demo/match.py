"""Matching a drill's injected faults to the incidents trainguard recorded (pure, stdlib only).

The rule (also printed in the demo's JSON as ``matching_rule``)::

    an incident is a candidate for an injected fault when
      - it names the fault's rank or the GPU that rank used, and no other rank or GPU; a
        fault with no rank (a torn checkpoint) takes only a job-wide incident (one naming
        neither rank nor GPU) whose evidence names the torn checkpoint's step, and
      - it was detected no earlier than 1 s before the injection and at most WINDOW s after it;
    faults are taken in the order they happened, twice: first each takes the earliest candidate
    with the expected root cause and action, then each fault still open takes its best remaining
    candidate (expected root cause first, then the earliest); an incident matches at most one fault.
    A left-over incident that is a candidate of matched faults is "related" to the latest of
    them (the same fault seen by a second detector).

A fault is OK when it matched an incident whose root cause is one of the expected ones and
whose action is one of the expected ones. There is no exception for any fault kind: an
incident that names another rank, or no rank at all, is not evidence about this fault.
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
    # Round one takes only right conclusions, so that a fault whose own incident is missing
    # cannot take the incident a later fault on the same rank is right about; round two gives
    # each fault still open its best remaining candidate, to report what was concluded instead.
    for right_only in (True, False):
        for inj in ordered:
            spec = plan[inj.id]
            if inj.id in results:
                continue
            if not inj.fired or inj.time is None:
                results[inj.id] = Outcome(
                    inj.id, None, False, "never injected: the run ended before its step"
                )
                continue
            pool = [i for i in candidates(inj, incidents, window_s) if i.id not in taken]
            if right_only:
                pool = [i for i in pool if judge(i, spec)[0]]
            if not pool:
                if not right_only:
                    results[inj.id] = Outcome(inj.id, None, False, f"no incident names {_where(inj)}")
                continue
            best = min(pool, key=lambda i: _preference(i, spec))
            assert best.id is not None
            taken.add(best.id)
            ok, reason = judge(best, spec)
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
    """Incidents that could be this fault: naming its rank or GPU, detected in the window."""
    if inj.time is None:
        return []
    return [
        inc
        for inc in incidents
        if inc.id is not None and inj.time - EARLY_S <= inc.time <= inj.time + window_s and names(inc, inj)
    ]


def names(inc: Incident, inj: InjectedFault) -> bool:
    """Does the incident point at where the fault was injected?"""
    if inj.rank is not None or inj.gpu is not None:
        same_rank = inj.rank is not None and inc.rank == inj.rank
        same_gpu = inj.gpu is not None and inc.gpu == inj.gpu
        other_rank = inc.rank is not None and inj.rank is not None and inc.rank != inj.rank
        other_gpu = inc.gpu is not None and inj.gpu is not None and inc.gpu != inj.gpu
        return (same_rank or same_gpu) and not (other_rank or other_gpu)
    if inc.rank is not None or inc.gpu is not None:
        return False
    if inj.checkpoint_step is None:
        return inj.kind != "corrupt_checkpoint"
    return any(isinstance(e, dict) and e.get("skipped_step") == inj.checkpoint_step for e in inc.evidence)


def judge(inc: Incident, spec: DemoFault) -> tuple[bool, str]:
    """Is the matched incident's conclusion the expected one? (ok, why in words)"""
    wrong = []
    if inc.root_cause.value not in spec.expected_causes:
        wrong.append(f"root cause {inc.root_cause.value}, expected {' or '.join(spec.expected_causes)}")
    if inc.action not in spec.expected_actions:
        wrong.append(f"action {inc.action}, expected {' or '.join(spec.expected_actions)}")
    if wrong:
        return False, f"incident #{inc.id}: " + "; ".join(wrong)
    return True, f"root cause {inc.root_cause.value}, action {inc.action}"


def unmatched(outcomes: list[Outcome], incidents: list[Incident]) -> list[Incident]:
    """Incidents no fault claimed (neither matched nor related): false alarms, or real trouble."""
    used = {o.incident_id for o in outcomes} | {r for o in outcomes for r in o.related}
    return [i for i in incidents if i.id not in used]


def _preference(inc: Incident, spec: DemoFault) -> tuple[int, int, float]:
    return (
        0 if inc.root_cause.value in spec.expected_causes else 1,
        0 if inc.action in spec.expected_actions else 1,
        inc.time,
    )


def _where(inj: InjectedFault) -> str:
    if inj.rank is None and inj.gpu is None:
        step = f" of step {inj.checkpoint_step}" if inj.checkpoint_step is not None else ""
        return f"the torn checkpoint{step}" if inj.kind == "corrupt_checkpoint" else "the job"
    parts = [
        f"rank {inj.rank}" if inj.rank is not None else "",
        f"GPU {inj.gpu}" if inj.gpu is not None else "",
    ]
    return " or ".join(p for p in parts if p)

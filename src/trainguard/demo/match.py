"""Matching a drill's injected faults to the incidents trainguard recorded (pure, stdlib only).

The rule (also printed in the demo's JSON as ``matching_rule``)::

    an incident is a candidate for an injected fault when
      - it names the fault's rank or the GPU that rank used, and no other rank or GPU; a
        fault with no rank (a torn checkpoint) takes only a job-wide incident (one naming
        neither rank nor GPU) whose evidence names the torn checkpoint's step, and
      - it was detected no earlier than 1 s before the injection and at most WINDOW s after it;
    each incident belongs to the latest fault injected before it that it is a candidate for;
    a fault's first incident is its answer, and the later ones are the same fault seen again
    ("related"); an incident no fault claims is a false incident.

The self-test counts precision as well as recall: a fault is OK when its first incident has an
expected root cause and action (an expected "unknown" must list the expected suspects, not
the fallback's), and every related incident agrees with it (an expected or unknown root
cause, an expected action or "continue"): a wrong first conclusion fails the fault even when
a later incident gets it right, and so does a needless restart or exclusion. Every false
incident fails the run. There is no exception for any fault kind.
"""

from __future__ import annotations

import re
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
    fired = [i for i in injected if i.fired and i.time is not None]
    owned: dict[str, list[Incident]] = {i.id: [] for i in fired}
    owner = owners(fired, incidents, window_s)
    for inc in incidents:
        if inc.id in owner:
            owned[owner[inc.id].id].append(inc)
    results: dict[str, Outcome] = {}
    for inj in injected:
        if inj.id not in owned:
            results[inj.id] = Outcome(inj.id, None, False, "never injected: the run ended before its step")
            continue
        mine = sorted(owned[inj.id], key=lambda i: (i.time, i.id or 0))
        if not mine:
            results[inj.id] = Outcome(inj.id, None, False, f"no incident names {_where(inj)}")
            continue
        first, later = mine[0], mine[1:]
        assert first.id is not None and inj.time is not None
        ok, reason = judge(first, plan[inj.id])
        if ok:
            disagree = [why for inc in later if (why := disagrees(inc, plan[inj.id]))]
            if disagree:
                ok, reason = False, "; ".join(disagree)
        related = tuple(i.id for i in later if i.id is not None)
        results[inj.id] = Outcome(inj.id, first.id, ok, reason, round(first.time - inj.time, 3), related)
    return [results[f.id] for f in faults if f.id in results]


def owners(
    fired: list[InjectedFault], incidents: list[Incident], window_s: float = WINDOW_S
) -> dict[int, InjectedFault]:
    """Incident id -> the fault that explains it: of the faults it is a candidate for, the latest
    injected before it was detected (within the early margin: the first one)."""
    out: dict[int, InjectedFault] = {}
    for inc in incidents:
        could = [inj for inj in fired if candidates(inj, [inc], window_s)]
        if inc.id is None or not could:
            continue
        before = [inj for inj in could if (inj.time or 0.0) <= inc.time]
        pick = max(before, key=_at) if before else min(could, key=_at)
        out[inc.id] = pick
    return out


def _at(inj: InjectedFault) -> float:
    return inj.time or 0.0


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
    """Is the fault's first incident the expected conclusion? (ok, why in words)"""
    wrong = []
    if inc.root_cause.value not in spec.expected_causes:
        wrong.append(f"root cause {inc.root_cause.value}, expected {' or '.join(spec.expected_causes)}")
    elif inc.root_cause.value == "unknown" and spec.expected_suspects:
        named = suspects_of(inc)
        if set(named) != set(spec.expected_suspects):
            wrong.append(
                f"unknown with suspects {', '.join(named) or 'none'}, expected suspects "
                f"{', '.join(spec.expected_suspects)}"
            )
    if inc.action not in spec.expected_actions:
        wrong.append(f"action {inc.action}, expected {' or '.join(spec.expected_actions)}")
    if wrong:
        return False, f"incident #{inc.id}: " + "; ".join(wrong)
    return True, f"root cause {inc.root_cause.value}, action {inc.action}"


def disagrees(inc: Incident, spec: DemoFault) -> str | None:
    """Why a later incident of the same fault contradicts the expected conclusion, or None: it
    may say less (root cause unknown, action continue), never something else."""
    cause, action = inc.root_cause.value, inc.action
    if cause not in spec.expected_causes and cause != "unknown":
        return f"later incident #{inc.id}: root cause {cause}, expected {' or '.join(spec.expected_causes)}"
    if action not in spec.expected_actions and action != "continue":
        return f"later incident #{inc.id}: action {action} (needless), expected {' or '.join(spec.expected_actions)}"
    return None


def suspects_of(inc: Incident) -> list[str]:
    """The root causes an "unknown; suspects: a (why); b (why)" evidence line names."""
    for e in inc.evidence:
        text = str(e)
        if text.startswith("unknown; suspects: "):
            return re.findall(r"(?:^|; )([a-z_]+) \(", text.removeprefix("unknown; suspects: "))
    return []


def unmatched(outcomes: list[Outcome], incidents: list[Incident]) -> list[Incident]:
    """Incidents no fault claimed (neither matched nor related): false alarms, or real trouble."""
    used = {o.incident_id for o in outcomes} | {r for o in outcomes for r in o.related}
    return [i for i in incidents if i.id not in used]


def _where(inj: InjectedFault) -> str:
    if inj.rank is None and inj.gpu is None:
        step = f" of step {inj.checkpoint_step}" if inj.checkpoint_step is not None else ""
        return f"the torn checkpoint{step}" if inj.kind == "corrupt_checkpoint" else "the job"
    parts = [
        f"rank {inj.rank}" if inj.rank is not None else "",
        f"GPU {inj.gpu}" if inj.gpu is not None else "",
    ]
    return " or ".join(p for p in parts if p)

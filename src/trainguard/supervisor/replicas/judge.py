"""The replica loop's judgement (pure): what the loop knows of each group (`ReplicaGroup`), what it
saw (`GroupsView`), what to do about it (`judge` -> `GroupDecision`), and the partial capacity of a run
(`capacity`). `replicas.loop` looks and acts; nothing here does I/O.
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass, field
from itertools import pairwise

from trainguard.actions import GroupAction
from trainguard.chaos.plan import Fault
from trainguard.supervisor.config import ExitCode
from trainguard.supervisor.replicas.result import GroupRun
from trainguard.supervisor.state import RunState

_FINAL_FOR_GROUP = (ExitCode.CRASH_LOOP, ExitCode.FAILED, ExitCode.USAGE)  # restarting won't help


@dataclass(slots=True)
class ReplicaGroup:
    """One replica group: its `trainguard run` process and what the loop knows of it."""

    index: int
    gpus: tuple[int, ...]
    state: RunState = RunState.INIT
    proc: subprocess.Popen[bytes] | None = None
    starts: int = 0
    started_at: float = 0.0  # its last start
    start_times: list[float] = field(default_factory=list)  # every start of its `trainguard run`
    last_step: int | None = None
    last_step_at: float | None = None
    steps: list[tuple[float, int]] = field(default_factory=list)  # (time, step) as first seen
    healing_since: float | None = None  # when its workers were seen restarting
    attempt: int = 0  # its own loop's attempt (its workers' start) in its ranks' newest heartbeat
    heals: list[float] = field(default_factory=list)  # seconds from restart to the live groups' step
    faults: list[Fault] = field(default_factory=list)  # chaos faults aimed at it, not fired yet
    runs: list[GroupRun] = field(default_factory=list)  # per start of its `trainguard run`: how it ended

    @property
    def name(self) -> str:
        return f"g{self.index}"


@dataclass(frozen=True, slots=True)
class GroupsView:
    time: float
    exits: dict[int, int | None]  # group -> exit code of its `trainguard run` (None: running)
    lost: dict[int, tuple[int, ...]]  # group that exited -> the GPUs its own loop took out of service
    steps: dict[int, int | None]  # group -> furthest step its ranks reported
    lighthouse_exit: int | None


@dataclass(frozen=True, slots=True)
class GroupDecision:
    kind: GroupAction
    group: int | None = None
    code: int | None = None
    reason: str = ""
    gpus: tuple[int, ...] = ()  # REPLACE: the GPUs the group starts on


def judge(
    view: GroupsView, groups: list[ReplicaGroup], spares: list[int], job_restarts_left: int
) -> list[GroupDecision]:
    """What to do about what was seen (pure); ``spares``: GPUs no group uses."""
    acts: list[GroupDecision] = []
    if view.lighthouse_exit is not None:
        acts.append(
            GroupDecision(
                GroupAction.RESTART_LIGHTHOUSE, code=view.lighthouse_exit, reason="the Lighthouse exited"
            )
        )
    free = list(spares)
    down: set[int] = set()
    for g in groups:
        code = view.exits.get(g.index)
        if g.state.final or code is None:
            continue
        if code == 0:
            acts.append(GroupDecision(GroupAction.FINISHED, g.index, code, "training completed"))
            continue
        bad = view.lost.get(g.index, ())
        keep = tuple(x for x in g.gpus if x not in bad)
        while len(keep) < len(g.gpus) and free:
            keep = (*keep, free.pop(0))
        if code in _FINAL_FOR_GROUP:
            acts.append(GroupDecision(GroupAction.STOP_GROUP, g.index, code, _why(code)))
            down.add(g.index)
        elif len(keep) < len(g.gpus):
            acts.append(
                GroupDecision(
                    GroupAction.STOP_GROUP, g.index, code, "no spare GPU to replace the excluded one"
                )
            )
            down.add(g.index)
        else:
            acts.append(GroupDecision(GroupAction.REPLACE, g.index, code, _why(code), tuple(sorted(keep))))
    alive = [g for g in groups if g.index not in down and not g.state.final]
    if down and not alive and not any(g.state is RunState.SUCCEEDED for g in groups):
        crash_loop = any(a.code == int(ExitCode.CRASH_LOOP) for a in acts if a.kind is GroupAction.STOP_GROUP)
        if job_restarts_left > 0 and not crash_loop:
            acts.append(GroupDecision(GroupAction.RESTART_ALL, reason="every replica group is down"))
        else:
            why = "a crash loop" if crash_loop else "the job's restart budget is used up"
            acts.append(GroupDecision(GroupAction.STOP_JOB, reason=f"every replica group is down ({why})"))
    return acts


def _why(code: int) -> str:
    try:
        return {
            ExitCode.FAILED: "the group's restart budget is used up",
            ExitCode.CRASH_LOOP: "the group is in a crash loop",
            ExitCode.NO_CAPACITY: "the group lost a GPU",
            ExitCode.USAGE: "usage error",
            ExitCode.INTERRUPTED: "the group was interrupted",
        }[ExitCode(code)]
    except ValueError:
        return f"the group's supervisor exited with {code}"


def capacity(groups: list[ReplicaGroup], start: float, end: float) -> dict[str, float]:
    """Partial capacity from each group's stepping spans as the loop saw them: the share of
    group-seconds in which a group committed steps (``capacity``), and the time k of N groups
    stepped (``k_of_n_s``). Empty (``n/a``) when no group was seen to step or the run had no
    wall time: nothing was measured, which is not a capacity of 0.

    >>> g = ReplicaGroup(0, (0,), steps=[(10.0, 0), (13.0, 1), (16.0, 2), (19.0, 3)])  # 3 s steps
    >>> capacity([g], 0.0, 20.0)["capacity"], capacity([ReplicaGroup(1, (1,))], 0.0, 20.0)
    (0.45, {})
    """
    n = len(groups)
    if n == 0 or end <= start or not any(g.steps for g in groups):
        return {}
    marks: list[tuple[float, int]] = []
    for g in groups:
        for a, b in _stepping_spans(g.steps):
            marks += [(max(a, start), 1), (min(b, end), -1)]
    marks.sort()
    k, last, busy = 0, start, 0.0
    spans: dict[int, float] = {}
    for t, d in marks:
        spans[k] = spans.get(k, 0.0) + max(0.0, t - last)
        busy += k * max(0.0, t - last)
        k, last = k + d, t
    spans[k] = spans.get(k, 0.0) + max(0.0, end - last)
    out = {"capacity": round(busy / (n * (end - start)), 4)}
    out.update({f"{k}_of_{n}_s": round(v, 3) for k, v in sorted(spans.items())})
    return out


def _stepping_spans(steps: list[tuple[float, int]], gap_s: float = 2.0) -> list[tuple[float, float]]:
    """Spans in which steps kept coming: no gap longer than ``gap_s`` or 3 of the group's median
    step times (a job whose steps take longer than ``gap_s`` steps all the same).

    >>> _stepping_spans([(0.0, 0), (3.0, 1), (6.0, 2), (40.0, 0), (43.0, 1)])
    [(0.0, 6.0), (40.0, 43.0)]
    """
    gaps = sorted(b[0] - a[0] for a, b in pairwise(steps) if b[1] > a[1])
    allowed = max(gap_s, 3 * gaps[len(gaps) // 2]) if gaps else gap_s
    spans: list[tuple[float, float]] = []
    for t, _ in steps:
        if spans and t - spans[-1][1] <= allowed:
            spans[-1] = (spans[-1][0], t)
        else:
            spans.append((t, t))
    return spans


def thinned(steps: list[tuple[float, int]], every_s: float = 1.0) -> list[tuple[float, int]]:
    """A group's observed (time, step) points for the store's progress (the report's plot): one
    per ``every_s`` at most, every restart (a step below the last kept), and the last point.

    >>> thinned([(0.0, 0), (0.4, 4), (1.0, 10), (1.2, 12), (1.3, 0), (1.5, 2)])
    [(0.0, 0), (1.0, 10), (1.3, 0), (1.5, 2)]
    """
    kept: list[tuple[float, int]] = []
    for t, s in steps:
        if not kept or s < kept[-1][1] or t - kept[-1][0] >= every_s:
            kept.append((t, s))
    if steps and kept[-1] != steps[-1]:
        kept.append(steps[-1])
    return kept

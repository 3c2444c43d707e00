"""`RunState`: the one name for where a supervised run stands (stdlib only).

The monitor loop (`supervisor.supervisor`) keeps the job's state in ``History.state``; with
replica groups (`supervisor.replicas`) each group has one too, and the job's follows from them
(`job_state`). Only the acting step changes a state.
"""

from __future__ import annotations

from collections.abc import Iterable
from enum import Enum


class RunState(str, Enum):
    """State of a run, or of one replica group of it. The state machine::

        INIT ──start──> RUNNING ──every worker finished──> SUCCEEDED
                          │  ▲
          trouble, restart│  │first step (or running RUNNING_S without heartbeats)
                          ▼  │
                       RECOVERING
        RUNNING ──one replica group fails (others keep stepping)──> DEGRADED
        DEGRADED ──the group healed from a live peer──> RUNNING
        DEGRADED ──every group down──> RECOVERING  (restart from the newest durable checkpoint)
        any ──the policy stops (crash loop, budget, capacity)──> STOPPED
        any ──SIGTERM / SIGINT / SIGHUP to the supervisor──> INTERRUPTED

    A replica group is RUNNING, RECOVERING (stopped, being restarted, or healing before its first
    committed step) or STOPPED (its own crash-loop breaker or budget ended it); DEGRADED and
    SUCCEEDED apply to it as to the job.
    """

    INIT = "init"
    RUNNING = "running"
    DEGRADED = "degraded"  # k of N replica groups step; the others are being replaced
    RECOVERING = "recovering"
    SUCCEEDED = "succeeded"
    STOPPED = "stopped"
    INTERRUPTED = "interrupted"

    @property
    def final(self) -> bool:
        return self in (RunState.SUCCEEDED, RunState.STOPPED, RunState.INTERRUPTED)


def job_state(groups: Iterable[RunState]) -> RunState:
    """The job's state from its replica groups': RUNNING when all run, DEGRADED when some do,
    RECOVERING when none does but one is being restarted, else the shared final state."""
    states = list(groups)
    if not states:
        return RunState.INIT
    running = sum(s is RunState.RUNNING for s in states)
    if all(s is RunState.SUCCEEDED for s in states):
        return RunState.SUCCEEDED
    if running and all(s in (RunState.RUNNING, RunState.SUCCEEDED) for s in states):
        return RunState.RUNNING
    if running:
        return RunState.DEGRADED
    if any(s in (RunState.RECOVERING, RunState.INIT) for s in states):
        return RunState.RECOVERING
    if any(s is RunState.INTERRUPTED for s in states):
        return RunState.INTERRUPTED
    return RunState.STOPPED

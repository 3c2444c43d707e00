"""The supervisor's state, as two explicit values.

- `Attempt`: one start of the workers (number, start time, rank -> GPU map, resume step, the
  exits, teardown aborts and log events seen). Created by each start, thrown away on restart.
- `History`: what outlives attempts (the run's `RunState`, restart budget used, failures in a
  row, crash signatures, what was already reported, incidents waiting for the recovery to finish).

The monitor loop (`trainguard.supervisor.supervisor`) reads both; only its acting step changes
them. Neither does I/O.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from trainguard.chaos import Injected
from trainguard.incidents import Incident
from trainguard.records import Event
from trainguard.supervisor.config import SupervisorConfig
from trainguard.supervisor.health import GpuMap
from trainguard.supervisor.policy import PolicyState
from trainguard.supervisor.state import RunState


@dataclass(slots=True, kw_only=True)
class Attempt:
    """One start of the workers."""

    number: int
    started: float
    rank_of: dict[int, int]  # local rank -> global rank
    gpu_map: GpuMap  # local rank -> physical GPU, after exclusions
    resume_step: int | None  # the step the workers resume from (None: no checkpoint directory)
    world_size: int
    node: str | None = None  # this node's rendezvous name (<host>_<pid>_<n>); None: one node
    peers: dict[str, tuple[int, ...]] = field(default_factory=dict)  # the other nodes -> global ranks
    oom_kills_at_start: int | None = None  # the memory cgroup's OOM-kill count (None: unreadable)
    standbys: dict[str, int] | None = None  # ranks started from ready/importing/fresh standbys (None: cold)
    exits_seen: dict[int, float] = field(default_factory=dict)  # local rank -> when first seen exited
    teardown_aborts: set[int] = field(default_factory=set)  # local ranks that finished, then aborted
    events: list[Event] = field(default_factory=list)  # classified worker log lines
    straggler_reported: bool = False
    first_step_seen: bool = False
    settled: bool = False  # past its start-up: the launcher was told (`Workers.settled`)
    last_step_emitted: int | None = None
    outcome: str | None = None  # once it ended: succeeded | failed | interrupted | ...

    @property
    def closed(self) -> bool:
        return self.outcome is not None

    @property
    def ranks(self) -> list[int]:
        return sorted(self.rank_of.values())

    def gpu_of_rank(self, rank: int | None) -> int | None:
        for lr, r in self.rank_of.items():
            if r == rank:
                return self.gpu_map.gpu_of(lr)
        return None

    def rank_of_gpu(self, gpu: int | None) -> int | None:
        lr = self.gpu_map.local_rank_of(gpu) if gpu is not None else None
        return self.rank_of.get(lr) if lr is not None else None


@dataclass(slots=True)
class Pending:
    """An incident whose recovery is under way: resolved at the next attempt's first step."""

    incident: Incident
    failed_at: float
    step_before: int | None  # the furthest step before the failure (for the work redone)
    suspect_nodes: tuple[str, ...] = ()  # peer nodes the next rendezvous may show gone (`peers`)
    suspect_ranks: tuple[int, ...] = ()  # their global ranks


@dataclass(slots=True)
class History:
    """What the supervisor remembers across attempts."""

    restarts_used: int = 0
    failures_in_a_row: int = 0  # failures without healthy progress in between (drives backoff)
    signatures: list[str | None] = field(default_factory=list)  # one per failed attempt
    fingerprints: list[str | None] = field(default_factory=list)  # one per failed attempt
    reported: set[tuple[Any, ...]] = field(default_factory=set)  # keys of troubles recorded once
    degraded_reported: bool = False
    numerics_incidents: dict[int, Incident] = field(default_factory=dict)  # step -> incident
    skipped_checkpoints: set[int] = field(default_factory=set)
    pending: list[Pending] = field(default_factory=list)
    injected: list[Injected] = field(default_factory=list)  # chaos drills fired
    recoveries: list[dict[str, Any]] = field(default_factory=list)
    world_sizes: list[int] = field(default_factory=list)  # per attempt
    nodes: list[dict[str, Any]] = field(default_factory=list)  # spares admitted, nodes replaced
    state: RunState = RunState.INIT
    exit: tuple[int, str] | None = None  # (exit code, reason) once the policy stopped the run

    @property
    def stopping(self) -> tuple[int, str] | None:
        return self.exit if self.state is RunState.STOPPED else None

    def stop(self, code: int, reason: str) -> None:
        self.state, self.exit = RunState.STOPPED, (code, reason)

    def policy_state(self, config: SupervisorConfig, gpus_in_use: int, fatal: bool) -> PolicyState:
        return PolicyState(
            max_restarts=config.recovery.max_restarts,
            restarts_used=self.restarts_used,
            failures_in_a_row=self.failures_in_a_row + (1 if fatal else 0),
            recent_signatures=tuple(self.signatures),
            crash_loop_after=config.recovery.crash_loop_after,
            recent_fingerprints=tuple(self.fingerprints),
            gpus_in_use=gpus_in_use,
            min_gpus=config.recovery.min_nproc,
            backoff_base_s=config.recovery.backoff_base_s,
            backoff_max_s=config.recovery.backoff_max_s,
        )

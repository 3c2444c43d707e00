"""supervisor: `trainguard run`, torchrun kept alive. Its room holds the loop and its decisions:
workers come to life through a `Launcher` (torch's elastic agent, or plain local processes), the
monitor loop watches them (exit codes, error files, heartbeats, logs, node health), asks its
policy (`supervisor.policy`) what to do, acts, and records incidents and the goodput ledger. With
``--replica-groups N`` the replica loop (`supervisor.replicas`) runs N such jobs as torchft
replica groups.

Importing this package does not import torch; the torch launcher's `launch` does. Nor does it
import the loop's machinery (the incident store, detection, the policy): `Supervisor`,
`RunEvent` and `RunResult` load on first use, so `trainguard run` reads its configuration and
starts its workers before it loads them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from trainguard.supervisor.config import (
    ExitCode,
    HealthConfig,
    LaunchConfig,
    RecordConfig,
    RecoveryConfig,
    StandbyConfig,
    SupervisorConfig,
    WatchConfig,
)

if TYPE_CHECKING:
    from trainguard.supervisor.result import RunEvent, RunResult
    from trainguard.supervisor.supervisor import Supervisor

__all__ = [
    "ExitCode",
    "HealthConfig",
    "LaunchConfig",
    "RecordConfig",
    "RecoveryConfig",
    "RunEvent",
    "RunResult",
    "StandbyConfig",
    "Supervisor",
    "SupervisorConfig",
    "WatchConfig",
]


def __getattr__(name: str) -> Any:
    if name == "Supervisor":
        from trainguard.supervisor import supervisor

        return supervisor.Supervisor
    if name in ("RunEvent", "RunResult"):
        from trainguard.supervisor import result

        return getattr(result, name)
    raise AttributeError(name)

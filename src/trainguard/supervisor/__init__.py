"""supervisor: `trainguard run`, torchrun kept alive. Launches workers through torch's elastic
agent and c10d rendezvous, watches them (exit codes, error files, heartbeats, logs, node health),
asks its policy (`supervisor.policy`) what to do, and records incidents and the goodput ledger.

Importing this package does not import torch; `Supervisor.run()` does.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from trainguard.supervisor.config import ExitCode, SupervisorConfig

if TYPE_CHECKING:
    from trainguard.supervisor.supervisor import RunEvent, RunResult, Supervisor

__all__ = ["ExitCode", "RunEvent", "RunResult", "Supervisor", "SupervisorConfig"]


def __getattr__(name: str) -> Any:
    if name in ("RunEvent", "RunResult", "Supervisor"):
        from trainguard.supervisor import supervisor

        return getattr(supervisor, name)
    raise AttributeError(name)

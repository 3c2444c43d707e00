"""The node agent: one per GPU node, installed by operators (``trainguard agent``).

Its loop reads like the supervisor's (``daemon.AgentDaemon.step``)::

    look    tick.Agent.tick: telemetry (NVML or a SimNode) + kernel-log lines -> a NodeVerdict
    judge   judge.onsets / incidents_for: which findings are new, the incidents they are (pure)
    record  the incident store, the counters, the snapshot the HTTP side serves
    act     the daemon's ``Act``, receiving the judged, recorded tick: remediation, which
            ``assemble.assemble`` (how ``trainguard agent`` builds the daemon) sets there

``node.open_node`` opens a node once (backend + kernel-log source + simulated node) for every
command; ``verdicts`` is how a supervisor on the same node reads the agent's verdict instead of
opening NVML a second time. The HTTP side (``serve``, ``server``, ``api``) and the Prometheus view
(``prometheus``) import their libraries; the loop itself imports neither.
"""

from __future__ import annotations

from trainguard.agent.assemble import assemble
from trainguard.agent.config import AgentConfig
from trainguard.agent.daemon import Act, AgentDaemon, Judged
from trainguard.agent.node import Node, open_node
from trainguard.agent.tick import Agent
from trainguard.agent.verdicts import AgentApiVerdicts, LocalVerdicts, VerdictSource

__all__ = [
    "Act",
    "Agent",
    "AgentApiVerdicts",
    "AgentConfig",
    "AgentDaemon",
    "Judged",
    "LocalVerdicts",
    "Node",
    "VerdictSource",
    "assemble",
    "open_node",
]

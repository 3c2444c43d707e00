"""``trainguard agent``: the always-on node agent (the loop, its state and its configuration).

The HTTP side lives in ``trainguard.web`` and the metrics in ``trainguard.export.prometheus``;
this package imports neither.
"""

from __future__ import annotations

from trainguard.agentd.config import AgentConfig
from trainguard.agentd.daemon import AgentDaemon

__all__ = ["AgentConfig", "AgentDaemon"]

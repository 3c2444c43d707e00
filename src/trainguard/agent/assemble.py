"""Where the node agent is put together: the daemon, and remediation as its act.

    daemon = assemble(config, thresholds)      # what `trainguard agent` serves (agent/serve.py)

The daemon (agent/daemon.py) is the loop; what happens to a judged, recorded tick is its `Act`.
Remediation (trainguard.remediate) is that act. It acts through the daemon's own store, fleet
writer and node, and tells the daemon's agent which GPUs it reset, so it is built here from the
daemon and set as its act, the one way in. ``assemble(config, act=...)`` puts another act in its
place (tests, a drill)::

    >>> import tempfile
    >>> from trainguard.agent import AgentConfig
    >>> d = tempfile.mkdtemp()
    >>> daemon = assemble(AgentConfig(backend="sim", gpus=2, db=f"{d}/tg.db", state_dir=d))
    >>> remediation_of(daemon).enforcing
    False
    >>> daemon.close()

The readers (the API's remediation routes, /metrics) find the remediation with `remediation_of`;
a daemon with another act has none, and they say so.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from trainguard.agent.daemon import Act, AgentDaemon, Judged
from trainguard.remediate.hook import AgentRemediation

if TYPE_CHECKING:
    from trainguard.agent.config import AgentConfig
    from trainguard.detect.thresholds import Thresholds

__all__ = ["RemediationAct", "assemble", "remediation_of"]


class RemediationAct:
    """The daemon's act when remediation runs: each tick's new findings go to its worker, and
    the GPUs it reset since the last tick are told to the agent (on the tick's own thread).
    Each tick also reads the breaker file for the readers (waiting at most the view's timeout,
    and not at all while a read hangs); a file that hangs or cannot be read is a problem of the
    agent's (degraded), ``problems()``."""

    def __init__(self, remediation: AgentRemediation) -> None:
        self.remediation = remediation

    def __call__(self, judged: Judged) -> None:
        self.remediation.step(list(judged.new), judged.time)
        self.remediation.breaker_view.read()

    def problems(self) -> list[str]:
        problem = self.remediation.breaker_view.problem()
        return [problem] if problem else []

    def close(self) -> None:
        self.remediation.close()


def assemble(
    config: AgentConfig, thresholds: Thresholds | None = None, *, act: Act | None = None, **kw: Any
) -> AgentDaemon:
    """The daemon with its act: ``act``, or remediation as ``config`` sets it (``policy``,
    ``enforce``: a dry run by default). ``kw`` goes to `AgentDaemon` (clock, backend, store)."""
    if act is not None:
        return AgentDaemon(config, thresholds, act=act, **kw)
    daemon = AgentDaemon(config, thresholds, **kw)
    try:
        daemon.act = RemediationAct(
            AgentRemediation(
                node=daemon.hostname, state_dir=daemon.state_dir, store=daemon.store,
                backend=daemon.node.backend, policy_path=config.policy, enforce=config.enforce,
                sim=daemon.sim, on_reset=daemon.agent.gpu_was_reset, clock=daemon.clock.time,
                fleet_writer=daemon.fleet_writer,
            )
        )  # fmt: skip
    except BaseException:  # a policy that does not load: nothing of the node stays open
        daemon.close()
        raise
    return daemon


def remediation_of(daemon: AgentDaemon) -> AgentRemediation | None:
    """The daemon's remediation (its act), or None when its act is something else."""
    act = daemon.act
    return act.remediation if isinstance(act, RemediationAct) else None

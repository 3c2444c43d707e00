"""A simulated scheduler: the node provider of demos, drills and tests (no Slurm, no cluster).

It keeps each node's state as a real scheduler would (idle, drained with a reason, reboot
requested, cordoned), is idempotent in the same way, and can be told to fail or time out the next
calls, so the executor's retry and never-blindly-retry paths are exercised::

    >>> s = SimScheduler(["n1"])
    >>> s.apply("drain", Target("n1", reason="trainguard: xid")).status.value
    'done'
    >>> s.apply("drain", Target("n1", reason="trainguard: xid")).status.value
    'already'
"""

from __future__ import annotations

from dataclasses import dataclass, field

from trainguard.remediate.providers import Outcome, Status, Target

__all__ = ["SimScheduler"]


@dataclass
class _Node:
    state: str = "idle"  # idle | drained | reboot_requested | cordoned
    reason: str = ""


@dataclass
class SimScheduler:
    nodes: list[str]
    name: str = "sim"
    failures: list[Status] = field(default_factory=list)  # the next calls end like this, in order
    applied_after_timeout: bool = True  # an AMBIGUOUS call still took effect (as a slow RPC does)
    calls: list[tuple[str, str]] = field(default_factory=list)
    _state: dict[str, _Node] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self._state = {n: _Node() for n in self.nodes}

    def state(self, node: str) -> tuple[str, str]:
        st = self._state[node]
        return st.state, st.reason

    def apply(self, remedy: str, target: Target) -> Outcome:
        self.calls.append((remedy, target.node))
        st = self._state.get(target.node)
        if st is None:
            return Outcome(Status.FAILED, f"no such node {target.node}")
        want = {"drain": "drained", "cordon": "cordoned", "hardware_inspection": "drained",
                "reboot_node": "reboot_requested", "resume": "idle"}.get(remedy)  # fmt: skip
        if want is None:
            return Outcome(Status.FAILED, f"the scheduler cannot {remedy}")
        if st.state == want:
            return Outcome(Status.ALREADY, f"already {want}")
        if self.failures:
            status = self.failures.pop(0)
            if status is Status.AMBIGUOUS and self.applied_after_timeout:
                st.state, st.reason = want, target.reason
            return Outcome(status, "simulated " + status.value, retry=status is Status.FAILED)
        st.state, st.reason = want, target.reason if want != "idle" else ""
        return Outcome(Status.DONE, f"{target.node} {want}")

    def verify(self, remedy: str, target: Target) -> bool | None:
        st = self._state.get(target.node)
        if st is None:
            return None
        want = {"drain": "drained", "cordon": "cordoned", "hardware_inspection": "drained",
                "reboot_node": "reboot_requested", "resume": "idle"}.get(remedy)  # fmt: skip
        return st.state == want

"""Where an MPI job's next attempt runs: its hosts, their slots and GPUs, and ``-np`` (pure).

The MPI launchers (`supervisor.mpirun`) call `plan_hosts` before every start with what the user
asked for (``--host``/``--hostfile`` entries and ``-np``), the fleet's view of each host
(`incidents.hosts.NodeState`, as ``trainguard hosts`` judges it), the nodes an earlier attempt
lost, and the GPUs the monitor loop still uses on this node::

    >>> from trainguard.incidents.hosts import NodeState
    >>> p = plan_hosts([("here", 2), ("n2", 2)], 4, {"n2": NodeState("n2", gpus=2, failed_gpus=(1,))},
    ...                {}, (0, 1), is_here=lambda h: h == "here", now=0.0)
    >>> p.np, p.hostfile(), p.host_gpus
    (3, 'here slots=2\\nn2 slots=1\\n', {'n2': (0,)})
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from trainguard.incidents.hosts import Host, NodeState, choose

__all__ = ["HostPlan", "plan_hosts"]


@dataclass(frozen=True, slots=True)
class HostPlan:
    hosts: tuple[Host, ...]  # usable, in the user's order
    np: int  # ranks to start: the user's -np, cut to the slots left
    left_out: dict[str, str] = field(default_factory=dict)  # host -> why
    host_gpus: dict[str, tuple[int, ...]] = field(default_factory=dict)  # hosts whose GPUs differ

    def hostfile(self) -> str:
        return "".join(f"{h.name} slots={h.slots}\n" for h in self.hosts)


def plan_hosts(
    wanted: Sequence[tuple[str, int | None]],
    np: int | None,
    states: Mapping[str, NodeState],
    lost: Mapping[str, str],
    gpus_here: tuple[int, ...],
    *,
    is_here: Callable[[str], bool],
    now: float,
    default_slots: int = 1,
) -> HostPlan:
    """The hosts of the next start: ``wanted`` less the hosts ``states`` and ``lost`` rule out;
    this node's slots at most its GPUs in use, another's at most its healthy GPUs."""
    usable: list[Host] = []
    left_out: dict[str, str] = {}
    host_gpus: dict[str, tuple[int, ...]] = {}
    for host in choose(states, wanted, now, default_slots=default_slots):
        why = lost.get(host.name) or host.left_out
        if why:
            left_out[host.name] = why
            continue
        slots = host.slots
        if is_here(host.name):
            slots = min(slots, len(gpus_here)) if gpus_here else slots
        else:
            st = states.get(host.name)
            if st is not None and st.failed_gpus and st.gpus > 0:
                host_gpus[host.name] = tuple(g for g in range(st.gpus) if g not in st.failed_gpus)
        if slots <= 0:
            left_out[host.name] = "no GPU left in use on it"
            continue
        usable.append(Host(host.name, slots))
    total = sum(h.slots for h in usable)
    return HostPlan(tuple(usable), min(np, total) if np is not None else total, left_out, host_gpus)

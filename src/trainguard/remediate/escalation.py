"""Escalation (pure): a node or GPU remediated too often goes to hardware inspection, and a rack
with at least half its nodes bad is one rack incident rather than many node incidents.

    >>> lim = EscalationLimits(max_remediations=2, window_s=3600)
    >>> s = EscalationState()
    >>> s = remember(s, "n1", 3, "reset_gpu", now=0.0, xid=48)
    >>> needs_inspection(s, lim, "n1", 3, xid=48, now=10.0)
    False
    >>> s = remember(s, "n1", 3, "reset_gpu", now=20.0, xid=48)
    >>> needs_inspection(s, lim, "n1", 3, xid=48, now=30.0)
    True

A node (or GPU) in inspection is never resumed automatically; ``set_healthy`` (a person, through
``trainguard agent set-healthy``) takes it out.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from trainguard.remediate.jsonfile import JsonFile
from trainguard.remediate.policy import EscalationLimits

__all__ = [
    "EscalationFile",
    "EscalationState",
    "in_inspection",
    "needs_inspection",
    "rack_incidents",
    "remember",
    "set_healthy",
    "xid_of",
]


@dataclass(frozen=True, slots=True)
class Remediated:
    time: float
    node: str
    gpu: int | None
    remedy: str
    xid: int | None = None


@dataclass(frozen=True, slots=True)
class EscalationState:
    history: tuple[Remediated, ...] = ()
    inspection: tuple[tuple[str, int | None, str], ...] = ()  # (node, gpu or None, why)

    def to_dict(self) -> dict[str, Any]:
        return {
            "history": [[r.time, r.node, r.gpu, r.remedy, r.xid] for r in self.history],
            "inspection": [list(i) for i in self.inspection],
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> EscalationState:
        return cls(
            tuple(Remediated(float(t), str(n), g, str(r), x) for t, n, g, r, x in d.get("history", [])),
            tuple((str(n), g, str(w)) for n, g, w in d.get("inspection", [])),
        )


def xid_of(text: str) -> int | None:
    """The Xid a finding's reason names ("Xid 79 on GPU 3"), if any."""
    m = re.search(r"\bXid\D{0,20}?(\d+)", text)
    return int(m.group(1)) if m else None


def remember(
    state: EscalationState,
    node: str,
    gpu: int | None,
    remedy: str,
    now: float,
    xid: int | None = None,
    keep_s: float = 30 * 86400,
) -> EscalationState:
    history = tuple(r for r in state.history if now - r.time < keep_s)
    return replace(state, history=(*history, Remediated(now, node, gpu, remedy, xid)))


def needs_inspection(
    state: EscalationState, limits: EscalationLimits, node: str, gpu: int | None, xid: int | None, now: float
) -> bool:
    """Whether this node (or GPU) has been remediated its limit of times in the window."""
    limit = limits.per_xid.get(xid, limits.max_remediations) if xid is not None else limits.max_remediations
    if limit <= 0:
        return False
    same = [
        r
        for r in state.history
        if r.node == node and now - r.time < limits.window_s and (gpu is None or r.gpu == gpu)
        and (xid is None or xid not in limits.per_xid or r.xid == xid)
    ]  # fmt: skip
    return len(same) >= limit


def in_inspection(state: EscalationState, node: str, gpu: int | None = None) -> str | None:
    """Why the node (or that GPU of it) is in inspection; None when it is not."""
    for n, g, why in state.inspection:
        if n == node and (g is None or g == gpu):
            return why
    return None


def node_in_inspection(state: EscalationState, node: str) -> str | None:
    """Why the node, or any GPU of it, is in inspection; None when none is (what resuming the
    whole node must respect: a GPU out for a person keeps its node out)."""
    for n, g, why in state.inspection:
        if n == node:
            return why if g is None else f"GPU {g}: {why}"
    return None


def set_healthy(state: EscalationState, node: str, gpu: int | None = None) -> EscalationState:
    """A person clears the node (every GPU when ``gpu`` is None) and its remediation count."""

    def cleared(n: str, g: int | None) -> bool:
        return n == node and (gpu is None or g == gpu)

    return EscalationState(
        tuple(r for r in state.history if not cleared(r.node, r.gpu)),
        tuple(i for i in state.inspection if not cleared(i[0], i[1])),
    )


def rack_incidents(bad_nodes: Iterable[str], racks: Mapping[str, str]) -> dict[str, list[str]]:
    """Racks with at least half their nodes bad -> those bad nodes (one incident per rack)."""
    members: dict[str, list[str]] = {}
    for node, rack in racks.items():
        members.setdefault(rack, []).append(node)
    bad = set(bad_nodes)
    out = {}
    for rack, nodes in sorted(members.items()):
        hit = sorted(n for n in nodes if n in bad)
        if hit and 2 * len(hit) >= len(nodes):
            out[rack] = hit
    return out


class EscalationFile(JsonFile[EscalationState]):
    def __init__(self, path: str | os.PathLike[str]) -> None:
        super().__init__(path, EscalationState.from_dict, EscalationState.to_dict, EscalationState)

"""Verdict sources: where a loop gets the node's verdict without opening the node a second time.

A supervisor on a node where ``trainguard agent`` runs reads the agent's verdict from its API
(``AgentApiVerdicts``: one NVML reader and one kernel-log reader per node); where none serves, it
ticks its own agent in-process (``LocalVerdicts``). ``verdict_from_json`` reads what the agent's
``/api/v1/verdict`` returns (``verdict_to_json``)::

    >>> from trainguard.actions import Advice
    >>> from trainguard.records import Gpu, GpuVerdict, Health, NodeVerdict
    >>> v = NodeVerdict(Health.OK, Advice.NONE, (GpuVerdict(Gpu(0, "GPU-1"), Health.OK, Advice.NONE),))
    >>> verdict_from_json(verdict_to_json(v)) == v
    True
"""

from __future__ import annotations

import json
import logging
import urllib.error
import urllib.request
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from trainguard.actions import Advice
from trainguard.detect.verdict import finding_to_dict
from trainguard.errors import InputError
from trainguard.records import Category, Finding, Gpu, GpuVerdict, Health, NodeVerdict

if TYPE_CHECKING:
    from trainguard.agent.tick import Agent

log = logging.getLogger(__name__)

__all__ = ["AgentApiVerdicts", "LocalVerdicts", "VerdictSource", "verdict_from_json", "verdict_to_json"]


@runtime_checkable
class VerdictSource(Protocol):
    """The node's current verdict; None when there is none to give (never raises)."""

    def verdict(self) -> NodeVerdict | None: ...

    def close(self) -> None: ...


class LocalVerdicts:
    """Ticks an in-process ``Agent`` on each call (the node is read now)."""

    def __init__(self, agent: Agent) -> None:
        self.agent = agent

    def verdict(self) -> NodeVerdict | None:
        try:
            return self.agent.tick()
        except Exception:
            log.debug("node agent tick failed", exc_info=True)
            return None

    def close(self) -> None:
        self.agent.close()


class AgentApiVerdicts:
    """The verdict the running node agent published at ``url`` (its last tick).

    ``probe()`` says whether an agent answers there with this token; ``verdict()`` returns None
    while it does not (the caller then decides whether to read the node itself).
    """

    def __init__(self, url: str, token: str, *, timeout_s: float = 2.0, tls_ca: str | None = None) -> None:
        self.url = url.rstrip("/") + "/api/v1/verdict"
        self._headers = {"Authorization": f"Bearer {token}", "Accept": "application/json"}
        self.timeout_s = timeout_s
        self._context = None
        if self.url.startswith("https:"):
            import ssl

            self._context = ssl.create_default_context(cafile=tls_ca)
        self.seq = -1  # the agent's tick number of the last verdict read

    @classmethod
    def from_token_file(cls, url: str, token_file: str | Path, **kw: Any) -> AgentApiVerdicts:
        try:
            token = Path(token_file).read_text(encoding="utf-8").strip()
        except OSError as exc:
            raise InputError(
                f"cannot read the agent's token file {token_file}: {exc.strerror or exc}"
            ) from None
        return cls(url, token, **kw)

    def verdict(self) -> NodeVerdict | None:
        req = urllib.request.Request(self.url, headers=self._headers)
        try:
            with urllib.request.urlopen(req, timeout=self.timeout_s, context=self._context) as resp:
                body = json.loads(resp.read(4 << 20))
        except (OSError, urllib.error.URLError, ValueError) as exc:
            log.debug("agent at %s gave no verdict: %s", self.url, exc)
            return None
        try:
            self.seq = int(body.get("seq", -1))
            return verdict_from_json(body["verdict"]) if body.get("verdict") else None
        except (KeyError, TypeError, ValueError) as exc:
            log.warning("agent at %s answered an unreadable verdict: %s", self.url, exc)
            return None

    def probe(self) -> bool:
        return self.verdict() is not None

    def close(self) -> None:
        """Nothing held between calls."""


def verdict_to_json(v: NodeVerdict) -> dict[str, Any]:
    return {
        "health": v.health.value,
        "action": v.action.value,
        "findings": [finding_to_dict(f, evidence=True) for f in v.findings],
        "gpus": [
            {
                "gpu": asdict(g.gpu),
                "health": g.health.value,
                "action": g.action.value,
                "findings": [finding_to_dict(f, evidence=True) for f in g.findings],
            }
            for g in v.gpus
        ],
    }


def verdict_from_json(d: dict[str, Any]) -> NodeVerdict:
    """Raises KeyError/ValueError/TypeError on a malformed verdict."""
    gpus = tuple(
        GpuVerdict(
            Gpu(**g["gpu"]),
            Health(g["health"]),
            Advice(g["action"]),
            tuple(_finding(f) for f in g["findings"]),
        )
        for g in d["gpus"]
    )
    return NodeVerdict(
        Health(d["health"]), Advice(d["action"]), gpus, tuple(_finding(f) for f in d["findings"])
    )


def _finding(f: dict[str, Any]) -> Finding:
    return Finding(
        str(f["rule"]),
        Health(f["health"]),
        Advice(f["action"]),
        str(f["reason"]),
        gpu=None if f["gpu"] is None else int(f["gpu"]),
        time=None if f["time"] is None else float(f["time"]),
        category=None if f["category"] is None else Category(f["category"]),
        evidence=tuple(str(e) for e in f["evidence"]),
    )

"""Providers carry out one remedy each: Slurm, Kubernetes, GPU reset, webhook.

Every provider is idempotent (asking twice does what asking once did: it reads the current state
first) and says how a call ended as an ``Outcome``: ``done``, ``already`` (nothing to do),
``failed`` (a definite no: retrying may help when ``retry`` is set) or ``ambiguous`` (it may or may
not have happened: a timeout). ``with_retry`` retries failures with backoff and never repeats an
ambiguous call blindly: it asks the provider's ``verify`` what state the target is in first.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from typing import Protocol

log = logging.getLogger(__name__)

__all__ = ["Outcome", "Provider", "Status", "Target", "with_retry"]


class Status(str, Enum):
    DONE = "done"
    ALREADY = "already"
    FAILED = "failed"
    AMBIGUOUS = "ambiguous"


@dataclass(frozen=True, slots=True)
class Outcome:
    status: Status
    detail: str = ""
    retry: bool = False  # a FAILED call that may succeed later (a 503, a busy controller)

    @property
    def ok(self) -> bool:
        return self.status in (Status.DONE, Status.ALREADY)


@dataclass(frozen=True, slots=True)
class Target:
    node: str
    gpu: int | None = None
    reason: str = ""  # human-readable, e.g. "trainguard: xid GPU 3 inc 12"
    payload: dict[str, object] | None = None  # the incident, for webhooks and events


class Provider(Protocol):
    name: str

    def apply(self, remedy: str, target: Target) -> Outcome: ...

    def verify(self, remedy: str, target: Target) -> bool | None:
        """Whether ``remedy`` is in effect on the target (None: cannot tell)."""
        ...


def with_retry(
    provider: Provider,
    remedy: str,
    target: Target,
    *,
    attempts: int = 4,
    backoff_s: float = 1.0,
    sleep: Callable[[float], None],
) -> tuple[Outcome, int]:
    """(the final outcome, how many calls were made)."""
    outcome = Outcome(Status.FAILED, "not tried")
    for n in range(1, attempts + 1):
        outcome = provider.apply(remedy, target)
        if outcome.status is Status.AMBIGUOUS:
            seen = provider.verify(remedy, target)
            if seen is True:
                return Outcome(Status.DONE, f"{outcome.detail}; verified in effect"), n
            if seen is None:  # cannot tell: repeating could do it twice
                return outcome, n
            outcome = Outcome(Status.FAILED, f"{outcome.detail}; verified not in effect", retry=True)
        if outcome.ok or not outcome.retry:
            return outcome, n
        if n < attempts:
            log.info(
                "%s %s on %s failed (%s): retry %d", provider.name, remedy, target.node, outcome.detail, n
            )
            sleep(backoff_s * 2 ** (n - 1))
    return outcome, attempts

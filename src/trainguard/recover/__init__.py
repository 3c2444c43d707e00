"""recover: the last stage of the spine. `policy` decides what to do about a failure (pure);
the supervisor (`trainguard.supervisor`) carries the decision out."""

from __future__ import annotations

from trainguard.recover.policy import (
    Decision,
    PolicyState,
    Trouble,
    TroubleKind,
    Verb,
    backoff_s,
    decide,
    error_signature,
    with_diagnosis,
)

__all__ = [
    "Decision",
    "PolicyState",
    "Trouble",
    "TroubleKind",
    "Verb",
    "backoff_s",
    "decide",
    "error_signature",
    "with_diagnosis",
]

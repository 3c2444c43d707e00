"""Putting a node back: only after a passing diagnostic, and never out of hardware inspection.

    trainguard remediate resume --node gpu-a17            # runs `trainguard diagnose`, then resumes

A node that escalated to hardware inspection stays out until a person clears it
(``trainguard agent set-healthy``); a diagnostic that fails or cannot run leaves it drained.
"""

from __future__ import annotations

import logging
import subprocess
from collections.abc import Sequence

from trainguard.remediate.escalation import EscalationState, node_in_inspection
from trainguard.remediate.providers import Outcome, Provider, Status, Target, with_retry

log = logging.getLogger(__name__)

__all__ = ["diagnose_passes", "resume_node"]


def diagnose_passes(command: Sequence[str], timeout_s: float = 1800.0) -> tuple[bool, str]:
    """Run a diagnostic command (``trainguard diagnose ...``): (passed, what it said)."""
    try:
        r = subprocess.run(list(command), capture_output=True, text=True, timeout=timeout_s, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return False, f"diagnostic could not run: {exc}"
    tail = (r.stdout.strip().splitlines() or [""])[-1][:200]
    return r.returncode == 0, f"{' '.join(command)} exited {r.returncode}: {tail}"


def resume_node(
    provider: Provider,
    node: str,
    *,
    passed: bool,
    evidence: str,
    escalation: EscalationState | None = None,
) -> Outcome:
    """Resume ``node`` when its diagnostic ``passed`` and neither it nor any GPU of it is in
    hardware inspection."""
    why = node_in_inspection(escalation, node) if escalation is not None else None
    if why is not None:
        return Outcome(Status.FAILED, f"{node} is in hardware inspection ({why}): a person clears it with "
                       "`trainguard agent set-healthy`")  # fmt: skip
    if not passed:
        return Outcome(Status.FAILED, f"not resumed: {evidence}")
    outcome, _ = with_retry(provider, "resume", Target(node), sleep=_sleep)
    return outcome


def _sleep(s: float) -> None:
    import time

    time.sleep(s)

"""The trainer's load balancing, as the supervisor sees it (pure).

The ranks of a job that balances (``Guard(..., balance=True)``, docs/balance.md) agree among
themselves when to move their shares; rank 0 writes each move to the run directory as a finding:
``balance.on`` when balancing starts, then ``balance.rebalance``, ``balance.restore`` and
``balance.exclude``, each with its evidence (the rank, its GPU, every rank's measured speed, the
shares). Each move becomes a `Trouble` here: the policy records it (an incident with the evidence,
action ``rebalance`` / ``restore_shares``) or, for an exclusion, restarts without the GPU.

A GPU that telemetry finds only slow (clocks stuck low, thermal or power slowdown: no error, no
lost data) in a job that balances is left to the balancing first: its share follows its speed,
and it is excluded when the trainer's ladder finds keeping it costs more than dropping it.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from trainguard.actions import Advice
from trainguard.incidents import RootCause, suspects
from trainguard.records import Finding, Health
from trainguard.supervisor.policy import Trouble, TroubleKind

if TYPE_CHECKING:
    from trainguard.supervisor.attempt import Attempt, History
    from trainguard.supervisor.observe import Observation

__all__ = ["balance_trouble", "balancing", "only_slow"]

PREFIX = "balance."
# Sample rules that say a GPU computes slower, and nothing worse (detect/rules.py)
SLOW_RULES = frozenset({"straggler", "thermal", "power_brake", "hw_slowdown"})


def balancing(obs: Observation) -> bool:
    """The ranks of this attempt balance their shares (the Guard announced it)."""
    return any(f.rule.startswith(PREFIX) for _, _, _, f in obs.findings)


def only_slow(findings: tuple[Finding, ...] | list[Finding]) -> bool:
    """Every finding says the GPU is slow (degraded, diagnostics advised), none that it is failing."""
    return bool(findings) and all(
        f.rule in SLOW_RULES and f.health is Health.DEGRADED and f.action is Advice.RUN_DIAGNOSTICS
        for f in findings
    )


def balance_trouble(obs: Observation, attempt: Attempt, history: History) -> Trouble | None:
    """The earliest balancing move not recorded yet, as a trouble (None: none new)."""
    for key, _rank, _step, f in obs.findings:
        if key in history.reported or not f.rule.startswith(PREFIX) or f.rule == "balance.on":
            continue
        move = _evidence(f)
        verb = str(move.get("verb", f.rule.removeprefix(PREFIX)))
        rank = move.get("rank")
        rank = rank if isinstance(rank, int) else None
        gpu = f.gpu if f.gpu is not None else attempt.gpu_of_rank(rank) if rank is not None else None
        speeds = move.get("speeds") or []
        evidence = [f"measured speeds (samples/s of each rank's own compute): {speeds}"]
        evidence.append(
            f"shares {move.get('old_shares')} -> {move.get('shares')} from global batch {move.get('first_batch')}"
        )
        figures = {
            k: move[k] for k in ("idle_before", "idle_after", "x_keep", "x_drop", "slow_for_s") if k in move
        }
        if figures:
            evidence.append(", ".join(f"{k} {v}" for k, v in figures.items()))
        cause = RootCause.UNKNOWN
        if rank is not None:
            evidence.append(
                suspects(
                    (
                        RootCause.FAULTY_GPU,
                        f"rank {rank}'s device computes slower per sample than its peers'",
                    ),
                    (RootCause.GPU_THERMAL, "a power or thermal clock limit, which no health rule flags"),
                )
            )
        return Trouble(
            kind=TroubleKind.STRAGGLER,
            gpu=gpu,
            gpu_health=obs.gpu_health.get(gpu) if gpu is not None else None,
            fatal=False,
            detected_by="balance",
            time=obs.time,
            started=f.time or obs.time,
            summary=f.reason[:300],
            root_cause=cause,
            rank=rank,
            ranks=(rank,) if rank is not None else (),
            gpus=(gpu,) if gpu is not None else (),
            evidence=tuple(evidence),
            # the move is stored whole in the incident's evidence: the report and its plot read it
            extra={
                "key": key,
                "balance": {**move, "verb": verb},
                "report": {"balance": {**move, "verb": verb}},
            },
        )
    return None


def _evidence(f: Finding) -> dict[str, Any]:
    for item in f.evidence:
        try:
            value = json.loads(item)
        except (TypeError, ValueError):
            continue
        if isinstance(value, dict):
            return value
    return {}

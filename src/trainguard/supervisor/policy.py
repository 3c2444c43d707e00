"""The supervisor's recovery policy: given one trouble and the run's history, what to do next.

The judge step of the monitor loop (`supervisor.supervisor`), pure and small on purpose: the
loop gathers the evidence (`observe`, `assess`), this module decides, the loop acts. Read
`decide` top to bottom; the first rule that matches wins::

    stopped by a crash loop?      the same application error N times in a row -> STOP_CRASH_LOOP
                                  (the same failure before any step, as evidence: twice)
    a GPU we use is FAILED?       -> EXCLUDE_GPU (continue on fewer; not a retry)
                                     or STOP_NO_CAPACITY when nothing would be left
    hardware-looking but unproven (CUDA ECC / launch failure text, degraded GPU, app Xid burst,
    a NaN one GPU produced)?
                                  -> DIAGNOSE the suspect GPU first (then the supervisor calls
                                     `decide` again with the diagnosis filled in)
    the ranks moved their shares (a slow GPU, docs/balance.md)?  -> REBALANCE / RESTORE_SHARES
                                     recorded; EXCLUDE_GPU when they found it costs more than it adds
    a GPU only slow (clocks, thermal) in a job that balances?  -> CONTINUE (balancing answers first)
    only a warning (straggler, degraded GPU, NaN the trainer handled)?  -> CONTINUE; on a GPU
                                     that works but is degraded, also a checkpoint now (so a
                                     failure that follows loses little)
    a peer node left or joined?   -> RESTART, not counted as a retry (membership change)
    otherwise                     -> RESTART with exponential backoff, if budget is left,
                                     else STOP_BUDGET

    >>> t = Trouble(kind=TroubleKind.PROCESS_EXIT, signature="ValueError: bad batch @ train.py:step")
    >>> decide(t, PolicyState(max_restarts=3)).verb.value
    'restart'
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from enum import Enum
from typing import Any

from trainguard.actions import JobAction
from trainguard.incidents.taxonomy import RootCause
from trainguard.records import HARDWARE_CATEGORIES, Health


class TroubleKind(str, Enum):
    PROCESS_EXIT = "process_exit"  # a worker exited non-zero or was killed by a signal
    HANG = "hang"  # no rank made progress within the learned timeout
    GPU_FAILED = "gpu_failed"  # the node agent says a GPU we use is FAILED
    GPU_DEGRADED = "gpu_degraded"  # ... is DEGRADED (thermal, straggler clocks, app Xid burst)
    NUMERICS = "numerics"  # NaN/Inf or a loss spike reported by the trainer
    STRAGGLER = "straggler"  # steps much slower than this run's baseline
    MEMBERSHIP = "membership"  # a node joined or left the rendezvous


@dataclass(frozen=True, slots=True, kw_only=True)
class Trouble:
    """One problem the supervisor assessed: what the policy decides on and the incident records.

    The first block is what `decide` reads; the second is the record of how it was seen.
    """

    kind: TroubleKind
    signature: str | None = None  # normalised application error (see `error_signature`)
    fingerprint: str | None = None  # a failure before any step, as evidence (`supervisor.fingerprint`)
    category: str | None = None  # records.Category value of the root-cause evidence
    gpu: int | None = None  # suspect physical GPU index on this node
    gpu_health: Health | None = None  # the agent's verdict for that GPU
    diagnosis: Health | None = None  # result of diagnostics, once run
    fatal: bool = True  # False: the workers are still running (a warning)

    detected_by: str = ""  # exit_code | error_file | kernel_log | heartbeat | numerics | telemetry ...
    time: float = 0.0  # when the supervisor detected it
    started: float = 0.0  # earliest evidence
    summary: str = ""
    root_cause: RootCause = RootCause.UNKNOWN
    rank: int | None = None  # the global rank it started on
    ranks: tuple[int, ...] = ()  # every rank that produced it (rank is the first), when several
    gpus: tuple[int, ...] = ()  # their GPUs
    evidence: tuple[str, ...] = ()
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class PolicyState:
    """The run's history and limits, as the policy sees them."""

    max_restarts: int = 3  # restart budget (membership changes and exclusions are free)
    restarts_used: int = 0
    failures_in_a_row: int = 0  # failures without healthy progress in between (drives backoff)
    recent_signatures: tuple[str | None, ...] = ()  # newest last, one per failed attempt
    crash_loop_after: int = 3  # same application error this many times in a row -> stop
    recent_fingerprints: tuple[str | None, ...] = ()  # newest last, one per failed attempt
    startup_loop_after: int = 2  # the same failure before any step this many times in a row -> stop
    gpus_in_use: int = 1  # local GPUs (or worker slots) still in use on this node
    min_gpus: int = 1  # fewest local workers worth continuing with
    backoff_base_s: float = 1.0
    backoff_max_s: float = 60.0


@dataclass(frozen=True, slots=True)
class JobDecision:
    verb: JobAction
    reason: str
    counts_as_retry: bool = False
    backoff_s: float = 0.0
    gpu: int | None = None
    checkpoint: bool = False  # ask the ranks for a checkpoint now (the control file)
    extra: dict[str, object] = field(default_factory=dict)


def decide(trouble: Trouble, state: PolicyState) -> JobDecision:
    """The one decision for one trouble (see the module docstring for the rule order)."""
    if trouble.kind is TroubleKind.PROCESS_EXIT and trouble.signature and _is_crash_loop(trouble, state):
        n = state.crash_loop_after
        return JobDecision(
            JobAction.STOP_CRASH_LOOP, f"the same error {n} times in a row: {trouble.signature}"
        )
    if trouble.kind is TroubleKind.PROCESS_EXIT and trouble.fingerprint and _is_startup_loop(trouble, state):
        n = min(state.startup_loop_after, state.crash_loop_after)
        return JobDecision(
            JobAction.STOP_CRASH_LOOP,
            f"the same failure before any step {n} times in a row: {trouble.fingerprint}",
        )

    gpu_dead = trouble.gpu_health is Health.FAILED or trouble.diagnosis is Health.FAILED
    if trouble.gpu is not None and gpu_dead:
        if state.gpus_in_use - 1 < state.min_gpus:
            return JobDecision(
                JobAction.STOP_NO_CAPACITY, f"GPU {trouble.gpu} failed and no GPU is left to continue on"
            )
        return JobDecision(
            JobAction.EXCLUDE_GPU, f"GPU {trouble.gpu} failed: continue without it", gpu=trouble.gpu
        )

    move = trouble.extra.get("balance")
    if isinstance(move, dict):
        return _balanced(trouble, move, state)
    if trouble.extra.get("balancing"):
        return JobDecision(
            JobAction.CONTINUE,
            f"GPU {trouble.gpu} is slow, not failing, in a job that balances: its share follows its speed; "
            "it is excluded if keeping it costs more than dropping it",
        )

    if trouble.gpu is not None and trouble.diagnosis is None and _looks_like_hardware(trouble):
        return JobDecision(
            JobAction.DIAGNOSE, f"evidence points at GPU {trouble.gpu} but is not conclusive", gpu=trouble.gpu
        )

    if not trouble.fatal:
        degraded = Health.DEGRADED in (trouble.gpu_health, trouble.diagnosis)
        at_risk = trouble.gpu is not None and (trouble.kind is TroubleKind.GPU_DEGRADED or degraded)
        reason = f"{trouble.kind.value}: workers still running, recorded"
        if at_risk:
            reason += f"; GPU {trouble.gpu} is degraded: checkpoint now"
        return JobDecision(JobAction.CONTINUE, reason, checkpoint=at_risk)

    if trouble.kind is TroubleKind.MEMBERSHIP:
        return JobDecision(JobAction.RESTART, "membership changed: re-form the group (not a retry)")

    if state.restarts_used >= state.max_restarts:
        return JobDecision(JobAction.STOP_BUDGET, f"restart budget of {state.max_restarts} used up")
    reason = f"{trouble.kind.value}: restart from the newest valid checkpoint"
    if trouble.diagnosis is Health.OK:
        reason = f"GPU {trouble.gpu} passed diagnostics; " + reason
    return JobDecision(JobAction.RESTART, reason, counts_as_retry=True, backoff_s=backoff_s(state))


def _balanced(trouble: Trouble, move: dict[str, Any], state: PolicyState) -> JobDecision:
    """The ranks' own balancing move (``supervisor.balance``): recorded, or an exclusion acted on."""
    verb = move.get("verb")
    if verb == "exclude":
        if trouble.gpu is None:
            return JobDecision(
                JobAction.CONTINUE, "the ranks would exclude a rank whose GPU is not known: kept"
            )
        if state.gpus_in_use - 1 < state.min_gpus:
            return JobDecision(
                JobAction.CONTINUE, f"keeping GPU {trouble.gpu}: no GPU would be left without it"
            )
        why = f"GPU {trouble.gpu} costs the job more than dropping it: restart without it (not a retry)"
        return JobDecision(JobAction.EXCLUDE_GPU, why, gpu=trouble.gpu)
    if verb == "restore":
        return JobDecision(JobAction.RESTORE_SHARES, "the ranks' speeds are even again: uniform shares")
    return JobDecision(
        JobAction.REBALANCE, "a rank computes slower than its peers: shares follow measured speed"
    )


def backoff_s(state: PolicyState) -> float:
    """Retry at once after the first failure, then back off exponentially up to the cap."""
    n = state.failures_in_a_row
    if n <= 1:
        return 0.0
    return float(min(state.backoff_max_s, state.backoff_base_s * 2 ** (n - 2)))


def _is_crash_loop(trouble: Trouble, state: PolicyState) -> bool:
    history = (*state.recent_signatures, trouble.signature)
    tail = history[-state.crash_loop_after :]
    return len(tail) >= state.crash_loop_after and all(s == trouble.signature for s in tail)


def _is_startup_loop(trouble: Trouble, state: PolicyState) -> bool:
    n = min(state.startup_loop_after, state.crash_loop_after)
    tail = (*state.recent_fingerprints, trouble.fingerprint)[-n:]
    return len(tail) >= n and all(f == trouble.fingerprint for f in tail)


def _looks_like_hardware(trouble: Trouble) -> bool:
    if trouble.kind is TroubleKind.GPU_DEGRADED or trouble.gpu_health is Health.DEGRADED:
        return True
    if trouble.kind is TroubleKind.NUMERICS:  # one GPU's own NaN: a silent data corruption suspect
        return True
    return trouble.category in HARDWARE_CATEGORIES


def with_diagnosis(trouble: Trouble, health: Health) -> Trouble:
    """The same trouble once diagnostics ran on its GPU (the supervisor then calls `decide` again)."""
    note = f"diagnostics on GPU {trouble.gpu}: {health.value}"
    return replace(trouble, diagnosis=health, evidence=(*trouble.evidence, note))


_HEX = re.compile(r"0x[0-9a-fA-F]+")
_NUM = re.compile(r"\d+(?:\.\d+)?")
_PATHY = re.compile(r"(?:/[\w.-]+)+")


def error_signature(exc_type: str, message: str, traceback: str = "") -> str:
    """A crash-loop key: exception type + message with numbers/addresses/paths masked + top frame.

    Two crashes with the same signature are "the same bug", whatever step or pid they hit::

        >>> error_signature("ValueError", "bad value 3.5 at step 120")
        'ValueError: bad value <n> at step <n>'
    """
    text = _HEX.sub("<hex>", message.strip().splitlines()[0] if message.strip() else "")
    text = _NUM.sub("<n>", _PATHY.sub("<path>", text))[:200]
    frame = _top_frame(traceback)
    return f"{exc_type}: {text}" + (f" @ {frame}" if frame else "")


_FRAME = re.compile(r'File "([^"]+)", line \d+, in (\S+)')


def _top_frame(traceback: str) -> str | None:
    """The innermost frame of a Python traceback as ``file.py:function`` (line numbers dropped:
    an edited line above the bug must not split the loop)."""
    frames = _FRAME.findall(traceback)
    if not frames:
        return None
    path, func = frames[-1]
    return f"{path.rsplit('/', 1)[-1]}:{func}"

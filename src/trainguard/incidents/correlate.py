"""Which failure caused the others: the one correlation the supervisor and `logs explain` share.

The root cause is the EARLIEST causal failure, not the loudest: a GPU that falls off the bus at
t=10 makes every other rank time out in NCCL at t=600, and those hundreds of timeouts are
symptoms. Symptoms only decide the cause when nothing causal was seen::

    >>> from trainguard.records import Event, EventKind, Category
    >>> xid = Event(EventKind.XID, "NVRM: Xid (PCI:0000:3b:00): 79, ...", time=10.0, xid=79)
    >>> hang = Event(EventKind.TRAINING, "Watchdog caught collective operation timeout",
    ...              time=600.0, category=Category.NCCL_TIMEOUT_HANG)
    >>> root_cause_for([hang, hang, hang, xid]).value
    'faulty_gpu'

``explain_job`` applies the same rule to the findings of every rank of a failed job and adds what
an operator needs: the ranks that failed as a consequence, the action, a confidence, the evidence.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace

from trainguard.actions import Advice
from trainguard.detect.training_log import ambiguous_cuda
from trainguard.incidents.taxonomy import Evidence, EvidenceLike, RootCause, as_evidence, suspects
from trainguard.records import Category, Event, EventKind

__all__ = ["Consequence", "Explanation", "JobFinding", "explain_job", "first_failure", "first_failure_index",
           "root_cause_for"]  # fmt: skip

# Among failures in the same burst (see `burst_s`), the more specific cause wins:
# Xid 172 refines the Xid 48 printed with it to SRAM; hardware beats the software crash it caused.
_SPECIFICITY = [
    RootCause.GPU_SRAM,
    RootCause.GPU_HBM_MEMORY,
    RootCause.GPU_SYSTEM_PROCESSOR,
    RootCause.FAULTY_GPU,
    RootCause.GPU_THERMAL,
    RootCause.NIC,
    RootCause.NETWORK_SWITCH_CABLE,
    RootCause.HOST,
    RootCause.SILENT_DATA_CORRUPTION,
    RootCause.DEPENDENCY,
    RootCause.SOFTWARE_BUG,
    RootCause.NCCL_WATCHDOG_TIMEOUT,
    RootCause.UNKNOWN,
]
_HARDWARE_CAUSES = {
    RootCause.GPU_SRAM,
    RootCause.GPU_HBM_MEMORY,
    RootCause.GPU_SYSTEM_PROCESSOR,
    RootCause.FAULTY_GPU,
}
# A launch failure is hardware's until told otherwise; the GPU's own log tells (the illegal
# addresses and EXECUTION_FAILED that the driver or a library causes as often: ``ambiguous_cuda``).
_LAUNCH_FAILURE = "unspecified launch failure"
_SEQ = re.compile(r"SeqNum=(\d+)")


def first_failure_index(items: Sequence[EvidenceLike], burst_s: float = 2.0) -> int | None:
    """Index of the evidence that names the root cause: the earliest causal failure (within
    `burst_s` of it, the most specific), else the earliest symptom, else None. Untimed evidence
    counts last; ties keep the order of `items`."""
    found = [(i, e) for i, e in enumerate(map(as_evidence, items)) if e is not None]
    # an unknown cause with suspects (a CUDA failure the driver or the GPU can cause) is a failure
    # of its own, not a bystander's complaint: it can be the first causal one
    causal = [(i, e) for i, e in found if not e.symptom and (e.cause is not RootCause.UNKNOWN or e.suspects)]
    pool = causal or [(i, e) for i, e in found if e.cause is not RootCause.UNKNOWN] or found
    if not pool:
        return None
    timed = sorted(((i, e) for i, e in pool if e.time is not None), key=lambda p: (p[1].time or 0.0, p[0]))
    if not timed:
        return min(pool, key=lambda p: (_SPECIFICITY.index(p[1].cause), p[0]))[0]
    first_time = timed[0][1].time or 0.0
    burst = [(i, e) for i, e in timed if (e.time or 0.0) - first_time <= burst_s]
    return min(burst, key=lambda p: (_SPECIFICITY.index(p[1].cause), p[1].time or 0.0, p[0]))[0]


def first_failure(items: Iterable[EvidenceLike], burst_s: float = 2.0) -> Evidence | None:
    """The evidence that names the root cause (see `first_failure_index`), or None."""
    seq = list(items)
    index = first_failure_index(seq, burst_s)
    return None if index is None else as_evidence(seq[index])


def root_cause_for(items: Iterable[EvidenceLike], burst_s: float = 2.0) -> RootCause:
    """The root cause of an interruption given everything seen around it (UNKNOWN if nothing)."""
    first = first_failure(items, burst_s)
    return first.cause if first is not None else RootCause.UNKNOWN


@dataclass(frozen=True, slots=True)
class JobFinding:
    """One finding of a job's logs, with the rank, host and GPU it belongs to (None: unknown)."""

    event: Event
    rank: int | None = None
    host: str | None = None
    pci: str | None = None  # the rank's GPU, from NCCL's init lines; an Xid's own for kernel lines


@dataclass(frozen=True, slots=True)
class Consequence:
    rank: int | None
    category: str
    count: int


@dataclass(frozen=True, slots=True)
class Explanation:
    """What `trainguard logs explain` concludes about a failed job."""

    root: JobFinding | None
    cause: RootCause
    consequences: tuple[Consequence, ...]
    action: Advice
    confidence: str  # high | medium | low
    evidence: tuple[str, ...]


def explain_job(
    findings: Sequence[JobFinding],
    ranks: Iterable[int] = (),
    burst_s: float = 2.0,
    corroborate_s: float = 120.0,
) -> Explanation:
    """The root-cause finding of a failed job, the ranks that failed as a consequence, the action.

    ``ranks``: every rank the job had (those that logged nothing included), so that a hang in
    which every other rank timed out can point at the silent one.
    """
    evidence = [_evidence(f) for f in findings]
    index = first_failure_index(evidence, burst_s)
    if index is None:
        return Explanation(None, RootCause.UNKNOWN, (), Advice.NONE, "low", ("no finding in the logs",))
    root, cause, notes, unconfirmed = findings[index], evidence[index].cause, [], False
    if _LAUNCH_FAILURE in root.event.text or ambiguous_cuda(root.event.text):
        hardware = _corroborating(root, findings, evidence, corroborate_s, _is_hardware)
        driver = None if hardware else _corroborating(root, findings, evidence, corroborate_s, _is_driver)
        where = f"GPU {root.pci}" if root.pci else "this rank's GPU"
        if hardware is not None:
            notes.append(f"GPU {root.pci or hardware.pci or '(PCI unknown)'} logged {hardware.event.text.strip()[:160]!r} "
                         "around it: the GPU's fault")  # fmt: skip
            cause = _evidence(hardware).cause
            rank = root.rank if hardware.rank is None else hardware.rank
            root = replace(hardware, rank=rank, host=hardware.host or root.host)
        elif driver is not None:
            notes.append(f"rank {_r(driver.rank)} logged {driver.event.text.strip()[:160]!r} around it: the driver's "
                         "or a CUDA library's fault")  # fmt: skip
            cause = RootCause.SOFTWARE_BUG
        elif evidence[index].suspects:
            unconfirmed = True
            notes.append(f"no Xid or ECC event on {where} and no driver error: "
                         + suspects(*evidence[index].suspects))  # fmt: skip
        else:
            unconfirmed = True
            notes.append(f"no Xid or ECC event on {where}: a program bug unless it recurs on that GPU "
                         "(then run `trainguard diagnose` on it)")  # fmt: skip
    elif evidence[index].suspects:
        notes.append(suspects(*evidence[index].suspects))
    counts = Counter(
        (f.rank, f.event.category.value) for f in findings if f.rank != root.rank or root.rank is None
    )
    if root.rank is None:
        counts.pop((None, root.event.category.value), None)
    consequences = tuple(Consequence(r, c, n) for (r, c), n in sorted(counts.items(), key=_rank_order))
    causal_ranks = {
        f.rank
        for f, e in zip(findings, evidence, strict=True)
        if not e.symptom and e.cause is not RootCause.UNKNOWN and f.rank not in (None, root.rank)
    }
    confidence = _confidence(_evidence(root), root, causal_ranks, unconfirmed)
    if confidence == "low":
        notes += _hang_suspects(findings, ranks)
    where = f"{root.event.path}:{root.event.line_no}" if root.event.path else "?"
    first = (
        "first causal failure" if confidence != "low" else "no causal failure in the logs; earliest symptom"
    )
    lines = [f"{first}: rank {_r(root.rank)} at {where}", *notes]
    symptoms = sum(1 for e in evidence if e.symptom)
    if symptoms:
        lines.append(
            f"{symptoms} finding(s) on other ranks are symptoms (watchdog timeouts, aborted communicators)"
        )
    if causal_ranks:
        lines.append(
            f"other ranks with their own errors: {', '.join(_r(r) for r in sorted(causal_ranks, key=_key))}"
        )
    return Explanation(root, cause, consequences, root.event.action, confidence, tuple(lines))


def _evidence(finding: JobFinding) -> Evidence:
    e = as_evidence(finding.event) or Evidence(RootCause.UNKNOWN, finding.event.time, finding.event.text)
    return replace(e, rank=finding.rank, node=finding.host)


def _is_hardware(f: JobFinding, e: Evidence) -> bool:
    return e.cause in _HARDWARE_CAUSES or f.event.category is Category.GPU_MEMORY_ECC


def _is_driver(f: JobFinding, e: Evidence) -> bool:
    return f.event.category is Category.DRIVER_SOFTWARE


def _corroborating(
    root: JobFinding,
    findings: Sequence[JobFinding],
    evidence: Sequence[Evidence],
    window_s: float,
    kind: Callable[[JobFinding, Evidence], bool],
) -> JobFinding | None:
    """A finding of ``kind`` (an Xid/ECC error, a driver error) on the root's GPU or rank around the
    root's time."""
    for f, e in zip(findings, evidence, strict=True):
        if not kind(f, e):
            continue
        same_gpu = f.pci is not None and f.pci == root.pci and (f.host is None or root.host in (None, f.host))
        same_rank = f.event.kind is EventKind.TRAINING and f.rank == root.rank
        near = (
            f.event.time is None or root.event.time is None or abs(f.event.time - root.event.time) <= window_s
        )
        if (same_gpu or same_rank) and near and f is not root:
            return f
    return None


def _hang_suspects(findings: Sequence[JobFinding], ranks: Iterable[int]) -> list[str]:
    """When every finding is a symptom: the ranks that logged nothing, and those whose timeout
    came on an earlier collective (a lower SeqNum: they were behind)."""
    notes = []
    silent = sorted(set(ranks) - {f.rank for f in findings})
    if silent:
        notes.append(f"rank(s) {', '.join(map(str, silent))} logged no failure while the others timed out: "
                     "the likely origin of the hang (look at their stacks)")  # fmt: skip
    seqs: dict[int, int] = {}
    for f in findings:
        if f.rank is not None and (m := _SEQ.search(f.event.text)):
            seqs[f.rank] = min(int(m.group(1)), seqs.get(f.rank, 1 << 62))
    if len(set(seqs.values())) > 1:
        low = min(seqs.values())
        behind = ", ".join(str(r) for r, seq in sorted(seqs.items()) if seq == low)
        notes.append(
            f"rank(s) {behind} timed out on an earlier collective (SeqNum {low}) than the others: behind"
        )
    return notes


def _confidence(root_ev: Evidence, root: JobFinding, causal_ranks: set[int], unconfirmed: bool) -> str:
    if root_ev.symptom or (root_ev.cause is RootCause.UNKNOWN and not root_ev.suspects):
        return "low"  # only symptoms: every rank waited on someone
    if root.event.time is None or causal_ranks or unconfirmed:
        return "medium"
    return "high"


def _rank_order(item: tuple[tuple[int | None, str], int]) -> tuple[int, str]:
    (rank, category), _ = item
    return (_key(rank), category)


def _key(rank: int | None) -> int:
    return -1 if rank is None else rank


def _r(rank: int | None) -> str:
    return "?" if rank is None else str(rank)

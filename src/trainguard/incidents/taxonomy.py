"""Root causes of training interruptions, and the pure rule that picks one from the evidence.

Sits between detect and the store: the supervisor and the agent hand over what they saw
(kernel-log Events, Findings, rank error files, or `Evidence` they build themselves) and get
back the root cause to record. The taxonomy is the one Meta published for the unexpected
interruptions of its Llama 3 405B pre-training run (faulty GPU 30%, HBM 17%, software 13%...).

Each observation is reduced to ``Evidence``: the cause it points to, and whether it is a
symptom (sympathetic Xid 45 / 154, NCCL watchdog timeouts, "connection reset by peer" on the
survivors) rather than a cause. Where one line cannot decide, the cause is UNKNOWN with
``suspects``: a peer lost by the survivors' transport (its node, its process, the link), a CUDA
failure the driver, a library or the GPU can cause (``EXECUTION_FAILED``, an illegal address).
``incidents.correlate`` picks the root cause among them::

    >>> from trainguard.records import Event, EventKind, Category
    >>> hang = Event(EventKind.TRAINING, "Watchdog caught collective operation timeout",
    ...              time=600.0, category=Category.NCCL_TIMEOUT_HANG)
    >>> e = as_evidence(hang)
    >>> e.cause.value, e.symptom
    ('nccl_watchdog_timeout', True)
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from enum import Enum

from trainguard.detect.culprit import named_rank
from trainguard.detect.detector import PREDICTED_FAILURE
from trainguard.detect.training_log import ambiguous_cuda
from trainguard.detect.xid import xid_info
from trainguard.records import Category, Event, EventKind, Finding
from trainguard.rundir import ErrorRecord


class RootCause(str, Enum):
    """Why a run was interrupted (Llama 3 interruption taxonomy, adapted)."""

    FAULTY_GPU = "faulty_gpu"  # fell off the bus, NVLink, GPU stopped processing
    GPU_HBM_MEMORY = "gpu_hbm_memory"  # DRAM ECC, row remap / page retirement
    GPU_SRAM = "gpu_sram"  # on-chip SRAM ECC (Xid 172)
    GPU_SYSTEM_PROCESSOR = "gpu_system_processor"  # GSP / PMU / SEC2 firmware
    GPU_THERMAL = "gpu_thermal"  # thermal interface, sensor, power brake
    NETWORK_SWITCH_CABLE = "network_switch_cable"  # fabric: switch, cable, NVSwitch
    NIC = "nic"  # the host's network adapter
    HOST = "host"  # host maintenance, CPU, host memory, kernel, OOM killer
    SOFTWARE_BUG = "software_bug"  # application or framework error, CUDA OOM
    DEPENDENCY = "dependency"  # storage, data pipeline, scheduler, external service
    NCCL_WATCHDOG_TIMEOUT = "nccl_watchdog_timeout"  # a collective timed out, nothing else seen
    SILENT_DATA_CORRUPTION = "silent_data_corruption"  # numerics wrong, not reproducible
    UNKNOWN = "unknown"


# Causes that stop every replica, so replica groups (`trainguard run --replica-groups`) cannot
# train around them and the whole job restarts from a checkpoint: a software bug is in every
# replica's code and data path and crashes them all; silent data corruption reaches every replica
# through the gradient all-reduce before anything sees it, so all roll back; a switch or cable
# failure cuts the fabric the cross-replica all-reduce runs on; a dependency (storage, scheduler)
# serves every replica. The rest (a GPU, its memory, a host, its NIC) stay inside one replica.
JOB_WIDE_CAUSES = frozenset(
    {
        RootCause.SOFTWARE_BUG,
        RootCause.SILENT_DATA_CORRUPTION,
        RootCause.NETWORK_SWITCH_CABLE,
        RootCause.DEPENDENCY,
    }
)


_CATEGORY_CAUSE: dict[Category, RootCause] = {
    Category.GPU_HARDWARE: RootCause.FAULTY_GPU,
    Category.GPU_MEMORY_ECC: RootCause.GPU_HBM_MEMORY,
    Category.NCCL_NETWORK: RootCause.NETWORK_SWITCH_CABLE,
    Category.NCCL_TIMEOUT_HANG: RootCause.NCCL_WATCHDOG_TIMEOUT,
    Category.CUDA_OOM: RootCause.SOFTWARE_BUG,
    Category.APPLICATION_BUG: RootCause.SOFTWARE_BUG,
    Category.DRIVER_SOFTWARE: RootCause.SOFTWARE_BUG,
    Category.NODE_HOST: RootCause.HOST,
    Category.INTERCONNECT: RootCause.FAULTY_GPU,
    Category.THERMAL_POWER: RootCause.GPU_THERMAL,
    # A NaN or spike is an SDC suspect until a rollback tells (numerics.data_problem/transient).
    Category.NUMERICS: RootCause.SILENT_DATA_CORRUPTION,
    Category.UNKNOWN: RootCause.UNKNOWN,  # an error no rule knows: its text is the evidence
}
# Rules whose conclusion is more specific than their category.
_RULE_CAUSE: dict[str, RootCause] = {
    "numerics.transient": RootCause.SILENT_DATA_CORRUPTION,
    "numerics.data_problem": RootCause.SOFTWARE_BUG,
}

# A network error names the adapter itself (not the fabric behind it).
_NIC_TEXT = re.compile(r"mlx5|\bNIC\b|\bHCA\b|ibv_open_device|port \d+ (?:down|error)|ethtool", re.I)
# Errors a surviving rank raises because a peer died or stalled: symptoms, never the cause.
_PEER_TEXT = re.compile(
    r"watchdog caught collective|collective operation timeout|timed out|connection reset|"
    r"connection closed by (?:remote )?peer|broken pipe|DistNetworkError|DistBackendError|"
    r"NCCL communicator was aborted|ProcessGroupNCCL.*abort",
    re.I,
)
_DEPENDENCY_TEXT = re.compile(
    r"no space left|stale file handle|input/output error|read-only file system|"
    r"DataLoader worker .* (?:killed|exited)|quota exceeded",
    re.I,
)
# A full or failing file system: storage's (a dependency), unless it is /dev/shm (the host's memory).
_STORAGE_TEXT = re.compile(
    r"no space left on device|input/output error|disk quota exceeded|read-only file system|stale file handle",
    re.I,
)
_HOST_TEXT = re.compile(r"out of memory: kill|oom-kill|MemoryError|machine check|segmentation fault", re.I)
_CUDA_OOM_TEXT = re.compile(r"CUDA out of memory|OutOfMemoryError", re.I)


@dataclass(frozen=True, slots=True)
class Evidence:
    """One observation reduced to what the root-cause rule needs.

    ``symptom`` marks downstream effects (peer timeouts, sympathetic Xids): they decide the
    cause only when nothing causal was seen. ``source`` says what saw it (kernel_log,
    training_log, error_file, exit_code, heartbeat, numerics, telemetry...).
    """

    cause: RootCause
    time: float | None = None
    text: str = ""
    symptom: bool = False
    source: str = ""
    category: str | None = None
    gpu: int | None = None
    rank: int | None = None
    node: str | None = None
    suspects: tuple[tuple[RootCause, str], ...] = ()  # a cause UNKNOWN to this line: what it may be


# What a line that cannot decide points at (``Evidence.suspects``; ``suspects()`` words them).
CUDA_SUSPECTS = (
    (
        RootCause.SOFTWARE_BUG,
        "the driver or a CUDA library (cuBLAS, cuDNN) at odds with it, or the program's kernel",
    ),
    (RootCause.FAULTY_GPU, "the GPU, when an Xid or ECC error on it comes with the line"),
)
PEER_SUSPECTS = (
    (RootCause.HOST, "the peer's node: killed, rebooted, out of memory or power"),
    (RootCause.SOFTWARE_BUG, "the peer's process crashed: its own log says why"),
    (RootCause.NETWORK_SWITCH_CABLE, "the link between the two"),
)
CONSEQUENCE_SUSPECTS = (
    (RootCause.SOFTWARE_BUG, "another rank's error, printed before this line"),
    (RootCause.HOST, "another rank's node went away"),
)


EvidenceLike = Evidence | Event | Finding | ErrorRecord


def xid_root_cause(code: int) -> RootCause | None:
    """The cause an Xid points to (the Xid catalog's ``root_cause``, `trainguard.detect.xid`);
    None for sympathetic Xids and codes whose category decides."""
    cause = xid_info(code).root_cause
    return RootCause(cause) if cause and cause != "symptom" else None


def suspects(*candidates: tuple[RootCause, str]) -> str:
    """The evidence line of a cause that the evidence cannot pin down: ``unknown; suspects: ...``
    (recorded with root cause UNKNOWN, so no confident label is claimed)."""
    return "unknown; suspects: " + "; ".join(f"{cause.value} ({why})" for cause, why in candidates)


def numerics_root_cause(reproduced_after_rollback: bool) -> RootCause:
    """A NaN or loss spike that comes back at the same step after a rollback is the program's
    (data, code, hyper-parameters); one that vanishes is silent data corruption."""
    return RootCause.SOFTWARE_BUG if reproduced_after_rollback else RootCause.SILENT_DATA_CORRUPTION


def as_evidence(item: EvidenceLike) -> Evidence | None:
    """Reduce an Event / Finding / error record to Evidence; None when it says nothing is wrong."""
    if isinstance(item, Evidence):
        return item
    if isinstance(item, Event):
        return _from_event(item)
    if isinstance(item, Finding):
        return _from_finding(item)
    if isinstance(item, ErrorRecord):
        return _from_error(item)
    return None


def _from_event(ev: Event) -> Evidence | None:
    if ev.kind is EventKind.GPU_MAP:
        return None
    source = "training_log" if ev.kind is EventKind.TRAINING else "kernel_log"
    base = Evidence(RootCause.UNKNOWN, ev.time, ev.text, ev.sympathetic, source, ev.category.value)
    if ev.kind is EventKind.GPU_LOST:
        return replace(base, cause=RootCause.FAULTY_GPU)
    if ev.kind is EventKind.SXID:
        return replace(base, cause=RootCause.NETWORK_SWITCH_CABLE)
    named = xid_info(ev.xid).root_cause if ev.kind is EventKind.XID and ev.xid is not None else ""
    if named == "symptom":
        return replace(base, cause=_category_cause(ev.category, ev.text), symptom=True)
    if named:
        return replace(base, cause=RootCause(named))
    if ev.category is Category.INFO:
        return None
    if ev.category is Category.UNKNOWN and ambiguous_cuda(ev.text):
        return replace(base, symptom=ev.sympathetic, suspects=CUDA_SUSPECTS)
    if ev.sympathetic and ev.category is Category.NCCL_NETWORK:  # a survivor's transport lost its peer
        return replace(base, symptom=True, suspects=PEER_SUSPECTS)
    if ev.sympathetic and ev.category is Category.NODE_HOST:  # a survivor names the task it lost
        return replace(base, symptom=True, suspects=PEER_SUSPECTS, rank=named_rank(ev.text))
    if ev.sympathetic and ev.category is Category.UNKNOWN:
        return replace(base, symptom=True, suspects=CONSEQUENCE_SUSPECTS)
    cause = _category_cause(ev.category, ev.text)
    peer = cause is RootCause.NCCL_WATCHDOG_TIMEOUT or bool(_PEER_TEXT.search(ev.text))
    return replace(base, cause=cause, symptom=ev.sympathetic or peer)


def _from_finding(f: Finding) -> Evidence | None:
    if f.category is None or f.category is Category.INFO or f.rule == PREDICTED_FAILURE:
        return None  # a forecast says a GPU may fail, not that anything has: no cause of its own
    text = f"{f.rule}: {f.reason}"
    cause = _RULE_CAUSE.get(f.rule) or _category_cause(f.category, text)
    symptom = cause is RootCause.NCCL_WATCHDOG_TIMEOUT
    source = "numerics" if f.rule.startswith("numerics.") else "telemetry"
    return Evidence(cause, f.time, text, symptom, source, f.category.value, gpu=f.gpu)


def _from_error(rec: ErrorRecord) -> Evidence:
    text = f"{rec.exc_type}: {rec.message}"
    base = Evidence(RootCause.SOFTWARE_BUG, rec.time, text, source="error_file", rank=rec.rank)
    if _PEER_TEXT.search(text):
        return replace(base, cause=RootCause.NCCL_WATCHDOG_TIMEOUT, symptom=True)
    if _CUDA_OOM_TEXT.search(text):
        return replace(base, category=Category.CUDA_OOM.value)
    if _DEPENDENCY_TEXT.search(text):
        return replace(base, cause=RootCause.DEPENDENCY)
    if _HOST_TEXT.search(text):
        return replace(base, cause=RootCause.HOST, category=Category.NODE_HOST.value)
    return replace(base, category=Category.APPLICATION_BUG.value)


def _category_cause(category: Category, text: str) -> RootCause:
    cause = _CATEGORY_CAUSE.get(category, RootCause.UNKNOWN)
    if cause is RootCause.NETWORK_SWITCH_CABLE and _NIC_TEXT.search(text):
        return RootCause.NIC
    if cause is RootCause.SOFTWARE_BUG and _DEPENDENCY_TEXT.search(text):
        return RootCause.DEPENDENCY
    if cause is RootCause.HOST and _STORAGE_TEXT.search(text) and "/dev/shm" not in text:
        return RootCause.DEPENDENCY
    return cause

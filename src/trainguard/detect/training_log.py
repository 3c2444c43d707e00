"""Training-log lines -> ``Event``: NCCL, CUDA, OOM, torchelastic and crash signatures.

The detect step for what a PyTorch job prints (stdout/stderr of each rank, torchrun's summary).
Each line is matched against an ordered table of signatures, most specific first, so
``RuntimeError: CUDA error: an illegal memory access was encountered`` is a CUDA fault, not a
generic exception::

    >>> e = classify_training_line("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB")
    >>> e.category.value, e.severity.value, e.action.value
    ('cuda_oom', 'error', 'restart_app')

``parse_elastic_root_cause`` reads torchelastic's ``Root Cause (first observed failure)`` block
(rank, exit code, signal) out of a run of lines.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable
from dataclasses import dataclass

from trainguard.records import Action, Category, Event, EventKind, Severity

log = logging.getLogger(__name__)

__all__ = ["TRAINING_ANCHORS", "ElasticRootCause", "classify_training_line", "parse_elastic_root_cause"]

C, S, A = Category, Severity, Action

# The file scanner looks for these literals in bulk and classifies only the lines that have one.
# Every needle of every rule below contains one of them (a test checks), so the scanner finds
# exactly what line-by-line classification finds.
TRAINING_ANCHORS: tuple[str, ...] = (
    "NCCL", "nccl", "NET/IB", "CUDA", "ECC", "OutOfMemory", "out of memory", "Out of memory",
    "illegal", "launch failure", "CUBLAS", "CUDNN", "device-side", "Assertion", "Watchdog",
    "collective operation", "Heartbeat monitor", "Killed", "oom-kill", "oom_reaper", "SIGKILL", "SIGSEGV",
    "SIGBUS", "SIGABRT", "Segmentation fault", "segfault", "Fatal Python", "Bus error", "bus error",
    "exitcode", "Error", "Exception",
)  # fmt: skip

# (needles, pattern, ...): the pattern is tried only on lines containing one of the needles,
# which keeps a miss at a few substring tests instead of a regex run per rule.
_TABLE: tuple[tuple[tuple[str, ...], str, Category, Severity, Action], ...] = (
    # GPU memory and GPU faults
    (("ECC error",), r"uncorrectable ECC error|ECC error(?:s)? (?:detected|encountered)", C.GPU_MEMORY_ECC, S.FATAL, A.RESET_GPU),
    (("CUDA", "cudaErrorDevicesUnavailable"), r"no CUDA-capable device is detected|CUDA error: GPU is lost"
     r"|cudaErrorDevicesUnavailable", C.GPU_HARDWARE, S.FATAL, A.REBOOT_NODE),
    (("CUDA",), r"uncorrectable NVLink error", C.GPU_HARDWARE, S.ERROR, A.RESET_GPU),
    # OOM before generic CUDA errors: "CUDA error: out of memory" is the job's size, not the GPU
    (("out of memory", "OutOfMemoryError", "cudaErrorMemoryAllocation", "CUBLAS_STATUS_ALLOC", "CUDNN_STATUS_ALLOC"),
     r"CUDA out of memory|OutOfMemoryError|CUDA error: out of memory|cudaErrorMemoryAllocation"
     r"|CUBLAS_STATUS_ALLOC_FAILED|CUDNN_STATUS_ALLOC_FAILED", C.CUDA_OOM, S.ERROR, A.RESTART_APP),
    (("illegal memory access", "launch failure", "CUBLAS_STATUS_EXECUTION", "CUDNN_STATUS_EXECUTION",
      "CUDNN_STATUS_MAPPING", "ncclUnhandledCudaError", "CUDA error: unknown error"),
     r"illegal memory access|launch failure|CUBLAS_STATUS_EXECUTION_FAILED|CUDNN_STATUS_EXECUTION_FAILED"
     r"|CUDNN_STATUS_MAPPING_ERROR|ncclUnhandledCudaError|CUDA error: unknown error", C.GPU_HARDWARE, S.ERROR, A.RESTART_APP),
    (("device-side assert", "Assertion `", "CUDA error: "), r"device-side assert|Assertion `.*` failed"
     r"|CUDA error: (?:misaligned address|an illegal instruction|no kernel image|invalid device function)",
     C.APPLICATION_BUG, S.ERROR, A.RESTART_APP),
    (("CUDA", "CUBLAS_STATUS_", "CUDNN_STATUS_"), r"CUDA driver version is insufficient|CUDA driver initialization failed"
     r"|CUDA error: system not yet initialized|CUDA error: forward compatibility|CUDA error: initialization error"
     r"|CUBLAS_STATUS_(?:INTERNAL_ERROR|NOT_INITIALIZED|ARCH_MISMATCH)"
     r"|CUDNN_STATUS_(?:INTERNAL_ERROR|NOT_INITIALIZED|ARCH_MISMATCH|VERSION_MISMATCH|RUNTIME_\w+)",
     C.DRIVER_SOFTWARE, S.ERROR, A.DRAIN),
    (("CUBLAS_STATUS_", "CUDNN_STATUS_", "CUDA error:"), r"CUBLAS_STATUS_\w+|CUDNN_STATUS_\w+|CUDA error:",
     C.APPLICATION_BUG, S.ERROR, A.RESTART_APP),
    # NCCL: hangs first (they mention NCCL too), then the network, then the rest
    (("collective operation timeout", "NCCL", "Heartbeat monitor timed out", "ncclTimeout"),
     r"collective operation timeout|NCCL communicator was aborted|Some NCCL operations have failed or timed out"
     r"|Heartbeat monitor timed out|watchdog (?:thread )?got stuck|ncclTimeout|NCCL timeout",
     C.NCCL_TIMEOUT_HANG, S.ERROR, A.RESTART_APP),
    (("NET/IB", "nccl", "NCCL"), r"NET/IB\s*:.*(?:completion|[Ee]rror)|ncclSystemError|ncclRemoteError"
     r"|unhandled system error|remote process exited or there was a network error"
     r"|NCCL WARN.*(?:[Cc]onnect|[Ss]ocket|NET/|IB|timed out)", C.NCCL_NETWORK, S.ERROR, A.RESTART_APP),
    (("ncclInternalError", "NCCL"), r"ncclInternalError|internal error - please report", C.DRIVER_SOFTWARE, S.ERROR, A.RESTART_APP),
    (("ncclInvalid", "NCCL"), r"ncclInvalidUsage|ncclInvalidArgument|invalid usage", C.APPLICATION_BUG, S.ERROR, A.RESTART_APP),
    (("NCCL WARN", "NCCL error"), r"NCCL WARN|NCCL error", C.NCCL_NETWORK, S.WARNING, A.RESTART_APP),
    # the host
    (("Out of memory", "oom-kill", "oom_reaper"), r"Out of memory: Kill(?:ed)? process|invoked oom-killer|oom-kill:"
     r"|oom_reaper", C.NODE_HOST, S.ERROR, A.RESTART_APP),
    (("Killed", "SIGKILL", "exitcode"), r"^\W*Killed\s*$|\d+\s+Killed\s+\S|\bSIGKILL\b|exitcode\s*:\s*-9\b",
     C.NODE_HOST, S.ERROR, A.RESTART_APP),
    (("Bus error", "bus error", "SIGBUS", "exitcode"), r"\b[Bb]us error\b|\bSIGBUS\b|exitcode\s*:\s*-7\b",
     C.NODE_HOST, S.ERROR, A.RESTART_APP),  # often /dev/shm full
    # crashes and torchelastic's summary
    (("Segmentation fault", "SIGSEGV", "Fatal Python", "segfault", "SIGABRT", "exitcode"),
     r"Segmentation fault|\bSIGSEGV\b|Fatal Python error|\bsegfault at\b|\bSIGABRT\b|exitcode\s*:\s*-(?:11|6)\b",
     C.APPLICATION_BUG, S.ERROR, A.RESTART_APP),
    (("ChildFailedError", "exitcode"), r"ChildFailedError|exitcode\s*:\s*-?[1-9]\d*\b", C.APPLICATION_BUG, S.ERROR, A.RESTART_APP),
    # the last line of a Python traceback, e.g. "ValueError: ..." (possibly behind a "[rank3]:" tag)
    (("Error", "Exception"), r"(?:^|[\]:]\s)\s*(?:[A-Za-z_]\w*\.)*[A-Z]\w*(?:Error|Exception)(?::\s|\s*$)",
     C.APPLICATION_BUG, S.WARNING, A.RESTART_APP),
)  # fmt: skip
_RULES = tuple((needles, re.compile(pattern), c, s, a) for needles, pattern, c, s, a in _TABLE)


def classify_training_line(line: str, now: float | None = None) -> Event | None:
    """One training-log line -> a TRAINING ``Event``, or None when it is not a failure. Never raises."""
    try:
        text = line.rstrip("\r\n")
        if "NCCL INFO" in text:
            return None  # chatter, even when it mentions an error being retried
        for needles, pattern, category, severity, action in _RULES:
            if any(map(text.__contains__, needles)) and pattern.search(text):
                return Event(
                    EventKind.TRAINING, text, now, category=category, severity=severity, action=action
                )
    except Exception:  # a classifier bug must not take the supervisor down
        log.debug("unclassifiable training line %r", line[:200], exc_info=True)
    return None


def rule_needles() -> tuple[str, ...]:
    """Every needle of the rule table (for the check that the scanner's anchors cover them)."""
    return tuple(dict.fromkeys(n for needles, *_ in _TABLE for n in needles))


@dataclass(frozen=True, slots=True)
class ElasticRootCause:
    """torchelastic's "Root Cause (first observed failure)": the rank that failed first and how."""

    rank: int | None = None
    local_rank: int | None = None
    exitcode: int | None = None
    signal: str | None = None  # e.g. "SIGKILL", from "Signal 9 (SIGKILL) received by PID ..."
    host: str | None = None
    pid: int | None = None


_FIELD = re.compile(r"^\s*(?P<key>time|host|rank|exitcode|error_file|traceback)\s*:\s*(?P<value>.*)$")
_INT = re.compile(r"-?\d+")


def parse_elastic_root_cause(lines: Iterable[str]) -> ElasticRootCause | None:
    """The first ``Root Cause`` block in ``lines`` (a torchrun summary), or None."""
    fields: dict[str, str] = {}
    inside = False
    for raw in lines:
        line = raw.rstrip("\r\n")
        if not inside:
            inside = "Root Cause (first observed failure)" in line
            continue
        if line.startswith("=====") or (
            fields and line.lstrip().startswith("[") and line.strip().endswith("]:")
        ):
            break
        if m := _FIELD.match(line):
            fields.setdefault(m["key"], m["value"].strip())
    if not fields:
        return None
    rank = _INT.search(fields.get("rank", ""))
    local = re.search(r"local_rank:\s*(-?\d+)", fields.get("rank", ""))
    code = _INT.search(fields.get("exitcode", ""))
    pid = re.search(r"pid:\s*(\d+)", fields.get("exitcode", ""))
    sig = re.search(r"\((SIG[A-Z]+)\)", fields.get("traceback", ""))
    return ElasticRootCause(
        rank=int(rank.group()) if rank else None,
        local_rank=int(local.group(1)) if local else None,
        exitcode=int(code.group()) if code else None,
        signal=sig.group(1) if sig else None,
        host=fields.get("host") or None,
        pid=int(pid.group(1)) if pid else None,
    )

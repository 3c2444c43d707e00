"""Training-log lines -> ``Event``: NCCL, CUDA, OOM, torchelastic, host and crash signatures.

The detect step for what a PyTorch job prints (stdout/stderr of each rank, torchrun's summary,
nvidia-smi's own complaints). Each line is matched against an ordered table of signatures, most
specific first, so ``CUDA error: uncorrectable ECC error encountered`` is an ECC fault, not a
generic CUDA error::

    >>> e = classify_training_line("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB")
    >>> e.category.value, e.severity.value, e.action.value
    ('cuda_oom', 'error', 'restart_app')

Lines that only restate another line are judged by what they quote: "NCCL communicator was
aborted on rank 3. Original reason for failure was: <reason>" is classified by <reason> and
marked sympathetic (a consequence), and torch's boilerplate hints ("Compile with
`TORCH_USE_CUDA_DSA`...") are not findings. A glog stamp (``[rank3]:[E1124 10:14:02.123...]``) or
a wall-clock prefix becomes the event's time.
"""

from __future__ import annotations

import logging
import re
import time as _time
from datetime import datetime

from trainguard.detect.elastic import ElasticRootCause, parse_elastic_root_cause
from trainguard.detect.kernel_log import line_time
from trainguard.records import Action, Category, Event, EventKind, Severity

log = logging.getLogger(__name__)

__all__ = [
    "NEEDLE_CONTEXT",
    "TRAINING_ANCHORS",
    "UNKNOWN_ANCHORS",
    "ElasticRootCause",
    "classify_training_line",
    "line_rank",
    "parse_elastic_root_cause",
    "training_time",
]

C, S, A = Category, Severity, Action

# (needles, pattern, category, severity, action): the pattern is tried only on lines containing
# one of the needles, which keeps a miss at a few substring tests instead of a regex run per rule.
# The needles are also what the stdlib scan engine searches for in bulk, so they are specific
# ("NCCL WARN", not "NCCL": with NCCL_DEBUG=INFO a third of all lines say "NCCL").
_TABLE: tuple[tuple[tuple[str, ...], str, Category, Severity, Action], ...] = (
    # GPU memory and GPU faults
    (("ECC error", "ECC_UNCORRECTABLE", "ECCUncorrectable"), r"uncorrectable ECC error|ECC errors? (?:detected|encountered)"
     r"|CUDA_ERROR_ECC_UNCORRECTABLE|cudaErrorECCUncorrectable", C.GPU_MEMORY_ECC, S.FATAL, A.RESET_GPU),
    (("no CUDA-capable device", "GPU is lost", "cudaErrorDevicesUnavailable", "fallen off the bus"),
     r"no CUDA-capable device is detected|GPU is lost|cudaErrorDevicesUnavailable|GPU has fallen off the bus",
     C.GPU_HARDWARE, S.FATAL, A.REBOOT_NODE),
    (("Unable to determine the device handle",), r"Unable to determine the device handle for GPU ?[0-9A-Fa-f:.]+: ",
     C.GPU_HARDWARE, S.ERROR, A.RESET_GPU),  # nvidia-smi: "Unknown Error" and kin
    (("NVLink error",), r"uncorrectable NVLink error", C.GPU_HARDWARE, S.ERROR, A.RESET_GPU),
    # host memory before the GPU's: "DefaultCPUAllocator: can't allocate memory" is the node's RAM
    (("DefaultCPUAllocator", "DataLoader worker", "Out of memory", "out of memory: Kill", "oom-kill", "oom_reaper",
      "Killed process", "oom_kill", "Out Of Memory", "OOM Killed", "out-of-memory handler", "bad_alloc", "MemoryError",
      "Cannot allocate memory", "exited unexpectedly", "shared memory segment", "/dev/shm", "OOMKilled"),
     r"DefaultCPUAllocator: (?:can't allocate|not enough) memory|DataLoader worker \(pid \d+\) is killed by signal: "
     r"(?:Killed|Bus error)|[Oo]ut of memory: Kill(?:ed)? process|invoked oom-killer|oom-kill:|oom_reaper"
     r"|Killed process \d+ \("
     # the batch system's cgroup killer (Slurm's step daemon and srun), the container runtime's
     r"|Detected \d+ oom[-_]kill event|tasks? [\d,-]+: Out Of Memory|OOM Killed|cgroup out-of-memory handler|OOMKilled"
     # the process's own allocator: C++, Python, libc (errno 12)
     r"|std::bad_alloc|(?:^|[\]:]\s|\s)MemoryError\b|\[Errno 12\] Cannot allocate memory|Error code 12 \(Cannot allocate"
     # shared memory (/dev/shm) full: DataLoader workers and NCCL's shm transport
     r"|DataLoader worker \(pids?\(?s?\)? [\d, ]+\) exited unexpectedly|Error while creating shared memory segment"
     r"|failed to extend /dev/shm|/dev/shm\S* .*No space left on device",
     C.NODE_HOST, S.ERROR, A.RESTART_APP),
    # a peer node gone: torch elastic's rendezvous loses its store or removes a dead node
    (("keep-alive heartbeat", "RendezvousConnectionError", "RendezvousClosedError", "Detected dead node",
      "C10d store has failed", "failed to shutdown the rendezvous"),
     r"failed to send a keep-alive heartbeat to the rendezvous|RendezvousConnectionError|RendezvousClosedError"
     r"|Detected dead node|connection to the C10d store has failed|has failed to shutdown the rendezvous",
     C.NODE_HOST, S.ERROR, A.RESTART_APP),
    # OOM before generic CUDA errors: "CUDA error: out of memory" is the job's size, not the GPU
    (("out of memory", "OutOfMemoryError", "cudaErrorMemoryAllocation", "CUBLAS_STATUS_ALLOC", "CUDNN_STATUS_ALLOC",
      "Tried to allocate", "OOM when", "RESOURCE_EXHAUSTED", "Resource exhausted", "CUDA_ERROR_OUT_OF_MEMORY",
      "Failed to CUDA"),
     r"CUDA out of memory|OutOfMemoryError|CUDA error: out of memory|cudaErrorMemoryAllocation"
     r"|CUBLAS_STATUS_ALLOC_FAILED|CUDNN_STATUS_ALLOC_FAILED|Tried to allocate [\d.]+ [KMG]iB \(GPU \d"
     # TensorFlow/Keras's BFC allocator, XLA (JAX, TF, torch-xla), the CUDA driver API's name for it
     r"|OOM when allocating tensor|RESOURCE_EXHAUSTED: (?:OOM|Out of memory|Failed to allocate)"
     r"|Resource exhausted: (?:OOM|Out of memory)|CUDA_ERROR_OUT_OF_MEMORY"
     # NCCL's own allocations (buffers, proxies): the GPU was full when the communicator needed memory
     r"|Cuda failure (?:2 )?'out of memory'|Failed to CUDA (?:calloc|malloc|host alloc)",
     C.CUDA_OOM, S.ERROR, A.RESTART_APP),
    # An illegal address is the program's until hardware evidence on that GPU says otherwise
    # (incidents.correlate upgrades it when an Xid/ECC event on the same GPU corroborates).
    (("illegal memory access", "device-side assert", "Assertion `", "CUDA error: "),
     r"illegal memory access|device-side assert triggered|Assertion `.*` failed"
     r"|CUDA error: (?:misaligned address|an illegal instruction|no kernel image|invalid device function)",
     C.APPLICATION_BUG, S.ERROR, A.RESTART_APP),
    (("launch failure", "CUBLAS_STATUS_EXECUTION", "CUDNN_STATUS_EXECUTION", "CUDNN_STATUS_MAPPING",
      "ncclUnhandledCudaError", "unhandled cuda error", "CUDA error: unknown error", "Cuda failure 999"),
     r"launch failure|CUBLAS_STATUS_EXECUTION_FAILED|CUDNN_STATUS_EXECUTION_FAILED|CUDNN_STATUS_MAPPING_ERROR"
     r"|ncclUnhandledCudaError|unhandled cuda error|CUDA error: unknown error|Cuda failure 999",
     C.GPU_HARDWARE, S.ERROR, A.RESTART_APP),
    (("CUDA driver", "CUDA error: ", "CUBLAS_STATUS_", "CUDNN_STATUS_", "NVIDIA driver", "NVRM: No NVIDIA",
      "nvidia-container-cli", "No devices were found", "Cuda failure", "cuda runtime error", "not yet initialized"),
     r"CUDA driver version is insufficient|CUDA driver initialization failed|system not yet initialized"
     r"|CUDA error: forward compatibility|CUDA error: initialization error|NVIDIA driver on your system is too old"
     r"|NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver|NVRM: No NVIDIA \w+ \w+ probed"
     r"|nvidia-container-cli: initialization error|No devices were found\s*$|NCCL WARN Cuda failure"
     r"|CUBLAS_STATUS_(?:INTERNAL_ERROR|NOT_INITIALIZED|ARCH_MISMATCH)"
     r"|CUDNN_STATUS_(?:INTERNAL_ERROR|NOT_INITIALIZED|ARCH_MISMATCH|VERSION_MISMATCH|RUNTIME_\w+)",
     C.DRIVER_SOFTWARE, S.ERROR, A.DRAIN),
    (("CUBLAS_STATUS_", "CUDNN_STATUS_", "CUDA error:"), r"CUBLAS_STATUS_\w+|CUDNN_STATUS_\w+|CUDA error:",
     C.APPLICATION_BUG, S.ERROR, A.RESTART_APP),
    # NCCL: hangs first (they mention NCCL too), then the network, then the rest
    (("collective operation timeout", "NCCL operations", "Heartbeat monitor", "watchdog got stuck", "ncclTimeout",
      "NCCL timeout", "detected by watchdog", "Timeout at NCCL work", "heartbeat of its watchdog",
      "in call to wait()", "NCCL communicator was aborted", "thread terminated with exception", "stop signal",
      "dump signal", "attempting to dump debug info", "blocking wait"),
     r"collective operation timeout|Some NCCL operations have failed or timed out|Heartbeat monitor timed out"
     r"|watchdog got stuck|ncclTimeout|NCCL timeout|Exception \(either an error or timeout\) detected by watchdog"
     r"|failure detected by watchdog|Timeout at NCCL work|detected no heartbeat of its watchdog"
     r"|timed out in call to wait\(\)|NCCL communicator was aborted|watchdog thread terminated with exception"
     # torch 2.3+: the watchdog's dump-and-abort wordings, blocking-wait timeouts
     r"|Received a (?:dump|global stop) signal|flight recorder dump signal from another rank"
     r"|Terminating the process after attempting to dump debug info|timed out in blocking wait",
     C.NCCL_TIMEOUT_HANG, S.ERROR, A.RESTART_APP),
    (("Got completion", "Got async event", "ncclSystemError", "ncclRemoteError", "unhandled system error", "network error", "NCCL WARN",
      "Connection reset by peer"),
     r"NET/IBP?\s*:\s*Got (?:completion|async event)|ncclSystemError|ncclRemoteError|unhandled system error"
     r"|remote process exited or there was a network error|Connection reset by peer"
     r"|NCCL WARN.*(?:[Cc]onnect|[Ss]ocket|NET/|IB|timed out|[Bb]roken pipe|[Pp]roxy|ibv_)",
     C.NCCL_NETWORK, S.ERROR, A.RESTART_APP),
    # the adapter itself: a port that lost its cable or link takes the node off the fabric
    (("Cable unplugged", "Link down", "Port module event"), r"mlx5_core.*(?:Cable unplugged|Link down|Port module event.*[Ee]rror)",
     C.NCCL_NETWORK, S.ERROR, A.DRAIN),
    (("ncclInternalError", "internal error - please report", "internal error, NCCL version"),
     r"ncclInternalError|internal error - please report|internal error, NCCL version",
     C.DRIVER_SOFTWARE, S.ERROR, A.RESTART_APP),
    (("ncclInvalid", "invalid usage"), r"ncclInvalidUsage|ncclInvalidArgument|invalid usage",
     C.APPLICATION_BUG, S.ERROR, A.RESTART_APP),
    (("NCCL WARN", "NCCL error", "NCCL Error"), r"NCCL WARN|NCCL [Ee]rror", C.NCCL_NETWORK, S.WARNING, A.RESTART_APP),
    # the host
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
# ASCII classes, as the Hyperscan first pass reads bytes: the two agree on which lines can match


class _Lazy:
    """A rule's regex, compiled the first time one of its needles shows up: a scan of a log with
    a few findings compiles a few of the table's patterns, not all (start-up of `logs scan`)."""

    __slots__ = ("_compiled", "_pattern")

    def __init__(self, pattern: str) -> None:
        self._pattern = pattern
        self._compiled: re.Pattern[str] | None = None

    def search(self, text: str) -> re.Match[str] | None:
        compiled = self._compiled
        if compiled is None:
            compiled = self._compiled = re.compile(self._pattern, re.ASCII)
        return compiled.search(text)


_RULES = tuple((needles, _Lazy(pattern), c, s, a) for needles, pattern, c, s, a in _TABLE)

# Every needle, deduplicated: the literals the scanner's first pass finds in bulk. A line without
# one cannot be a training finding: each rule's needles gate its pattern, and the lines judged by
# what they quote carry a needle of the hang rule.
TRAINING_ANCHORS: tuple[str, ...] = tuple(dict.fromkeys(n for needles, *_ in _TABLE for n in needles))

# Needles too common to search for alone, with the regex a line holding them must match to be a
# candidate (Hyperscan runs it; "ACPI Error: ..." has the needle but is no Python traceback).
NEEDLE_CONTEXT: dict[str, str] = dict.fromkeys(("Error", "Exception"), r"\S(?:Error|Exception)(?::\s|\s*$)")

# A line no rule knows that still has an error's shape: a Python exception line (what closes a
# traceback; its "Traceback (most recent call last):" header is no finding of its own) at the
# start (after torch's rank tag), FATAL, a C/C++ "fatal error", a glog/abseil CHECK failure
# (JAX/XLA, TensorFlow), Slurm's "srun: error:" / "slurmstepd: error:". Kernel lines such as
# "ACPI Error: ..." have no Python exception shape (and are not training lines).
UNKNOWN_ANCHORS = (  # "Error" and "Exception" are searched in context (NEEDLE_CONTEXT)
    "Error",
    "Exception",
    "FATAL",
    "fatal error",
    "Check failed",
    "srun: error",
    "slurmstepd: error",
)
_ERROR_SHAPE = re.compile(
    r"^\W*(?:\[rank\d+\]:\s*)?(?:[a-z_]\w*\.)*[A-Z]\w*(?:Error|Exception): \S"
    r"|\bFATAL\b|\bfatal error\b|\] Check failed: |^(?:srun|slurmstepd): error: "
)

# Lines that restate another line: judged by the failure they quote.
_ABORTED = re.compile(
    r"NCCL communicator was aborted(?: on rank \d+)?\.?\s*(?:Original reason for failure was:\s*)?"
)
_TERMINATED = re.compile(r"watchdog thread terminated with exception:\s*")
# torch's hints after a CUDA error: they repeat the error's context, they are not one.
_BOILERPLATE = re.compile(
    r"^\W*(?:rank\d+\]:\s*)?(?:Compile with `TORCH_USE_CUDA_DSA`|CUDA kernel errors might be asynchronously"
    r"|For debugging consider passing CUDA_LAUNCH_BLOCKING)"
)
_RANK_TAG = re.compile(r"\[rank(\d+)\]:")
_RANK_TEXT = re.compile(r"\[(?:PG (?:ID )?\d+ (?:PG GUID \d+(?:\([^)]*\))? )?)?Rank (\d+)\]")
# glog, as torch's C++ logs print it: "[E1124 10:14:02.123456789 1234 ProcessGroupNCCL.cpp:616]"
_GLOG = re.compile(r"\[[EWIF](\d\d)(\d\d) (\d\d):(\d\d):(\d\d)(?:\.(\d{1,9}))?[\s\]]")


def line_rank(text: str) -> int | None:
    """The rank a line speaks for: its ``[rankN]:`` tag, else a ``[Rank N]``/``[PG ... Rank N]`` tag."""
    m = _RANK_TAG.search(text, 0, 200) or _RANK_TEXT.search(text)
    return int(m.group(1)) if m else None


def training_time(text: str, now: float | None = None) -> float | None:
    """The wall-clock stamp a training line carries (glog, ISO, syslog), else None.

    glog prints no year and local time: the year is that of ``now`` (or today), and a stamp more
    than a day ahead of ``now`` belongs to the previous year. Seconds-since-boot stamps are left
    out: they cannot be ordered against the other ranks' wall clocks.
    """
    if m := _GLOG.search(text, 0, 120):
        month, day, hh, mm, ss, frac = m.groups()
        try:
            year = datetime.fromtimestamp(now if now is not None else _time.time()).year
            stamp = datetime(year, int(month), int(day), int(hh), int(mm), int(ss)).timestamp()
            if now is not None and stamp > now + 86400:
                stamp = datetime(year - 1, int(month), int(day), int(hh), int(mm), int(ss)).timestamp()
        except (ValueError, OverflowError, OSError):
            return None
        return stamp + (int(frac) / 10 ** len(frac) if frac else 0.0)
    if text[:1].isdigit() or text[:1] in "[<":
        wall = line_time(text[:64].lstrip("[<"), now)
        return wall if wall is not None and wall > 1e9 else None
    return None


def classify_training_line(line: str, now: float | None = None) -> Event | None:
    """One training-log line -> a TRAINING ``Event``, or None when it is not a failure. Never raises."""
    try:
        text = line.rstrip("\r\n")
        verdict = _classify(text)
        if verdict is None:
            return None
        category, severity, action, sympathetic = verdict
        stamp = training_time(text, now)
        return Event(EventKind.TRAINING, text, stamp if stamp is not None else now, category=category,
                     severity=severity, action=action, sympathetic=sympathetic)  # fmt: skip
    except Exception:  # a classifier bug must not take the supervisor down
        log.debug("unclassifiable training line %r", line[:200], exc_info=True)
    return None


_Verdict = tuple[Category, Severity, Action, bool]  # category, severity, action, sympathetic
_HANG: _Verdict = (C.NCCL_TIMEOUT_HANG, S.ERROR, A.RESTART_APP, False)


def _classify(text: str, depth: int = 0) -> _Verdict | None:
    if "NCCL INFO" in text or _BOILERPLATE.match(text):
        return None  # chatter, even when it mentions an error being retried
    if depth < 2:
        for quote, sympathetic in ((_ABORTED, True), (_TERMINATED, False)):
            if m := quote.search(text):
                reason = text[m.end() :]
                category, severity, action, _ = (
                    _classify(reason, depth + 1) if reason.strip() else None
                ) or _HANG
                return category, severity, action, sympathetic
    for needles, pattern, category, severity, action in _RULES:
        if any(map(text.__contains__, needles)) and pattern.search(text):
            return category, severity, action, False
    if any(map(text.__contains__, UNKNOWN_ANCHORS)) and _ERROR_SHAPE.search(text):
        return C.UNKNOWN, S.ERROR, A.NONE, False  # reported with its text, never dropped
    return None


def rule_needles() -> tuple[str, ...]:
    """Every needle of the rule table (for the check that the scanner's anchors cover them)."""
    return TRAINING_ANCHORS

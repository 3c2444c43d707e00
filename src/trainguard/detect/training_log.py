"""Training-log lines -> ``Event``: NCCL, CUDA, OOM, torchelastic, host and crash signatures.

The detect step for what a PyTorch job prints (stdout/stderr of each rank, torchrun's summary,
nvidia-smi's own complaints). Each line is matched against an ordered table of signatures, most
specific first, so ``CUDA error: uncorrectable ECC error encountered`` is an ECC fault, not a
generic CUDA error::

    >>> e = classify_training_line("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB")
    >>> e.category.value, e.severity.value, e.action.value
    ('cuda_oom', 'error', 'restart_app')

The table (``training_rules``) covers PyTorch, TensorFlow/Keras and JAX/XLA, Open MPI and
Horovod, Slurm and Ray. Lines that only restate another line are judged by what they
quote: "NCCL communicator was aborted on rank 3. Original reason for failure was: <reason>" is
classified by <reason> and marked sympathetic (a consequence), as are the survivors' transport
errors when a peer goes away (gloo's "Connection closed by peer", NCCL's ``ncclRemoteError``);
torch's boilerplate hints ("Compile with `TORCH_USE_CUDA_DSA`...") are not findings. A glog stamp
(``[rank3]:[E1124 10:14:02.123...]``) or a wall-clock prefix becomes the event's time;
``line_rank`` and ``line_node`` (``culprit``) say whom a line blames.
"""

from __future__ import annotations

import logging
import re
import time as _time
from datetime import datetime

from trainguard.actions import Advice
from trainguard.detect.culprit import line_node, line_rank
from trainguard.detect.elastic import ElasticRootCause, parse_elastic_root_cause
from trainguard.detect.kernel_log import line_time
from trainguard.detect.training_rules import AMBIGUOUS_CUDA, RULES
from trainguard.records import Category, Event, EventKind, Severity

log = logging.getLogger(__name__)

__all__ = [
    "NEEDLE_CONTEXT",
    "TRAINING_ANCHORS",
    "UNKNOWN_ANCHORS",
    "ElasticRootCause",
    "ambiguous_cuda",
    "classify_training_line",
    "line_node",
    "line_rank",
    "parse_elastic_root_cause",
    "training_time",
]

C, S, A = Category, Severity, Advice
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


_RULES = tuple((r.needles, _Lazy(r.pattern), r.category, r.severity, r.action, r.sympathetic) for r in RULES)

# Every needle, deduplicated: the literals the scanner's first pass finds in bulk. A line without
# one cannot be a training finding: each rule's needles gate its pattern, and the lines judged by
# what they quote carry a needle of the hang rule.
TRAINING_ANCHORS: tuple[str, ...] = tuple(dict.fromkeys(n for r in RULES for n in r.needles))

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
# TensorFlow's start-up probe on a host without an NVIDIA driver (error 303: libcuda will not
# initialise): TF logs it, at error level since 2.15, and trains on the CPU. No failure; the same
# probe naming a CUDA_ERROR_* (a GPU host whose driver fails) stays the driver's (the rules).
_NO_DRIVER = re.compile(
    r"failed call to cuInit: (?:INTERNAL: CUDA error: Failed call to cuInit: )?UNKNOWN ERROR \(303\)"
)
_AMBIGUOUS = re.compile(AMBIGUOUS_CUDA)
# glog, as torch's C++ logs print it: "[E1124 10:14:02.123456789 1234 ProcessGroupNCCL.cpp:616]"
_GLOG = re.compile(r"\[[EWIF](\d\d)(\d\d) (\d\d):(\d\d):(\d\d)(?:\.(\d{1,9}))?[\s\]]")


def ambiguous_cuda(text: str) -> bool:
    """Whether a line is one of the CUDA failures one line cannot pin on the driver, a library, the
    program or the GPU (``EXECUTION_FAILED``, an illegal address): "unknown" with those suspects."""
    return _AMBIGUOUS.search(text) is not None


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


_Verdict = tuple[Category, Severity, Advice, bool]  # category, severity, action, sympathetic
_HANG: _Verdict = (C.NCCL_TIMEOUT_HANG, S.ERROR, A.RESTART_APP, False)


def _classify(text: str, depth: int = 0) -> _Verdict | None:
    if "NCCL INFO" in text or _BOILERPLATE.match(text) or ("cuInit" in text and _NO_DRIVER.search(text)):
        return None  # chatter, even when it mentions an error being retried
    if depth < 2:
        for quote, sympathetic in ((_ABORTED, True), (_TERMINATED, False)):
            if m := quote.search(text):
                reason = text[m.end() :]
                category, severity, action, quoted = (
                    _classify(reason, depth + 1) if reason.strip() else None
                ) or _HANG
                return category, severity, action, sympathetic or quoted
    for needles, pattern, category, severity, action, sympathetic in _RULES:
        if any(map(text.__contains__, needles)) and pattern.search(text):
            return category, severity, action, sympathetic
    if any(map(text.__contains__, UNKNOWN_ANCHORS)) and _ERROR_SHAPE.search(text):
        return C.UNKNOWN, S.ERROR, A.NONE, False  # reported with its text, never dropped
    return None


def rule_needles() -> tuple[str, ...]:
    """Every needle of the rule table (for the check that the scanner's anchors cover them)."""
    return TRAINING_ANCHORS

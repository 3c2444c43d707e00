"""Restart or stop, per failed attempt, from evidence (pure).

Where it sits: ``logs explain`` (and anything holding a job's attempts) turns each failed attempt
into an `AttemptOutcome` (its root-cause line, the step it reached, the GPU/node the evidence
blames) and `recommend` says what to do next, with an exit code a scheduler can act on.

Stop only on proof of a workload bug, which a restart cannot fix:

- a signature of `WORKLOAD` (configuration, argument, shape, missing file, checkpoint that does
  not match the model, import/syntax error) in the root-cause line;
- the same exception at the same step in two attempts in a row.

Stop too, for a person rather than the program, when the root-cause line says storage is full
(`ENVIRONMENT`: no space left, quota exceeded, a read-only file system): every restart would die
at its next checkpoint write. A failing disk's "Input/output error" restarts (shared file systems
recover).

Cascade lines (`CASCADE`: a communicator aborted after another rank's error, CUDA's "might be
asynchronously reported", a peer closing the connection or gone (gloo, NCCL's
``ncclRemoteError``, Open MPI, PMIx), Horovod shutting down after another rank's error, the
elastic agent's child-failed summary) are never root causes: `root_line` skips them. Everything
else restarts: without the GPU or node the evidence names when it names one (a node the launcher
reported lost, `incidents.nodes`), and within a retry budget that follows progress:
``max_stalled`` attempts in a row with the same root cause and no step gained stop (the budget);
any step gained resets it.

Exit codes (`EXIT`): 0 no failure; 75 restart (requeue; EX_TEMPFAIL); 76 restart without the
named GPU/node (requeue excluding it); 3 stop, workload bug (do not requeue, like ``trainguard
run``'s CRASH_LOOP); 1 stop, retry budget spent without progress or storage full (a person should
look).

>>> o = AttemptOutcome(1, "RuntimeError: mat1 and mat2 shapes cannot be multiplied (4x3 and 5x2)", step=0)
>>> recommend([o]).verb, recommend([o]).exit_code
('stop', 3)
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

__all__ = [
    "CASCADE",
    "ENVIRONMENT",
    "EXIT",
    "WORKLOAD",
    "AttemptOutcome",
    "Recommendation",
    "environment_fault",
    "recommend",
    "root_line",
    "workload_bug",
]


@dataclass(frozen=True, slots=True)
class Signature:
    name: str
    pattern: re.Pattern[str]
    why: str


def _sig(name: str, pattern: str, why: str) -> Signature:
    return Signature(name, re.compile(pattern), why)


# The documented table (docs/logs.md "Restart or stop"); each row has a real-shaped test line.
WORKLOAD: tuple[Signature, ...] = (
    _sig("checkpoint_mismatch", r"Error\(s\) in loading state_dict for|size mismatch for [\w.]+: copying a param with "
         r"shape|(?:Missing|Unexpected) key\(s\) in state_dict", "the checkpoint does not match the model"),
    _sig("shape", r"mat1 and mat2 shapes cannot be multiplied|The size of tensor a \(\d+\) must match the size of "
         r"tensor b|shape '\[[-\d, ]*\]' is invalid for input of size|Expected input batch_size \(\d+\) to match "
         r"target batch_size|Given groups=\d+, weight of size", "tensor shapes in the program disagree"),
    _sig("argument", r"error: unrecognized arguments:|error: the following arguments are required:|error: argument "
         r"[-\w/]+: invalid|TypeError: \S+\(\) got an unexpected keyword argument", "the command line or a call's "
         "arguments are wrong"),
    _sig("configuration", r"omegaconf\.errors\.\w+|hydra\.errors\.\w+|ConfigAttributeError|ConfigKeyError|"
         r"Missing mandatory value:|yaml\.(?:scanner|parser)\.\w+Error|json\.decoder\.JSONDecodeError",
         "the configuration is invalid"),
    _sig("missing_file", r"FileNotFoundError: \[Errno 2\] No such file or directory|does not appear to have a file "
         r"named|No such file or directory: '", "a file the job needs does not exist"),
    _sig("code", r"ModuleNotFoundError: No module named|ImportError: cannot import name|^\S*SyntaxError: |"
         r"IndentationError: ", "the program cannot even load"),
)  # fmt: skip

# Faults of the machine that a restart meets again and only a person clears.
ENVIRONMENT: tuple[Signature, ...] = (
    _sig("storage_full", r"No space left on device|Disk quota exceeded|Read-only file system",
         "storage is full or read-only: a restart dies at its next checkpoint write; free space, then requeue"),
)  # fmt: skip

# Lines that only report another rank's or another layer's failure.
CASCADE = re.compile(
    r"NCCL communicator was aborted|CUDA kernel errors might be asynchronously reported|"
    r"Compile with `TORCH_USE_CUDA_DSA`|For debugging consider passing CUDA_LAUNCH_BLOCKING|"
    r"Connection (?:closed|reset) by peer|Broken pipe|ChildFailedError|"
    # a peer gone, as the survivors' transports (NCCL, TCPStore, Open MPI, PMIx) and Horovod say it
    r"ncclRemoteError|remote process exited or there was a network error|recvValue failed|"
    r"peer process has unexpectedly disconnected|PMIX ERROR: UNREACHABLE|Horovod has been shut down|"
    r"HorovodInternalError|"
    r"Some NCCL operations have failed or timed out|To avoid data inconsistency, we are taking the entire process|"
    r"Signal \d+ \(SIG\w+\) received by PID|failed \(exitcode: -?\d+\) local_rank|"
    r"Watchdog caught collective operation timeout|Process group watchdog thread terminated|"
    r"DistNetworkError: .*(?:recvValue|Connection)|barrier\(\) timed out|"
    r"another rank|terminate called after throwing|Aborted \(core dumped\)"
)
EXIT = {
    "none": 0,
    "restart": 75,
    "restart_without": 76,
    "stop_workload": 3,
    "stop_budget": 1,
    "stop_environment": 1,
}
_ERRORISH = re.compile(r"\b\w*(?:Error|Exception)\b[:(]|\bFATAL\b|\b[Ee]rror: ")
_HEX = re.compile(r"0x[0-9a-fA-F]+")
_NUM = re.compile(r"\d+")


def workload_bug(text: str) -> Signature | None:
    """The workload-bug signature in a root-cause line, if any (a cascade line has none)."""
    if CASCADE.search(text):
        return None
    return next((s for s in WORKLOAD if s.pattern.search(text)), None)


def environment_fault(text: str) -> Signature | None:
    """The machine's fault a root-cause line names that only a person clears (storage full), if any."""
    if CASCADE.search(text):
        return None
    return next((s for s in ENVIRONMENT if s.pattern.search(text)), None)


def root_line(lines: Iterable[str]) -> str | None:
    """The first error-looking line that is not a cascade of another failure."""
    return next((ln for ln in lines if _ERRORISH.search(ln) and not CASCADE.search(ln)), None)


@dataclass(frozen=True, slots=True)
class AttemptOutcome:
    number: int
    root: str | None  # the attempt's root-cause line (None: no failure found)
    step: int | None = None  # the last step the attempt reached
    gpu: str | None = None  # the GPU the evidence blames (hardware root cause)
    node: str | None = None  # the node the evidence blames (a node failure)


@dataclass(frozen=True, slots=True)
class Recommendation:
    attempt: int
    verb: str  # restart | restart_without | stop | none
    reason: str
    exit_code: int
    retries_left: int | None = None
    signature: str | None = None  # the workload signature that proved a bug


def _key(text: str | None) -> str:
    return _NUM.sub("<n>", _HEX.sub("<hex>", text or "")).strip()[:200]


def recommend(history: Sequence[AttemptOutcome], max_stalled: int = 3) -> Recommendation:
    """What to do after the last attempt of ``history`` (oldest first)."""
    last = history[-1]
    if last.root is None:
        return Recommendation(last.number, "none", "no failure found", EXIT["none"])
    if sig := workload_bug(last.root):
        return Recommendation(last.number, "stop", f"workload bug ({sig.name}): {sig.why}", EXIT["stop_workload"],
                              0, sig.name)  # fmt: skip
    if env := environment_fault(last.root):
        return Recommendation(
            last.number, "stop", f"{env.name}: {env.why}", EXIT["stop_environment"], 0, env.name
        )
    if len(history) >= 2:
        prev = history[-2]
        if _key(prev.root) == _key(last.root) and prev.step is not None and prev.step == last.step:
            return Recommendation(last.number, "stop", f"the same exception at step {last.step} twice: a bug in the "
                                  "workload, not a fault a restart clears", EXIT["stop_workload"], 0, "repeated")  # fmt: skip
    times = 1  # this root cause, in a row, without a step gained
    for prev, cur in zip(reversed(history[:-1]), reversed(history), strict=False):
        gained = cur.step is not None and (prev.step is None or cur.step > prev.step)
        if _key(prev.root) != _key(cur.root) or gained:
            break
        times += 1
    if times >= max_stalled:
        return Recommendation(last.number, "stop", f"{times} attempts in a row failed the same way without gaining "
                              "a step: the retry budget is spent", EXIT["stop_budget"], 0)  # fmt: skip
    left = max_stalled - times
    if last.gpu or last.node:
        what = " and ".join(
            x for x in (f"GPU {last.gpu}" if last.gpu else "", f"node {last.node}" if last.node else "") if x
        )
        return Recommendation(last.number, "restart_without", f"restart without {what}: the evidence blames it",
                              EXIT["restart_without"], left)  # fmt: skip
    return Recommendation(last.number, "restart", "no proof of a workload bug", EXIT["restart"], left)

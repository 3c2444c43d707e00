"""Chaos plans: which faults a drill injects, when, and into which rank (TOML, validated).

    # examples/chaos/xid-and-kill.toml
    [[fault]]
    kind = "kill"        # SIGKILL rank 1 ...
    rank = 1
    at_s = 20            # ... 20 s after the supervisor started (or: step = 40)

    [[fault]]
    kind = "xid"         # a simulated Xid 79 on the GPU rank 0 uses, and rank 0 dies of it
    rank = 0
    xid = 79
    step = 60

Kinds (docs/chaos.md has the evidence each one produces): kill, stop, hang, nan, slow, xid,
raise, exit, corrupt_checkpoint, wrong_products, throttle. Every fault has exactly one trigger: ``at_s`` (seconds since
start) or ``step`` (when the furthest local rank reached that step); faults that happen inside
the worker (hang, nan, slow, raise, exit, xid) take ``step``. Errors name the bad field.

    >>> plan = parse_plan('[[fault]]\\nkind = "nan"\\nrank = 1\\nstep = 5\\n')
    >>> plan.faults[0].kind.value, plan.faults[0].step
    ('nan', 5)
"""

from __future__ import annotations

import json
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Any

from trainguard.errors import ConfigError
from trainguard.rundir import replica_group


class FaultKind(str, Enum):
    KILL = "kill"  # external: a signal (default SIGKILL) to the rank's process
    STOP = "stop"  # external: SIGSTOP (a hang the process cannot notice)
    HANG = "hang"  # in-process: block forever before the next collective
    NAN = "nan"  # in-process: the rank's loss becomes NaN (`recurs`: every time the step runs)
    SLOW = "slow"  # in-process: delay_s per step for `steps` steps (+ sim clocks stuck low)
    XID = "xid"  # simulated node writes the Xid kernel line; the rank raises the matching CUDA error
    RAISE = "raise"  # in-process: raise `exc`(`message`) (a software crash)
    EXIT = "exit"  # in-process: exit with `code`
    CORRUPT_CHECKPOINT = "corrupt_checkpoint"  # external: flip bytes in the newest checkpoint
    # external, simulated node: `rate` of the elements of the rank's GPU's products come back wrong, the
    # same ones for the same operands (silent data corruption: no telemetry symptom; the
    # pre-flight's SDC round finds it)
    WRONG_PRODUCTS = "wrong_products"
    # external, simulated node: the rank's GPU held at `fraction` of its clock by a software limit (for
    # `duration_s`, else for good): telemetry shows the throttle, no health rule fires, and the
    # rank really computes at that fraction of its peers' speed (a fail-slow GPU)
    THROTTLE = "throttle"

    @property
    def needs_rank(self) -> bool:
        return self is not FaultKind.CORRUPT_CHECKPOINT

    @property
    def in_process(self) -> bool:
        return self in (FaultKind.HANG, FaultKind.NAN, FaultKind.SLOW, FaultKind.RAISE, FaultKind.EXIT)


def torch_cuda_error(text: str, name: str, asynchronous: bool = False) -> str:
    """The message torch raises for a failed CUDA call (c10's ``c10_cuda_check_implementation``):
    the CUDA runtime's error string, where to look its name up, and, for a fault inside a kernel,
    the note that it may be reported late. The kernel driver's words (``NVRM: Xid ... GPU has
    fallen off the bus``) are never in it: they go to the kernel log only."""
    msg = (
        f"CUDA error: {text}\nSearch for `{name}' in "
        "https://docs.nvidia.com/cuda/cuda-runtime-api/group__CUDART__TYPES.html for more information."
    )
    if asynchronous:
        msg += (
            "\nCUDA kernel errors might be asynchronously reported at some other API call, so the "
            "stacktrace below might be incorrect.\nFor debugging consider passing CUDA_LAUNCH_BLOCKING=1"
        )
    return msg + "\nCompile with `TORCH_USE_CUDA_DSA` to enable device-side assertions.\n"


_LAUNCH_FAILURE = torch_cuda_error("unspecified launch failure", "cudaErrorLaunchFailure", True)
_ECC = torch_cuda_error("uncorrectable ECC error encountered", "cudaErrorECCUncorrectable")
_ILLEGAL_ADDRESS = torch_cuda_error(
    "an illegal memory access was encountered", "cudaErrorIllegalAddress", True
)
# The CUDA error a process sees when its GPU suffers this Xid (what PyTorch raises). A GPU that
# falls off the bus (79) fails the kernels in flight: the process sees a launch failure.
XID_CUDA_MESSAGE: dict[int, str] = {
    79: _LAUNCH_FAILURE,
    48: _ECC,
    63: _ECC,
    64: _ECC,
    94: _ECC,
    95: _ECC,
    13: _ILLEGAL_ADDRESS,
    31: _ILLEGAL_ADDRESS,
    43: _ILLEGAL_ADDRESS,
}
DEFAULT_XID_MESSAGE = _LAUNCH_FAILURE

_COMMON = {"kind", "rank", "at_s", "step", "name", "group"}
_FIELDS: dict[FaultKind, dict[str, type | tuple[type, ...]]] = {
    FaultKind.KILL: {"signal": str},
    FaultKind.STOP: {},
    FaultKind.HANG: {},
    FaultKind.NAN: {"recurs": bool},
    FaultKind.SLOW: {"delay_s": (int, float), "steps": int},
    FaultKind.XID: {"xid": int, "message": str},
    FaultKind.RAISE: {"exc": str, "message": str},
    FaultKind.EXIT: {"code": int},
    FaultKind.CORRUPT_CHECKPOINT: {"bytes": int},
    FaultKind.WRONG_PRODUCTS: {"rate": (int, float)},
    FaultKind.THROTTLE: {"fraction": (int, float), "duration_s": (int, float)},
}


@dataclass(frozen=True, slots=True)
class Fault:
    kind: FaultKind
    rank: int | None = None
    at_s: float | None = None
    step: int | None = None
    name: str = ""  # a label for reports (default: "<kind> rank <r>")
    signal: str = "SIGKILL"
    delay_s: float = 1.0
    steps: int = 10
    xid: int = 79
    exc: str = "RuntimeError"
    message: str = ""
    code: int = 1
    bytes: int = 64  # how many bytes corrupt_checkpoint flips
    rate: float = 1.0  # wrong_products: the share of the results of the GPU's products that are wrong
    fraction: float = 0.5  # throttle: the share of its clock the GPU keeps
    duration_s: float | None = None  # throttle: for how long (None: until the GPU is reset)
    # nan: the NaN is the data's, not the machine's: it comes back whenever the step is replayed
    # (after a rollback or a restart), so the replay verdict is "data problem", not SDC
    recurs: bool = False
    group: int | None = None  # --replica-groups: the replica group whose rank it hits (None: every group)

    @property
    def label(self) -> str:
        if self.name:
            return self.name
        what = f"xid {self.xid}" if self.kind is FaultKind.XID else self.kind.value
        return what if self.rank is None else f"{what} rank {self.rank}"

    def cuda_message(self) -> str:
        return self.message or XID_CUDA_MESSAGE.get(self.xid, DEFAULT_XID_MESSAGE)

    def to_dict(self) -> dict[str, Any]:
        """The fields that are not their default (JSON-ready; `from_dict` reads it back)."""
        defaults = Fault(kind=self.kind)
        out: dict[str, Any] = {"kind": self.kind.value}
        for name in Fault.__dataclass_fields__:
            value = getattr(self, name)
            if name != "kind" and value != getattr(defaults, name):
                out[name] = value
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Fault:
        known = {k: v for k, v in data.items() if k in Fault.__dataclass_fields__ and k != "kind"}
        return cls(kind=FaultKind(data["kind"]), **known)


@dataclass(frozen=True, slots=True)
class ChaosPlan:
    faults: tuple[Fault, ...] = ()
    source: str = "<plan>"


def for_group(plan: ChaosPlan, group: int | None) -> ChaosPlan:
    """The faults of a plan that hit one replica group (``group`` None: the plan as it is)."""
    if group is None:
        return plan
    return ChaosPlan(tuple(f for f in plan.faults if f.group is None or f.group == group), plan.source)


def for_this_group(plan: ChaosPlan, environ: Mapping[str, str] | None = None) -> ChaosPlan:
    """The faults that hit this process's replica group (`rundir.replica_group`), else all."""
    group = replica_group(environ)
    return for_group(plan, group[0] if group is not None else None)


def plan_toml(faults: tuple[Fault, ...] | list[Fault]) -> str:
    """A plan file holding these faults (what `parse_plan` reads back to the same faults)."""
    defaults = Fault(kind=FaultKind.KILL)
    lines: list[str] = []
    for f in faults:
        lines.append("[[fault]]")
        lines.append(f'kind = "{f.kind.value}"')
        for name in Fault.__dataclass_fields__:
            value = getattr(f, name)
            if name == "kind" or value is None or (value == getattr(defaults, name) and name != "rank"):
                continue
            if name not in _COMMON and name not in _FIELDS[f.kind]:
                continue
            lines.append(f"{name} = {json.dumps(value)}")
        lines.append("")
    return "\n".join(lines)


def step_triggered(plan: ChaosPlan) -> tuple[int, ...]:
    """Plan positions of the faults that fire at a training step: they need a script that
    reports its steps (the Guard's heartbeats), which a plain torchrun script does not."""
    return tuple(i for i, f in enumerate(plan.faults) if f.step is not None)


def refusal(plan: ChaosPlan, indices: tuple[int, ...]) -> str:
    """Why step-triggered faults are refused in a job without heartbeats, and what to do."""
    named = ", ".join(f"#{i + 1} ({plan.faults[i].label}, step = {plan.faults[i].step})" for i in indices)
    return (
        f"chaos plan {plan.source}: refusing fault(s) {named}: they fire at a training step, and this "
        "job reports none (no heartbeats: the script does not run trainguard's Guard), so they would "
        "never fire. Give external faults (kill, stop, corrupt_checkpoint) a time, at_s = SECONDS; "
        "in-process faults (hang, nan, slow, raise, exit, xid) need the Guard in the script."
    )


def load_plan(path: Path | str) -> ChaosPlan:
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise ConfigError(f"chaos plan {path}: cannot read it ({exc.strerror})") from None
    return parse_plan(text, source=str(path))


def parse_plan(text: str, source: str = "<plan>") -> ChaosPlan:
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"chaos plan {source}: not valid TOML: {exc}") from None
    unknown = set(raw) - {"fault"}
    if unknown:
        raise ConfigError(
            f"chaos plan {source}: unknown top-level key(s) {sorted(unknown)}; use [[fault]] tables"
        )
    faults = raw.get("fault", [])
    if not isinstance(faults, list):
        raise ConfigError(f"chaos plan {source}: 'fault' must be an array of tables ([[fault]])")
    return ChaosPlan(tuple(_fault(f, i + 1, source) for i, f in enumerate(faults)), source)


def _fault(raw: Any, n: int, source: str) -> Fault:
    where = f"chaos plan {source}: fault #{n}"
    if not isinstance(raw, dict):
        raise ConfigError(f"{where}: must be a table")
    kind_text = raw.get("kind")
    try:
        kind = FaultKind(str(kind_text).replace("-", "_"))
    except ValueError:
        kinds = ", ".join(k.value for k in FaultKind)
        raise ConfigError(f"{where}: field 'kind' is {kind_text!r}; expected one of: {kinds}") from None
    where = f"{where} (kind {kind.value!r})"
    allowed = _COMMON | set(_FIELDS[kind])
    for key in raw:
        if key not in allowed:
            raise ConfigError(f"{where}: unknown field {key!r}; allowed: {', '.join(sorted(allowed))}")
    _check(where, raw, "rank", int)
    _check(where, raw, "group", int)
    _check(where, raw, "step", int)
    _check(where, raw, "at_s", (int, float))
    _check(where, raw, "name", str)
    for key, typ in _FIELDS[kind].items():
        _check(where, raw, key, typ)
    if kind.needs_rank and "rank" not in raw:
        raise ConfigError(f"{where}: field 'rank' is required (which rank to hit)")
    if ("at_s" in raw) == ("step" in raw):
        raise ConfigError(f"{where}: give exactly one trigger: field 'at_s' (seconds) or field 'step'")
    if "at_s" in raw and (kind.in_process or kind is FaultKind.XID):
        raise ConfigError(
            f"{where}: field 'at_s' is not allowed here; {kind.value!r} happens inside the worker "
            "(the Guard reads its faults when it starts), so give field 'step'"
        )
    if kind is FaultKind.THROTTLE and not 0 < raw.get("fraction", 0.5) <= 1:
        raise ConfigError(
            f"{where}: field 'fraction' is the share of its clock the GPU keeps: 0 < fraction <= 1"
        )
    for key in ("rank", "group", "step", "at_s", "delay_s", "steps", "xid", "bytes", "duration_s"):
        if key in raw and raw[key] < 0:
            raise ConfigError(f"{where}: field {key!r} must not be negative, got {raw[key]}")
    if kind is FaultKind.KILL and "signal" in raw:
        import signal as _signal

        if not isinstance(getattr(_signal, raw["signal"], None), _signal.Signals):
            raise ConfigError(f"{where}: field 'signal' is {raw['signal']!r}; use a name like 'SIGKILL'")
    values = {k: v for k, v in raw.items() if k != "kind"}
    if "at_s" in values:
        values["at_s"] = float(values["at_s"])
    for key in ("delay_s", "fraction", "duration_s"):
        if key in values:
            values[key] = float(values[key])
    return Fault(kind=kind, **values)


def _check(where: str, raw: dict[str, Any], key: str, typ: type | tuple[type, ...]) -> None:
    if key not in raw:
        return
    value = raw[key]
    ok = isinstance(value, typ) and not (isinstance(value, bool) and typ is not bool)
    if not ok:
        names = " or ".join(t.__name__ for t in (typ if isinstance(typ, tuple) else (typ,)))
        raise ConfigError(f"{where}: field {key!r} must be {names}, got {value!r}")

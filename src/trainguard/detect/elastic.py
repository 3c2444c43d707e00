"""torchelastic's ``Root Cause (first observed failure)`` block -> ``ElasticRootCause``.

torchrun prints it once per failed job; ``parse_elastic_root_cause`` reads the rank, exit code,
signal, host and pid of the rank that failed first out of a run of lines.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

__all__ = ["ElasticRootCause", "parse_elastic_root_cause"]


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

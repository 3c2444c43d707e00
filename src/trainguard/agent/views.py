"""The API's answers as plain JSON-able values, computed from the daemon's snapshot and store.

Pure readers: nothing here writes. ``incidents`` and ``jobs`` read SQLite (the caller runs them
off the event loop); the rest read the in-memory snapshot.
"""

from __future__ import annotations

import dataclasses
import math
from enum import Enum
from typing import TYPE_CHECKING, Any

from trainguard.agent.judge import all_findings
from trainguard.agent.snapshot import CHART_FIELDS
from trainguard.errors import StoreError
from trainguard.records import Finding, Sample

if TYPE_CHECKING:
    from trainguard.agent.daemon import AgentDaemon

Query = dict[str, list[str]]
MAX_PAGE = 500


class NotFound(LookupError):
    pass


class BadQuery(ValueError):
    pass


class Unavailable(RuntimeError):
    pass


def node(d: AgentDaemon, q: Query) -> dict[str, Any]:
    s = d.snapshot
    v = s.verdict
    return {
        "hostname": s.hostname,
        "time": s.time,
        "seq": s.seq,
        "health": v.health.value if v else "unknown",
        "action": v.action.value if v else "none",
        "reasons": _reasons(v) if v else [],
        "gpus": len(s.samples),
        "agent": {
            "health": s.health.value,
            "problems": list(s.problems),
            "started": s.started,
            "interval_s": s.interval_s,
            "tick_s": round(s.tick_s, 6),
            "backend": "sim" if d.config.sim else d.config.backend,
            "scenario": d.config.scenario or None,
        },
    }


def verdict(d: AgentDaemon, q: Query) -> dict[str, Any]:
    """The whole NodeVerdict of the last tick (what a supervisor on this node reads)."""
    from trainguard.agent.verdicts import verdict_to_json

    s = d.snapshot
    return {
        "hostname": s.hostname,
        "seq": s.seq,
        "time": s.time,
        "verdict": verdict_to_json(s.verdict) if s.verdict is not None else None,
    }


def _reasons(v: Any) -> list[str]:
    """The node's reasons, each GPU's prefixed with its index."""
    return [f.reason for f in v.findings] + [f"GPU {g.gpu.index}: {r}" for g in v.gpus for r in g.reasons]


def gpus(d: AgentDaemon, q: Query) -> list[dict[str, Any]]:
    s = d.snapshot
    verdicts = {g.gpu.index: g for g in s.verdict.gpus} if s.verdict else {}
    out = []
    for sample in s.samples:
        gv = verdicts.get(sample.gpu.index)
        out.append(
            {
                **dataclasses.asdict(sample.gpu),
                "health": gv.health.value if gv else "unknown",
                "action": gv.action.value if gv else "none",
                "reasons": gv.reasons if gv else [],
                "reading": reading(sample),
            }
        )
    return out


def gpu(d: AgentDaemon, index: str) -> dict[str, Any]:
    for g in gpus(d, {}):
        if str(g["index"]) == index:
            return g
    raise NotFound(f"no GPU {index} on this node")


def reading(s: Sample) -> dict[str, Any]:
    out = {}
    for f in dataclasses.fields(s):
        if f.name == "gpu":
            continue
        value = getattr(s, f.name)
        if isinstance(value, frozenset):
            value = sorted(t.value for t in value)
        elif isinstance(value, Enum):
            value = value.value
        out[f.name] = value
    return out


def finding(f: Finding) -> dict[str, Any]:
    return {
        "rule": f.rule,
        "gpu": f.gpu,
        "health": f.health.value,
        "action": f.action.value,
        "category": f.category.value if f.category else None,
        "reason": f.reason,
        "time": f.time,
        "evidence": list(f.evidence),
    }


def findings(d: AgentDaemon, q: Query) -> list[dict[str, Any]]:
    v = d.snapshot.verdict
    items = all_findings(v) if v else []
    gpu_filter = arg(q, "gpu")
    health = arg(q, "health")
    return [
        finding(f)
        for f in items
        if (gpu_filter is None or str(f.gpu) == gpu_filter) and (health is None or f.health.value == health)
    ]


def history(d: AgentDaemon, q: Query) -> dict[str, Any]:
    since = arg_float(q, "since", 0.0)
    return {
        "fields": ["time", *CHART_FIELDS],
        "gpus": {str(i): pts for i, pts in d.history.since(since).items()},
        "now": d.snapshot.time,
    }


def incidents(d: AgentDaemon, q: Query) -> dict[str, Any]:
    """Filters: job, node, gpu, root_cause, category, since, until; paging: limit, offset (newest first)."""
    limit = arg_int(q, "limit", 50, 1, MAX_PAGE)
    offset = arg_int(q, "offset", 0, 0, 10**9)
    since, until = arg_float(q, "since", None), arg_float(q, "until", None)
    want = {k: arg(q, k) for k in ("node", "gpu", "root_cause", "category")}
    try:
        items = d.store().incidents(job=arg(q, "job"), since=since)
    except StoreError as exc:
        raise Unavailable(str(exc)) from None
    rows = []
    for inc in reversed(items):
        row = inc.to_dict()
        if until is not None and inc.time > until:
            continue
        if any(v is not None and str(row[k]) != v for k, v in want.items()):
            continue
        rows.append(row)
    page = rows[offset : offset + limit]
    more = offset + limit < len(rows)
    return {
        "items": page,
        "total": len(rows),
        "limit": limit,
        "offset": offset,
        "next_offset": offset + limit if more else None,
    }


def jobs(d: AgentDaemon, q: Query) -> list[dict[str, Any]]:
    """The ``limit`` (default 50) most recently started jobs with their goodput."""
    try:
        store = d.store()
        now = d.snapshot.time
        out = []
        limit = arg_int(q, "limit", 50, 1, MAX_PAGE)
        for j in store.list_jobs()[-limit:]:  # the most recently started
            g = store.goodput(j.job, now=now)
            out.append({**dataclasses.asdict(j), "goodput": g.to_dict()})
        return out
    except StoreError as exc:
        raise Unavailable(str(exc)) from None


def arg(q: Query, name: str) -> str | None:
    values = q.get(name)
    return values[-1] if values else None


def arg_float(q: Query, name: str, default: Any) -> Any:
    text = arg(q, name)
    if text is None or text == "":
        return default
    try:
        value = float(text)
    except ValueError:
        raise BadQuery(f"{name}={text[:40]!r} is not a number") from None
    if not math.isfinite(value):  # inf, nan, 1e400
        raise BadQuery(f"{name}={text[:40]!r} is not a finite number")
    return value


def arg_int(q: Query, name: str, default: int, low: int, high: int) -> int:
    """A whole number in low..high (digits only: no 1e3, inf or nan)."""
    text = arg(q, name)
    if text is None or text == "":
        return default
    if not (text.isascii() and text.isdigit()) or len(text) > 12 or not low <= int(text) <= high:
        raise BadQuery(f"{name} must be a whole number in {low}..{high} (got {text[:40]!r})")
    return int(text)

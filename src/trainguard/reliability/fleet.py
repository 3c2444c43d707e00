"""Fleet analytics from the incident store (`trainguard report --fleet`): MTBF per GPU, node and
root cause, the lemons (GPUs and nodes that fail far more often than the fleet), and the trend.

Pure: `fleet_report(incidents, jobs)` over what the store returns; stdlib only. The observed
time is the union of the jobs' wall-clock spans: every GPU the store knows is taken to have
served for all of it (the store records incidents, not inventories), so per-GPU MTBFs are
upper bounds for GPUs that joined late.

A lemon has at least 2 incidents and a Poisson tail P(X >= k | fleet mean) below 1% divided by
the number of units (Bonferroni: with 1,000 GPUs one of them is unlucky by chance). The trend is
the Laplace test of a Poisson process: U > 1.96 means incidents come faster over time, U < -1.96
slower (reliability growth), at 95%.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Sequence
from typing import Any

from trainguard.incidents.goodput import JobInfo
from trainguard.incidents.incident import Incident

LEMON_ALPHA = 0.01


def poisson_sf(k: int, mean: float) -> float:
    """P(X >= k) for X ~ Poisson(mean)."""
    if k <= 0:
        return 1.0
    term = cdf = math.exp(-mean)
    for i in range(1, k):
        term *= mean / i
        cdf += term
    return max(0.0, 1.0 - cdf)


def laplace_trend(times: Sequence[float], start: float, end: float) -> float | None:
    """Laplace's U for event times in [start, end]; None with fewer than 3 events."""
    n, span = len(times), end - start
    if n < 3 or span <= 0:
        return None
    return (sum(t - start for t in times) / n - span / 2.0) / (span * math.sqrt(1.0 / (12.0 * n)))


def job_spans(jobs: Iterable[JobInfo], incidents: Sequence[Incident]) -> list[tuple[float, float]]:
    """The union of the jobs' wall-clock spans, merged and sorted (a job still running ends at its
    last incident)."""
    spans = []
    for j in jobs:
        end = (
            j.ended
            if j.ended is not None
            else max((i.time for i in incidents if i.job == j.job), default=None)
        )
        if j.started is not None and end is not None and end > j.started:
            spans.append((j.started, end))
    merged: list[tuple[float, float]] = []
    for s, e in sorted(spans):
        if merged and s <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], e))
        else:
            merged.append((s, e))
    return merged


def observed_span(jobs: Iterable[JobInfo], incidents: Sequence[Incident]) -> tuple[float, float, float]:
    """(first, last, seconds covered by at least one job) over the store; with no job spans, the
    incidents' own span."""
    spans = job_spans(jobs, incidents)
    if not spans and len(incidents) >= 2:
        spans = [(min(i.time for i in incidents), max(i.time for i in incidents))]
    if not spans:
        return 0.0, 0.0, 0.0
    return spans[0][0], spans[-1][1], sum(e - s for s, e in spans)


def gpu_key(inc: Incident) -> str | None:
    return None if inc.gpu is None else f"{inc.node or 'local'}/gpu{inc.gpu}"


def _units(counts: Counter[str], population: int, observed_s: float) -> list[dict[str, Any]]:
    n = max(population, len(counts), 1)
    mean = sum(counts.values()) / n
    threshold = LEMON_ALPHA / n
    rows = []
    for unit, k in counts.most_common():
        p = poisson_sf(k, mean)
        rows.append(
            {
                "unit": unit,
                "incidents": k,
                "mtbf_hours": round(observed_s / k / 3600.0, 3) if observed_s else None,
                "p_value": p,
                "lemon": k >= 2 and p < threshold,
            }
        )
    return rows


def fleet_report(incidents: Sequence[Incident], jobs: Sequence[JobInfo], bins: int = 12) -> dict[str, Any]:
    first, last, observed = observed_span(jobs, incidents)
    by_gpu = Counter(k for k in (gpu_key(i) for i in incidents) if k)
    by_node = Counter(i.node for i in incidents if i.node)
    by_cause = Counter(i.root_cause.value for i in incidents)
    world = max((j.world_size or 0 for j in jobs), default=0)
    nodes_seen = {i.node for i in incidents if i.node}
    times = sorted(i.time for i in incidents if first <= i.time <= last) if last > first else []
    width = (last - first) / bins if last > first else 0.0
    histogram: list[dict[str, Any]] = []
    if width > 0:
        for b in range(bins):
            lo = first + b * width
            inside = [i for i in incidents if lo <= i.time < lo + width or (b == bins - 1 and i.time == last)]
            histogram.append(
                {
                    "start": lo,
                    "end": lo + width,
                    "incidents": len(inside),
                    "by_cause": dict(Counter(i.root_cause.value for i in inside)),
                }
            )
    u = laplace_trend(times, first, last)
    trend = "unknown" if u is None else "rising" if u > 1.96 else "falling" if u < -1.96 else "flat"
    gpus = _units(by_gpu, max(world, len(by_gpu)), observed)
    nodes = _units(by_node, len(nodes_seen), observed)
    return {
        "incidents": len(incidents),
        "jobs": len(jobs),
        "first": first,
        "last": last,
        "observed_hours": round(observed / 3600.0, 3),
        "mtbf_hours": round(observed / len(incidents) / 3600.0, 3) if incidents and observed else None,
        "by_root_cause": [
            {
                "root_cause": c,
                "incidents": k,
                "mtbf_hours": round(observed / k / 3600.0, 3) if observed else None,
            }
            for c, k in by_cause.most_common()
        ],
        "gpus": gpus,
        "nodes": nodes,
        "lemon_gpus": [r["unit"] for r in gpus if r["lemon"]],
        "lemon_nodes": [r["unit"] for r in nodes if r["lemon"]],
        "trend": {"laplace_u": None if u is None else round(u, 3), "verdict": trend, "bins": histogram},
    }


def fleet_from_store(store: Any) -> dict[str, Any]:
    return fleet_report(store.incidents(), store.list_jobs())


def render_fleet(r: dict[str, Any], top: int = 10) -> str:
    from trainguard.incidents.report import format_table

    def hours(x: float | None) -> str:
        return "-" if x is None else f"{x:.2f}"

    if not r["incidents"]:
        return f"fleet: no incidents in the store ({r['jobs']} jobs)"
    lines = [
        f"fleet: {r['incidents']} incidents over {r['jobs']} jobs, {r['observed_hours']:.2f} h observed; "
        f"MTBF {hours(r['mtbf_hours'])} h",
        "",
        *format_table(
            [["root cause", "incidents", "MTBF (h)"]]
            + [[c["root_cause"], str(c["incidents"]), hours(c["mtbf_hours"])] for c in r["by_root_cause"]]
        ),
    ]
    for kind in ("gpus", "nodes"):
        rows = r[kind][:top]
        if not rows:
            continue
        lines += [
            "",
            *format_table(
                [[kind[:-1], "incidents", "MTBF (h)", "P(chance)", ""]]
                + [
                    [
                        u["unit"],
                        str(u["incidents"]),
                        hours(u["mtbf_hours"]),
                        f"{u['p_value']:.2g}",
                        "LEMON" if u["lemon"] else "",
                    ]
                    for u in rows
                ]
            ),
        ]
    t = r["trend"]
    lines.append(
        f"\ntrend: {t['verdict']}"
        + (
            f" (Laplace U = {t['laplace_u']:.2f}; |U| > 1.96 is significant at 95%)"
            if t["laplace_u"] is not None
            else ""
        )
    )
    if t["bins"]:
        lines.append("incidents per period: " + " ".join(str(b["incidents"]) for b in t["bins"]))
    return "\n".join(lines)

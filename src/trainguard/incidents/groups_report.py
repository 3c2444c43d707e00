"""A ``trainguard run --replica-groups N`` job in the report: the whole job's figures from its
groups' ledgers (read side only; `report.job_report` calls it).

Each replica group keeps its own ledger in the store under ``<job>.g<i>`` (its own loop records
it, as for any job), and the replica loop adds to it: the group's start (``init``, detail ``group
start``: its launch to the first step seen), its heals (``init``, detail ``heal ...``: from its
workers' restart to reaching the live groups' step) and the steps it discarded (``lost`` intervals, detail ``discarded step S``: a step whose quorum or
all-reduce failed, so its work was thrown away). From those, over the job's wall time:

- ``capacity`` (capacity-weighted ETTR): group-seconds charged to productive steps / (N x wall),
  so a job that ran on 1 of 2 groups for half its time has at most 0.75; None (``n/a``) where a
  group's steps went unmeasured (a script that reports none) or the job had no wall time;
- ``k_of_n_s``: seconds in which exactly k of the N groups made productive steps;
- per group: its ETTR over the job's wall, attempts, interruptions, heals, discarded steps;
- the job's breakdown: each kind's group-seconds / N (so the rows add up to the wall time)::

    >>> from trainguard.incidents.goodput import Interval, IntervalKind as K
    >>> g0 = [Interval("j.g0", K.PRODUCTIVE, 0, 100)]
    >>> g1 = [Interval("j.g1", K.PRODUCTIVE, 0, 40), Interval("j.g1", K.PRODUCTIVE, 60, 100),
    ...       Interval("j.g1", K.INIT, 50, 60, attempt=1, detail="heal from a live peer")]
    >>> s = groups_summary({0: g0, 1: g1}, 0, 100)
    >>> s["capacity"], s["k_of_n_s"], s["groups"][1]["heals_s"]
    (0.9, {'1_of_2': 20.0, '2_of_2': 80.0}, [10.0])
"""

from __future__ import annotations

import re
from dataclasses import fields, replace
from typing import Any

from trainguard.incidents.goodput import (
    GoodputSummary,
    Interval,
    IntervalKind,
    charged_spans,
    goodput,
)
from trainguard.incidents.store import IncidentStore

HEAL = "heal"  # detail prefix of a group's heal interval (kind init)
DISCARDED = "discarded step"  # detail prefix of a discarded step (kind lost)
START = "group start"  # detail of a group's start (kind init): its launch to its first step
LOOP_DETAILS = (HEAL, DISCARDED, START)  # what the replica loop adds to a group's ledger


def group_jobs(store: IncidentStore, job: str) -> dict[int, str]:
    """The job ids of a replica job's groups in the store: {group index: ``<job>.g<i>``}."""
    pattern = re.compile(re.escape(job) + r"\.g(\d+)")
    found = (pattern.fullmatch(j.job) for j in store.list_jobs())
    return {int(m.group(1)): m.group(0) for m in found if m is not None}


def groups_summary(ledgers: dict[int, list[Interval]], start: float, end: float) -> dict[str, Any]:
    """The whole job's figures from each group's intervals over the job's wall [start, end]."""
    n = len(ledgers)
    wall = max(0.0, end - start)
    per: list[dict[str, Any]] = []
    summaries: list[GoodputSummary] = []
    spans: list[list[tuple[float, float]]] = []
    for index, ivs in sorted(ledgers.items()):
        s = goodput(ivs, start, end)
        spans.append(charged_spans(ivs, IntervalKind.PRODUCTIVE, start, end))
        heals = [iv for iv in ivs if iv.kind is IntervalKind.INIT and iv.detail.startswith(HEAL)]
        dropped = [iv for iv in ivs if iv.kind is IntervalKind.LOST and iv.detail.startswith(DISCARDED)]
        # Interruptions and attempts are the group loop's own: a discarded step is lost work,
        # not an interruption, and the replica loop's intervals carry no attempt of the group's.
        own = goodput([iv for iv in ivs if not iv.detail.startswith(LOOP_DETAILS)], start, end)
        s = replace(s, interruptions=own.interruptions, attempts=own.attempts)
        summaries.append(s)
        per.append(
            {
                "group": index,
                "ettr": s.ettr,
                "productive_s": s.productive_s,
                "attempts": s.attempts,
                "interruptions": s.interruptions,
                "heals_s": [round(iv.end - iv.start, 3) for iv in heals],
                "discarded_steps": len(dropped),
                "discarded_s": round(sum(iv.end - iv.start for iv in dropped), 6),
            }
        )
    measured = bool(n and wall) and all(s.ettr is not None for s in summaries)
    return {
        "replica_groups": n,
        "capacity": round(sum(s.productive_s for s in summaries) / (n * wall), 4) if measured else None,
        "k_of_n_s": k_of_n(spans, start, end),
        "heals_s": sorted(h for g in per for h in g["heals_s"]),
        "discarded_steps": sum(g["discarded_steps"] for g in per),
        "groups": per,
        "goodput": _mean_summary(summaries, wall).to_dict() if summaries else None,
    }


def k_of_n(spans: list[list[tuple[float, float]]], start: float, end: float) -> dict[str, float]:
    """Seconds of [start, end] in which exactly k of the N groups were in one of their spans."""
    n = len(spans)
    edges = sorted((t, d) for group in spans for a, b in group for t, d in ((a, 1), (b, -1)))
    k, last = 0, start
    out: dict[int, float] = {}
    for t, d in edges:
        out[k] = out.get(k, 0.0) + max(0.0, t - last)
        k, last = k + d, max(last, t)
    out[k] = out.get(k, 0.0) + max(0.0, end - last)
    return {f"{k}_of_{n}": round(v, 3) for k, v in sorted(out.items()) if v > 0}


def _mean_summary(summaries: list[GoodputSummary], wall: float) -> GoodputSummary:
    """The job's breakdown: each kind's seconds averaged over the groups (a row is the share of
    the job's capacity that went there), ETTR capacity-weighted, interruptions and attempts summed."""
    n = len(summaries)
    seconds = {
        f.name: round(sum(getattr(s, f.name) for s in summaries) / n, 6)
        for f in fields(GoodputSummary)
        if f.name.endswith("_s") and f.name != "wall_s"
    }
    unknown = any(s.ettr is None for s in summaries)
    ettr = None if unknown else (min(1.0, seconds["productive_s"] / wall) if wall > 0 else 0.0)
    return GoodputSummary(
        wall_s=round(wall, 6),
        ettr=ettr,
        interruptions=sum(s.interruptions for s in summaries),
        attempts=sum(s.attempts for s in summaries),
        **seconds,
    )


def groups_section(store: IncidentStore, job: str, start: float, end: float) -> dict[str, Any] | None:
    """The report's ``groups`` section for a replica job (None for any other job), with each
    group's sampled progress and incidents for the timeline plot."""
    jobs = group_jobs(store, job)
    if not jobs:
        return None
    section = groups_summary({i: store.intervals(j) for i, j in jobs.items()}, start, end)
    for g in section["groups"]:
        info = store.get_job(jobs[g["group"]])
        g["job"] = jobs[g["group"]]
        g["status"] = info.status if info else None
        g["progress"] = [(p.time, p.step) for p in store.progress(g["job"])]
        g["incidents"] = [i.to_dict() for i in store.incidents(job=g["job"])]
    return section


def groups_result(report: dict[str, Any]) -> dict[str, Any]:
    """A report's groups in the shape `groups_plot.plot_groups` draws (as the job's result)."""
    section = report["groups"]
    return {
        "job_id": report["job"],
        "capacity": {"capacity": section["capacity"]},
        "groups": [
            {"group": g["group"], "steps": g["progress"], "runs": [{"incidents": g["incidents"]}]}
            for g in section["groups"]
        ],
    }


def render_groups(section: dict[str, Any]) -> list[str]:
    """The report's lines about the groups."""
    n = section["replica_groups"]
    heals = section["heals_s"]
    lines = [
        "",
        f"replica groups ({n})",
        f"  {'capacity':<14} {_percent(section['capacity'])}  (group-seconds stepping / {n} x wall time)",
        "  {:<14} {}".format(
            "k of N",
            ", ".join(f"{k.replace('_of_', ' of ')}: {v:.1f}s" for k, v in section["k_of_n_s"].items())
            or "-",
        ),
        "  {:<14} {}".format(
            "heals",
            f"{len(heals)}, median {sorted(heals)[len(heals) // 2]:.1f}s, longest {max(heals):.1f}s"
            if heals
            else "none",
        ),
        f"  {'discarded':<14} {section['discarded_steps']} steps",
    ]
    for g in section["groups"]:
        ettr = _percent(g["ettr"])
        heal = ", ".join(f"{h:.1f}s" for h in g["heals_s"]) or "-"
        lines.append(
            f"  group {g['group']:<3} {g.get('status') or '-':<10} ETTR {ettr:>6}  "
            f"attempts {g['attempts']}  interruptions {g['interruptions']}  heals {heal}  "
            f"discarded {g['discarded_steps']}"
        )
    return lines


def _percent(value: float | None) -> str:
    """A share as the report prints it; ``n/a`` where it was not measured."""
    return "n/a" if value is None else f"{value:.1%}"

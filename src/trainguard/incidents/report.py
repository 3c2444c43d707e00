"""A job's report: goodput, where the time went, and its incidents, as JSON and as text.

Read side only (`trainguard report JOB` uses it; the demo prints the same text). A
``--replica-groups`` job is reported from its groups' ledgers (`groups_report`)::

    report = job_report(store, "llm-7b")      # a JSON-ready dict
    print(render_report(report))              # the table
"""

from __future__ import annotations

from typing import Any

from trainguard.errors import InputError
from trainguard.incidents.goodput import GoodputSummary
from trainguard.incidents.groups_report import groups_section, render_groups
from trainguard.incidents.incident import Incident
from trainguard.incidents.store import IncidentStore

# The breakdown rows of the report, in reading order: (key in GoodputSummary, label).
BREAKDOWN: tuple[tuple[str, str], ...] = (
    ("productive_s", "productive steps"),
    ("checkpoint_s", "checkpoint stall"),
    ("init_s", "init (start to first step)"),
    ("restart_s", "restart"),
    ("lost_s", "lost work (recomputed)"),
    ("detection_s", "detection delay"),
    ("downtime_s", "downtime"),
    ("unmeasured_s", "running, no steps reported"),
    ("unaccounted_s", "unaccounted"),
)
NO_ETTR = (
    "n/a (no heartbeats: the workers reported no steps, so productive time is unknown; "
    "the Guard reports them, see README 'In your training script')"
)


def job_report(store: IncidentStore, job: str, now: float | None = None) -> dict[str, Any]:
    """Everything `trainguard report` shows about one job. Times are absolute (as recorded);
    each incident also gets ``t_s``, seconds since the job started."""
    info = store.get_job(job)
    incidents = store.incidents(job=job)
    intervals = store.intervals(job)
    progress = store.progress(job)
    if info is None and not incidents and not intervals:
        known = ", ".join(j.job for j in store.list_jobs()) or "none"
        raise InputError(f"no job {job!r} in incident store {store.path} (jobs there: {known})")
    # A running job is measured up to `now`, else up to its last recorded interval (not the
    # machine's clock: simulated jobs run on virtual time).
    summary = store.goodput(job, now=now)
    started = info.started if info and info.started is not None else _first_time(incidents, intervals)
    # A replica job's figures are its groups' (each kept its own ledger): capacity-weighted.
    end = started + summary.wall_s if started is not None else None
    groups = groups_section(store, job, started, end) if started is not None and end is not None else None
    if groups is not None and groups["goodput"] is not None:
        summary = GoodputSummary(**groups["goodput"])
    return {
        "job": job,
        "name": info.name if info else None,
        "command": info.command if info else None,
        "status": info.status if info else None,
        "world_size": info.world_size if info else None,
        "started": started,
        "ended": info.ended if info else None,
        "goodput": summary.to_dict(),
        "incidents": [_incident_entry(i, started) for i in incidents],
        "intervals": [
            {"kind": i.kind.value, "start": i.start, "end": i.end, "attempt": i.attempt, "detail": i.detail}
            for i in intervals
        ],
        "progress": [
            {"time": p.time, "step": p.step, "loss": p.loss, "attempt": p.attempt} for p in progress
        ],
        "last_step": max(
            [p.step for p in progress]
            + [s for g in (groups or {}).get("groups", []) for _, s in g["progress"]],
            default=None,
        ),
        "groups": groups,
    }


def render_report(report: dict[str, Any]) -> str:
    """The report as aligned plain text (no colour: it goes to logs and CI output too)."""
    g = report["goodput"]
    wall = g["wall_s"] or 0.0
    head = f"job {report['job']}"
    if report.get("name"):
        head += f" ({report['name']})"
    lines = [head]
    facts = [
        ("status", report.get("status") or "-"),
        ("world size", report.get("world_size") or "-"),
        ("wall time", _dur(wall)),
        ("last step", report.get("last_step") if report.get("last_step") is not None else "-"),
        ("attempts", g["attempts"]),
        ("interruptions", g["interruptions"]),
        ("ETTR", NO_ETTR if g["ettr"] is None else f"{g['ettr']:.1%}  (productive time / wall time)"),
    ]
    if report.get("groups"):
        facts[-1] = (facts[-1][0], facts[-1][1] + ", capacity-weighted over the replica groups")
    lines += [f"  {k:<14} {v}" for k, v in facts]
    lines += ["", "where the time went"]
    for key, label in BREAKDOWN:
        seconds = g.get(key, 0.0)
        if key in ("unaccounted_s", "unmeasured_s") and seconds < 0.005:
            continue
        share = seconds / wall if wall > 0 else 0.0
        lines.append(f"  {label:<28} {_dur(seconds):>10}  {share:6.1%}  {_bar(share)}".rstrip())
    if report.get("groups"):
        lines += render_groups(report["groups"])
    incidents = report["incidents"]
    lines += ["", f"incidents ({len(incidents)})"]
    if not incidents:
        lines.append("  none")
        return "\n".join(lines)
    rows = [["id", "t", "root cause", "action", "detected by", "detect", "lost", "summary"]]
    for inc in incidents:
        rows.append(
            [
                str(inc["id"]),
                _dur(inc["t_s"]) if inc["t_s"] is not None else "-",
                inc["root_cause"],
                inc["action"],
                inc["detected_by"] or "-",
                _dur(inc["detection_delay_s"]) if inc["detection_delay_s"] is not None else "-",
                _dur(inc["time_lost_s"]) if inc["time_lost_s"] is not None else "-",
                _clip(inc["summary"], 60),
            ]
        )
    lines += ["  " + line for line in format_table(rows)]
    return "\n".join(lines)


def format_table(rows: list[list[str]]) -> list[str]:
    """Left-aligned columns separated by two spaces; the last column is not padded."""
    widths = [max(len(r[c]) for r in rows) for c in range(len(rows[0]))]
    out = []
    for row in rows:
        cells = [cell.ljust(widths[c]) if c < len(row) - 1 else cell for c, cell in enumerate(row)]
        out.append("  ".join(cells).rstrip())
    return out


def _incident_entry(inc: Incident, started: float | None) -> dict[str, Any]:
    entry = inc.to_dict()
    entry["t_s"] = inc.time - started if started is not None else None
    return entry


def _first_time(incidents: list[Incident], intervals: list[Any]) -> float | None:
    times = [i.time for i in incidents] + [i.start for i in intervals]
    return min(times) if times else None


def _dur(seconds: float) -> str:
    """12.3s / 4m05s / 2h03m: short and unambiguous."""
    if seconds < 0:
        return "-" + _dur(-seconds)
    if seconds < 60:
        return f"{seconds:.1f}s"
    if seconds < 3600:
        return f"{int(seconds // 60)}m{int(seconds % 60):02d}s"
    return f"{int(seconds // 3600)}h{int(seconds % 3600 // 60):02d}m"


def _bar(share: float, width: int = 20) -> str:
    return "#" * round(max(0.0, min(1.0, share)) * width)


def _clip(text: str, n: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= n else text[: n - 1] + "…"

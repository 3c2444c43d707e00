"""The timeline of a ``trainguard run --replica-groups`` job, one line per replica group.

`groups_timeline(result)` turns the job's result (``--json``) into plain plot data (pure,
tested): each group's steps against wall time, a marker at each incident of a group (its rank,
GPU and root cause), and the spans in which only k of N groups stepped; `plot_groups(result,
path)` draws it. The healthy groups' lines run on through the failed one's gap: that is the
point of the mode. Needs ``pip install 'trainguard[plot]'``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True, slots=True)
class GroupLine:
    group: int
    x: tuple[float, ...]  # seconds since the job started
    steps: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class GroupMark:
    x: float
    group: int
    label: str


@dataclass(frozen=True, slots=True)
class GroupsTimeline:
    title: str
    lines: tuple[GroupLine, ...]
    marks: tuple[GroupMark, ...]
    x_max: float


def groups_timeline(result: dict[str, Any]) -> GroupsTimeline:
    groups = result.get("groups", [])
    starts = [t for g in groups for t, _ in g.get("steps", [])]
    t0 = min(starts) if starts else 0.0
    lines = tuple(
        GroupLine(g["group"], tuple(t - t0 for t, _ in g["steps"]), tuple(s for _, s in g["steps"]))
        for g in groups
    )
    marks = []
    for g in groups:
        for run in g.get("runs", []):
            for i in run.get("incidents", []):
                what = f"rank {i.get('rank')} GPU {i.get('gpu')}: {i.get('root_cause')}"
                marks.append(GroupMark(i["time"] - t0, g["group"], f"g{g['group']} {what}"))
    x_max = max([x for line in lines for x in line.x] + [m.x for m in marks] + [0.0])
    cap = result.get("capacity", {}).get("capacity")
    title = f"{result.get('job_id', 'job')}: {len(groups)} replica groups" + (
        f", capacity {cap:.2f}" if cap is not None else ""
    )
    return GroupsTimeline(title, lines, tuple(sorted(marks, key=lambda m: m.x)), x_max)


def _broken(line: GroupLine, gap_s: float = 2.0) -> tuple[list[float], list[float]]:
    """The line with a gap where the group was down: its step fell (restarted) or nothing came."""
    x: list[float] = []
    y: list[float] = []
    for i, (t, s) in enumerate(zip(line.x, line.steps, strict=True)):
        if i and (s < line.steps[i - 1] or t - line.x[i - 1] > gap_s):
            x.append(float("nan"))
            y.append(float("nan"))
        x.append(t)
        y.append(float(s))
    return x, y


def plot_groups(result: dict[str, Any], path: str | Path) -> GroupsTimeline:
    """Draw the per-group timeline to a PNG file; returns the data drawn."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise ImportError("the groups plot needs matplotlib: pip install 'trainguard[plot]'") from None
    data = groups_timeline(result)
    fig, ax = plt.subplots(figsize=(11, 4.8))
    try:
        for line in data.lines:
            x, y = _broken(line)
            ax.plot(x, y, lw=1.6, marker=".", ms=3, label=f"group {line.group}")
        for n, m in enumerate(data.marks):
            ax.axvline(m.x, color="#e53935", ls="--", lw=1)
            ax.annotate(
                m.label,
                (m.x, 1.0),
                xycoords=("data", "axes fraction"),
                fontsize=7,
                rotation=90,
                va="top",
                ha="right",
                xytext=(-2 - 9 * (n % 2), -4),
                textcoords="offset points",
            )
        ax.set_xlabel("wall time since the first step (s)")
        ax.set_ylabel("committed step")
        ax.set_title(data.title, loc="left", fontsize=11)
        ax.set_xlim(0, max(data.x_max, 1e-9))
        ax.set_ylim(bottom=0)
        ax.grid(True, alpha=0.3)
        ax.legend(loc="lower right", fontsize=8)
        fig.savefig(path, dpi=110, bbox_inches="tight")
    finally:
        plt.close(fig)
    return data

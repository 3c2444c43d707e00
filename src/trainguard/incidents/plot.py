"""The job timeline plot of `trainguard report JOB --plot PATH.png` (matplotlib, Agg backend).

`timeline(report)` turns a `job_report()` dict into plain plot data (pure, tested);
`plot_timeline(report, path)` draws it: training steps against wall time, one line per attempt;
a dashed red line at each failure labelled with its root cause; restarts, initialisation,
detection delay and downtime shaded; lost work hatched; for a job that balances its ranks
(docs/balance.md), each rank's share of the global batch over time, and a dotted line at each
move; below, a strip showing where every second went; ETTR in the title. Needs
``pip install 'trainguard[plot]'``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# Colours per ledger kind (colour-blind-safe-ish, light enough to read the step line through).
KIND_STYLE: dict[str, tuple[str, str]] = {
    "productive": ("#66bb6a", "productive"),
    "checkpoint": ("#ab47bc", "checkpoint stall"),
    "init": ("#64b5f6", "init"),
    "restart": ("#757575", "restart"),
    "downtime": ("#bdbdbd", "downtime"),
    "detection": ("#ffa726", "detection delay"),
    "lost": ("#e53935", "lost work"),
    "unmeasured": ("#fff59d", "running, no steps reported"),
}
# Shaded on the step axes; checkpoint stalls are many and thin, so they only show in the strip.
SHADED = ("init", "restart", "downtime", "detection", "lost")
BALANCE_ACTIONS = ("rebalance", "restore_shares")  # moves of a balancing job: not failures
_MAX_NAMED = 12  # more failures than this: label them by incident id only


@dataclass(frozen=True, slots=True)
class Series:
    attempt: int
    x: tuple[float, ...]
    steps: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class Marker:
    x: float
    label: str
    incident_id: int | None = None


@dataclass(frozen=True, slots=True)
class Span:
    kind: str
    x0: float
    x1: float


@dataclass(frozen=True, slots=True)
class Timeline:
    title: str
    unit: str  # x-axis unit: "s", "min" or "h" since the job started
    series: tuple[Series, ...] = ()
    failures: tuple[Marker, ...] = ()
    spans: tuple[Span, ...] = ()
    x_max: float = 0.0
    kinds: tuple[str, ...] = field(default=())  # kinds present, for the legend
    moves: tuple[Marker, ...] = ()  # the ranks moved their shares (not failures)
    shares: tuple[tuple[float, tuple[int, ...]], ...] = ()  # (x, each rank's share) from x on
    gpus: tuple[int | None, ...] = ()  # each rank's GPU, for the shares' legend


def timeline(report: dict[str, Any]) -> Timeline:
    """Plot data from a `job_report()` dict; x is time since the job started, in `unit`."""
    g = report["goodput"]
    origin = report.get("started") or 0.0
    wall = float(g["wall_s"] or 0.0)
    unit, scale = ("h", 3600.0) if wall >= 3 * 3600 else ("min", 60.0) if wall >= 300 else ("s", 1.0)

    def x(t: float) -> float:
        return (t - origin) / scale

    by_attempt: dict[int, list[tuple[float, int]]] = {}
    for p in report["progress"]:
        by_attempt.setdefault(int(p["attempt"]), []).append((x(p["time"]), int(p["step"])))
    series = tuple(
        Series(a, tuple(px for px, _ in pts), tuple(s for _, s in pts))
        for a, pts in sorted(by_attempt.items())
    )
    failures = tuple(
        Marker(
            x(inc["started"] if inc.get("started") is not None else inc["time"]), inc["root_cause"], inc["id"]
        )
        for inc in report["incidents"]
        if inc["action"] not in BALANCE_ACTIONS
    )
    moves = tuple(
        Marker(x(inc["time"]), inc["action"], inc["id"])
        for inc in report["incidents"]
        if inc["action"] in BALANCE_ACTIONS
    )
    shares, gpus = _shares(report["incidents"], x)
    spans = tuple(
        Span(iv["kind"], x(iv["start"]), x(iv["end"]))
        for iv in report["intervals"]
        if iv["kind"] in KIND_STYLE and iv["end"] > iv["start"]
    )
    kinds = tuple(k for k in KIND_STYLE if any(s.kind == k for s in spans))
    n_int, n_inc = g["interruptions"], len(report["incidents"])
    ettr = "n/a (no heartbeats)" if g["ettr"] is None else f"{g['ettr']:.1%}"
    title = f"{report['job']}: ETTR {ettr}, {n_int} interruption{'s' if n_int != 1 else ''}"
    if n_inc != n_int:
        title += f", {n_inc} incident{'s' if n_inc != 1 else ''}"
    # The wall window comes from the ledger; never cut off progress or a failure recorded past it.
    x_max = max([wall / scale, *(px for srs in series for px in srs.x), *(m.x for m in failures)])
    return Timeline(title, unit, series, failures, spans, x_max, kinds, moves, shares, gpus)


def _shares(
    incidents: list[dict[str, Any]], x: Any
) -> tuple[tuple[tuple[float, tuple[int, ...]], ...], tuple[int | None, ...]]:
    """Each rank's share over time, from the balancing moves stored in the incidents' evidence."""
    points: list[tuple[float, tuple[int, ...]]] = []
    gpus: tuple[int | None, ...] = ()
    for inc in sorted(incidents, key=lambda i: i["time"]):
        move = next((e["balance"] for e in inc["evidence"] if isinstance(e, dict) and "balance" in e), None)
        if not isinstance(move, dict) or not move.get("shares") or not move.get("old_shares"):
            continue
        if not points:
            points.append((0.0, tuple(move["old_shares"])))
        if move["shares"] != move["old_shares"]:
            points.append((x(inc["time"]), tuple(move["shares"])))
        gpus = tuple(move.get("gpus") or ())
    return tuple(points), gpus


def plot_timeline(report: dict[str, Any], path: str | Path) -> Timeline:
    """Draw the timeline of a job report to a PNG file; returns the data drawn."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.patches import Patch
    except ImportError:
        raise ImportError("the report plot needs matplotlib: pip install 'trainguard[plot]'") from None

    data = timeline(report)
    if data.shares:
        fig, (ax, held, strip) = plt.subplots(
            3, 1, figsize=(11, 7.2), sharex=True, gridspec_kw={"height_ratios": [6, 2.4, 1], "hspace": 0.08}
        )
    else:
        fig, (ax, strip) = plt.subplots(
            2, 1, figsize=(11, 5.6), sharex=True, gridspec_kw={"height_ratios": [6, 1], "hspace": 0.08}
        )
    try:
        if data.shares:
            _draw_shares(held, data)
        for m in data.moves:
            ax.axvline(m.x, color="#616161", ls=":", lw=1.0, zorder=2)
        for span in data.spans:
            if span.kind in SHADED:
                color = KIND_STYLE[span.kind][0]
                hatch = "///" if span.kind == "lost" else None
                ax.axvspan(span.x0, span.x1, color=color, alpha=0.25, hatch=hatch, lw=0, zorder=0)
        for s in data.series:
            ax.plot(s.x, s.steps, lw=1.8, marker="." if len(s.x) < 60 else None, label=f"attempt {s.attempt}")
        ax.set_ylim(bottom=0)
        _label_failures(ax, data)
        ax.set_ylabel("training step")
        ax.set_title(data.title, fontsize=12, loc="left", pad=10 + 12 * _label_rows(data))
        ax.grid(True, alpha=0.3)
        if data.series:
            ax.legend(loc="upper left", fontsize=8, ncol=min(4, len(data.series)), framealpha=0.9)
        for span in data.spans:
            strip.broken_barh([(span.x0, span.x1 - span.x0)], (0, 1), color=KIND_STYLE[span.kind][0])
        strip.set_yticks([])
        strip.set_ylabel("time", rotation=0, ha="right", va="center")
        strip.set_xlabel(f"wall time since job start ({data.unit})")
        strip.set_xlim(0, max(data.x_max, 1e-9))
        handles = [Patch(color=KIND_STYLE[k][0], label=KIND_STYLE[k][1]) for k in data.kinds]
        if handles:
            strip.legend(
                handles=handles,
                loc="upper center",
                bbox_to_anchor=(0.5, -0.9),
                ncol=len(handles),
                fontsize=8,
                frameon=False,
            )
        fig.savefig(path, dpi=110, bbox_inches="tight")
    finally:
        plt.close(fig)
    return data


def _draw_shares(ax: Any, data: Timeline) -> None:
    """Each rank's share of the global batch, stacked, as a step function of time."""
    xs = [x for x, _ in data.shares] + [data.x_max]
    world = len(data.shares[0][1])
    bottom = [0.0] * len(xs)
    for r in range(world):
        ys = [float(s[r]) for _, s in data.shares] + [float(data.shares[-1][1][r])]
        top = [b + y for b, y in zip(bottom, ys, strict=True)]
        gpu = data.gpus[r] if r < len(data.gpus) else None
        label = f"rank {r}" + (f" (GPU {gpu})" if gpu is not None else "")
        ax.fill_between(xs, bottom, top, step="post", alpha=0.75, lw=0.5, edgecolor="white", label=label)
        bottom = top
    ax.set_ylim(0, max(bottom) if bottom else 1)
    ax.set_ylabel("share of\nthe batch")
    ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8, frameon=False)
    for m in data.moves:
        ax.axvline(m.x, color="#616161", ls=":", lw=1.0)


def _label_rows(data: Timeline) -> int:
    return 1 + (len(data.failures) > 1) + (len(data.failures) > 4) if data.failures else 0


def _label_failures(ax: Any, data: Timeline) -> None:
    """A dashed line per failure, labelled above the axes (rows alternate so neighbours do not
    collide, and the labels never cover the step lines)."""
    rows = _label_rows(data)
    for n, m in enumerate(sorted(data.failures, key=lambda f: f.x)):
        ax.axvline(m.x, color="#c62828", ls="--", lw=1.3, zorder=3)
        ident = f"#{m.incident_id}" if m.incident_id is not None else ""
        label = ident if len(data.failures) > _MAX_NAMED and ident else f"{ident} {m.label}".strip()
        ax.annotate(
            label,
            xy=(m.x, 1.0),
            xycoords=("data", "axes fraction"),
            xytext=(0, 3 + 12 * (n % rows)),
            textcoords="offset points",
            ha="right" if m.x > 0.85 * data.x_max else "left" if m.x < 0.15 * data.x_max else "center",
            va="bottom",
            fontsize=8.5,
            color="#b71c1c",
            annotation_clip=False,
        )

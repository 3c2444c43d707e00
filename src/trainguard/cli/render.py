"""Terminal rendering of readings and verdicts, shared by `check`, `monitor` and `demo`.

The plain-text verdict table needs nothing beyond the stdlib (so `trainguard check` runs on a bare
node in a Slurm prolog); the live tables use rich, imported inside the functions that draw them.
"""

from __future__ import annotations

import os
import sys
from typing import Any, TextIO

from trainguard.actions import Advice
from trainguard.palette import ANSI, STYLE
from trainguard.records import GpuVerdict, Health, NodeVerdict, Sample, Throttle

_THROTTLE_SHORT = {
    Throttle.HW_SLOWDOWN: "HWS",
    Throttle.HW_THERMAL: "HWT",
    Throttle.HW_POWER_BRAKE: "PB",
    Throttle.SW_POWER_CAP: "PC",
    Throttle.SW_THERMAL: "SWT",
}
THROTTLE_LEGEND = "throttle: HWS hw slowdown, HWT hw thermal, PB power brake, PC power cap, SWT sw thermal"


def use_color(stream: TextIO) -> bool:
    return stream.isatty() and "NO_COLOR" not in os.environ


def paint(text: str, health: Health, color: bool) -> str:
    return f"\x1b[{ANSI[health]}m{text}\x1b[0m" if color else text


def action_text(action: Advice) -> str:
    return "-" if action is Advice.NONE else action.value


def verdict_text(v: NodeVerdict, color: bool | None = None, stream: TextIO | None = None) -> str:
    """The human output of `trainguard check`: one row per GPU, node-scoped findings, the verdict."""
    stream = stream or sys.stdout
    color = use_color(stream) if color is None else color
    rows = [("GPU", "VERDICT", "ACTION", "REASONS")]
    healths: list[Health | None] = [None]
    for g in v.gpus:
        rows.append((str(g.gpu.index), g.health.value, action_text(g.action), "; ".join(g.reasons) or "-"))
        healths.append(g.health)
    for f in v.findings:
        rows.append(("node", f.health.value, action_text(f.action), f.reason))
        healths.append(f.health)
    widths = [max(len(r[i]) for r in rows) for i in range(3)]
    lines = []
    for row, health in zip(rows, healths, strict=True):
        cells = [row[0].ljust(widths[0]), row[1].ljust(widths[1]), row[2].ljust(widths[2])]
        if health is not None:
            cells[1] = paint(cells[1], health, color)
        lines.append("  ".join([*cells, row[3]]).rstrip())
    bad = sum(1 for g in v.gpus if g.health is not Health.OK)
    summary = f"node: {paint(v.health.value.upper(), v.health, color)}"
    if v.action is not Advice.NONE:
        summary += f" (action: {v.action.value})"
    summary += f", {bad} of {len(v.gpus)} GPUs need attention" if bad else f", {len(v.gpus)} GPUs checked"
    return "\n".join([*lines, summary])


def _num(x: float | int | None, fmt: str = "{:.0f}") -> str:
    return "?" if x is None else fmt.format(x)


def _pair(a: float | int | None, b: float | int | None, fmt: str = "{:.0f}") -> str:
    return f"{_num(a, fmt)}/{_num(b, fmt)}"


def reading_cells(s: Sample | None) -> list[str]:
    """The reading columns of the monitor table for one GPU (``?``: could not read)."""
    if s is None or s.lost:
        return ["-"] * len(COLUMNS)
    mib = 1024.0
    mem = _pair(
        None if s.mem_used_mib is None else s.mem_used_mib / mib,
        None if s.mem_total_mib is None else s.mem_total_mib / mib,
    )
    remap = (
        "?" if s.remap_pending is None else "FAIL" if s.remap_failure else "pend" if s.remap_pending else "-"
    )
    pcie = f"G{_num(s.pcie_gen)}x{_num(s.pcie_width)} r{_num(s.pcie_replay)}"
    nvl = "-" if not s.nvlink_total else f"{_pair(s.nvlink_up, s.nvlink_total)} c{_num(s.nvlink_crc_errors)}"
    throttle = "?" if s.throttle is None else ",".join(sorted(_THROTTLE_SHORT[t] for t in s.throttle)) or "-"
    return [
        f"{_num(s.temperature_c)}°C",
        _pair(s.power_w, s.power_limit_w),
        _pair(s.sm_clock_mhz, s.sm_clock_max_mhz),
        f"{_num(s.util_gpu_pct)}%",
        mem,
        _pair(s.ecc_sbe_volatile, s.ecc_dbe_volatile),
        remap,
        pcie,
        nvl,
        throttle,
    ]


# Reading columns with the width they need; on a narrow terminal the first of DROP_ORDER go first.
COLUMNS = {
    "temp": 6,
    "power W": 9,
    "SM MHz": 11,
    "util": 6,
    "mem GiB": 9,
    "ECC": 5,
    "remap": 7,
    "PCIe": 13,
    "NVLink": 14,
    "throttle": 13,
}
DROP_ORDER = ("mem GiB", "power W", "util", "NVLink", "ECC")
FIXED = 17  # the GPU and verdict columns and the edges (widths include cell padding)
WIDE = 150  # terminal columns from which the reasons fit in the table


def headline(g: GpuVerdict) -> str:
    """The worst reason of a GPU, and how many more there are (the full list is in `check`)."""
    reasons = g.reasons
    if not reasons:
        return ""
    return reasons[0] + (f" (+{len(reasons) - 1} more)" if len(reasons) > 1 else "")


def visible_columns(width: int) -> list[str]:
    """The reading columns that fit ``width`` terminal columns, dropping the least vital first."""
    shown = list(COLUMNS)
    for name in DROP_ORDER:
        if FIXED + sum(COLUMNS[c] for c in shown) <= width:
            break
        shown.remove(name)
    return shown


def gpu_table(
    samples: list[Sample], verdict: NodeVerdict | None, title: str | None = None, width: int = 200
) -> Any:
    """The live view of `trainguard monitor`: every reading, the verdict and its reasons.

    Reasons get their own column on a wide terminal (``width`` >= WIDE) and lines beneath the
    table otherwise, one per GPU that is not ok, so the readings never get squeezed.
    """
    from rich import box
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    inline = width >= WIDE
    shown = visible_columns(width)
    keep = [i for i, name in enumerate(COLUMNS) if name in shown]
    table = Table(
        title=title, header_style="bold", box=box.SIMPLE_HEAD, padding=(0, 1), collapse_padding=True
    )
    table.add_column("GPU", no_wrap=True)
    for name in shown:
        table.add_column(name, justify="left" if name == "throttle" else "right", no_wrap=True)
    table.add_column("verdict", no_wrap=True)
    if inline:  # the column that gives way; its cells never wrap
        table.add_column("reasons", min_width=20)
    by_index: dict[int, GpuVerdict] = {g.gpu.index: g for g in verdict.gpus} if verdict else {}
    below: list[Text] = []
    for s in samples:
        g = by_index.get(s.gpu.index)
        health = g.health if g else Health.UNKNOWN
        style = STYLE[health]
        reasons = headline(g) if g else ""
        if s.lost and not reasons:
            reasons = s.error or "lost"
        readings = reading_cells(s)
        cells: list[Any] = [str(s.gpu.index), *(readings[i] for i in keep), Text(health.value, style=style)]
        if inline:
            cells.append(Text(reasons, style=style, no_wrap=True, overflow="ellipsis"))
        elif reasons and health is not Health.OK:
            below.append(
                Text(f"GPU {s.gpu.index}: {reasons}", style=style, no_wrap=True, overflow="ellipsis")
            )
        table.add_row(*cells)
    if verdict is not None:
        for f in verdict.findings:
            line = Text(f"node: {f.reason}", style=STYLE[f.health], no_wrap=True, overflow="ellipsis")
            if inline:
                table.add_row("node", *[""] * len(shown), Text(f.health.value, style=STYLE[f.health]), line)
            else:
                below.append(line)
    return Group(table, *below)


def node_line(verdict: NodeVerdict | None) -> Any:
    """One rich Text line with the node verdict and action."""
    from rich.text import Text

    if verdict is None:
        return Text("node: waiting for the first reading", style="dim")
    text = Text("node: ")
    text.append(verdict.health.value.upper(), style=STYLE[verdict.health])
    if verdict.action is not Advice.NONE:
        text.append(f"  action: {verdict.action.value}")
    return text

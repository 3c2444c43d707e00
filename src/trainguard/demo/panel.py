"""The rich panel of the demo's live view (imports rich; `live.RichDisplay` calls it).

Laid out for 80-100 columns: every line is no-wrap with an ellipsis, the incident table gives
its last column (the summary) whatever width is left.
"""

from __future__ import annotations

import time
from typing import Any

from rich import box
from rich.console import Group
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from trainguard.demo.live import DemoState, clock, gpu_health, sparkline
from trainguard.palette import STYLE
from trainguard.records import Health

_PHASE = {
    "reference": ("fault-free reference run", "cyan"),
    "chaos": ("training under chaos", "bold"),
    "report": ("writing the report", "green"),
    "starting": ("starting", "dim"),
}
_FAULT_MARK = {"injected": ("●", "bold yellow"), "detected": ("✓", "green")}
_CAUSE_STYLE = {"unknown": "magenta"}
_ACTION_STYLE = {"exclude_gpu": "bold red", "restart": "yellow", "rollback": "yellow", "continue": "green"}


def panel(state: DemoState, width: int) -> Any:
    inner = max(40, min(width, 120) - 4)
    parts: list[Any] = [_progress(state, inner), _loss(state, inner), _attempt(state)]
    if state.phase in ("chaos", "report"):
        parts += [_gpus(state), *_gpu_reasons(state), _faults(state), _incidents(state)]
    parts += [Text(line, style="dim", no_wrap=True, overflow="ellipsis") for line in state.log]
    title = "[bold]trainguard demo[/]: simulated 4-GPU node, DDP digits CNN on CPU/gloo"
    elapsed = clock(time.time() - state.started)
    return Panel(
        Group(*parts), title=title, subtitle=f"elapsed {elapsed}", width=min(width, 120), box=box.ROUNDED
    )


def _progress(state: DemoState, inner: int) -> Text:
    label, style = _PHASE.get(state.phase, (state.phase, ""))
    step = state.step if state.step is not None else 0
    total = max(1, state.total_steps)
    frac = min(1.0, (step + 1) / total) if state.step is not None else 0.0
    head = f"{label:<25} step {step:>4}/{total:<4} "
    bar_w = max(10, min(40, inner - len(head) - 6))
    filled = round(frac * bar_w)
    text = Text(no_wrap=True, overflow="ellipsis")
    text.append(head[:25], style=style)
    text.append(head[25:])
    text.append("█" * filled, style="green")
    text.append("░" * (bar_w - filled), style="dim")
    text.append(f" {frac:4.0%}")
    return text


def _loss(state: DemoState, inner: int) -> Text:
    text = Text(no_wrap=True, overflow="ellipsis")
    if state.waiting_since is not None:
        waited = time.time() - state.waiting_since
        what = "loading the checkpoint, " if state.resume_step else ""
        text.append(f"starting {state.world_size} workers ({waited:.0f}s): ", style="yellow")
        text.append(f"python + torch import, gloo rendezvous, {what}first step", style="dim")
        return text
    if state.loss is None:
        text.append("loss      -", style="dim")
        return text
    text.append(f"loss {state.loss:6.3f}  ")
    text.append(sparkline(list(state.losses))[-max(8, inner - 14) :], style="cyan")
    return text


def _attempt(state: DemoState) -> Text:
    text = Text(no_wrap=True, overflow="ellipsis")
    if not state.world_size:
        text.append("launching 4 ranks through torch elastic (gloo rendezvous)...", style="dim")
        return text
    text.append(f"attempt {state.attempt}", style="bold")
    text.append(f"  world size {state.world_size}")
    text.append(f"  GPUs {','.join(map(str, state.gpus))}")
    if state.resume_step:
        text.append(f"  resumed from checkpoint of step {state.resume_step}", style="dim")
    return text


def _gpus(state: DemoState) -> Text:
    text = Text("GPUs  ", no_wrap=True, overflow="ellipsis")
    for gpu in range(state.nproc):
        health, _ = gpu_health(state.verdict, gpu)
        text.append(f"{gpu}:", style="bold")
        text.append(health.value if state.verdict is not None else "-", style=STYLE[health])
        if state.gpus and gpu not in state.gpus:
            text.append(" (excluded)", style="red")
        text.append("   ")
    return text


def _gpu_reasons(state: DemoState) -> list[Text]:
    out = []
    for gpu in range(state.nproc):
        health, reason = gpu_health(state.verdict, gpu)
        if health in (Health.DEGRADED, Health.FAILED) and reason:
            out.append(Text(f"  GPU {gpu}: {reason}", style=STYLE[health], no_wrap=True, overflow="ellipsis"))
    return out


def _faults(state: DemoState) -> Text:
    text = Text(no_wrap=True, overflow="ellipsis")
    for n, (fid, status) in enumerate(state.faults.items()):
        short = state.fault_labels.get(fid, "")
        mark, style = _FAULT_MARK.get(status, ("○", "dim"))
        text.append(("  " if n else "") + f"{mark} {fid} {short}", style=style)
    return text


def _incidents(state: DemoState) -> Any:
    table = Table(
        box=box.SIMPLE_HEAD,
        padding=(0, 1),
        collapse_padding=True,
        expand=True,
        header_style="bold",
        show_edge=False,
    )
    table.add_column("t", justify="right", no_wrap=True, width=5)
    table.add_column("seen by", no_wrap=True, max_width=10)
    table.add_column("root cause", no_wrap=True, max_width=22)
    table.add_column("action", no_wrap=True, max_width=11)
    table.add_column("what happened", no_wrap=True, overflow="ellipsis", ratio=1, min_width=16)
    rows = state.incidents[-6:]
    if not rows:
        table.add_row("", Text("no incidents yet", style="dim"), "", "", "")
    for r in rows:
        table.add_row(
            clock(r.t),
            r.detected_by,
            Text(r.root_cause, style=_CAUSE_STYLE.get(r.root_cause, "")),
            Text(r.action, style=_ACTION_STYLE.get(r.action, "")),
            r.summary,
        )
    return table

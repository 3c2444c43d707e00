"""`trainguard demo`: the main demo, and `trainguard demo --node`, the node-health demo.

    trainguard demo                      # DDP training on a simulated 4-GPU node under chaos (trainguard.demo)
    trainguard demo --node --speed 4     # a simulated 8-GPU node walks through the `tour` scenario, live

The node demo: faults are scripted on a simulated fleet (the same evidence real ones leave: NVML-shaped readings
and kernel-log lines); the agent turns them into verdicts. The monitor table shows every GPU, an
incident log beneath it records each verdict change, and a summary at the end pairs every fault
with the verdict it produced and how long detection took.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass
from typing import Any

from trainguard.actions import Advice
from trainguard.cli.interrupt import quits_on_ctrl_c
from trainguard.records import GpuVerdict, Health, NodeVerdict

SCENARIO = "tour"
LOG_ROWS = 12


def register(subparsers: Any) -> None:
    from trainguard import demo

    p = subparsers.add_parser(
        "demo",
        help="live demo: training kept alive through injected faults on a simulated GPU node",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    demo.add_arguments(p)
    p.add_argument("--node", action="store_true", help="the node-health demo instead (no training)")
    p.add_argument("--seed", type=int, default=0, metavar="S", help="seed of the simulated node (--node)")
    # --speed defaults differ per demo: 1x for training, 2x for the node tour.
    p.set_defaults(func=run, speed=None)


@quits_on_ctrl_c  # also when started in the background with SIGINT ignored (see cli.interrupt)
def run(args: argparse.Namespace) -> int:
    if args.node:
        return run_node_demo(speed=args.speed or 2.0, seed=args.seed)
    from trainguard import demo

    args.speed = args.speed or 1.0
    return demo.run(args)


@dataclass(frozen=True, slots=True)
class LogEntry:
    """One line of the incident log: a GPU's verdict changed or a new reason appeared."""

    t: float
    gpu: int | None
    old: Health
    new: Health
    reason: str
    action: Advice


def _key(rule: str, reason: str) -> str:
    # Rates re-word their reason every tick; Xids differ by code: key on what is new, not on numbers.
    return reason.split(":", 1)[0] if rule in ("xid", "sxid") else rule


def changes(prev: NodeVerdict | None, cur: NodeVerdict, t: float) -> list[LogEntry]:
    """Incident-log entries between two verdicts: one per GPU whose verdict or reasons changed."""
    before: dict[int, GpuVerdict] = {g.gpu.index: g for g in prev.gpus} if prev else {}
    out = []
    for g in cur.gpus:
        old = before.get(g.gpu.index)
        old_health = old.health if old else Health.OK
        seen = {_key(f.rule, f.reason) for f in old.findings} if old else set()
        new = [f for f in g.findings if _key(f.rule, f.reason) not in seen and f.health is not Health.OK]
        if new:
            more = f" (+{len(new) - 1} more)" if len(new) > 1 else ""
            out.append(LogEntry(t, g.gpu.index, old_health, g.health, new[0].reason + more, g.action))
        elif g.health is not old_health:
            reason = g.reasons[0] if g.reasons else "cleared"
            out.append(LogEntry(t, g.gpu.index, old_health, g.health, reason, g.action))
    return out


def run_node_demo(speed: float = 2.0, console: Any = None, seed: int = 0) -> int:
    """Play the node demo; returns 0 when the node and every GPU reached the verdict the scenario
    expects (`Scenario.mismatches`)."""
    from rich.console import Console, Group
    from rich.live import Live

    from trainguard.agent import Agent, open_node
    from trainguard.cli.render import gpu_table, node_line
    from trainguard.clock import VirtualClock
    from trainguard.telemetry.sim import SCENARIOS

    console = console or Console()
    speed = max(speed, 0.01)
    spec = SCENARIOS[SCENARIO]
    log: list[LogEntry] = []
    clock = VirtualClock()
    with open_node("sim", n_gpus=8, seed=seed, scenario=spec.name, clock=clock) as node:
        fleet = node.sim
        assert fleet is not None
        faults = fleet.pending()
        title = f"trainguard demo: simulated 8-GPU node, scenario '{spec.name}' at {speed:g}x"
        with Agent.of(node, clock=clock) as agent:
            prev = agent.tick()

            def frame() -> Group:
                table = gpu_table(agent.samples, agent.verdict, title=title, width=console.width)
                return Group(
                    table,
                    node_line(agent.verdict),
                    _log_table(log),
                    _progress(fleet.elapsed, spec.duration_s),
                )

            try:
                with Live(frame(), console=console, refresh_per_second=8, transient=False) as live:
                    while fleet.elapsed < spec.duration_s + 2:
                        time.sleep(1.0 / speed)
                        clock.advance(1.0)
                        cur = agent.tick()
                        log.extend(changes(prev, cur, fleet.elapsed))
                        prev = cur
                        live.update(frame())
            except KeyboardInterrupt:
                console.print("[dim]demo interrupted[/dim]")
                return 0
            final = agent.verdict
    console.print()
    console.print(_summary(faults, log, final))
    # The self-test: the node's verdict and each GPU's (a faulty GPU missed, or a healthy one
    # flagged, fails it as much as a wrong node verdict).
    wrong = spec.mismatches(final) if final is not None else ["no verdict"]
    verdict = final.health.value if final else "none"
    node_ok = final is not None and final.health is spec.expected
    console.print(
        f"node verdict: {verdict} (expected {spec.expected.value})" + ("" if node_ok else "  MISMATCH")
    )
    if wrong:
        console.print("self-test FAILED:\n" + "\n".join(f"  - {line}" for line in wrong))
    else:
        console.print(f"every GPU's verdict as expected ({len(final.gpus) if final else 0} GPUs)")
    return 0 if not wrong else 1


def _log_table(log: list[LogEntry]) -> Any:
    from rich import box
    from rich.table import Table
    from rich.text import Text

    from trainguard.palette import STYLE

    table = Table(title="incident log", title_justify="left", box=box.SIMPLE_HEAD, collapse_padding=True)
    for name in ("t", "GPU", "verdict", "action"):
        table.add_column(name, no_wrap=True, justify="right" if name == "t" else "left")
    table.add_column("reason", min_width=20)  # gives way on a narrow terminal; cells never wrap
    for e in log[-LOG_ROWS:]:
        change = Text(e.new.value, style=STYLE[e.new])
        if e.old is not e.new:
            change = Text(e.old.value, style=STYLE[e.old]) + Text(" -> ") + change
        reason = Text(e.reason, no_wrap=True, overflow="ellipsis")
        table.add_row(f"{e.t:.0f}s", "node" if e.gpu is None else str(e.gpu), change, e.action.value, reason)
    if not log:
        table.add_row("", "", Text("no incidents yet", style="dim"), "", "")
    return table


def _progress(elapsed: float, duration: float) -> Any:
    from rich.text import Text

    from trainguard.cli.render import THROTTLE_LEGEND

    return Text(f"t={elapsed:.0f}s of {duration:.0f}s  (Ctrl-C to stop)   {THROTTLE_LEGEND}", style="dim")


def _fault_name(fault: Any) -> str:
    name = type(fault).__name__
    if name == "Xid":
        return f"Xid {fault.code}"
    return {
        "FallOffBus": "fell off the bus",
        "DoubleBitEcc": "double-bit ECC",
        "RowRemapFailure": "row-remap failure",
        "Uncontained": "uncontained error",
        "RecoveryActionChange": f"Xid 154 {getattr(getattr(fault, 'action', None), 'value', '')}",
        "ThermalRunaway": "thermal runaway",
        "PowerBrake": "power brake",
        "PcieReplayStorm": "PCIe replay storm",
        "PcieDowntrain": "PCIe downtrain",
        "NvlinkCrcStorm": "NVLink CRC storm",
        "NvlinkDown": "NVLink down",
        "Straggler": "straggler",
    }.get(name, name)


def _summary(faults: list[tuple[float, Any]], log: list[LogEntry], final: NodeVerdict | None) -> Any:
    """Every fault (grouped per GPU), the verdict it produced and the time it took to detect."""
    from rich.table import Table
    from rich.text import Text

    from trainguard.palette import STYLE

    per_gpu: dict[int, list[tuple[float, Any]]] = {}
    for t, fault in faults:
        per_gpu.setdefault(getattr(fault, "gpu", -1), []).append((t, fault))
    verdicts = {g.gpu.index: g for g in final.gpus} if final else {}
    table = Table(title="summary: every fault and the verdict it produced", title_justify="left")
    for name in ("GPU", "fault(s)", "at", "detected", "verdict", "action"):
        table.add_column(name, overflow="fold", max_width=24 if name == "fault(s)" else None)
    table.add_column("reason", overflow="fold", ratio=1)
    for gpu in sorted(per_gpu):
        items = per_gpu[gpu]
        first = min(t for t, _ in items)
        names = ", ".join(dict.fromkeys(_fault_name(f) for _, f in items))
        hit = next((e for e in log if e.gpu == gpu and e.t >= first and e.new is not Health.OK), None)
        detected = f"+{hit.t - first:.0f}s" if hit else "not detected"
        g = verdicts.get(gpu)
        health = g.health if g else Health.UNKNOWN
        reason = g.reasons[0] if g and g.reasons else "-"
        table.add_row(
            str(gpu),
            names,
            f"{first:.0f}s",
            detected,
            Text(health.value, style=STYLE[health]),
            g.action.value if g else "-",
            reason,
        )
    return table

"""`trainguard monitor`: a live table of every GPU, its readings, verdict and reasons.

    trainguard monitor                                   # this node through NVML, every 2 s
    trainguard monitor --backend sim --scenario tour     # a simulated node through scripted faults
    trainguard monitor --backend sim --scenario thermal --speed 10
    trainguard monitor --once                            # print one table and exit
    trainguard monitor --json > gpus.jsonl               # one JSON object per GPU per interval

Outside a terminal (a pipe, a file, a log collector) it prints one plain line per GPU per
interval instead of the live table. Ctrl-C quits (exit 0) and leaves the terminal as it was.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trainguard.actions import Advice
from trainguard.cli.interrupt import CtrlC
from trainguard.cli.options import add_config_args, add_sim_node_options, thresholds
from trainguard.detect.thresholds import Thresholds
from trainguard.errors import BackendUnavailable, TrainguardError
from trainguard.records import Health, NodeVerdict, Sample, strongest_action

if TYPE_CHECKING:
    from collections.abc import Callable

    from trainguard.agent import Agent
    from trainguard.clock import VirtualClock


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "monitor",
        help="live table of every GPU: readings, verdict and reasons",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_sim_node_options(p)
    p.add_argument("--interval", type=float, default=None, metavar="S", help="refresh every S seconds")
    p.add_argument("--kernel-log", type=Path, metavar="PATH", help="kernel log to follow for Xid lines")
    p.add_argument("--once", action="store_true", help="print one table and exit")
    p.add_argument("--json", action="store_true", help="one JSON object per GPU per interval (JSON lines)")
    p.add_argument("--speed", type=float, default=1.0, metavar="X", help="simulated time runs X times faster")
    add_config_args(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    backend = args.backend or ("sim" if args.scenario else "nvml")
    interval = args.interval if args.interval is not None else (1.0 if backend == "sim" else 2.0)
    if interval <= 0 or args.speed <= 0:
        print("trainguard monitor: --interval and --speed must be positive", file=sys.stderr)
        return 2
    console: Any = None
    if not (args.json or (not args.once and not sys.stdout.isatty())):  # the table needs rich
        try:
            from rich.console import Console
        except ImportError:
            print("trainguard monitor needs rich: pip install 'trainguard[cli]'", file=sys.stderr)
            return 3
        console = Console()
    # From here on Ctrl-C quits with exit 0, also when the shell that started us ignored SIGINT.
    with CtrlC() as ctrl_c:
        try:
            return _open_and_watch(args, backend, interval, console, ctrl_c)
        except KeyboardInterrupt:  # a second Ctrl-C: the first one was not noticed in time
            return 0


def _open_and_watch(
    args: argparse.Namespace, backend: str, interval: float, console: Any, ctrl_c: CtrlC
) -> int:
    try:
        session = Session.open(
            backend, args.scenario, args.kernel_log, args.gpus, args.seed, args.speed, thresholds(args)
        )
    except BackendUnavailable as exc:
        message = str(exc).rstrip()
        hint = "" if "--backend sim" in message else " (try --backend sim for a simulated node)"
        print(f"trainguard monitor: {message}{hint}", file=sys.stderr)
        return 3
    except TrainguardError as exc:
        print(f"trainguard monitor: {exc}", file=sys.stderr)
        return 2
    with session:
        if ctrl_c.pressed:  # during start-up: nothing drawn yet, nothing to restore
            return 0
        if args.once:
            session.settle(interval, cancelled=lambda: ctrl_c.pressed, sleep=ctrl_c.sleep)
            if ctrl_c.pressed:
                return 0
            if console is None:
                print_lines(session, args.json)
            else:
                console.print(session.frame(console.width, live=False))
            return 0
        if console is None:
            return watch_plain(session, interval, ctrl_c, args.json)
        return watch(session, interval, console, ctrl_c)


def watch_plain(session: Session, interval: float, ctrl_c: CtrlC, as_json: bool) -> int:
    """Outside a terminal: every interval, one line (or JSON object) per GPU, flushed at once."""
    try:
        while not ctrl_c.pressed:
            print_lines(session, as_json)
            if ctrl_c.sleep(interval):
                break
            session.step(cancelled=lambda: ctrl_c.pressed)
    except BrokenPipeError:  # `| head`: the reader left; so do we, quietly
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return 0


def print_lines(session: Session, as_json: bool) -> None:
    import json

    for record in gpu_records(session.agent.samples, session.agent.verdict, session.elapsed):
        print(json.dumps(record) if as_json else plain_line(record), flush=True)


def gpu_records(samples: list[Sample], verdict: NodeVerdict | None, elapsed: float) -> list[dict[str, Any]]:
    """One record per GPU: its readings, verdict, action and reasons, and the node's (pure)."""
    by_gpu = {s.gpu.index: s for s in samples}
    gpus = verdict.gpus if verdict is not None else ()
    node = verdict.health.value if verdict is not None else "unknown"
    out = []
    for g in gpus:
        s = by_gpu.get(g.gpu.index)
        record: dict[str, Any] = {"t": round(elapsed, 1), "gpu": g.gpu.index, "health": g.health.value}
        record["action"] = effective_action(g.health, g.action).value
        for key in _READINGS:
            record[key] = getattr(s, key, None) if s is not None and not s.lost else None
        record["lost"] = bool(s is not None and s.lost)
        record["reasons"] = g.reasons
        record["node"] = node
        record["node_action"] = node_action(verdict).value if verdict is not None else "none"
        out.append(record)
    return out


_READINGS = ("temperature_c", "power_w", "sm_clock_mhz", "util_gpu_pct", "mem_used_mib", "ecc_dbe_volatile")


def plain_line(r: dict[str, Any]) -> str:
    """``t=12.0 gpu=3 health=degraded action=run_diagnostics temp=91C ... reasons=...``"""

    def num(value: Any, unit: str = "") -> str:
        return "?" if value is None else f"{value:.0f}{unit}"

    line = f"t={r['t']} gpu={r['gpu']} health={r['health']} action={r['action']}"
    if r["lost"]:
        line += " lost=yes"
    else:
        line += (
            f" temp={num(r['temperature_c'], 'C')} power={num(r['power_w'], 'W')}"
            f" sm={num(r['sm_clock_mhz'], 'MHz')} util={num(r['util_gpu_pct'], '%')}"
            f" dbe={num(r['ecc_dbe_volatile'])}"
        )
    line += f" node={r['node']}/{r['node_action']}"
    return line + (f" reasons={'; '.join(r['reasons'])}" if r["reasons"] else "")


def effective_action(health: Health, action: Advice) -> Advice:
    """An action follows the verdict: a healthy GPU or node needs none, whatever a finding
    that did not change its health suggested."""
    return Advice.NONE if health is Health.OK else action


def node_action(verdict: NodeVerdict) -> Advice:
    """The node's action, from the GPUs and node findings that are not OK."""
    actions = [effective_action(g.health, g.action) for g in verdict.gpus]
    actions += [effective_action(f.health, f.action) for f in verdict.findings]
    return effective_action(verdict.health, strongest_action(actions))


def watch(session: Session, interval: float, console: Any, ctrl_c: CtrlC) -> int:
    """Redraw the table every ``interval`` until Ctrl-C, then restore the terminal (cursor shown).

    Ctrl-C only sets ``ctrl_c.pressed`` (see ``trainguard.cli.interrupt``): the loop notices it
    within a tick and leaves through ``live.stop()``, never halfway through a redraw. The loop is
    the only writer to the terminal (no refresh thread).
    """
    from rich.live import Live

    live = Live(console=console, auto_refresh=False, transient=False)
    try:
        live.start()  # hides the cursor
        while not ctrl_c.pressed:
            live.update(session.frame(console.width), refresh=True)
            if ctrl_c.sleep(interval):
                break
            session.step(cancelled=lambda: ctrl_c.pressed)
    finally:
        live.stop()  # draws the last frame and shows the cursor; a no-op if start() did not begin
    return 0


class Session:
    """An agent plus the clock that drives it: real for NVML, accelerated virtual time for sim."""

    def __init__(self, agent: Agent, clock: VirtualClock | None, speed: float, title: str) -> None:
        self.agent, self.clock, self.speed, self.title = agent, clock, speed, title
        self._t0 = time.monotonic()
        self._start = clock.time() if clock is not None else 0.0
        self.scenario_end: float | None = None
        self.agent.tick()

    @classmethod
    def open(
        cls,
        backend: str,
        scenario: str | None,
        kernel_log: Path | None,
        n_gpus: int,
        seed: int,
        speed: float,
        thresholds: Thresholds | None = None,
    ) -> Session:
        from trainguard.agent import Agent, open_node
        from trainguard.errors import ConfigError

        if backend != "sim":
            if scenario:
                raise ConfigError("--scenario runs on the simulated node: use --backend sim")
            agent = Agent.of(open_node(backend, kernel_log=kernel_log), thresholds=thresholds)
            return cls(agent, None, 1.0, f"{backend} telemetry")
        from trainguard.clock import VirtualClock
        from trainguard.telemetry.sim import SCENARIOS

        spec = SCENARIOS.get(scenario or "healthy")
        if spec is None:
            raise ConfigError(f"unknown scenario {scenario!r}: choose one of {', '.join(SCENARIOS)}")
        from trainguard.cli.check import sim_kernel_log_is_new

        sim_kernel_log_is_new(kernel_log)
        clock = VirtualClock()
        node = open_node(
            "sim", kernel_log=kernel_log, n_gpus=n_gpus, seed=seed, scenario=spec.name, clock=clock
        )
        session = cls(
            Agent.of(node, clock=clock, thresholds=thresholds),
            clock,
            speed,
            f"simulated node: {spec.name}",
        )
        session.scenario_end = spec.duration_s
        return session

    @property
    def elapsed(self) -> float:
        return self.clock.time() - self._start if self.clock is not None else time.monotonic() - self._t0

    def step(self, cancelled: Callable[[], bool] = lambda: False) -> None:
        """Bring the agent up to now: one tick, or on virtual time one tick per simulated second.

        ``cancelled`` is asked before each tick: catching up (a fast ``--speed``, a stalled
        process) can take many ticks, and Ctrl-C should not wait for all of them.
        """
        if self.clock is None:
            self.agent.tick()
            return
        target = self._start + (time.monotonic() - self._t0) * self.speed
        while self.clock.time() < target and not cancelled():
            self.clock.advance_to(min(self.clock.time() + 1.0, target))
            self.agent.tick()

    def settle(
        self,
        interval: float,
        cancelled: Callable[[], bool] = lambda: False,
        sleep: Callable[[float], object] = time.sleep,
    ) -> None:
        """For --once: a second reading (counter rates need two); a scenario plays to its end."""
        if self.clock is None:
            sleep(interval)
            self.agent.tick()
            return
        end = self._start + (self.scenario_end or 0.0) + 1.0
        while self.clock.time() < end and not cancelled():
            self.clock.advance_to(min(self.clock.time() + 1.0, end))
            self.agent.tick()

    def frame(self, width: int = 200, live: bool = True) -> Any:
        from rich.console import Group
        from rich.text import Text

        from trainguard.cli.render import THROTTLE_LEGEND, gpu_table, node_line

        verdict = self.agent.verdict
        if verdict is not None:  # actions follow verdicts (see effective_action)
            gpus = tuple(replace(g, action=effective_action(g.health, g.action)) for g in verdict.gpus)
            verdict = replace(verdict, action=node_action(verdict), gpus=gpus)
        table = gpu_table(self.agent.samples, verdict, title=self.title, width=width)
        if not live:
            return Group(table, node_line(verdict))
        footer = Text(f"t={self.elapsed:.0f}s  Ctrl-C to quit   {THROTTLE_LEGEND}", style="dim")
        return Group(table, node_line(verdict), footer)

    def close(self) -> None:
        self.agent.close()

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

"""`trainguard monitor` (one frame, and Ctrl-C in a real terminal) and the node demo."""

from __future__ import annotations

import io
import os
import pty
import select
import signal
import subprocess
import sys
import threading
import time

import pytest
from rich.console import Console

from trainguard.cli import main
from trainguard.cli.demo import run_node_demo
from trainguard.cli.interrupt import CtrlC
from trainguard.cli.monitor import Session, watch
from trainguard.records import Health
from trainguard.telemetry.sim import SCENARIOS


def test_once_prints_every_gpu_with_readings_verdict_and_reasons(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")
    assert main(["monitor", "--backend", "sim", "--scenario", "tour", "--once"]) == 0
    out = capsys.readouterr().out
    rows = [line.split() for line in out.splitlines() if line.strip()[:1].isdigit()]
    assert [r[0] for r in rows] == [str(i) for i in range(8)]
    header = next(line for line in out.splitlines() if "GPU" in line and "verdict" in line)
    for column in (
        "temp",
        "power W",
        "SM MHz",
        "util",
        "mem GiB",
        "ECC",
        "remap",
        "PCIe",
        "NVLink",
        "throttle",
        "reasons",
    ):
        assert column in header
    assert "°C" in rows[0][1] and "/700" in out and "/1980" in out  # temperature, power limit, max clock
    assert "G5x8" in out  # GPU 5's downtrained link
    assert "failed" in rows[4] and "GPU stopped answering" in out
    assert "node: FAILED" in out


def test_on_a_narrow_terminal_reasons_move_beneath_the_table(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "80")
    assert main(["monitor", "--backend", "sim", "--scenario", "tour", "--once"]) == 0
    out = capsys.readouterr().out
    assert max(len(line) for line in out.splitlines()) <= 80
    assert "GPU 4: GPU stopped answering" in out and "GPU 1: temperature" in out
    assert "…" not in "".join(line for line in out.splitlines() if line.strip()[:1].isdigit())


def test_once_on_a_healthy_node_shows_ok(capsys):
    assert main(["monitor", "--backend", "sim", "--once", "--gpus", "2"]) == 0
    out = capsys.readouterr().out
    assert "node: OK" in out and out.count(" ok") >= 2


def test_unknown_scenario_is_an_error_not_a_crash(capsys):
    assert main(["monitor", "--backend", "sim", "--scenario", "nope", "--once"]) == 2
    assert "nope" in capsys.readouterr().err


@pytest.mark.parametrize("inherited", ["default", "ignored"])
def test_ctrl_c_quits_cleanly_and_restores_the_terminal(inherited):
    """In a real pseudo-terminal: the live table draws, SIGINT ends it with exit 0, cursor shown again.

    "ignored": started the way `cmd &` in a script (or a CI runner) starts it, with SIGINT ignored,
    where Python installs no KeyboardInterrupt handler of its own.
    """
    disposition = signal.SIG_DFL if inherited == "default" else signal.SIG_IGN
    leader, follower = pty.openpty()
    env = {**os.environ, "COLUMNS": "120", "LINES": "40", "TERM": "xterm-256color"}
    env.pop("NO_COLOR", None)
    argv = [sys.executable, "-m", "trainguard.cli", "monitor", "--backend", "sim", "--interval", "0.2"]
    proc = subprocess.Popen(
        argv,
        stdin=follower,
        stdout=follower,
        stderr=follower,
        env=env,
        close_fds=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, disposition),
    )
    os.close(follower)
    out = b""

    def drain(seconds: float) -> None:
        nonlocal out
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            ready, _, _ = select.select([leader], [], [], 0.1)
            if ready:
                try:
                    out += os.read(leader, 65536)
                except OSError:
                    return

    try:
        deadline = time.monotonic() + 120  # start-up and imports on a loaded machine
        while b"node:" not in out and time.monotonic() < deadline and proc.poll() is None:
            drain(0.2)
        assert b"node:" in out, out[-2000:]
        proc.send_signal(signal.SIGINT)
        # Keep reading while it exits: a full pty buffer would block its last frame (and the test).
        deadline = time.monotonic() + 120
        while proc.poll() is None and time.monotonic() < deadline:
            drain(0.2)
        code = proc.wait(timeout=1)
        drain(0.3)
    finally:
        if proc.poll() is None:
            proc.kill()
        os.close(leader)
    assert code == 0
    assert b"\x1b[?25l" in out and out.rfind(b"\x1b[?25h") > out.rfind(b"\x1b[?25l")  # cursor back
    assert b"Traceback" not in out


def _terminal() -> tuple[Console, io.StringIO]:
    buf = io.StringIO()
    return Console(file=buf, width=120, force_terminal=True, color_system="truecolor"), buf


def _sim_session() -> Session:
    return Session.open("sim", None, None, n_gpus=2, seed=0, speed=1.0)


def test_ctrl_c_during_start_up_quits_with_exit_0(monkeypatch, capsys):
    opened, real_open = [], Session.open

    def open_then_ctrl_c(*args, **kwargs):
        session = real_open(*args, **kwargs)
        opened.append(session)
        signal.raise_signal(signal.SIGINT)  # arrives while the node is being opened
        return session

    monkeypatch.setattr(Session, "open", open_then_ctrl_c)
    waits: list[float] = []  # every wait the monitor asks for (an interval, a settle)
    real_sleep = CtrlC.sleep
    monkeypatch.setattr(CtrlC, "sleep", lambda self, s: waits.append(s) or real_sleep(self, s))
    before = signal.getsignal(signal.SIGINT)
    assert main(["monitor", "--backend", "sim", "--interval", "5"]) == 0
    assert waits == []  # did not wait for the first interval
    node = opened[0].agent.node
    assert len(opened) == 1 and not os.path.exists(node.kernel_log)  # the node was closed
    assert "node:" not in capsys.readouterr().out  # nothing drawn
    assert signal.getsignal(signal.SIGINT) == before  # the previous handler is back


def test_ctrl_c_during_a_tick_finishes_the_tick_then_restores_the_terminal(monkeypatch):
    console, buf = _terminal()
    with _sim_session() as session:
        real_tick, ticks = session.agent.tick, []

        def tick():
            ticks.append(1)
            if len(ticks) == 2:
                signal.raise_signal(signal.SIGINT)  # in the middle of the tick
            return real_tick()

        monkeypatch.setattr(session.agent, "tick", tick)
        with CtrlC() as ctrl_c:
            assert watch(session, 0.01, console, ctrl_c) == 0
    out = buf.getvalue()
    assert len(ticks) == 2  # quit right after the tick it interrupted
    assert "node:" in out and "Traceback" not in out
    assert out.rfind("\x1b[?25h") > out.rfind("\x1b[?25l") >= 0  # cursor hidden, then shown again


def test_a_second_ctrl_c_breaks_a_stuck_tick_and_still_restores_the_terminal(monkeypatch):
    console, buf = _terminal()
    with _sim_session() as session:

        def stuck_tick():
            signal.raise_signal(signal.SIGINT)  # noticed only after the tick...
            threading.Timer(0.2, os.kill, (os.getpid(), signal.SIGINT)).start()
            time.sleep(3600)  # ...which never ends: the second Ctrl-C ends it (else the test times out)

        monkeypatch.setattr(session.agent, "tick", stuck_tick)
        with CtrlC() as ctrl_c, pytest.raises(KeyboardInterrupt):
            watch(session, 0.01, console, ctrl_c)
    out = buf.getvalue()
    assert out.rfind("\x1b[?25h") > out.rfind("\x1b[?25l") >= 0


def test_node_demo_walks_the_tour_and_summarises_every_fault():
    buf = io.StringIO()
    assert run_node_demo(speed=2000, console=Console(file=buf, width=120)) == 0
    out = buf.getvalue()
    assert "incident log" in out and "summary: every fault and the verdict it produced" in out
    summary = out[out.index("summary:") :]
    expected = SCENARIOS["tour"].expected_gpus(8)
    assert sorted(expected.values()).count(Health.DEGRADED) == 6
    for gpu, verdict in expected.items():
        row = next(line for line in summary.splitlines() if line.startswith(f"│ {gpu} "))
        other = ({"ok", "degraded", "failed"} - {verdict.value}) & set(row.replace("│", " ").split())
        assert verdict.value in row and not other, row
    assert "node verdict: failed (expected failed)" in out
    assert "every GPU's verdict as expected (8 GPUs)" in out


def test_node_demo_fails_when_one_gpus_verdict_differs_from_the_expected_one(monkeypatch):
    from dataclasses import replace

    tour = SCENARIOS["tour"]
    wrong = replace(tour, per_gpu={**tour.per_gpu, 4: Health.DEGRADED})  # GPU 4 really fails
    monkeypatch.setitem(SCENARIOS, "tour", wrong)
    buf = io.StringIO()
    assert run_node_demo(speed=2000, console=Console(file=buf, width=120)) == 1
    out = buf.getvalue()
    assert "node verdict: failed (expected failed)\n" in out  # the node alone would have passed
    assert "GPU 4 failed, expected degraded" in out


def test_demo_command_accepts_node_flag():
    from trainguard.cli import build_parser

    args = build_parser().parse_args(["demo", "--node", "--speed", "3"])
    assert args.node and args.speed == 3.0 and callable(args.func)


def test_outside_a_terminal_monitor_prints_one_plain_line_per_gpu_per_interval(tmp_path):
    out = tmp_path / "out.txt"
    with open(out, "w") as f:  # stdout is a file, as in `trainguard monitor > f`
        proc = subprocess.Popen(
            [sys.executable, "-m", "trainguard.cli", "monitor", "--backend", "sim", "--gpus", "2",
             "--interval", "0.2"],
            stdout=f, stderr=subprocess.PIPE,
        )  # fmt: skip
        try:
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline and out.read_text().count("\n") < 6:
                time.sleep(0.1)
        finally:
            proc.send_signal(signal.SIGINT)
            proc.wait(120)
    lines = out.read_text().splitlines()
    assert len(lines) >= 6 and "\x1b[" not in out.read_text()
    assert [line.split()[1] for line in lines[:4]] == ["gpu=0", "gpu=1", "gpu=0", "gpu=1"]
    assert all("health=ok" in line and "action=none" in line for line in lines)


def test_monitor_json_writes_one_object_per_gpu(capsys):
    import json

    assert main(["monitor", "--backend", "sim", "--gpus", "3", "--once", "--json"]) == 0
    records = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [r["gpu"] for r in records] == [0, 1, 2]
    assert {"health", "action", "temperature_c", "reasons", "node", "node_action"} <= set(records[0])


def test_a_node_whose_gpus_are_all_ok_has_no_action():
    from trainguard.actions import Advice
    from trainguard.cli.monitor import effective_action, node_action
    from trainguard.records import Finding, Gpu, GpuVerdict, Health, NodeVerdict

    hint = Finding(rule="xid.13", health=Health.OK, action=Advice.RESTART_APP, reason="Xid 13: app error")
    gpus = tuple(
        GpuVerdict(Gpu(i), Health.OK, Advice.RESTART_APP if i == 0 else Advice.NONE) for i in range(2)
    )
    verdict = NodeVerdict(Health.OK, Advice.RESTART_APP, gpus, (hint,))
    assert node_action(verdict) is Advice.NONE
    assert effective_action(Health.OK, Advice.RESTART_APP) is Advice.NONE
    sick = NodeVerdict(
        Health.DEGRADED,
        Advice.RUN_DIAGNOSTICS,
        (GpuVerdict(Gpu(0), Health.DEGRADED, Advice.RUN_DIAGNOSTICS),),
    )
    assert node_action(sick) is Advice.RUN_DIAGNOSTICS

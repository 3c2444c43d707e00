"""`trainguard agent` as an operator runs it: a real process, scraped, reloaded and stopped by signals."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest

from agent_service import TOKEN, write_token
from trainguard.procs import parent_death

TRAINGUARD = str(Path(sys.executable).with_name("trainguard"))


class AgentProcess:
    def __init__(self, tmp: Path, *args: str) -> None:
        write_token(tmp / "token")
        self.config = tmp / "agent.toml"
        if not self.config.exists():
            self.config.write_text("[agent]\ninterval_s = 0.2\n")
        cmd = [
            TRAINGUARD,
            "agent",
            "--backend",
            "sim",
            "--listen",
            "127.0.0.1:0",
            "--config",
            str(self.config),
            "--token-file",
            str(tmp / "token"),
            "--state-dir",
            str(tmp / "state"),
            "--db",
            str(tmp / "tg.db"),
            *args,
        ]
        self.proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True, preexec_fn=parent_death())
        self.log: list[str] = []
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.log.append(line)
            if m := re.search(r"serving http://127\.0\.0\.1:(\d+)/", line):
                self.port = int(m.group(1))
                break
        else:
            raise AssertionError("agent did not start:\n" + "".join(self.log))

    def wait_for_log(self, text: str, ceiling_s: float = 120.0) -> None:
        """Read the agent's stderr until a line holds ``text`` (kept in ``log`` for stop())."""
        found = threading.Event()

        def read() -> None:
            for line in self.proc.stderr:  # type: ignore[union-attr]
                self.log.append(line)
                if text in line:
                    found.set()
                    return

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        assert found.wait(ceiling_s), f"no {text!r} in the agent's log:\n" + "".join(self.log)
        reader.join()

    def get(self, path: str) -> dict:
        req = urllib.request.Request(
            f"http://127.0.0.1:{self.port}{path}", headers={"Authorization": f"Bearer {TOKEN}"}
        )
        with urllib.request.urlopen(req, timeout=10) as r:
            return json.loads(r.read())

    def stop(self) -> tuple[int, str]:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        _, rest = self.proc.communicate(timeout=30)
        return self.proc.returncode, "".join(self.log) + rest

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.communicate(timeout=10)


def wait_for(check, timeout: float = 10.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.05)


def test_agent_serves_reloads_on_sighup_and_stops_cleanly_on_sigterm(tmp_path: Path) -> None:
    agent = AgentProcess(tmp_path)
    try:
        node = agent.get("/api/v1/node")
        assert node["gpus"] == 8 and node["agent"]["interval_s"] == 0.2
        agent.config.write_text("[agent]\ninterval_s = 0.5\n")
        agent.proc.send_signal(signal.SIGHUP)
        wait_for(lambda: agent.get("/api/v1/node")["agent"]["interval_s"] == 0.5)
        agent.config.write_text("[agent]\ninterval_s = -1\n")  # a broken edit keeps the running config
        agent.proc.send_signal(signal.SIGHUP)
        agent.wait_for_log("config reload refused")  # the broken edit was read, and refused
        assert agent.get("/api/v1/node")["agent"]["interval_s"] == 0.5
        code, log = agent.stop()
    finally:
        agent.kill()
    assert code == 0, log
    assert "config reload refused" in log and "stopping" in log
    assert TOKEN not in log
    assert (tmp_path / "state" / "agent-state.json").exists()


def test_agent_refuses_to_start_with_a_readable_token_file(tmp_path: Path) -> None:
    token = write_token(tmp_path / "token", mode=0o644)
    done = subprocess.run(
        [
            TRAINGUARD,
            "agent",
            "--backend",
            "sim",
            "--listen",
            "127.0.0.1:0",
            "--token-file",
            str(token),
            "--state-dir",
            str(tmp_path / "state"),
            "--db",
            str(tmp_path / "tg.db"),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        preexec_fn=parent_death(),
    )
    assert done.returncode == 2 and "chmod 600" in done.stderr and TOKEN not in done.stderr


def test_agent_refuses_an_address_in_use(tmp_path: Path) -> None:
    first = AgentProcess(tmp_path)
    try:
        done = subprocess.run(
            [
                TRAINGUARD,
                "agent",
                "--backend",
                "sim",
                "--listen",
                f"127.0.0.1:{first.port}",
                "--token-file",
                str(tmp_path / "token"),
                "--state-dir",
                str(tmp_path / "state2"),
                "--db",
                str(tmp_path / "tg2.db"),
            ],
            capture_output=True,
            text=True,
            timeout=60,
            preexec_fn=parent_death(),
        )
        assert done.returncode == 2 and "cannot listen on" in done.stderr
    finally:
        first.stop()
        first.kill()


@pytest.mark.slow
@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="reads /proc")
def test_agent_memory_stays_bounded_while_sampling(tmp_path: Path) -> None:
    agent = AgentProcess(tmp_path, "--scenario", "tour")
    try:

        def rss_mb() -> float:
            status = Path(f"/proc/{agent.proc.pid}/status").read_text()
            return int(re.search(r"VmRSS:\s+(\d+)", status).group(1)) / 1024  # type: ignore[union-attr]

        agent.get("/api/v1/node")
        time.sleep(1.0)
        early = rss_mb()
        time.sleep(3.0)  # 15 more ticks at 5 Hz through the tour's first faults
        assert rss_mb() < early + 5
        assert rss_mb() < 120
    finally:
        agent.stop()
        agent.kill()

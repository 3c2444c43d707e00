"""torchft's Lighthouse as a child of the replica loop (`replicas.loop`): started before the
groups, restarted on the same port when it dies (the groups' quorum retries carry them over).

It runs the ``torchft_lighthouse`` program torchft installs (nothing here imports torchft), with
a parent-death signal, so it never outlives the supervisor.
"""

from __future__ import annotations

import logging
import shutil
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from trainguard.errors import MissingDependency
from trainguard.procs import parent_death
from trainguard.supervisor.ports import private_port

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class LighthouseConfig:
    min_replicas: int = 1  # groups a quorum needs
    join_timeout_ms: int = 200  # wait this long for stragglers before issuing a quorum
    heartbeat_timeout_ms: int = 1000  # a group without a heartbeat this long is out of the quorum
    quorum_tick_ms: int = 50


def program() -> str:
    """The ``torchft_lighthouse`` executable beside this Python, else on PATH."""
    beside = Path(sys.executable).parent / "torchft_lighthouse"
    found = str(beside) if beside.exists() else shutil.which("torchft_lighthouse")
    if found is None:
        raise MissingDependency(
            "--replica-groups needs torchft's Lighthouse (torchft_lighthouse): pip install 'trainguard[ft]'"
        )
    return found


class Lighthouse:
    """One Lighthouse process on 127.0.0.1 (or ``host``) and a fixed port."""

    def __init__(
        self, config: LighthouseConfig, log_path: Path, host: str = "127.0.0.1", port: int | None = None
    ) -> None:
        self.config, self.log_path, self.host = config, log_path, host
        self.port = port or private_port()
        self.proc: subprocess.Popen[bytes] | None = None
        self.restarts = 0

    @property
    def address(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self, timeout_s: float = 30.0) -> None:
        """Start it and wait until it accepts connections."""
        c = self.config
        argv = [
            program(),
            "--min_replicas",
            str(c.min_replicas),
            "--bind",
            f"{self.host}:{self.port}",
            "--join_timeout_ms",
            str(c.join_timeout_ms),
            "--heartbeat_timeout_ms",
            str(c.heartbeat_timeout_ms),
            "--quorum_tick_ms",
            str(c.quorum_tick_ms),
        ]
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as out:
            self.proc = subprocess.Popen(
                argv,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                preexec_fn=parent_death(),
            )
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"the Lighthouse exited at start ({self.proc.returncode}); see {self.log_path}"
                )
            try:
                socket.create_connection((self.host, self.port), timeout=1).close()
                return
            except OSError:
                time.sleep(0.05)
        raise RuntimeError(f"the Lighthouse did not listen on {self.host}:{self.port} within {timeout_s:g}s")

    def exited(self) -> int | None:
        """Its exit code once it died, else None."""
        return self.proc.poll() if self.proc is not None else None

    def restart(self) -> None:
        """Start it again on the same port (the groups keep its address)."""
        self.stop()
        self.restarts += 1
        self.start()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(30)

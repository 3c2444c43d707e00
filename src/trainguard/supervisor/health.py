"""The node's health, as the supervisor sees it (its look at the node), and which ranks use
which GPU.

Where ``trainguard agent`` serves on the node, the supervisor reads the agent's verdict from its
API (``AgentApiVerdicts``): the node is sampled and its kernel log read once, by the agent. Where
none serves, it opens the node itself (``open_node``) and ticks an in-process agent
(``LocalVerdicts``). With ``backend="sim"`` that node is a ``SimNode`` of ``nproc`` GPUs whose
kernel-log file the agent follows; chaos drills inject faults into it, so a simulated Xid 79
reaches the supervisor through the same kernel line a real one would.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trainguard.detect.thresholds import Thresholds
from trainguard.records import Health, NodeVerdict

DEFAULT_AGENT_URL = "http://127.0.0.1:9410"

log = logging.getLogger(__name__)

Diagnose = Callable[[int], Health]


@dataclass(frozen=True, slots=True)
class GpuMap:
    """Which physical GPU each local rank uses: local rank i -> ``gpus[i]``."""

    gpus: tuple[int, ...]

    def gpu_of(self, local_rank: int) -> int | None:
        return self.gpus[local_rank] if 0 <= local_rank < len(self.gpus) else None

    def local_rank_of(self, gpu: int) -> int | None:
        return self.gpus.index(gpu) if gpu in self.gpus else None

    def without(self, gpu: int) -> GpuMap:
        return GpuMap(tuple(g for g in self.gpus if g != gpu))

    def cuda_visible_devices(self) -> str:
        return ",".join(str(g) for g in self.gpus)

    def cuda_env(self) -> dict[str, str]:
        """The worker's GPU environment. CUDA numbers devices fastest-first by default, NVML and
        nvidia-smi by PCI bus: the indices we exclude are NVML's, so CUDA must count the same way."""
        return {"CUDA_DEVICE_ORDER": "PCI_BUS_ID", "CUDA_VISIBLE_DEVICES": self.cuda_visible_devices()}


class NodeHealth:
    """Reads the node's verdict at most every ``interval`` seconds; never raises (a broken health
    source degrades to "no verdict", it must not stop training).

    ``source`` is ``"agent"`` (the running node agent's API), ``"local"`` (an in-process agent)
    or ``"none"``. ``agent_url``: the agent to read; without one, a real node (``nvml``) looks
    for an agent on ``127.0.0.1:9410`` whose token it can read, a simulated node never does.
    """

    def __init__(
        self,
        backend: str,
        n_gpus: int,
        run_dir: Path,
        kernel_log: Path | None = None,
        interval: float = 0.5,
        thresholds: Thresholds | None = None,
        *,
        agent_url: str = "",
        agent_token_file: Path | None = None,
    ) -> None:
        self.backend_name = backend
        self.thresholds = thresholds
        self.interval = interval
        self.sim: Any = None  # the SimNode when the supervisor simulates the node itself
        self.kernel_log = kernel_log
        self.run_dir = run_dir
        self._speeds: dict[int, float] | None = None  # the simulated GPUs' speeds last written
        self.source = "none"
        self._verdicts: Any = None
        self._next = 0.0
        self.last: NodeVerdict | None = None
        if backend in ("", "none"):
            return
        self._verdicts = self._agent_api(backend, agent_url, agent_token_file)
        if self._verdicts is not None:
            self.source = "agent"
            log.warning("node health: reading the node agent's verdict at %s", self._verdicts.url)
            return
        try:
            self._verdicts = self._open(backend, n_gpus, run_dir)
            self.source = "local"
        except Exception as exc:  # missing module, no driver...: run without node health
            log.warning("node health disabled (%s backend): %s", backend, exc)
            self._verdicts = None

    @property
    def active(self) -> bool:
        """Node health is read (an agent answers or a backend was opened)."""
        return self._verdicts is not None

    def _agent_api(self, backend: str, url: str, token_file: Path | None) -> Any:
        """The running agent's verdicts when one answers (asked for, or found on a real node)."""
        from trainguard.agent.verdicts import AgentApiVerdicts

        if not url and backend != "nvml":
            return None
        if token_file is None:
            from trainguard.agent.daemon import default_state_dir

            token_file = default_state_dir() / "agent.token"
        try:
            source = AgentApiVerdicts.from_token_file(url or DEFAULT_AGENT_URL, token_file)
        except Exception as exc:
            if url:
                log.warning("node agent at %s not used: %s", url, exc)
            return None
        if source.probe():
            return source
        if url:
            log.warning("node agent at %s gave no verdict: reading the node here", url)
        return None

    def _open(self, backend: str, n_gpus: int, run_dir: Path) -> Any:
        from trainguard.agent.node import open_node
        from trainguard.agent.tick import Agent
        from trainguard.agent.verdicts import LocalVerdicts

        if backend == "sim" and self.kernel_log is None:
            self.kernel_log = run_dir / "sim-kmsg.log"
        node = open_node(backend, kernel_log=self.kernel_log, n_gpus=n_gpus, seed=0)
        self.sim = node.sim
        if self.sim is not None:  # before the ranks start: they read it from their first step
            self._publish_speeds()
        return LocalVerdicts(Agent.of(node, thresholds=self.thresholds))

    @property
    def enabled(self) -> bool:
        return self._verdicts is not None

    def tick(self, now: float | None = None, force: bool = False) -> NodeVerdict | None:
        """A fresh verdict when the interval elapsed (or ``force``), else None."""
        now = time.time() if now is None else now
        if self._verdicts is None or (not force and now < self._next):
            return None
        self._next = now + self.interval
        verdict: NodeVerdict | None = self._verdicts.verdict()
        if verdict is not None:
            self.last = verdict
        if self.sim is not None:
            self._publish_speeds()
        return verdict

    def _publish_speeds(self) -> None:
        """A simulated node's GPU speeds, for the ranks to run at (``telemetry.sim.speed``)."""
        from trainguard.telemetry.sim.speed import SPEEDS_FILE, gpu_speeds, write_speeds

        speeds = gpu_speeds(self.sim)
        if speeds != self._speeds:
            try:
                write_speeds(self.run_dir / SPEEDS_FILE, speeds)
                self._speeds = speeds
            except OSError as exc:
                log.warning("simulated GPU speeds not written: %s", exc)

    def gpu_health(self, gpu: int) -> Health | None:
        if self.last is None:
            return None
        for gv in self.last.gpus:
            if gv.gpu.index == gpu:
                return gv.health
        return None

    def diagnose_builtin(self, gpu: int) -> Health:
        """The built-in diagnostic: a fresh, forced look at the GPU (the sim's ground truth).

        Real active diagnostics (DCGM-style) plug in through ``Supervisor(diagnose=...)``."""
        verdict = self.tick(force=True)
        if verdict is None:
            return Health.UNKNOWN
        for gv in verdict.gpus:
            if gv.gpu.index == gpu:
                # Passive degradation (an app Xid burst, a warm GPU) does not fail diagnostics.
                return Health.FAILED if gv.health is Health.FAILED else Health.OK
        return Health.UNKNOWN

    def close(self) -> None:
        if self._verdicts is not None:
            try:
                self._verdicts.close()  # closes the node (and the SimNode's temp files) with it
            except Exception:
                log.debug("close failed", exc_info=True)

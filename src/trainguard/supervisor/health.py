"""The node's health, as the supervisor sees it: the node agent (telemetry + kernel log) ticked
from the monitor loop, and which ranks use which GPU.

With ``backend="sim"`` the supervisor owns a simulated fleet of ``nproc`` GPUs whose kernel-log
file the agent follows; chaos drills inject faults into that fleet, so a simulated Xid 79 reaches
the supervisor through the same kernel line a real one would.
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
    """Ticks the node agent at most every ``interval`` seconds; never raises (a broken health
    source degrades to "no verdict", it must not stop training)."""

    def __init__(
        self,
        backend: str,
        n_gpus: int,
        run_dir: Path,
        kernel_log: Path | None = None,
        interval: float = 0.5,
        thresholds: Thresholds | None = None,
    ) -> None:
        self.backend_name = backend
        self.thresholds = thresholds
        self.interval = interval
        self.fleet: Any = None  # the SimFleet when backend == "sim"
        self.kernel_log = kernel_log
        self._agent: Any = None
        self._next = 0.0
        self.last: NodeVerdict | None = None
        if backend in ("", "none"):
            return
        try:
            self._agent = self._open(backend, n_gpus, run_dir)
        except Exception as exc:  # missing module, no driver...: run without node health
            log.warning("node health disabled (%s backend): %s", backend, exc)
            self._agent = None

    @property
    def active(self) -> bool:
        """The node agent runs (a backend was asked for and opened)."""
        return self._agent is not None

    def _open(self, backend: str, n_gpus: int, run_dir: Path) -> Any:
        from trainguard.agent import Agent

        if backend == "sim":
            from trainguard.telemetry.sim import SimFleet

            if self.kernel_log is None:
                self.kernel_log = run_dir / "sim-kmsg.log"
            self.kernel_log.parent.mkdir(parents=True, exist_ok=True)
            self.kernel_log.touch()
            self.fleet = SimFleet(n_gpus=n_gpus, seed=0, kmsg_path=self.kernel_log)
            return Agent(self.fleet, kernel_log=self.kernel_log, thresholds=self.thresholds)
        from trainguard.telemetry import open_backend

        return Agent(open_backend(backend), kernel_log=self.kernel_log, thresholds=self.thresholds)

    @property
    def enabled(self) -> bool:
        return self._agent is not None

    def tick(self, now: float | None = None, force: bool = False) -> NodeVerdict | None:
        """A fresh verdict when the interval elapsed (or ``force``), else None."""
        now = time.time() if now is None else now
        if self._agent is None or (not force and now < self._next):
            return None
        self._next = now + self.interval
        try:
            verdict = self._agent.tick()
        except Exception:
            log.debug("node agent tick failed", exc_info=True)
            return None
        self.last = verdict
        return verdict

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
        for obj in (self._agent, self.fleet):
            close = getattr(obj, "close", None)
            if callable(close):
                try:
                    close()
                except Exception:
                    log.debug("close failed", exc_info=True)

"""A rank on a simulated GPU computes at that GPU's speed: its forward and backward really take
``1 / speed`` as long.

Part of the Guard, on a simulated node only: under ``trainguard run --backend sim`` the supervisor
writes its ``SimNode``'s GPU speeds (``trainguard.telemetry.sim.speed``) and names the file in
``TRAINGUARD_SIM_SPEEDS``; the Guard then times each forward of ``state.model`` and, on a GPU
below full speed, sleeps what the rest of that step's compute would have taken longer: the
forward and its backward (counted as twice the forward, its share of the FLOPs) at ``1 / speed``.
The forward's time is the CPU time of the thread that ran it (the simulated device's clock, as in
``trainguard.diagnose.sim_device``: a busy host does not slow a GPU). The sleep is inside the
rank's compute, before its gradients are ready, so its peers really wait for it, and it is device
time (``device_time``), so the rank's measured compute per sample really grows, as on a throttled
GPU. A sleep, not more arithmetic: a slow GPU does not take its host's CPU from the other ranks.

    >>> import torch
    >>> naps = []
    >>> gpu = SimGpu(lambda: 0.5, sleep=naps.append, clock=iter([0.0, 0.01]).__next__)
    >>> gpu.attach(torch.nn.Linear(2, 2))
    >>> _ = gpu.model(torch.ones(1, 2))
    >>> naps                                  # 10 ms forward at half speed: 30 ms more in all
    [0.03]
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from trainguard.telemetry.sim.speed import SPEEDS_ENV, read_speed
from trainguard.torch.state import unwrap_model

__all__ = ["SimGpu", "from_file", "simulated_gpu"]

BACKWARD_FACTOR = 3.0  # forward + backward, in units of the forward
REFRESH_S = 0.25  # re-read the speeds at most this often


class SimGpu:
    def __init__(
        self,
        speed: Callable[[], float | None],
        sleep: Callable[[float], None] = time.sleep,
        clock: Callable[[], float] = time.thread_time,
    ) -> None:
        self.speed, self._sleep, self._clock = speed, sleep, clock
        self.model: torch.nn.Module | None = None
        self.slept_s = 0.0  # device time the slowdown added so far (slept)
        self._t0: float | None = None
        self._hooks: list[Any] = []

    def attach(self, model: torch.nn.Module) -> None:
        inner = unwrap_model(model)
        self.model = model
        self._hooks = [
            inner.register_forward_pre_hook(self._before),
            inner.register_forward_hook(self._after),
        ]

    def device_time(self) -> float:
        """The simulated device's clock: the thread's CPU time plus the time the slowdown added."""
        return time.thread_time() + self.slept_s

    def close(self) -> None:
        for h in self._hooks:
            h.remove()
        self._hooks = []

    def _before(self, module: torch.nn.Module, args: tuple[Any, ...]) -> None:
        self._t0 = self._clock()

    def _after(self, module: torch.nn.Module, args: tuple[Any, ...], output: Any) -> None:
        if self._t0 is None or not torch.is_grad_enabled():
            return
        forward = self._clock() - self._t0
        self._t0 = None
        speed = self.speed()
        if speed is None or not 0 < speed < 1:
            return
        extra = (1 / speed - 1) * BACKWARD_FACTOR * forward
        self.slept_s += extra
        self._sleep(extra)


def from_file(
    path: Path, gpu: int, clock: Callable[[], float] = time.monotonic
) -> Callable[[], float | None]:
    """The speed of ``gpu`` in the supervisor's file, re-read at most every `REFRESH_S`."""
    cached: list[Any] = [None, -float("inf")]  # (speed, when read)

    def speed() -> float | None:
        now = clock()
        if now - cached[1] >= REFRESH_S:
            cached[0], cached[1] = read_speed(path, gpu), now
        value: float | None = cached[0]
        return value

    return speed


def simulated_gpu(state: Any) -> SimGpu | None:
    """On a simulated node (``TRAINGUARD_SIM_SPEEDS`` set by the supervisor), a `SimGpu` on
    ``state.model`` for this rank's GPU (``TRAINGUARD_GPU``); else None."""
    path, named = os.environ.get(SPEEDS_ENV), os.environ.get("TRAINGUARD_GPU", "")
    model = getattr(state, "model", None)
    if not path or not named.isdigit() or not isinstance(model, torch.nn.Module):
        return None
    sim = SimGpu(from_file(Path(path), int(named)))
    sim.attach(model)
    return sim

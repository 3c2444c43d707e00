"""The device seam of the diagnostics, and how much work each level does on each kind of device.

Tests are written once, against ``Device``; two implementations ship:

- ``TorchDevice`` (``diagnose/torch_device.py``): a CUDA GPU through torch, or the CPU where there
  is no GPU (expectations then come from the machine itself);
- ``SimDevice`` (``diagnose/sim_device.py``): one GPU of the simulated node. It runs the same real
  computation on the CPU and applies what the node's faults do to silicon: a slower clock, flipped
  bits in products, corrupted writes, a capped link, heat under load. Every result is measured;
  none is read from the simulator's ground truth.

This module is torch-free; tensors appear as ``Any``.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from dataclasses import dataclass, replace
from typing import Any, Protocol

from trainguard.records import Sample

__all__ = ["BUDGETS", "Budget", "Device", "budget_for"]


class Device(Protocol):
    """One device the tests run on. ``kind`` is ``"cuda"``, ``"cpu"`` or ``"sim"``."""

    index: int
    name: str  # the model, as NVML names it ("NVIDIA H100 80GB HBM3"), or "cpu"
    kind: str
    torch_device: str  # "cuda:3" or "cpu"

    def sync(self) -> None:
        """Wait until queued work finished (timing needs it on CUDA)."""

    def clock(self) -> float:
        """Seconds of this device's time, for timing its work (wall time on real devices)."""

    def matmul(self, a: Any, b: Any) -> Any:
        """``a @ b`` as this device computes it."""

    def write(self, dst: Any, src: Any) -> None:
        """Store ``src`` (a tensor or a scalar) into ``dst`` in device memory."""

    def all_reduce(self, group: Any, tensor: Any) -> None:
        """Sum ``tensor`` over ``group`` (a torch process group this device is a rank of) and wait."""

    def link_seconds(self, nbytes: int, ranks: int, wall_s: float) -> float:
        """How long an all-reduce of ``nbytes`` among ``ranks`` took on this device's link, given
        its wall time: the wall time on real devices."""

    def busy(self) -> AbstractContextManager[None]:
        """The span during which the device is under test load."""

    def reading(self) -> Sample | None:
        """A fresh telemetry reading of this device; None where there is none (the CPU)."""

    def memory_free(self) -> int:
        """Bytes free for the memory tests."""


@dataclass(frozen=True, slots=True)
class Budget:
    """How much work a level does per device: sizes, rounds and seconds."""

    matmul_n: int  # square matrix side of the compute test
    dtypes: tuple[str, ...]  # compute test dtypes, first one judged against peers
    compute_s: float  # seconds of timed matrix products per dtype
    sdc_rounds: int
    sdc_n: int
    copy_bytes: int  # buffer of the bandwidth test
    bandwidth_s: float
    pattern_fraction: float  # of free memory the pattern test covers
    pattern_max_bytes: int
    allreduce_bytes: int
    allreduce_iters: int
    stress_s: float  # seconds of load during the thermal/power test
    sample_every_s: float  # telemetry sampling period during the stress
    timeout_s: float  # the watchdog: a test that runs longer is failed as hung


_MiB = 2**20
_GiB = 2**30

_CUDA2 = Budget(
    matmul_n=8192, dtypes=("bf16", "fp32"), compute_s=8.0, sdc_rounds=20, sdc_n=4096,
    copy_bytes=_GiB, bandwidth_s=3.0, pattern_fraction=0.25, pattern_max_bytes=64 * _GiB,
    allreduce_bytes=256 * _MiB, allreduce_iters=20, stress_s=30.0, sample_every_s=0.5, timeout_s=180.0,
)  # fmt: skip
# Sized to a shared CPU so that level 2 over 8 simulated GPUs takes well under a minute.
_CPU2 = Budget(
    matmul_n=384, dtypes=("fp32",), compute_s=0.6, sdc_rounds=20, sdc_n=256,
    copy_bytes=16 * _MiB, bandwidth_s=0.4, pattern_fraction=1.0, pattern_max_bytes=4 * _MiB,
    allreduce_bytes=4 * _MiB, allreduce_iters=8, stress_s=3.5, sample_every_s=0.25, timeout_s=60.0,
)  # fmt: skip
SIM_COPY_BYTES = 256 * 2**10
BUDGETS: dict[tuple[int, str], Budget] = {
    (2, "cuda"): _CUDA2,
    (3, "cuda"): replace(
        _CUDA2, compute_s=60.0, sdc_rounds=200, bandwidth_s=10.0, pattern_fraction=0.9,
        pattern_max_bytes=512 * _GiB, allreduce_bytes=_GiB, allreduce_iters=50, stress_s=300.0,
        sample_every_s=1.0, timeout_s=900.0,
    ),
    (2, "cpu"): _CPU2,
    (3, "cpu"): replace(
        _CPU2, matmul_n=512, dtypes=("fp32", "bf16"), compute_s=5.0, sdc_rounds=200,
        copy_bytes=64 * _MiB, bandwidth_s=2.0, pattern_max_bytes=256 * _MiB, allreduce_bytes=16 * _MiB,
        allreduce_iters=20, stress_s=20.0, sample_every_s=0.5, timeout_s=300.0,
    ),
}  # fmt: skip


def budget_for(level: int, kind: str, **overrides: Any) -> Budget:
    """The budget of ``level`` (2 or 3; 1 has no device work) on ``kind`` (sim uses the CPU's)."""
    base = BUDGETS[(max(2, min(level, 3)), "cuda" if kind == "cuda" else "cpu")]
    if kind == "sim":  # a simulated GPU's memory is its own: a copy held in the core's L2 cache is
        base = replace(base, copy_bytes=SIM_COPY_BYTES)  # not slowed by the host's other processes
    return replace(base, **overrides) if overrides else base

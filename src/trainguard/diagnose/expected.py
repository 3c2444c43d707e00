"""What well-known datacenter GPUs should do: dense matrix-multiply peak per dtype and memory
bandwidth, from NVIDIA's datasheets (SXM/OAM boards unless the name says PCIe).

Peaks are what the silicon can do; a healthy GPU sustains a share of it on large GEMMs (bf16
~60-80%, fp32 ~80-90%), so tests judge measured/peak against ``PEAK_FLOOR`` rather than 1.0.

    >>> spec_for("NVIDIA H100 80GB HBM3").tflops["bf16"]
    989.0
    >>> spec_for("cpu") is None
    True
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

__all__ = ["GPU_SPECS", "PEAK_FLOOR", "GpuSpec", "floor_of", "peak_of", "spec_for"]


@dataclass(frozen=True, slots=True)
class GpuSpec:
    name: str  # what NVML's name contains (matched longest first, case-insensitive)
    tflops: dict[str, float] = field(default_factory=dict)  # dense, no sparsity
    hbm_gbps: float | None = None  # memory bandwidth, GB/s (1e9)


# Dense peaks (TFLOPS): bf16/fp16 and tf32 on tensor cores, fp32 on CUDA cores.
GPU_SPECS: tuple[GpuSpec, ...] = (
    GpuSpec("B200", {"bf16": 2250.0, "fp16": 2250.0, "tf32": 1100.0}, 8000.0),
    GpuSpec("H200", {"bf16": 989.0, "fp16": 989.0, "tf32": 494.0, "fp32": 67.0}, 4800.0),
    GpuSpec("GH200", {"bf16": 989.0, "fp16": 989.0, "tf32": 494.0, "fp32": 67.0}, 4000.0),
    GpuSpec("H100 80GB HBM3", {"bf16": 989.0, "fp16": 989.0, "tf32": 494.0, "fp32": 67.0}, 3350.0),
    GpuSpec("H100 SXM", {"bf16": 989.0, "fp16": 989.0, "tf32": 494.0, "fp32": 67.0}, 3350.0),
    GpuSpec("H100 NVL", {"bf16": 835.0, "fp16": 835.0, "tf32": 418.0, "fp32": 60.0}, 3900.0),
    GpuSpec("H100 PCIe", {"bf16": 756.0, "fp16": 756.0, "tf32": 378.0, "fp32": 51.0}, 2000.0),
    GpuSpec("H800", {"bf16": 989.0, "fp16": 989.0, "tf32": 494.0, "fp32": 67.0}, 3350.0),
    GpuSpec("A100-SXM4-80GB", {"bf16": 312.0, "fp16": 312.0, "tf32": 156.0, "fp32": 19.5}, 2039.0),
    GpuSpec("A100-SXM4-40GB", {"bf16": 312.0, "fp16": 312.0, "tf32": 156.0, "fp32": 19.5}, 1555.0),
    GpuSpec("A100 80GB PCIe", {"bf16": 312.0, "fp16": 312.0, "tf32": 156.0, "fp32": 19.5}, 1935.0),
    GpuSpec("A100-PCIE-40GB", {"bf16": 312.0, "fp16": 312.0, "tf32": 156.0, "fp32": 19.5}, 1555.0),
    GpuSpec("L40S", {"bf16": 362.0, "fp16": 362.0, "tf32": 183.0, "fp32": 91.6}, 864.0),
    GpuSpec("L4", {"bf16": 121.0, "fp16": 121.0, "tf32": 60.0, "fp32": 30.3}, 300.0),
    GpuSpec("A10", {"bf16": 125.0, "fp16": 125.0, "tf32": 62.5, "fp32": 31.2}, 600.0),
    GpuSpec("V100-SXM2", {"fp16": 125.0, "fp32": 15.7}, 900.0),
)

# measured/peak below which a test warns or fails, per dtype family (tensor cores reach less).
PEAK_FLOOR: dict[str, tuple[float, float]] = {  # dtype -> (warn below, fail below)
    "bf16": (0.45, 0.3),
    "fp16": (0.45, 0.3),
    "tf32": (0.45, 0.3),
    "fp32": (0.6, 0.4),
    "memory": (0.6, 0.4),
}


def spec_for(model: str) -> GpuSpec | None:
    """The spec whose name the model contains (``"NVIDIA H100 80GB HBM3"`` -> H100 SXM)."""
    for spec in sorted(GPU_SPECS, key=lambda s: -len(s.name)):
        # "A10" must not match "A100", nor "L4" match "L40": a name ending in a digit ends there.
        tail = r"(?![0-9])" if spec.name[-1].isdigit() else ""
        if re.search(r"(?<![0-9a-z])" + re.escape(spec.name.lower()) + tail, model.lower()):
            return spec
    return None


def peak_of(kind: str, model: str, what: str) -> float | None:
    """The datasheet figure for ``what`` (a dtype or ``"memory"``) of a CUDA device's model; None
    for other devices (a simulated H100 computes on the host's CPU) and unknown models."""
    spec = spec_for(model) if kind == "cuda" else None
    if spec is None:
        return None
    return spec.hbm_gbps if what == "memory" else spec.tflops.get(what)


def floor_of(what: str) -> tuple[float, float]:
    return PEAK_FLOOR.get(what, PEAK_FLOOR["fp32"])

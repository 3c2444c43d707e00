"""What well-known datacenter GPUs should do: dense matrix-multiply peak per dtype and memory
bandwidth, from NVIDIA's datasheets (SXM/OAM boards unless the name says PCIe).

Peaks are what the silicon can do; a healthy GPU sustains a share of it on large GEMMs (bf16
~60-80%, fp32 ~80-90%), so tests judge measured/peak against ``PEAK_FLOOR`` rather than 1.0.

    >>> spec_for("NVIDIA H100 80GB HBM3").tflops["bf16"]
    989.0
    >>> spec_for("cpu") is None
    True

The link a GPU pair's all-reduce runs over, from what NVML reports (PCIe generation and width,
NVLinks and their version), in GB/s per direction:

    >>> link_gbps(pcie_gen=5, pcie_width=16)
    63.0
    >>> link_gbps(pcie_gen=5, pcie_width=16, nvlinks=18, nvlink_version=6)  # H100 SXM, NVLink 4
    450.0
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

__all__ = ["GPU_SPECS", "LINK_FLOOR", "PEAK_FLOOR", "GpuSpec", "floor_of", "link_gbps", "peak_of", "spec_for"]


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


# PCIe per lane and direction after line encoding (GB/s): 8b/10b to gen 2, 128b/130b from gen 3,
# gen 6's FLIT mode about 7.56. NVLink per link and direction (GB/s), keyed by NVML's
# nvmlNvlinkVersion_t (1: 1.0 P100; 2, 3: 2.x V100; 4, 5: 3.x A100; 6: 4.0 H100; 7: 5.0 B200).
PCIE_LANE_GBPS: dict[int, float] = {1: 0.25, 2: 0.5, 3: 0.985, 4: 1.969, 5: 3.938, 6: 7.56}
NVLINK_GBPS: dict[int, float] = {1: 20.0, 2: 25.0, 3: 25.0, 4: 25.0, 5: 25.0, 6: 25.0, 7: 50.0}
# The least share of that a healthy pair's 64 MiB all-reduce reaches (nccl-tests' bus bandwidth):
# a pair on the link's floor is broken (a link down, P2P off through the host), not slow.
LINK_FLOOR = 0.25


def link_gbps(
    pcie_gen: int | None, pcie_width: int | None, nvlinks: int = 0, nvlink_version: int | None = None
) -> float | None:
    """GB/s per direction a GPU can send a peer: its NVLinks to it when it has any (``nvlinks``
    up, of ``nvlink_version``), else its PCIe link (use the maximum generation and width: an idle
    link trains down); None when NVML did not say."""
    if nvlinks and nvlink_version in NVLINK_GBPS:
        return round(nvlinks * NVLINK_GBPS[nvlink_version], 1)
    if pcie_gen in PCIE_LANE_GBPS and pcie_width:
        return round(PCIE_LANE_GBPS[pcie_gen] * pcie_width, 1)
    return None

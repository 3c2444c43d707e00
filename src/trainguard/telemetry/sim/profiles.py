"""What a healthy simulated GPU reads: per-model specs, identities, and the baseline reading.

Numbers follow what ``nvidia-smi -q`` reports on real boards (H100 SXM5: 700 W, 1980 MHz SM,
2619 MHz HBM3, slowdown at 89 C, shutdown at 92 C, PCIe Gen5 x16, 18 NVLinks, no fan).
"""

from __future__ import annotations

import dataclasses
import random
from dataclasses import dataclass
from typing import Any

from trainguard.records import RecoveryAction

__all__ = [
    "PROFILES",
    "GpuProfile",
    "Quirks",
    "activity",
    "baseline",
    "counters",
    "link_gbps",
    "pci_address",
    "profile_for",
    "serial",
    "uuid",
]


@dataclass(frozen=True, slots=True)
class GpuProfile:
    name: str
    device_id: str  # PCI vendor:device, as the kernel prints it
    power_limit_w: float
    idle_power_w: float
    sm_clock_max_mhz: float
    sm_clock_idle_mhz: float
    mem_clock_max_mhz: float
    mem_total_mib: float
    temp_max_operating_c: float  # SW thermal slowdown target
    temp_slowdown_c: float  # HW slowdown
    temp_shutdown_c: float
    pcie_gen_max: int
    pcie_width_max: int
    nvlinks: int
    has_fan: bool = False  # SXM boards are cooled by the chassis: NVML says NotSupported
    gpm: bool = False  # NVML GPM (the DCGM_FI_PROF_* ratios): Hopper and newer


PROFILES: dict[str, GpuProfile] = {
    p.name: p
    for p in (
        GpuProfile(
            "NVIDIA H100 80GB HBM3",
            "10de:2330",
            700,
            72,
            1980,
            345,
            2619,
            81559,
            87,
            89,
            92,
            5,
            16,
            18,
            gpm=True,
        ),
        GpuProfile(
            "NVIDIA H200", "10de:2335", 700, 75, 1980, 345, 3201, 143771, 87, 89, 92, 5, 16, 18, gpm=True
        ),
        GpuProfile(
            "NVIDIA A100-SXM4-80GB", "10de:20b2", 400, 62, 1410, 210, 1593, 81920, 85, 89, 92, 4, 16, 12
        ),
        GpuProfile(
            "NVIDIA A100 80GB PCIe", "10de:20b5", 300, 45, 1410, 210, 1512, 81920, 85, 89, 92, 4, 16, 0, True
        ),
    )
}


def activity(p: GpuProfile, util: float, load: float, rng: random.Random) -> dict[str, float | None]:
    """What GPM reports for a busy training step (None before Hopper, as NVML answers there)."""
    if not p.gpm:
        return dict.fromkeys(
            ("gr_engine_active", "tensor_active", "dram_active", "pcie_tx_bytes_s", "pcie_rx_bytes_s")
        )
    return {
        "gr_engine_active": round(util / 100, 3),
        "tensor_active": round(0.55 * load * rng.uniform(0.9, 1.1), 3),
        "dram_active": round(0.4 * load * rng.uniform(0.9, 1.1), 3),
        "pcie_tx_bytes_s": round(2e8 * load * rng.uniform(0.5, 1.5)),  # data loading, small next to NVLink
        "pcie_rx_bytes_s": round(8e8 * load * rng.uniform(0.5, 1.5)),
    }


def counters(p: GpuProfile, load: float, elapsed_s: float, uptime_s: float) -> dict[str, int | None]:
    """Cumulative counters at ``elapsed_s`` into a run at a constant ``load`` (uptime before it idle):
    energy (mJ) and NVLink data (KiB, tx + rx, all links)."""
    busy_w = p.idle_power_w + load * (0.86 * p.power_limit_w - p.idle_power_w)
    energy_j = p.idle_power_w * max(0.0, uptime_s - elapsed_s) + busy_w * max(0.0, elapsed_s)
    nvlink = None
    if p.nvlinks:  # all-reduce traffic: a fifth of the links' rate, both ways
        nvlink = round(2 * 0.2 * link_gbps(p) * 1e9 / 1024 * load * max(0.0, elapsed_s))
    return {"energy_mj": round(energy_j * 1000), "nvlink_data_kib": nvlink}


# GPU bus numbers of a DGX H100 baseboard; more GPUs continue in the next PCI domains.
_DGX_BUSES = (0x1B, 0x43, 0x52, 0x61, 0x9D, 0xC3, 0xD1, 0xDF)


def profile_for(model: str) -> GpuProfile:
    """The profile of a known model; an unknown name gets H100 numbers under that name."""
    if model in PROFILES:
        return PROFILES[model]
    return dataclasses.replace(PROFILES["NVIDIA H100 80GB HBM3"], name=model)


# GB/s (1e9) one way: an NVLink of generations 3 and 4 moves 25; a PCIe lane per generation.
_NVLINK_GBPS = 25.0
_PCIE_LANE_GBPS = {3: 0.985, 4: 1.969, 5: 3.938}


def link_gbps(p: GpuProfile) -> float:
    """The one-way bandwidth of the GPU's link to its peers: its NVLinks together, else its PCIe
    slot (an H100 SXM: 18 x 25 = 450 GB/s; an A100 PCIe: Gen4 x16, 31.5 GB/s)."""
    if p.nvlinks:
        return p.nvlinks * _NVLINK_GBPS
    return _PCIE_LANE_GBPS.get(p.pcie_gen_max, _PCIE_LANE_GBPS[4]) * p.pcie_width_max


def pci_address(index: int) -> str:
    return f"{index // len(_DGX_BUSES):04x}:{_DGX_BUSES[index % len(_DGX_BUSES)]:02x}:00"


def uuid(seed: int, hostname: str, index: int) -> str:
    rng = random.Random(f"uuid/{seed}/{hostname}/{index}")
    h = f"{rng.getrandbits(128):032x}"
    return f"GPU-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


def serial(seed: int, hostname: str, index: int) -> str:
    return f"1654922{random.Random(f'serial/{seed}/{hostname}/{index}').randrange(10**6):06d}"


@dataclass(frozen=True, slots=True)
class Quirks:
    """Fixed per-board differences: position in the chassis, silicon bin."""

    temp_offset_c: float
    power_scale: float
    clock_bin_mhz: float

    @classmethod
    def draw(cls, seed: int, hostname: str, index: int) -> Quirks:
        rng = random.Random(f"quirks/{seed}/{hostname}/{index}")
        return cls(rng.uniform(-4.0, 6.0), rng.uniform(0.93, 1.04), rng.choice((0, 15, 30, 45, 60)))


def baseline(p: GpuProfile, q: Quirks, load: float, rng: random.Random) -> dict[str, Any]:
    """One healthy reading as ``Sample`` keyword arguments (throttle as a mutable set)."""
    load = min(max(load, 0.0), 1.0)
    busy = load >= 0.05
    util = max(0.0, min(100.0, load * 100 - rng.uniform(0, 4))) if busy else 0.0
    temp = 31 + 30 * load + q.temp_offset_c + rng.gauss(0, 0.8)
    power = p.idle_power_w + load * (0.86 * p.power_limit_w - p.idle_power_w) * q.power_scale
    power = min(power + rng.gauss(0, 0.02 * p.power_limit_w), p.power_limit_w)
    # Under load the SM clock sits near its max, a bin or two below as power management dithers.
    sm = p.sm_clock_max_mhz - q.clock_bin_mhz - 15 * rng.randrange(4) if busy else p.sm_clock_idle_mhz
    used = round(p.mem_total_mib * (0.86 * load + 0.005) + rng.uniform(-200, 200) * load)
    reserved = round(p.mem_total_mib * 0.0066)  # what the driver and firmware keep (~540 MiB on 80 GB)
    return {
        "temperature_c": round(temp),
        "temp_slowdown_c": p.temp_slowdown_c,
        "temp_shutdown_c": p.temp_shutdown_c,
        "power_w": round(power, 2),
        "power_limit_w": float(p.power_limit_w),
        "fan_pct": round(30 + 40 * load + rng.uniform(-2, 2)) if p.has_fan else None,
        "sm_clock_mhz": float(max(sm, p.sm_clock_idle_mhz)),
        "sm_clock_max_mhz": p.sm_clock_max_mhz,
        "mem_clock_mhz": p.mem_clock_max_mhz,
        "mem_clock_max_mhz": p.mem_clock_max_mhz,
        "util_gpu_pct": round(util),
        "util_mem_pct": round(util * rng.uniform(0.35, 0.55)),
        "mem_used_mib": used,
        "mem_total_mib": p.mem_total_mib,
        "mem_free_mib": p.mem_total_mib - used - reserved,
        "mem_reserved_mib": reserved,
        "memory_temp_c": round(temp + 6 + 4 * load),  # HBM runs a few degrees above the core
        "enc_util_pct": 0,  # training uses neither NVENC nor NVDEC
        "dec_util_pct": 0,
        **activity(p, util, load, rng),
        "throttle": set(),
        "retired_sbe": None,  # Ampere and later remap rows instead of retiring pages: NotSupported
        "retired_dbe": None,
        "retired_pending": None,
        "pcie_gen": p.pcie_gen_max,
        "pcie_gen_max": p.pcie_gen_max,
        "pcie_width": p.pcie_width_max,
        "pcie_width_max": p.pcie_width_max,
        "pcie_replay": 0,
        "nvlink_up": p.nvlinks if p.nvlinks else None,
        "nvlink_total": p.nvlinks if p.nvlinks else None,
        "nvlink_crc_errors": 0 if p.nvlinks else None,
        "nvlink_replay_errors": 0 if p.nvlinks else None,
        "nvlink_recovery_errors": 0 if p.nvlinks else None,
        "recovery_action": RecoveryAction.NONE,
    }

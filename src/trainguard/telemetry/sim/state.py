"""The mutable state of one simulated GPU, and the lasting conditions faults leave on it.

A fault fires once (``faults.py``): it bumps counters here, appends kernel lines, and may attach
a ``Condition`` that keeps shaping every later reading (a temperature that keeps climbing, a
replay counter that keeps counting). Conditions are functions of the time since they began, so
a reading depends only on the seed, the clock and the faults, never on how often it was taken.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any, Protocol

from trainguard.records import Gpu, RecoveryAction, Throttle
from trainguard.telemetry.sim.profiles import GpuProfile

__all__ = [
    "Capped",
    "Condition",
    "DetouredLink",
    "Downtrain",
    "FaultContext",
    "GpuState",
    "HbmCorruption",
    "HotUnderLoad",
    "NvlinkCrcStorm",
    "NvlinkDown",
    "PowerBrake",
    "ReplayStorm",
    "SlowLink",
    "SlowProducts",
    "Straggler",
    "StuckBits",
    "ThermalRunaway",
    "WrongProducts",
]


class Condition(Protocol):
    @property
    def since(self) -> float: ...

    def apply(self, r: dict[str, Any], now: float, p: GpuProfile, rng: random.Random) -> None: ...


@dataclass
class GpuState:
    lost_at: float | None = None
    lost_error: str | None = None
    ecc_sbe_volatile: int = 0
    ecc_dbe_volatile: int = 0
    ecc_sbe_aggregate: int = 0
    ecc_dbe_aggregate: int = 0
    remap_correctable: int = 0
    remap_uncorrectable: int = 0
    remap_pending: bool = False
    remap_failure: bool = False
    recovery_action: RecoveryAction = RecoveryAction.NONE
    load: float | None = None  # None: the node's load
    busy_since: float | None = None  # when this GPU's own load last went from idle to busy
    conditions: list[Condition] = field(default_factory=list)
    defects: list[Condition] = field(default_factory=list)  # silicon damage: survives resets

    def counters(self) -> dict[str, Any]:
        return {
            "ecc_sbe_volatile": self.ecc_sbe_volatile,
            "ecc_dbe_volatile": self.ecc_dbe_volatile,
            "ecc_sbe_aggregate": self.ecc_sbe_aggregate,
            "ecc_dbe_aggregate": self.ecc_dbe_aggregate,
            "remap_correctable": self.remap_correctable,
            "remap_uncorrectable": self.remap_uncorrectable,
            "remap_pending": self.remap_pending,
            "remap_failure": self.remap_failure,
            "recovery_action": self.recovery_action,
        }

    def reset(self) -> None:
        """What a GPU reset clears: volatile counters, the pending remap (now active), the
        driver's requested action and every transient condition. Aggregates persist in the InfoROM."""
        self.ecc_sbe_volatile = self.ecc_dbe_volatile = 0
        self.remap_pending = False
        self.recovery_action = RecoveryAction.NONE
        self.conditions.clear()


class FaultContext(Protocol):
    """What a fault may touch when it fires (implemented by ``SimNode``)."""

    @property
    def n_gpus(self) -> int: ...

    @property
    def profile(self) -> GpuProfile: ...

    def state(self, gpu: int) -> GpuState: ...

    def identity(self, gpu: int) -> Gpu: ...

    def kernel(self, at: float, messages: list[str]) -> None: ...

    def boot_messages(self) -> list[str]: ...

    def rng(self, *key: object) -> random.Random: ...


def _slow(r: dict[str, Any], p: GpuProfile, clock_frac: float, power_frac: float) -> None:
    r["sm_clock_mhz"] = float(round(min(r["sm_clock_mhz"], p.sm_clock_max_mhz * clock_frac) / 15) * 15)
    r["power_w"] = round(min(r["power_w"], p.power_limit_w * power_frac), 2)


@dataclass(frozen=True, slots=True)
class ThermalRunaway:
    """Cooling lost: the temperature climbs until HW slowdown holds it just past the threshold."""

    since: float
    rate_c_per_s: float

    def apply(self, r: dict[str, Any], now: float, p: GpuProfile, rng: random.Random) -> None:
        ceiling = p.temp_slowdown_c + 2 + rng.uniform(-0.5, 0.5)
        temp = min(r["temperature_c"] + self.rate_c_per_s * (now - self.since), ceiling)
        r["temperature_c"] = round(temp)
        if temp >= p.temp_max_operating_c:
            r["throttle"].add(Throttle.SW_THERMAL)
            _slow(r, p, 0.85, 0.8)
        if temp >= p.temp_slowdown_c:
            r["throttle"].update((Throttle.HW_THERMAL, Throttle.HW_SLOWDOWN))
            _slow(r, p, 0.5, 0.55)


@dataclass(frozen=True, slots=True)
class PowerBrake:
    """The board's power-brake input asserted (PSU or chassis event): clocks cut hard."""

    since: float
    until: float | None = None

    def apply(self, r: dict[str, Any], now: float, p: GpuProfile, rng: random.Random) -> None:
        if self.until is not None and now >= self.until:
            return
        r["throttle"].update((Throttle.HW_POWER_BRAKE, Throttle.HW_SLOWDOWN))
        _slow(r, p, 0.3, 0.35)


@dataclass(frozen=True, slots=True)
class Capped:
    """The SM clock held at ``fraction`` of its max under load by a software limit (a lowered power
    limit: SW power cap; a hot chassis: SW thermal slowdown), from ``since`` until ``until``.
    NVML reports the clock and the reason; no health rule fires (both are normal operation),
    yet the GPU computes at that fraction of its peers' speed."""

    since: float
    fraction: float
    reason: Throttle = Throttle.SW_POWER_CAP
    until: float | None = None

    def apply(self, r: dict[str, Any], now: float, p: GpuProfile, rng: random.Random) -> None:
        if self.until is not None and now >= self.until:
            return
        if not r["util_gpu_pct"] or r["util_gpu_pct"] <= 5:
            return  # idle, the clock is low anyway and no limit is hit
        r["throttle"].add(self.reason)
        _slow(r, p, self.fraction, 0.3 + 0.6 * self.fraction)


@dataclass(frozen=True, slots=True)
class Straggler:
    """Clocks stuck low under full load with no throttle reason: the GPU that slows the job."""

    since: float
    sm_clock_mhz: float

    def apply(self, r: dict[str, Any], now: float, p: GpuProfile, rng: random.Random) -> None:
        if r["util_gpu_pct"] and r["util_gpu_pct"] > 5:
            r["util_gpu_pct"] = 100
            r["sm_clock_mhz"] = float(self.sm_clock_mhz)
            r["power_w"] = round(r["power_w"] * 0.62, 2)


@dataclass(frozen=True, slots=True)
class ReplayStorm:
    since: float
    rate_per_s: float

    def apply(self, r: dict[str, Any], now: float, p: GpuProfile, rng: random.Random) -> None:
        r["pcie_replay"] += int(self.rate_per_s * (now - self.since))


@dataclass(frozen=True, slots=True)
class Downtrain:
    since: float
    gen: int | None
    width: int | None

    def apply(self, r: dict[str, Any], now: float, p: GpuProfile, rng: random.Random) -> None:
        if self.gen is not None:
            r["pcie_gen"] = min(r["pcie_gen"], self.gen)
        if self.width is not None:
            r["pcie_width"] = min(r["pcie_width"], self.width)


@dataclass(frozen=True, slots=True)
class NvlinkCrcStorm:
    """A marginal link: CRC errors climb fast, with the replays and recoveries they cause."""

    since: float
    rate_per_s: float

    def apply(self, r: dict[str, Any], now: float, p: GpuProfile, rng: random.Random) -> None:
        if r["nvlink_crc_errors"] is None:
            return
        dt = now - self.since
        r["nvlink_crc_errors"] += int(self.rate_per_s * dt)
        r["nvlink_replay_errors"] += int(self.rate_per_s * dt / 25)
        r["nvlink_recovery_errors"] += int(dt / 20)


@dataclass(frozen=True, slots=True)
class NvlinkDown:
    since: float
    links: int = 1

    def apply(self, r: dict[str, Any], now: float, p: GpuProfile, rng: random.Random) -> None:
        if r["nvlink_up"] is not None:
            r["nvlink_up"] = max(0, r["nvlink_up"] - self.links)


# Defects only an active test can see: no NVML reading changes, no kernel line is written. The
# diagnostics' simulated GPU (trainguard.diagnose.sim_device) applies them to the real
# computation it runs, as the broken silicon would.


@dataclass(frozen=True, slots=True)
class WrongProducts:
    """``rate`` of the elements of matrix products come back with a flipped bit, the same ones for
    the same operands (silent data corruption)."""

    since: float
    rate: float = 1.0

    def apply(self, r: dict[str, Any], now: float, p: GpuProfile, rng: random.Random) -> None:
        return


@dataclass(frozen=True, slots=True)
class HbmCorruption:
    """Some writes to device memory land with a flipped bit (``per_gib`` bad bytes per GiB written)."""

    since: float
    per_gib: float = 256.0

    def apply(self, r: dict[str, Any], now: float, p: GpuProfile, rng: random.Random) -> None:
        return


@dataclass(frozen=True, slots=True)
class SlowLink:
    """The GPU's interconnect link moves data at ``fraction`` of its bandwidth (a degraded lane or
    cable); counters stay clean, so only a bandwidth test finds it."""

    since: float
    fraction: float = 0.25

    def apply(self, r: dict[str, Any], now: float, p: GpuProfile, rng: random.Random) -> None:
        return


@dataclass(frozen=True, slots=True)
class SlowProducts:
    """Matrix products run at ``fraction`` of the rate while clocks, power and throttle reasons
    read normal: the simulated GPU really does ``1 / fraction`` of the work for each product."""

    since: float
    fraction: float = 0.5

    def apply(self, r: dict[str, Any], now: float, p: GpuProfile, rng: random.Random) -> None:
        return


@dataclass(frozen=True, slots=True)
class DetouredLink:
    """Peer-to-peer traffic detours through host memory (a PCIe ACS redirect): the link trains at
    full width, its counters stay clean, and every transfer is really copied through ``bounces``
    more buffers on the way."""

    since: float
    bounces: int = 4

    def apply(self, r: dict[str, Any], now: float, p: GpuProfile, rng: random.Random) -> None:
        return


@dataclass(frozen=True, slots=True)
class StuckBits:
    """``cells`` bytes of device memory each hold one bit stuck at 0 or 1, with no ECC event: a
    written pattern that needs the other value reads back wrong. ``span`` bytes from the start of
    an allocation hold the cells (the memory pattern test writes at least 1 MiB)."""

    since: float
    cells: int = 8
    span: int = 2**20

    def apply(self, r: dict[str, Any], now: float, p: GpuProfile, rng: random.Random) -> None:
        return


@dataclass(frozen=True, slots=True)
class HotUnderLoad:
    """Marginal cooling: idle the GPU looks fine; after ``after_s`` of continuous load it passes the
    slowdown temperature and HW thermal slowdown halves its clocks. ``r["_busy_s"]`` is how long
    the GPU has been busy (set by the node)."""

    since: float
    after_s: float = 2.0

    def apply(self, r: dict[str, Any], now: float, p: GpuProfile, rng: random.Random) -> None:
        busy_s = r.get("_busy_s")
        if busy_s is None:
            return
        r["temperature_c"] = max(r["temperature_c"], round(p.temp_max_operating_c - 6 + 2 * min(busy_s, 2)))
        if busy_s >= self.after_s:
            r["temperature_c"] = round(p.temp_slowdown_c + 1 + rng.uniform(0, 1))
            r["throttle"].update((Throttle.HW_THERMAL, Throttle.HW_SLOWDOWN))
            _slow(r, p, 0.5, 0.55)

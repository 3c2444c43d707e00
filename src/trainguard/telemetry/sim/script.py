"""The fluent scripting API: ``sim.at(t).xid(79, gpu=3)``, ``sim.at(10).thermal_runaway(gpu=1)``.

Every method queues one or more faults and returns the same ``At``, so faults at one moment
chain: ``sim.at(5).dbe(gpu=2).recovery_action(gpu=2)``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from trainguard.records import RecoveryAction, Throttle
from trainguard.telemetry.sim import faults as F

if TYPE_CHECKING:
    from trainguard.telemetry.sim.node import SimNode

__all__ = ["At"]


class At:
    """Faults scripted at ``t`` seconds after the node started."""

    def __init__(self, sim: SimNode, t: float) -> None:
        self.sim, self.t = sim, t

    def after(self, seconds: float) -> At:
        """The moment ``seconds`` later: ``sim.at(5).pcie_replay_storm(gpu=5).after(5).pcie_downtrain(gpu=5)``."""
        return At(self.sim, self.t + seconds)

    def fault(self, fault: F.Fault, delay: float = 0.0) -> At:
        self.sim.schedule(self.t + delay, fault)
        return self

    def xid(
        self, code: int, gpu: int, *, text: str | None = None, pid: int | None = None, name: str | None = None
    ) -> At:
        """An Xid with its full evidence: 79 loses the GPU, 48 is a DBE with a pending remap,
        64 a remap failure, 95 uncontained, 74 a link down, 154 a GPU-reset request; any other
        code (13, 31, 43, 45...) is the kernel line alone. ``text``/``pid`` give a bare line."""
        special: dict[int, F.Fault] = {
            79: F.FallOffBus(gpu),
            48: F.DoubleBitEcc(gpu),
            64: F.RowRemapFailure(gpu),
            95: F.Uncontained(gpu),
            74: F.NvlinkDown(gpu),
            154: F.RecoveryActionChange(gpu),
        }
        if text is None and pid is None and code in special:
            return self.fault(special[code])
        return self.fault(F.Xid(code, gpu, text=text, pid=pid, name=name))

    def fall_off_bus(self, gpu: int) -> At:
        return self.fault(F.FallOffBus(gpu))

    def dbe(self, gpu: int) -> At:
        return self.fault(F.DoubleBitEcc(gpu))

    def row_remap_failure(self, gpu: int) -> At:
        return self.fault(F.RowRemapFailure(gpu))

    def uncontained(self, gpu: int) -> At:
        return self.fault(F.Uncontained(gpu))

    def recovery_action(self, gpu: int, action: RecoveryAction = RecoveryAction.GPU_RESET) -> At:
        return self.fault(F.RecoveryActionChange(gpu, action))

    def thermal_runaway(self, gpu: int, rate_c_per_s: float = 1.5) -> At:
        return self.fault(F.ThermalRunaway(gpu, rate_c_per_s))

    def power_brake(self, gpu: int, duration_s: float | None = None) -> At:
        return self.fault(F.PowerBrake(gpu, duration_s))

    def pcie_replay_storm(self, gpu: int, rate_per_s: float = 200.0) -> At:
        return self.fault(F.PcieReplayStorm(gpu, rate_per_s))

    def pcie_downtrain(self, gpu: int, gen: int | None = None, width: int | None = 8) -> At:
        return self.fault(F.PcieDowntrain(gpu, gen, width))

    def nvlink_crc_storm(self, gpu: int, rate_per_s: float = 500.0) -> At:
        return self.fault(F.NvlinkCrcStorm(gpu, rate_per_s))

    def nvlink_down(self, gpu: int, links: int = 1) -> At:
        return self.fault(F.NvlinkDown(gpu, links))

    def straggler(self, gpu: int, sm_clock_mhz: float | None = None) -> At:
        return self.fault(F.Straggler(gpu, sm_clock_mhz))

    def throttled(
        self,
        gpu: int,
        fraction: float = 0.5,
        reason: Throttle = Throttle.SW_POWER_CAP,
        duration_s: float | None = None,
    ) -> At:
        """The clock held at ``fraction`` of max by a software limit (for ``duration_s``): a GPU
        that computes slower than its peers while no health rule fires."""
        return self.fault(F.Throttled(gpu, fraction, reason, duration_s))

    def wrong_products(self, gpu: int, rate: float = 1.0) -> At:
        """Silent data corruption: ``rate`` of the elements of the GPU's products have a flipped bit."""
        return self.fault(F.WrongProducts(gpu, rate))

    def hbm_corruption(self, gpu: int, per_gib: float = 256.0) -> At:
        return self.fault(F.HbmCorruption(gpu, per_gib))

    def slow_link(self, gpu: int, fraction: float = 0.25) -> At:
        return self.fault(F.SlowLink(gpu, fraction))

    def slow_products(self, gpu: int, fraction: float = 0.5) -> At:
        """Products at ``fraction`` of the rate, clocks reading normal (only ``diagnose`` sees it)."""
        return self.fault(F.SlowProducts(gpu, fraction))

    def detoured_link(self, gpu: int, bounces: int = 4) -> At:
        """Transfers copied through ``bounces`` host buffers, counters clean (only ``diagnose``)."""
        return self.fault(F.DetouredLink(gpu, bounces))

    def stuck_bits(self, gpu: int, cells: int = 8) -> At:
        """Memory cells with a stuck bit, no ECC event (only ``diagnose`` sees it)."""
        return self.fault(F.StuckBits(gpu, cells))

    def hot_under_load(self, gpu: int, after_s: float = 2.0) -> At:
        return self.fault(F.HotUnderLoad(gpu, after_s))

    def reset_gpu(self, gpu: int) -> At:
        return self.fault(F.GpuReset(gpu))

    def reboot_node(self) -> At:
        return self.fault(F.NodeReboot())

    def app_xid_burst(
        self,
        gpu: int,
        codes: tuple[int, ...] = (13, 31, 13),
        interval_s: float = 2.0,
        *,
        sympathetic: bool = True,
        pid: int | None = None,
        name: str = "python",
    ) -> At:
        """Application Xids from one process, ``interval_s`` apart, then (``sympathetic``) the
        Xid 45 the driver logs when it tears the faulting process's channels down."""
        pid = pid if pid is not None else self.sim.rng("burst-pid", gpu, self.t).randrange(2000, 400000)
        for k, code in enumerate(codes):
            self.fault(F.Xid(code, gpu, pid=pid, name=name), delay=k * interval_s)
        if sympathetic:
            self.fault(F.Xid(45, gpu, pid=pid, name=name), delay=(len(codes) - 1) * interval_s + 0.4)
        return self

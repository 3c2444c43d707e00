"""Faults a simulated GPU can suffer, each leaving the evidence the real one leaves.

A fault is a frozen value; ``fire(ctx, at)`` applies it once, at virtual time ``at``: it changes
the NVML-shaped state of the GPU (counters, a lost GPU, a lasting ``Condition``) and, where the
real driver or kernel logs something, appends those exact lines to the node's kernel log.

    >>> from trainguard.clock import VirtualClock
    >>> from trainguard.telemetry.sim import SimNode
    >>> sim = SimNode(clock=VirtualClock())
    >>> sim.inject_now(FallOffBus(gpu=3))            # or sim.at(30).xid(79, gpu=3)
    >>> sim.sample()[3].error
    'GPU is lost (Xid 79: GPU has fallen off the bus)'
"""

from __future__ import annotations

from dataclasses import dataclass

from trainguard.records import RecoveryAction, Throttle
from trainguard.telemetry.sim import kmsg, state
from trainguard.telemetry.sim.kmsg import xid_messages
from trainguard.telemetry.sim.state import FaultContext
from trainguard.telemetry.sim.wearout import Hang, Wear

__all__ = [
    "RECOVERY_CODES",
    "DetouredLink",
    "DoubleBitEcc",
    "FallOffBus",
    "Fault",
    "GpuReset",
    "HbmCorruption",
    "HotUnderLoad",
    "NodeReboot",
    "NvlinkCrcStorm",
    "NvlinkDown",
    "PcieDowntrain",
    "PcieReplayStorm",
    "PowerBrake",
    "RecoveryActionChange",
    "RowRemapFailure",
    "SlowLink",
    "SlowProducts",
    "Straggler",
    "StuckBits",
    "ThermalRunaway",
    "Throttled",
    "Uncontained",
    "WrongProducts",
    "Xid",
]

# NVML_GPU_RECOVERY_ACTION_* value and the name Xid 154 prints for it.
RECOVERY_CODES: dict[RecoveryAction, tuple[int, str]] = {
    RecoveryAction.NONE: (0, "None"),
    RecoveryAction.GPU_RESET: (1, "GPU Reset Required"),
    RecoveryAction.NODE_REBOOT: (2, "Node Reboot Required"),
    RecoveryAction.DRAIN_P2P: (3, "Drain P2P"),
    RecoveryAction.DRAIN_AND_RESET: (4, "Drain and Reset"),
}


_HARDWARE = {48, 63, 64, 74, 79, 94, 95, 119}  # raised by the GPU, not by a process


@dataclass(frozen=True, slots=True)
class Xid:
    """Any Xid as a kernel line only (application Xids 13/31/43/45 and codes with no NVML trace).

    ``text`` overrides the driver text; ``pid``/``name`` name the process (``'<unknown>'`` if None).
    """

    code: int
    gpu: int
    text: str | None = None
    pid: int | None = None
    name: str | None = None

    def fire(self, ctx: FaultContext, at: float) -> None:
        texts = [self.text] if self.text else xid_messages(self.code, ctx.rng("xid", self.gpu, self.code, at))
        _log_xid(ctx, at, self.gpu, self.code, texts, self.pid, self.name)


def _log_xid(
    ctx: FaultContext, at: float, gpu: int, code: int, texts: list[str], pid: int | None, name: str | None
) -> None:
    pci = ctx.identity(gpu).pci or "0000:00:00"
    if code in _HARDWARE and pid is None:
        ctx.kernel(at, [kmsg.format_xid(pci, code, t) for t in texts])
    else:
        pid = pid if pid is not None else ctx.rng("pid", gpu).randrange(2000, 400000)
        ctx.kernel(at, [kmsg.format_xid(pci, code, t, pid=pid, name=name or "python") for t in texts])


@dataclass(frozen=True, slots=True)
class FallOffBus:
    """Xid 79: the GPU stops answering on PCIe. NVML reports it lost from now on."""

    gpu: int

    def fire(self, ctx: FaultContext, at: float) -> None:
        st = ctx.state(self.gpu)
        st.lost_at, st.lost_error = at, "GPU is lost (Xid 79: GPU has fallen off the bus)"
        pci = ctx.identity(self.gpu).pci or "0000:00:00"
        ctx.kernel(
            at,
            [
                kmsg.format_xid(pci, 79, "GPU has fallen off the bus."),
                f"NVRM: GPU {pci}.0: GPU has fallen off the bus.",
                "NVRM: A GPU crash dump has been created. If possible, please run",
                "NVRM: nvidia-bug-report.sh as root to collect this data before",
                "NVRM: the NVIDIA kernel module is unloaded.",
            ],
        )


@dataclass(frozen=True, slots=True)
class DoubleBitEcc:
    """Xid 48 (+ Xid 63): an uncorrectable ECC error in HBM; the row is marked for remapping,
    which takes effect at the next GPU reset (remap pending)."""

    gpu: int

    def fire(self, ctx: FaultContext, at: float) -> None:
        st = ctx.state(self.gpu)
        st.ecc_dbe_volatile += 1
        st.ecc_dbe_aggregate += 1
        st.remap_uncorrectable += 1
        st.remap_pending = True
        rng = ctx.rng("dbe", self.gpu, at)
        row = xid_messages(48, rng)[0]
        addr = int(row.split("physAddr ")[1].split()[0], 16)
        remap = f"Row Remapper: New row (0x{addr:016x}) marked for remapping, reset gpu to activate."
        _log_xid(ctx, at, self.gpu, 48, [row], None, None)
        _log_xid(ctx, at + 0.0231, self.gpu, 63, [remap], None, None)


@dataclass(frozen=True, slots=True)
class RowRemapFailure:
    """Xid 64: a failing row could not be remapped (bank out of spare rows): replace the GPU."""

    gpu: int

    def fire(self, ctx: FaultContext, at: float) -> None:
        ctx.state(self.gpu).remap_failure = True
        _log_xid(ctx, at, self.gpu, 64, xid_messages(64, ctx.rng("xid64", self.gpu, at)), None, None)


@dataclass(frozen=True, slots=True)
class Uncontained:
    """Xid 95: an uncontained (here: L2 cache ECC) error; every process on the GPU is affected and
    the GPU must be reset. The uncorrectable error shows in the ECC counters."""

    gpu: int

    def fire(self, ctx: FaultContext, at: float) -> None:
        st = ctx.state(self.gpu)
        st.ecc_dbe_volatile += 1
        st.ecc_dbe_aggregate += 1
        _log_xid(ctx, at, self.gpu, 95, xid_messages(95, ctx.rng("xid95", self.gpu)), None, None)


@dataclass(frozen=True, slots=True)
class RecoveryActionChange:
    """Xid 154: the driver announces the action it needs; NVML's GPU_RECOVERY_ACTION follows."""

    gpu: int
    action: RecoveryAction = RecoveryAction.GPU_RESET

    def fire(self, ctx: FaultContext, at: float) -> None:
        st = ctx.state(self.gpu)
        (old, old_name), (new, new_name) = RECOVERY_CODES[st.recovery_action], RECOVERY_CODES[self.action]
        st.recovery_action = self.action
        text = f"GPU recovery action changed from 0x{old:x} ({old_name}) to 0x{new:x} ({new_name})"
        ctx.kernel(at, [kmsg.format_xid(ctx.identity(self.gpu).pci or "0000:00:00", 154, text, who=False)])


@dataclass(frozen=True, slots=True)
class ThermalRunaway:
    """Cooling lost (fan wall, blocked airflow): temperature climbs past the slowdown threshold,
    SW then HW thermal slowdown engage and the clocks drop. No kernel line, as on real boards."""

    gpu: int
    rate_c_per_s: float = 1.5

    def fire(self, ctx: FaultContext, at: float) -> None:
        ctx.state(self.gpu).conditions.append(state.ThermalRunaway(at, self.rate_c_per_s))


@dataclass(frozen=True, slots=True)
class PowerBrake:
    """External power brake (PSU/chassis): HW_POWER_BRAKE + HW_SLOWDOWN, clocks cut to ~30%."""

    gpu: int
    duration_s: float | None = None

    def fire(self, ctx: FaultContext, at: float) -> None:
        until = None if self.duration_s is None else at + self.duration_s
        ctx.state(self.gpu).conditions.append(state.PowerBrake(at, until))


@dataclass(frozen=True, slots=True)
class PcieReplayStorm:
    """A marginal PCIe link: the replay counter climbs fast; the kernel's AER driver logs
    corrected Data Link Layer errors (Replay Timer Timeout)."""

    gpu: int
    rate_per_s: float = 200.0

    def fire(self, ctx: FaultContext, at: float) -> None:
        ctx.state(self.gpu).conditions.append(state.ReplayStorm(at, self.rate_per_s))
        pci = ctx.identity(self.gpu).pci or "0000:00:00"
        domain, bus, _ = pci.split(":")
        bridge = f"{domain}:{max(int(bus, 16) - 1, 0):02x}:00.0"
        for k in range(3):
            ctx.kernel(at + 0.5 * k, kmsg.aer_corrected_lines(pci, ctx.profile.device_id, bridge))


@dataclass(frozen=True, slots=True)
class PcieDowntrain:
    """The link retrained below its capability (e.g. Gen5 x16 -> x8)."""

    gpu: int
    gen: int | None = None
    width: int | None = 8

    def fire(self, ctx: FaultContext, at: float) -> None:
        ctx.state(self.gpu).conditions.append(state.Downtrain(at, self.gen, self.width))


@dataclass(frozen=True, slots=True)
class NvlinkCrcStorm:
    """NVLink CRC errors climbing fast (a bad cable/connector or NVSwitch port). Correctable:
    the counters move, the driver logs nothing."""

    gpu: int
    rate_per_s: float = 500.0

    def fire(self, ctx: FaultContext, at: float) -> None:
        ctx.state(self.gpu).conditions.append(state.NvlinkCrcStorm(at, self.rate_per_s))


@dataclass(frozen=True, slots=True)
class NvlinkDown:
    """Xid 74: a fatal NVLink error takes a link down."""

    gpu: int
    links: int = 1

    def fire(self, ctx: FaultContext, at: float) -> None:
        ctx.state(self.gpu).conditions.append(state.NvlinkDown(at, self.links))
        _log_xid(ctx, at, self.gpu, 74, xid_messages(74, ctx.rng("xid74", self.gpu, at)), None, None)


@dataclass(frozen=True, slots=True)
class Straggler:
    """SM clock stuck low under full load with no throttle reason (default: half of max)."""

    gpu: int
    sm_clock_mhz: float | None = None

    def fire(self, ctx: FaultContext, at: float) -> None:
        clock = self.sm_clock_mhz or round(ctx.profile.sm_clock_max_mhz * 0.5 / 15) * 15
        ctx.state(self.gpu).conditions.append(state.Straggler(at, clock))


@dataclass(frozen=True, slots=True)
class Throttled:
    """The GPU runs at ``fraction`` of its clock under load, held there by a software limit
    (``reason``: SW power cap, e.g. a lowered power limit, or SW thermal slowdown), for
    ``duration_s`` (None: until reset). Telemetry shows the clock and the reason, no health rule
    fires, and a rank on it computes at that fraction of its peers' speed: a fail-slow GPU."""

    gpu: int
    fraction: float = 0.5
    reason: Throttle = Throttle.SW_POWER_CAP
    duration_s: float | None = None

    def fire(self, ctx: FaultContext, at: float) -> None:
        until = None if self.duration_s is None else at + self.duration_s
        ctx.state(self.gpu).conditions.append(state.Capped(at, self.fraction, Throttle(self.reason), until))


@dataclass(frozen=True, slots=True)
class GpuReset:
    """A GPU reset (``nvidia-smi -r``): clears volatile errors, activates pending remaps, lifts
    transient conditions. A GPU that fell off the bus stays lost (that needs a node reboot)."""

    gpu: int

    def fire(self, ctx: FaultContext, at: float) -> None:
        ctx.state(self.gpu).reset()


@dataclass(frozen=True, slots=True)
class NodeReboot:
    """The node reboots: every GPU answers again (a lost one too), volatile state is cleared and
    the driver prints its banner and GPU map again. Permanent damage (a remap failure, aggregate
    counters) survives, as on real boards. The dmesg clock does not restart at zero."""

    gpu: None = None

    def fire(self, ctx: FaultContext, at: float) -> None:
        for i in range(ctx.n_gpus):
            st = ctx.state(i)
            st.reset()
            st.lost_at = st.lost_error = None
        ctx.kernel(at, ctx.boot_messages())


# -- defects only an active diagnostic finds: no NVML reading changes, no kernel line ------------


@dataclass(frozen=True, slots=True)
class WrongProducts:
    """Silent data corruption: ``rate`` of the elements of the GPU's matrix products come back with
    a flipped bit, picked by position and value (the same operands, the same wrong elements).
    Nothing in telemetry or the kernel log shows it; the SDC test of ``trainguard diagnose`` does.
    A defect of the silicon: a GPU reset does not cure it."""

    gpu: int
    rate: float = 1.0

    def fire(self, ctx: FaultContext, at: float) -> None:
        ctx.state(self.gpu).defects.append(state.WrongProducts(at, self.rate))


@dataclass(frozen=True, slots=True)
class HbmCorruption:
    """Weak HBM cells: about ``per_gib`` bytes per GiB written read back with a flipped bit, with
    no ECC event (the memory pattern test finds it)."""

    gpu: int
    per_gib: float = 256.0

    def fire(self, ctx: FaultContext, at: float) -> None:
        ctx.state(self.gpu).defects.append(state.HbmCorruption(at, self.per_gib))


@dataclass(frozen=True, slots=True)
class SlowLink:
    """The GPU's link runs at ``fraction`` of its bandwidth with clean error counters (the
    interconnect test finds it)."""

    gpu: int
    fraction: float = 0.25

    def fire(self, ctx: FaultContext, at: float) -> None:
        ctx.state(self.gpu).conditions.append(state.SlowLink(at, self.fraction))


@dataclass(frozen=True, slots=True)
class SlowProducts:
    """Matrix products run at ``fraction`` of the GPU's rate while its clocks read full speed,
    with no throttle reason and normal power (unlike ``Straggler``, whose clock shows it): the
    compute test finds it because the products really take longer. A defect: resets keep it."""

    gpu: int
    fraction: float = 0.5

    def fire(self, ctx: FaultContext, at: float) -> None:
        ctx.state(self.gpu).defects.append(state.SlowProducts(at, self.fraction))


@dataclass(frozen=True, slots=True)
class DetouredLink:
    """The GPU's peer-to-peer traffic detours through host memory (PCIe ACS redirect, a wrong
    IOMMU setting): the link trains at full width and its counters stay clean, but each transfer
    is really copied through ``bounces`` more buffers, so it takes longer (the interconnect test
    finds it). A platform setting: a GPU reset keeps it."""

    gpu: int
    bounces: int = 4

    def fire(self, ctx: FaultContext, at: float) -> None:
        ctx.state(self.gpu).defects.append(state.DetouredLink(at, self.bounces))


@dataclass(frozen=True, slots=True)
class StuckBits:
    """``cells`` bytes of HBM each hold a bit stuck at 0 or 1 (seeded), with no ECC event: a
    pattern written over them reads back wrong wherever it needs the other value (the memory
    pattern test finds it)."""

    gpu: int
    cells: int = 8

    def fire(self, ctx: FaultContext, at: float) -> None:
        ctx.state(self.gpu).defects.append(state.StuckBits(at, self.cells))


@dataclass(frozen=True, slots=True)
class HotUnderLoad:
    """Marginal cooling: fine at idle, past the slowdown temperature after ``after_s`` seconds of
    continuous load, then HW thermal slowdown (the thermal/power test under stress finds it)."""

    gpu: int
    after_s: float = 2.0

    def fire(self, ctx: FaultContext, at: float) -> None:
        ctx.state(self.gpu).conditions.append(state.HotUnderLoad(at, self.after_s))


Fault = (
    Xid
    | FallOffBus
    | DoubleBitEcc
    | RowRemapFailure
    | Uncontained
    | RecoveryActionChange
    | ThermalRunaway
    | PowerBrake
    | PcieReplayStorm
    | PcieDowntrain
    | NvlinkCrcStorm
    | NvlinkDown
    | Straggler
    | Throttled
    | GpuReset
    | NodeReboot
    | WrongProducts
    | HbmCorruption
    | SlowLink
    | SlowProducts
    | DetouredLink
    | StuckBits
    | HotUnderLoad
    | Hang  # the slow precursors and the GSP hang: wearout.py
    | Wear
)

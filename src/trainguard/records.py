"""The shared nouns of trainguard: plain, frozen, stdlib-only values.

Everything that flows along the spine is one of these::

    telemetry -> Sample        (one GPU reading; None means "could not read", never "healthy")
    logs      -> Event         (one classified kernel-log or training-log line)
    detect    -> Finding       (one rule that fired: health, action, reason)
              -> GpuVerdict / NodeVerdict (findings folded per GPU and per node)

State enums are ``(str, Enum)`` so they serialise unchanged to JSON and SQLite.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum

from trainguard.actions import Advice


class Health(str, Enum):
    """How healthy something is. Never a bool: "could not read" is UNKNOWN, not broken."""

    OK = "ok"
    UNKNOWN = "unknown"
    DEGRADED = "degraded"
    FAILED = "failed"

    @property
    def rank(self) -> int:
        """Order used to fold verdicts: the worst state wins."""
        return _HEALTH_RANK[self]

    @property
    def exit_code(self) -> int:
        """Exit code of `trainguard check`: 0 ok, 1 degraded, 2 failed, 3 unknown."""
        return _HEALTH_EXIT[self]


_HEALTH_RANK = {Health.OK: 0, Health.UNKNOWN: 1, Health.DEGRADED: 2, Health.FAILED: 3}
_HEALTH_EXIT = {Health.OK: 0, Health.DEGRADED: 1, Health.FAILED: 2, Health.UNKNOWN: 3}


class RecoveryAction(str, Enum):
    """The driver's own statement of what it needs (NVML GPU_RECOVERY_ACTION / Xid 154)."""

    NONE = "none"
    GPU_RESET = "gpu_reset"
    NODE_REBOOT = "node_reboot"
    DRAIN_P2P = "drain_p2p"
    DRAIN_AND_RESET = "drain_and_reset"


# NVML_GPU_RECOVERY_ACTION_* codes, which Xid 154 lines print too ("... to 0x2 (Node Reboot
# Required)"). 5 (recover the IMEX domain) has no node-local equivalent: unknown.
RECOVERY_ACTION_CODES = {
    0: RecoveryAction.NONE,
    1: RecoveryAction.GPU_RESET,
    2: RecoveryAction.NODE_REBOOT,
    3: RecoveryAction.DRAIN_P2P,
    4: RecoveryAction.DRAIN_AND_RESET,
    6: RecoveryAction.GPU_RESET,  # bus reset
    7: RecoveryAction.NODE_REBOOT,  # system reboot
}


class Throttle(str, Enum):
    """Clock throttle (event) reasons that matter for health; idle/app-clock reasons are left out."""

    HW_SLOWDOWN = "hw_slowdown"
    HW_THERMAL = "hw_thermal"
    HW_POWER_BRAKE = "hw_power_brake"
    SW_POWER_CAP = "sw_power_cap"
    SW_THERMAL = "sw_thermal"


@dataclass(frozen=True, slots=True)
class Gpu:
    """Identity of one GPU. `pci` is normalised to ``dddd:bb:dd`` (lower case, no function)."""

    index: int
    uuid: str | None = None
    pci: str | None = None
    name: str | None = None


@dataclass(frozen=True, slots=True)
class Sample:
    """One reading of one GPU. Every metric is optional: None means unsupported or unreadable.

    ``lost`` is set when the GPU stopped answering (NVML GpuIsLost, fell off the bus); then the
    metrics are None and ``error`` says why.
    """

    gpu: Gpu
    time: float  # seconds since the epoch, or virtual seconds from the simulator's clock
    lost: bool = False
    error: str | None = None
    # thermal and power
    temperature_c: float | None = None
    temp_slowdown_c: float | None = None  # HW slowdown threshold
    temp_shutdown_c: float | None = None
    power_w: float | None = None
    power_limit_w: float | None = None
    fan_pct: float | None = None
    # clocks and load
    sm_clock_mhz: float | None = None
    sm_clock_max_mhz: float | None = None
    mem_clock_mhz: float | None = None
    mem_clock_max_mhz: float | None = None
    util_gpu_pct: float | None = None
    util_mem_pct: float | None = None
    mem_used_mib: float | None = None
    mem_total_mib: float | None = None
    throttle: frozenset[Throttle] | None = None  # active throttle reasons; None = unknown
    # memory errors
    ecc_sbe_volatile: int | None = None
    ecc_dbe_volatile: int | None = None
    ecc_sbe_aggregate: int | None = None
    ecc_dbe_aggregate: int | None = None
    retired_sbe: int | None = None  # pages retired for single-bit errors (pre-Ampere)
    retired_dbe: int | None = None
    retired_pending: bool | None = None
    remap_correctable: int | None = None  # rows remapped (Ampere and later)
    remap_uncorrectable: int | None = None
    remap_pending: bool | None = None  # a remap waits for a GPU reset
    remap_failure: bool | None = None  # a row could not be remapped: the GPU needs replacing
    # interconnect
    pcie_gen: int | None = None
    pcie_gen_max: int | None = None
    pcie_width: int | None = None
    pcie_width_max: int | None = None
    pcie_replay: int | None = None  # cumulative replay counter
    nvlink_up: int | None = None  # links active
    nvlink_total: int | None = None  # links the GPU has
    nvlink_crc_errors: int | None = None  # cumulative, summed over links (flit + data CRC)
    nvlink_replay_errors: int | None = None
    nvlink_recovery_errors: int | None = None
    # the driver's own word
    recovery_action: RecoveryAction | None = None
    # what dcgm-exporter's default counters add (docs/agent.md: where each comes from)
    mem_free_mib: float | None = None
    mem_reserved_mib: float | None = None  # held by the driver and firmware
    memory_temp_c: float | None = None  # HBM temperature
    energy_mj: int | None = None  # cumulative energy since the driver loaded (mJ)
    enc_util_pct: float | None = None
    dec_util_pct: float | None = None
    nvlink_data_kib: int | None = None  # cumulative NVLink data (tx + rx, all links), KiB
    # activity over the last sampling interval (NVML GPM: Hopper and newer; None before)
    gr_engine_active: float | None = None  # ratio 0..1 of time the graphics/compute engine was busy
    tensor_active: float | None = None  # ratio of cycles any tensor pipe was busy
    dram_active: float | None = None  # ratio of peak device-memory bandwidth used
    pcie_tx_bytes_s: float | None = None
    pcie_rx_bytes_s: float | None = None


class EventKind(str, Enum):
    XID = "xid"  # NVRM: Xid ... (a GPU error)
    SXID = "sxid"  # nvidia-nvswitch: SXid ... (an NVSwitch error, never a GPU Xid)
    GPU_LOST = "gpu_lost"  # "GPU has fallen off the bus" printed without an Xid
    GPU_MAP = "gpu_map"  # "NVRM: GPU at PCI:... : GPU-<uuid>": maps a PCI address to a UUID
    TRAINING = "training"  # a line of a training log (NCCL, CUDA, OOM, torchelastic...)


class Category(str, Enum):
    """What a log line says went wrong (the training-log taxonomy, `trainguard.detect.training_log`)."""

    GPU_HARDWARE = "gpu_hardware"
    GPU_MEMORY_ECC = "gpu_memory_ecc"
    NCCL_NETWORK = "nccl_network"
    NCCL_TIMEOUT_HANG = "nccl_timeout_hang"
    CUDA_OOM = "cuda_oom"
    APPLICATION_BUG = "application_bug"
    DRIVER_SOFTWARE = "driver_software"
    NODE_HOST = "node_host"
    INTERCONNECT = "interconnect"  # NVLink / NVSwitch / PCIe
    THERMAL_POWER = "thermal_power"
    INFO = "info"  # a line worth keeping (e.g. a GPU map) that says nothing is wrong
    NUMERICS = "numerics"  # NaN/Inf or a spike in the loss or gradients (trainguard.detect.numerics)
    UNKNOWN = "unknown"  # an error-shaped training line no rule knows (Traceback, FooError:, FATAL)


# Categories whose evidence alone points at the GPU, not the program.
HARDWARE_CATEGORIES = frozenset({Category.GPU_HARDWARE, Category.GPU_MEMORY_ECC, Category.INTERCONNECT})


class Severity(str, Enum):
    INFO = "info"
    WARNING = "warning"
    ERROR = "error"
    FATAL = "fatal"


@dataclass(frozen=True, slots=True)
class Event:
    """One classified log line (kernel log or training log).

    ``time`` is the line's own timestamp when it carries one, else the time it was read.
    """

    kind: EventKind
    text: str
    time: float | None = None
    xid: int | None = None
    pci: str | None = None
    uuid: str | None = None
    pid: int | None = None
    process: str | None = None
    category: Category = Category.INFO
    severity: Severity = Severity.INFO
    action: Advice = Advice.NONE
    sympathetic: bool = False  # an echo of an earlier error in the same burst (Xid 45)
    path: str | None = None
    line_no: int | None = None  # 1-based


@dataclass(frozen=True, slots=True)
class Finding:
    """One rule that fired: what it concluded, why, and what to do.

    ``gpu`` is None for node-scoped findings (e.g. an NVSwitch SXid or a host problem).
    """

    rule: str
    health: Health
    action: Advice
    reason: str
    gpu: int | None = None
    time: float | None = None
    category: Category | None = None
    evidence: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class GpuVerdict:
    gpu: Gpu
    health: Health
    action: Advice
    findings: tuple[Finding, ...] = ()

    @property
    def reasons(self) -> list[str]:
        return [f.reason for f in self.findings]


@dataclass(frozen=True, slots=True)
class NodeVerdict:
    health: Health
    action: Advice
    gpus: tuple[GpuVerdict, ...] = ()
    findings: tuple[Finding, ...] = field(default=())  # node-scoped findings

    @property
    def reasons(self) -> list[str]:
        return [f.reason for f in self.findings] + [r for g in self.gpus for r in g.reasons]


def worst_health(healths: list[Health] | tuple[Health, ...]) -> Health:
    """The worst of several states; OK when there are none."""
    return max(healths, key=lambda h: h.rank, default=Health.OK)


def strongest_action(actions: list[Advice] | tuple[Advice, ...]) -> Advice:
    """The strongest of several actions; NONE when there are none."""
    return max(actions, key=lambda a: a.rank, default=Advice.NONE)


def normalize_pci(bus_id: str | None) -> str | None:
    """``00000000:3B:00.0`` / ``0000:3b:00`` / ``3b:00.0`` -> ``0000:3b:00``; None if unparseable."""
    if not bus_id:
        return None
    text = bus_id.strip().lower()
    if text.startswith("pci:"):
        text = text[4:]
    head, _, _function = text.partition(".")
    parts = head.split(":")
    if len(parts) == 2:
        parts = ["0", *parts]
    if len(parts) != 3:
        return None
    domain, bus, device = parts
    try:
        d, b, v = int(domain, 16), int(bus, 16), int(device, 16)
    except ValueError:
        return None
    if d > 0xFFFFFFFF or b > 0xFF or v > 0x1F:
        return None
    return f"{d:04x}:{b:02x}:{v:02x}"


@dataclass(frozen=True, slots=True)
class GpuModes:
    """Settings of one GPU that pre-flight diagnostics check; None means could not read."""

    persistence: bool | None = None  # persistence mode (driver stays loaded between jobs)
    ecc: bool | None = None  # ECC enabled (current mode)
    ecc_pending: bool | None = None  # ECC mode after the next reboot
    mig: bool | None = None  # MIG enabled (current mode)


@dataclass(frozen=True, slots=True)
class DriverInfo:
    """The node's NVIDIA software: driver, the CUDA version it supports, NVML."""

    driver: str | None = None  # "550.90.07"
    cuda: str | None = None  # the newest CUDA the driver supports, "12.4"
    nvml: str | None = None


@dataclass(frozen=True, slots=True)
class GpuProcess:
    """A compute process on a GPU (NVML's running-process list, with what /proc says of it)."""

    pid: int
    gpu: int
    used_mib: float | None = None
    user: str | None = None
    command: str | None = None
    job: str | None = None  # the scheduler job whose cgroup holds it (Slurm, a pod); None: none found
    job_known: bool = True  # False: neither /proc nor the scheduler's cgroups could be read

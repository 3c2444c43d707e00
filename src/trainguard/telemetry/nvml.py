"""The NVML backend: real GPUs through nvidia-ml-py. The only module that imports pynvml.

    telemetry (here) -> detect -> diagnose -> incidents -> recover

NVML is initialised once per backend (``nvmlInit`` in the constructor, ``nvmlShutdown`` in
``close``). Every field is read on its own, so one the GPU lacks becomes None ("unknown", never
"healthy") without hiding the others. A GPU that stops answering (GpuIsLost) gets a Sample with
``lost=True`` and the backend keeps serving the rest. Every ``NVMLError_*`` is mapped to
``trainguard.errors`` here (``NVML_ERROR_MAP``), so nothing above this line sees pynvml::

    >>> with NvmlBackend() as nvml:          # BackendUnavailable without a driver or GPU
    ...     for s in nvml.sample():
    ...         print(s.gpu.index, s.temperature_c, s.throttle)
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from trainguard.clock import Clock, RealClock
from trainguard.errors import BackendError, BackendUnavailable, GpuLost, NoPermission, NotSupported
from trainguard.records import (
    RECOVERY_ACTION_CODES,
    DriverInfo,
    Gpu,
    GpuModes,
    GpuProcess,
    RecoveryAction,
    Sample,
    Throttle,
    normalize_pci,
)
from trainguard.telemetry.gpm import GpmReader

try:
    import pynvml as _pynvml
except ImportError:  # the nvml extra is not installed; opening the backend says so
    _pynvml = None
pynvml: Any = _pynvml

__all__ = ["NVML_ERROR_MAP", "NvmlBackend", "map_nvml_error"]

log = logging.getLogger(__name__)

_SIM_HINT = "use --backend sim to try trainguard without a GPU"

# Every NVMLError_* class nvidia-ml-py generates (one per NVML_ERROR_* code) -> trainguard's error.
NVML_ERROR_MAP: dict[str, type[BackendError]] = {
    # NVML cannot work at all on this machine
    "NVMLError_Uninitialized": BackendUnavailable,
    "NVMLError_DriverNotLoaded": BackendUnavailable,
    "NVMLError_LibraryNotFound": BackendUnavailable,
    "NVMLError_LibRmVersionMismatch": BackendUnavailable,  # driver upgraded without a reboot
    # this GPU stopped answering or must be reset before it answers again
    "NVMLError_GpuIsLost": GpuLost,
    "NVMLError_GpuNotFound": GpuLost,
    "NVMLError_ResetRequired": GpuLost,
    # the field does not exist on this GPU / driver: the reading is unknown
    "NVMLError_NotSupported": NotSupported,
    "NVMLError_FunctionNotFound": NotSupported,  # the driver predates the call
    "NVMLError_VgpuEccNotSupported": NotSupported,
    "NVMLError_FreqNotSupported": NotSupported,
    "NVMLError_ResetTypeNotSupported": NotSupported,
    "NVMLError_Deprecated": NotSupported,
    "NVMLError_NoData": NotSupported,
    "NVMLError_NotFound": NotSupported,
    # the driver refused
    "NVMLError_NoPermission": NoPermission,
    "NVMLError_OperatingSystem": NoPermission,
    # anything else: this query failed
    "NVMLError_InvalidArgument": BackendError,
    "NVMLError_AlreadyInitialized": BackendError,
    "NVMLError_InsufficientSize": BackendError,
    "NVMLError_InsufficientPower": BackendError,
    "NVMLError_Timeout": BackendError,
    "NVMLError_IrqIssue": BackendError,
    "NVMLError_CorruptedInforom": BackendError,
    "NVMLError_InUse": BackendError,
    "NVMLError_Memory": BackendError,
    "NVMLError_InsufficientResources": BackendError,
    "NVMLError_ArgumentVersionMismatch": BackendError,
    "NVMLError_NotReady": BackendError,
    "NVMLError_InvalidState": BackendError,
    "NVMLError_Unknown": BackendError,
}

# Clock event (throttle) reason bits, identical in the ClocksEventReasons and ThrottleReasons APIs.
_THROTTLE_BITS = {
    0x04: Throttle.SW_POWER_CAP,
    0x08: Throttle.HW_SLOWDOWN,
    0x20: Throttle.SW_THERMAL,
    0x40: Throttle.HW_THERMAL,
    0x80: Throttle.HW_POWER_BRAKE,
}


# NVML_FI_DEV_NVLINK_{CRC_FLIT,CRC_DATA,REPLAY,RECOVERY}_ERROR_COUNT_TOTAL: the fallback when
# per-link counters are not supported (newer GPUs report NVLink errors only as fields).
_NVLINK_TOTAL_FIELDS = (38, 45, 52, 59)


def map_nvml_error(exc: BaseException, what: str = "") -> BackendError:
    """The trainguard error for a pynvml exception (unknown codes become ``BackendError``)."""
    cls: type[BackendError] = NVML_ERROR_MAP.get(type(exc).__name__, BackendError)
    if type(exc).__name__ == "NVMLLibraryMismatchError":
        cls = BackendUnavailable
    err = cls(f"NVML{' ' + what if what else ''}: {exc}")
    err.__cause__ = exc
    return err


def _text(value: Any) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


class NvmlBackend:
    """All GPUs (or ``indices``) of this machine through NVML. See the module docstring."""

    def __init__(self, *, clock: Clock | None = None, indices: Sequence[int] | None = None) -> None:
        if pynvml is None:
            raise BackendUnavailable(
                f"nvidia-ml-py is not installed (pip install 'trainguard[nvml]'); {_SIM_HINT}"
            )
        self.clock = clock or RealClock()
        self.field_errors = 0  # reads that failed for a reason other than "not supported"
        try:
            pynvml.nvmlInit()
        except Exception as exc:  # NVMLError_*, NVMLLibraryMismatchError, OSError from ctypes
            raise BackendUnavailable(f"no NVIDIA driver or GPU here (NVML: {exc}); {_SIM_HINT}") from None
        self._open = True
        try:
            count = int(pynvml.nvmlDeviceGetCount())
        except pynvml.NVMLError as exc:
            self.close()
            raise BackendUnavailable(f"NVML cannot count the GPUs ({exc}); {_SIM_HINT}") from None
        if count == 0:
            self.close()
            raise BackendUnavailable(f"the NVIDIA driver sees no GPU; {_SIM_HINT}")
        self._handles: list[Any] = []
        self._gpus: list[Gpu] = []
        self._links: list[list[int]] = []
        self._gpm: list[GpmReader] = []
        for index in indices if indices is not None else range(count):
            self._attach(index)

    # -- TelemetryBackend -------------------------------------------------------------------
    def gpus(self) -> list[Gpu]:
        return list(self._gpus)

    def sample(self) -> list[Sample]:
        now = self.clock.time()
        return [self._sample_one(k, now) for k in range(len(self._gpus))]

    def close(self) -> None:
        if getattr(self, "_open", False):
            self._open = False
            for gpm in getattr(self, "_gpm", ()):
                gpm.close()
            try:
                pynvml.nvmlShutdown()
            except Exception as exc:  # shutting down must not fail the caller
                log.debug("nvmlShutdown failed: %s", exc)

    def __enter__(self) -> NvmlBackend:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def processes(self, k: int) -> list[GpuProcess]:
        """The compute processes on the k-th GPU (NVML's running-process list, /proc for the rest)."""
        from trainguard.telemetry.procinfo import describe_all

        try:
            running = pynvml.nvmlDeviceGetComputeRunningProcesses(self._handles[k])
        except pynvml.NVMLError as exc:
            raise map_nvml_error(exc, f"GPU {self._gpus[k].index} processes") from None
        pids = []
        for p in running:
            used = getattr(p, "usedGpuMemory", None)
            pids.append((int(p.pid), used / 2**20 if isinstance(used, int) else None))
        return describe_all(pids, self._gpus[k].index)

    # -- settings (pre-flight diagnostics) --------------------------------------------------
    def modes(self, k: int) -> GpuModes:
        """Persistence, ECC and MIG mode of the k-th GPU; fields it lacks are None."""
        handle = self._handles[k]
        if handle is None:
            return GpuModes()
        try:
            persistence = self._call("nvmlDeviceGetPersistenceMode", handle)
            ecc = self._call("nvmlDeviceGetEccMode", handle)  # (current, pending)
            mig = self._call("nvmlDeviceGetMigMode", handle)  # (current, pending)
        except (GpuLost, BackendUnavailable):
            return GpuModes()
        enabled = int(getattr(pynvml, "NVML_FEATURE_ENABLED", 1))
        return GpuModes(
            persistence=None if persistence is None else int(persistence) == enabled,
            ecc=None if ecc is None else int(ecc[0]) == enabled,
            ecc_pending=None if ecc is None else int(ecc[1]) == enabled,
            mig=None if mig is None else int(mig[0]) == int(getattr(pynvml, "NVML_DEVICE_MIG_ENABLE", 1)),
        )

    def driver_info(self) -> DriverInfo:
        """Driver version, the newest CUDA it supports ("12.4") and the NVML version."""
        driver = self._call("nvmlSystemGetDriverVersion")
        cuda = self._call("nvmlSystemGetCudaDriverVersion")  # 12040
        nvml = self._call("nvmlSystemGetNVMLVersion")
        return DriverInfo(
            driver=None if driver is None else _text(driver),
            cuda=None if cuda is None else f"{int(cuda) // 1000}.{int(cuda) % 1000 // 10}",
            nvml=None if nvml is None else _text(nvml),
        )

    # -- reading ----------------------------------------------------------------------------
    def _call(self, name: str, *args: Any, probe: bool = False) -> Any:
        """One NVML query. None when unsupported or failed (failures counted unless ``probe``);
        ``GpuLost`` and ``BackendUnavailable`` are raised for the caller to turn into a Sample."""
        fn = getattr(pynvml, name, None)
        if fn is None:  # an older nvidia-ml-py without this call
            return None
        try:
            return fn(*args)
        except pynvml.NVMLError as exc:
            err = map_nvml_error(exc, name)
            if isinstance(err, GpuLost | BackendUnavailable):
                raise err from exc
            if not isinstance(err, NotSupported) and not probe:
                self.field_errors += 1
                log.debug("%s", err)
            return None

    def _attach(self, index: int) -> None:
        links: list[int] = []
        try:
            handle = self._call("nvmlDeviceGetHandleByIndex", index)
            name, uuid = self._call("nvmlDeviceGetName", handle), self._call("nvmlDeviceGetUUID", handle)
            pci = self._call("nvmlDeviceGetPciInfo", handle)
            bus_id = normalize_pci(_text(pci.busId)) if pci is not None else None
            for link in range(int(getattr(pynvml, "NVML_NVLINK_MAX_LINKS", 18))):
                # links past the GPU's last answer InvalidArgument/NotSupported: probing, not errors
                if self._call("nvmlDeviceGetNvLinkState", handle, link, probe=True) is not None:
                    links.append(link)
        except (GpuLost, BackendUnavailable) as exc:
            log.warning("GPU %d cannot be opened: %s", index, exc)
            handle, name, uuid, bus_id = None, None, None, None
        self._handles.append(handle)
        self._links.append(links)
        self._gpm.append(GpmReader(pynvml, handle))
        self._gpus.append(Gpu(index, _text(uuid) if uuid else None, bus_id, _text(name) if name else None))

    def _sample_one(self, k: int, now: float) -> Sample:
        gpu, handle = self._gpus[k], self._handles[k]
        if handle is None:
            return Sample(gpu=gpu, time=now, lost=True, error="GPU could not be opened (NVML)")
        try:
            fields: dict[str, Any] = self._fields(handle, self._links[k])
            fields.update(self._dcgm(handle, self._links[k]))
            fields.update(self._gpm[k].read())
            return Sample(gpu=gpu, time=now, **fields)
        except GpuLost as exc:
            return Sample(gpu=gpu, time=now, lost=True, error=str(exc))
        except BackendUnavailable as exc:  # the driver went away: every reading unknown
            return Sample(gpu=gpu, time=now, error=str(exc))

    def _fields(self, h: Any, links: list[int]) -> dict[str, Any]:
        c, nv = self._call, pynvml
        util, mem = c("nvmlDeviceGetUtilizationRates", h), c("nvmlDeviceGetMemoryInfo", h)
        remap = c("nvmlDeviceGetRemappedRows", h)
        retired_sbe = c(
            "nvmlDeviceGetRetiredPages", h, nv.NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS
        )
        retired_dbe = c("nvmlDeviceGetRetiredPages", h, nv.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR)
        pending = c("nvmlDeviceGetRetiredPagesPendingStatus", h)
        ecc = {
            f"ecc_{kind}_{counter}": c("nvmlDeviceGetTotalEccErrors", h, err_type, counter_type)
            for kind, err_type in (
                ("sbe", nv.NVML_MEMORY_ERROR_TYPE_CORRECTED),
                ("dbe", nv.NVML_MEMORY_ERROR_TYPE_UNCORRECTED),
            )
            for counter, counter_type in (
                ("volatile", nv.NVML_VOLATILE_ECC),
                ("aggregate", nv.NVML_AGGREGATE_ECC),
            )
        }
        return {
            "temperature_c": c("nvmlDeviceGetTemperature", h, nv.NVML_TEMPERATURE_GPU),
            "temp_slowdown_c": c(
                "nvmlDeviceGetTemperatureThreshold", h, nv.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN
            ),
            "temp_shutdown_c": c(
                "nvmlDeviceGetTemperatureThreshold", h, nv.NVML_TEMPERATURE_THRESHOLD_SHUTDOWN
            ),
            "power_w": _milli(c("nvmlDeviceGetPowerUsage", h)),
            "power_limit_w": _milli(c("nvmlDeviceGetEnforcedPowerLimit", h)),
            "fan_pct": c("nvmlDeviceGetFanSpeed", h),
            "sm_clock_mhz": c("nvmlDeviceGetClockInfo", h, nv.NVML_CLOCK_SM),
            "sm_clock_max_mhz": c("nvmlDeviceGetMaxClockInfo", h, nv.NVML_CLOCK_SM),
            "mem_clock_mhz": c("nvmlDeviceGetClockInfo", h, nv.NVML_CLOCK_MEM),
            "mem_clock_max_mhz": c("nvmlDeviceGetMaxClockInfo", h, nv.NVML_CLOCK_MEM),
            "util_gpu_pct": None if util is None else util.gpu,
            "util_mem_pct": None if util is None else util.memory,
            "mem_used_mib": None if mem is None else mem.used / 2**20,
            "mem_total_mib": None if mem is None else mem.total / 2**20,
            "throttle": self._throttle(h),
            **ecc,
            "retired_sbe": None if retired_sbe is None else len(retired_sbe),
            "retired_dbe": None if retired_dbe is None else len(retired_dbe),
            "retired_pending": None if pending is None else bool(pending),
            "remap_correctable": None if remap is None else int(remap[0]),
            "remap_uncorrectable": None if remap is None else int(remap[1]),
            "remap_pending": None if remap is None else bool(remap[2]),
            "remap_failure": None if remap is None else bool(remap[3]),
            "pcie_gen": c("nvmlDeviceGetCurrPcieLinkGeneration", h),
            "pcie_gen_max": c("nvmlDeviceGetMaxPcieLinkGeneration", h),
            "pcie_width": c("nvmlDeviceGetCurrPcieLinkWidth", h),
            "pcie_width_max": c("nvmlDeviceGetMaxPcieLinkWidth", h),
            "pcie_replay": c("nvmlDeviceGetPcieReplayCounter", h),
            **self._nvlink(h, links),
            "recovery_action": self._recovery_action(h),
        }

    def _dcgm(self, h: Any, links: list[int]) -> dict[str, Any]:
        """The rest of dcgm-exporter's default counters (FB free/reserved, HBM temperature,
        energy, encoder/decoder, NVLink data)."""
        c, nv = self._call, pynvml
        v2 = getattr(nv, "nvmlMemory_v2", None)
        mem = c("nvmlDeviceGetMemoryInfo", h, v2) if v2 is not None else None
        if mem is None:  # a driver before R510: no reserved memory
            mem = c("nvmlDeviceGetMemoryInfo", h)
        enc, dec = c("nvmlDeviceGetEncoderUtilization", h), c("nvmlDeviceGetDecoderUtilization", h)
        mem_temp = getattr(nv, "NVML_FI_DEV_MEMORY_TEMP", None)
        energy = c("nvmlDeviceGetTotalEnergyConsumption", h)
        return {
            "mem_free_mib": None if mem is None else mem.free / 2**20,
            "mem_reserved_mib": _mib(getattr(mem, "reserved", None)),
            "memory_temp_c": None if mem_temp is None else self._field_value(h, mem_temp),
            "energy_mj": None if energy is None else int(energy),
            "enc_util_pct": None if enc is None else enc[0],
            "dec_util_pct": None if dec is None else dec[0],
            "nvlink_data_kib": self._nvlink_data(h, links),
        }

    def _nvlink_data(self, h: Any, links: list[int]) -> int | None:
        tx = getattr(pynvml, "NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX", None)
        rx = getattr(pynvml, "NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX", None)
        if not links or tx is None or rx is None:
            return None
        values = self._call("nvmlDeviceGetFieldValues", h, [(f, link) for link in links for f in (tx, rx)])
        if not values:
            return None
        ok = getattr(pynvml, "NVML_SUCCESS", 0)
        got = [int(v.value.ullVal) for v in values if v.nvmlReturn == ok]
        return sum(got) if got else None

    def _throttle(self, h: Any) -> frozenset[Throttle] | None:
        mask = self._call("nvmlDeviceGetCurrentClocksEventReasons", h)
        if mask is None:  # drivers before R535 only have the older name
            mask = self._call("nvmlDeviceGetCurrentClocksThrottleReasons", h)
        if mask is None:
            return None
        return frozenset(reason for bit, reason in _THROTTLE_BITS.items() if int(mask) & bit)

    def _nvlink(self, h: Any, links: list[int]) -> dict[str, Any]:
        keys = ("nvlink_crc_errors", "nvlink_replay_errors", "nvlink_recovery_errors")
        if not links:
            return {"nvlink_up": None, "nvlink_total": None, **dict.fromkeys(keys)}
        states = [self._call("nvmlDeviceGetNvLinkState", h, link) for link in links]
        known = [s for s in states if s is not None]
        nv = pynvml
        counters = {
            "nvlink_crc_errors": (nv.NVML_NVLINK_ERROR_DL_CRC_FLIT, nv.NVML_NVLINK_ERROR_DL_CRC_DATA),
            "nvlink_replay_errors": (nv.NVML_NVLINK_ERROR_DL_REPLAY,),
            "nvlink_recovery_errors": (nv.NVML_NVLINK_ERROR_DL_RECOVERY,),
        }
        totals: dict[str, Any] = {}
        for key, kinds in counters.items():
            reads = [
                self._call("nvmlDeviceGetNvLinkErrorCounter", h, link, kind)
                for link in links
                for kind in kinds
            ]
            got = [int(v) for v in reads if v is not None]
            totals[key] = sum(got) if got else None
        if all(v is None for v in totals.values()):
            flit, data, replay, recovery = (self._field_value(h, f) for f in _NVLINK_TOTAL_FIELDS)
            totals = {
                "nvlink_crc_errors": None
                if flit is None and data is None
                else int(flit or 0) + int(data or 0),
                "nvlink_replay_errors": None if replay is None else int(replay),
                "nvlink_recovery_errors": None if recovery is None else int(recovery),
            }
        up = sum(1 for s in known if int(s) == getattr(nv, "NVML_FEATURE_ENABLED", 1)) if known else None
        return {"nvlink_up": up, "nvlink_total": len(links), **totals}

    def _field_value(self, h: Any, field_id: int) -> float | int | None:
        values = self._call("nvmlDeviceGetFieldValues", h, [field_id])
        if not values:
            return None
        v = values[0]
        if v.nvmlReturn != getattr(pynvml, "NVML_SUCCESS", 0):
            err = map_nvml_error(pynvml.NVMLError(v.nvmlReturn), f"field {field_id}")
            if isinstance(err, GpuLost):
                raise err
            return None
        member = {0: "dVal", 1: "uiVal", 2: "ulVal", 3: "ullVal", 4: "sllVal", 5: "siVal", 6: "usVal"}
        return getattr(v.value, member.get(int(v.valueType), "ullVal"))

    def _recovery_action(self, h: Any) -> RecoveryAction | None:
        field_id = getattr(pynvml, "NVML_FI_DEV_GET_GPU_RECOVERY_ACTION", None)
        if field_id is None:  # nvidia-ml-py older than R565
            return None
        value = self._field_value(h, field_id)
        return None if value is None else RECOVERY_ACTION_CODES.get(int(value))


def _milli(value: Any) -> float | None:
    return None if value is None else float(value) / 1000.0


def _mib(value: Any) -> float | None:
    return None if value is None else float(value) / 2**20

"""The NVML backend on CPU: pynvml's functions are replaced by a fake GPU box (healthy GPUs,
unsupported fields, a GPU lost mid-run), and every NVMLError class must map to trainguard's errors."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pynvml
import pytest

from trainguard.errors import BackendError, BackendUnavailable, GpuLost, NoPermission, NotSupported
from trainguard.records import RecoveryAction, Throttle
from trainguard.telemetry import TelemetryBackend, open_backend
from trainguard.telemetry.nvml import NVML_ERROR_MAP, NvmlBackend, map_nvml_error

MIB = 2**20


class FakeGpu:
    """One GPU as NVML would answer for it. ``unsupported`` names calls that raise NotSupported;
    ``failing`` maps a call to the NVMLError class it raises; ``lost`` makes every call GpuIsLost."""

    def __init__(self, index: int, **values: Any) -> None:
        self.index = index
        self.lost = False
        self.unsupported: set[str] = set()
        self.failing: dict[str, type[Exception]] = {}
        self.v = {
            "name": "NVIDIA H100 80GB HBM3",
            "uuid": f"GPU-0000000{index}-1111-2222-3333-444444444444",
            "bus": f"00000000:{0x1B + 0x28 * index:02X}:00.0",
            "temp": 61,
            "slowdown": 89,
            "shutdown": 92,
            "power_mw": 612_345,
            "limit_mw": 700_000,
            "fan": 0,
            "clocks": {pynvml.NVML_CLOCK_SM: 1965, pynvml.NVML_CLOCK_MEM: 2619},
            "max_clocks": {pynvml.NVML_CLOCK_SM: 1980, pynvml.NVML_CLOCK_MEM: 2619},
            "util": (98, 41),
            "mem": (70_000 * MIB, 81_559 * MIB),
            "reasons": 0,
            "ecc": {(0, 0): 3, (0, 1): 17, (1, 0): 0, (1, 1): 1},  # (uncorrected?, aggregate?) -> count
            "retired": {0: [], 1: [0x1000]},
            "retired_pending": 0,
            "remap": (2, 1, 0, 0),
            "gen": (5, 5),
            "width": (16, 16),
            "replay": 7,
            "links": 18,
            "link_down": set(),
            "link_errors": {  # per link
                pynvml.NVML_NVLINK_ERROR_DL_CRC_FLIT: 2,
                pynvml.NVML_NVLINK_ERROR_DL_CRC_DATA: 1,
                pynvml.NVML_NVLINK_ERROR_DL_REPLAY: 1,
                pynvml.NVML_NVLINK_ERROR_DL_RECOVERY: 0,
            },
            "recovery": 0,
            "nvlink_totals": {},  # NVML_FI_DEV_NVLINK_*_TOTAL field id -> value
            "reserved": 512 * MIB,
            "mem_temp": 71,
            "energy_mj": 123_456_789,
            "enc_dec": (3, 5),
            "nvlink_data_kib": 1000,  # per link and direction
            "gpm": True,  # Hopper: GPM answers
            "gpm_samples": 0,
        }
        self.v.update(values)

    def answer(self, call: str) -> None:
        if self.lost:
            raise pynvml.NVMLError_GpuIsLost()
        if call in self.unsupported:
            raise pynvml.NVMLError_NotSupported()
        if call in self.failing:
            raise self.failing[call]()


class FakeNvml:
    def __init__(self, gpus: list[FakeGpu]) -> None:
        self.gpus = gpus
        self.inits = 0
        self.shutdowns = 0
        self.init_error: type[Exception] | None = None

    def install(self, mp: pytest.MonkeyPatch) -> None:
        for name in dir(self):
            if name.startswith("nvml"):
                mp.setattr(pynvml, name, getattr(self, name), raising=False)

    # library
    def nvmlInit(self) -> None:
        if self.init_error:
            raise self.init_error()
        self.inits += 1

    def nvmlShutdown(self) -> None:
        self.shutdowns += 1

    def nvmlDeviceGetCount(self) -> int:
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, i: int) -> FakeGpu:
        self.gpus[i].answer("handle")
        return self.gpus[i]

    # identity
    def nvmlDeviceGetName(self, h: FakeGpu) -> str:
        h.answer("name")
        return h.v["name"]

    def nvmlDeviceGetUUID(self, h: FakeGpu) -> bytes:
        h.answer("uuid")
        return h.v["uuid"].encode()  # old bindings return bytes

    def nvmlDeviceGetPciInfo(self, h: FakeGpu) -> Any:
        h.answer("pci")
        return SimpleNamespace(busId=h.v["bus"].encode())

    # readings
    def nvmlDeviceGetTemperature(self, h: FakeGpu, sensor: int) -> int:
        h.answer("temp")
        return h.v["temp"]

    def nvmlDeviceGetTemperatureThreshold(self, h: FakeGpu, which: int) -> int:
        h.answer("threshold")
        return h.v["slowdown"] if which == pynvml.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN else h.v["shutdown"]

    def nvmlDeviceGetPowerUsage(self, h: FakeGpu) -> int:
        h.answer("power")
        return h.v["power_mw"]

    def nvmlDeviceGetEnforcedPowerLimit(self, h: FakeGpu) -> int:
        h.answer("limit")
        return h.v["limit_mw"]

    def nvmlDeviceGetFanSpeed(self, h: FakeGpu) -> int:
        h.answer("fan")
        return h.v["fan"]

    def nvmlDeviceGetClockInfo(self, h: FakeGpu, kind: int) -> int:
        h.answer("clock")
        return h.v["clocks"][kind]

    def nvmlDeviceGetMaxClockInfo(self, h: FakeGpu, kind: int) -> int:
        h.answer("max_clock")
        return h.v["max_clocks"][kind]

    def nvmlDeviceGetUtilizationRates(self, h: FakeGpu) -> Any:
        h.answer("util")
        return SimpleNamespace(gpu=h.v["util"][0], memory=h.v["util"][1])

    def nvmlDeviceGetMemoryInfo(self, h: FakeGpu, version: int | None = None) -> Any:
        h.answer("mem")
        used, total = h.v["mem"]
        if version is None:
            return SimpleNamespace(used=used, total=total, free=total - used)
        h.answer("mem_v2")
        return SimpleNamespace(
            used=used, total=total, reserved=h.v["reserved"], free=total - used - h.v["reserved"]
        )

    def nvmlDeviceGetTotalEnergyConsumption(self, h: FakeGpu) -> int:
        h.answer("energy")
        return h.v["energy_mj"]

    def nvmlDeviceGetEncoderUtilization(self, h: FakeGpu) -> list[int]:
        h.answer("enc")
        return [h.v["enc_dec"][0], 167000]

    def nvmlDeviceGetDecoderUtilization(self, h: FakeGpu) -> list[int]:
        h.answer("dec")
        return [h.v["enc_dec"][1], 167000]

    # GPM (Hopper and newer)
    def nvmlGpmQueryDeviceSupport(self, h: FakeGpu) -> Any:
        h.answer("gpm")
        return SimpleNamespace(isSupportedDevice=int(h.v["gpm"]))

    def nvmlGpmSampleAlloc(self) -> Any:
        return pynvml.c_nvmlGpmSample_t()

    def nvmlGpmSampleFree(self, sample: Any) -> None:
        pass

    def nvmlGpmSampleGet(self, h: FakeGpu, sample: Any) -> Any:
        h.answer("gpm_sample")
        h.v["gpm_samples"] += 1
        return sample

    def nvmlGpmMetricsGet(self, get: Any) -> Any:
        percent = {
            pynvml.NVML_GPM_METRIC_GRAPHICS_UTIL: 90.0,
            pynvml.NVML_GPM_METRIC_ANY_TENSOR_UTIL: 55.0,
            pynvml.NVML_GPM_METRIC_DRAM_BW_UTIL: 40.0,
            pynvml.NVML_GPM_METRIC_PCIE_TX_PER_SEC: 2.0,  # MiB/s
            pynvml.NVML_GPM_METRIC_PCIE_RX_PER_SEC: 3.0,
        }
        for i in range(get.numMetrics):
            get.metrics[i].value = percent[get.metrics[i].metricId]
            get.metrics[i].nvmlReturn = pynvml.NVML_SUCCESS
        return get

    def nvmlDeviceGetCurrentClocksEventReasons(self, h: FakeGpu) -> int:
        h.answer("event_reasons")
        return h.v["reasons"]

    def nvmlDeviceGetCurrentClocksThrottleReasons(self, h: FakeGpu) -> int:
        h.answer("throttle_reasons")
        return h.v["reasons"]

    def nvmlDeviceGetTotalEccErrors(self, h: FakeGpu, error_type: int, counter: int) -> int:
        h.answer("ecc")
        return h.v["ecc"][(error_type, counter)]

    def nvmlDeviceGetRetiredPages(self, h: FakeGpu, cause: int) -> list[int]:
        h.answer("retired")
        return h.v["retired"][cause]

    def nvmlDeviceGetRetiredPagesPendingStatus(self, h: FakeGpu) -> int:
        h.answer("retired_pending")
        return h.v["retired_pending"]

    def nvmlDeviceGetRemappedRows(self, h: FakeGpu) -> tuple[int, int, int, int]:
        h.answer("remap")
        return h.v["remap"]

    def nvmlDeviceGetCurrPcieLinkGeneration(self, h: FakeGpu) -> int:
        h.answer("gen")
        return h.v["gen"][0]

    def nvmlDeviceGetMaxPcieLinkGeneration(self, h: FakeGpu) -> int:
        h.answer("gen")
        return h.v["gen"][1]

    def nvmlDeviceGetCurrPcieLinkWidth(self, h: FakeGpu) -> int:
        h.answer("width")
        return h.v["width"][0]

    def nvmlDeviceGetMaxPcieLinkWidth(self, h: FakeGpu) -> int:
        h.answer("width")
        return h.v["width"][1]

    def nvmlDeviceGetPcieReplayCounter(self, h: FakeGpu) -> int:
        h.answer("replay")
        return h.v["replay"]

    def nvmlDeviceGetNvLinkState(self, h: FakeGpu, link: int) -> int:
        h.answer("nvlink_state")
        if link >= h.v["links"]:
            raise pynvml.NVMLError_InvalidArgument()
        return 0 if link in h.v["link_down"] else 1

    def nvmlDeviceGetNvLinkErrorCounter(self, h: FakeGpu, link: int, counter: int) -> int:
        h.answer("nvlink_errors")
        return h.v["link_errors"][counter]

    def nvmlDeviceGetFieldValues(self, h: FakeGpu, ids: list[Any]) -> list[Any]:
        h.answer("fields")
        out = []
        throughput = (
            pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX,
            pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX,
        )
        for field_id in ids:
            if (
                isinstance(field_id, tuple)
                and field_id[0] in throughput
                and "nvlink_data" not in h.unsupported
            ):
                value, ret = SimpleNamespace(ullVal=h.v["nvlink_data_kib"]), pynvml.NVML_SUCCESS
            elif field_id == pynvml.NVML_FI_DEV_MEMORY_TEMP and "mem_temp" not in h.unsupported:
                value, ret = SimpleNamespace(uiVal=h.v["mem_temp"]), pynvml.NVML_SUCCESS
            elif field_id == pynvml.NVML_FI_DEV_GET_GPU_RECOVERY_ACTION:
                value, ret = SimpleNamespace(uiVal=h.v["recovery"]), pynvml.NVML_SUCCESS
            elif field_id in h.v["nvlink_totals"]:
                value, ret = SimpleNamespace(ullVal=h.v["nvlink_totals"][field_id]), pynvml.NVML_SUCCESS
                out.append(
                    SimpleNamespace(
                        nvmlReturn=ret, valueType=pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG, value=value
                    )
                )
                continue
            else:
                value, ret = SimpleNamespace(ullVal=0), pynvml.NVML_ERROR_NOT_SUPPORTED
            out.append(
                SimpleNamespace(nvmlReturn=ret, valueType=pynvml.NVML_VALUE_TYPE_UNSIGNED_INT, value=value)
            )
        return out


@pytest.fixture
def box(monkeypatch: pytest.MonkeyPatch) -> FakeNvml:
    fake = FakeNvml([FakeGpu(0), FakeGpu(1), FakeGpu(2)])
    fake.install(monkeypatch)
    return fake


def test_dcgm_exporters_default_counters_come_from_nvml(box):
    backend = NvmlBackend()
    first = backend.sample()[0]
    assert (first.mem_free_mib, first.mem_reserved_mib) == (81_559 - 70_000 - 512, 512)
    assert (first.memory_temp_c, first.energy_mj, first.enc_util_pct, first.dec_util_pct) == (
        71,
        123_456_789,
        3,
        5,
    )
    assert first.nvlink_data_kib == 18 * 2 * 1000  # every link, both directions
    assert first.tensor_active is None  # GPM reports over an interval: nothing after one sample
    second = backend.sample()[0]
    assert (second.gr_engine_active, second.tensor_active, second.dram_active) == (0.9, 0.55, 0.4)
    assert (second.pcie_tx_bytes_s, second.pcie_rx_bytes_s) == (2 * MIB, 3 * MIB)
    backend.close()


def test_before_hopper_the_gpm_fields_are_unknown(box):
    box.gpus[0].v["gpm"] = False
    box.gpus[0].unsupported |= {"mem_v2", "mem_temp", "nvlink_data"}
    backend = NvmlBackend()
    backend.sample()
    s = backend.sample()[0]
    assert (s.gr_engine_active, s.tensor_active, s.dram_active, s.pcie_tx_bytes_s) == (None, None, None, None)
    assert box.gpus[0].v["gpm_samples"] == 0  # never asked
    assert s.mem_reserved_mib is None and s.mem_free_mib == 81_559 - 70_000  # the v1 answer
    assert s.memory_temp_c is None and s.nvlink_data_kib is None
    assert backend.sample()[1].tensor_active == 0.55  # its Hopper neighbour still reports
    backend.close()


def test_healthy_gpu_reads_every_field_in_trainguard_units(box):
    box.gpus[0].v.update(reasons=0x04 | 0x01, recovery=0, link_down={17})
    backend = NvmlBackend()
    assert isinstance(backend, TelemetryBackend)
    s = backend.sample()[0]
    assert s.gpu.index == 0 and s.gpu.name == "NVIDIA H100 80GB HBM3"
    assert s.gpu.uuid == "GPU-00000000-1111-2222-3333-444444444444" and s.gpu.pci == "0000:1b:00"
    assert (s.temperature_c, s.temp_slowdown_c, s.temp_shutdown_c) == (61, 89, 92)
    assert (s.power_w, s.power_limit_w, s.fan_pct) == (612.345, 700.0, 0)
    assert (s.sm_clock_mhz, s.sm_clock_max_mhz, s.mem_clock_mhz, s.mem_clock_max_mhz) == (
        1965,
        1980,
        2619,
        2619,
    )
    assert (s.util_gpu_pct, s.util_mem_pct, s.mem_used_mib, s.mem_total_mib) == (98, 41, 70_000, 81_559)
    assert s.throttle == frozenset({Throttle.SW_POWER_CAP})  # GPU idle (0x1) is not a health reason
    assert (s.ecc_sbe_volatile, s.ecc_sbe_aggregate, s.ecc_dbe_volatile, s.ecc_dbe_aggregate) == (3, 17, 0, 1)
    assert (s.retired_sbe, s.retired_dbe, s.retired_pending) == (0, 1, False)
    assert (s.remap_correctable, s.remap_uncorrectable, s.remap_pending, s.remap_failure) == (
        2,
        1,
        False,
        False,
    )
    assert (s.pcie_gen, s.pcie_gen_max, s.pcie_width, s.pcie_width_max, s.pcie_replay) == (5, 5, 16, 16, 7)
    assert (s.nvlink_up, s.nvlink_total) == (17, 18)
    assert (s.nvlink_crc_errors, s.nvlink_replay_errors, s.nvlink_recovery_errors) == (18 * 3, 18, 0)
    assert s.recovery_action is RecoveryAction.NONE
    assert not s.lost and s.error is None
    backend.close()


def test_every_throttle_bit_maps_to_its_reason(box):
    box.gpus[0].v["reasons"] = 0x08 | 0x20 | 0x40 | 0x80
    with NvmlBackend() as backend:
        assert backend.sample()[0].throttle == {
            Throttle.HW_SLOWDOWN,
            Throttle.SW_THERMAL,
            Throttle.HW_THERMAL,
            Throttle.HW_POWER_BRAKE,
        }


def test_recovery_action_field_maps_to_the_drivers_request(box):
    box.gpus[1].v["recovery"] = pynvml.NVML_GPU_RECOVERY_ACTION_NODE_REBOOT
    box.gpus[2].v["recovery"] = pynvml.NVML_GPU_RECOVERY_ACTION_DRAIN_AND_RESET
    with NvmlBackend() as backend:
        actions = [s.recovery_action for s in backend.sample()]
    assert actions == [RecoveryAction.NONE, RecoveryAction.NODE_REBOOT, RecoveryAction.DRAIN_AND_RESET]


def test_unsupported_fields_are_unknown_and_the_rest_still_read(box):
    gpu = box.gpus[0]
    gpu.unsupported |= {"fan", "retired", "retired_pending", "remap", "ecc", "event_reasons", "fields"}
    gpu.v["links"] = 0  # a PCIe board without NVLink
    gpu.v["reasons"] = 0x40
    with NvmlBackend() as backend:
        s = backend.sample()[0]
    assert s.fan_pct is None and s.retired_sbe is None and s.retired_pending is None
    assert s.remap_pending is None and s.remap_failure is None and s.ecc_dbe_volatile is None
    assert s.nvlink_up is None and s.nvlink_crc_errors is None and s.recovery_action is None
    assert s.throttle == {Throttle.HW_THERMAL}  # read through the pre-R535 ThrottleReasons call
    assert s.temperature_c == 61 and s.power_w == 612.345 and not s.lost
    assert backend.field_errors == 0  # "not supported" is not an error


def test_nvlink_totals_come_from_field_values_when_per_link_counters_are_unsupported(box):
    gpu = box.gpus[0]
    gpu.unsupported.add("nvlink_errors")
    gpu.v["nvlink_totals"] = {
        pynvml.NVML_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL: 40,
        pynvml.NVML_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL: 2,
        pynvml.NVML_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL: 7,
        pynvml.NVML_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL: 1,
    }
    with NvmlBackend() as backend:
        s = backend.sample()[0]
    assert (s.nvlink_crc_errors, s.nvlink_replay_errors, s.nvlink_recovery_errors) == (42, 7, 1)
    assert s.nvlink_up == 18


def test_throttle_is_unknown_when_neither_reasons_call_works(box):
    box.gpus[0].unsupported |= {"event_reasons", "throttle_reasons"}
    with NvmlBackend() as backend:
        assert backend.sample()[0].throttle is None


def test_a_failing_field_read_is_unknown_and_counted_not_raised(box):
    box.gpus[0].failing["temp"] = pynvml.NVMLError_Timeout
    with NvmlBackend() as backend:
        s = backend.sample()[0]
        assert s.temperature_c is None and s.power_w is not None
        assert backend.field_errors == 1


def test_gpu_lost_mid_run_marks_only_that_gpu_and_the_rest_keep_reading(box):
    with NvmlBackend() as backend:
        assert not any(s.lost for s in backend.sample())
        box.gpus[1].lost = True
        for _ in range(2):
            samples = backend.sample()
            assert samples[1].lost and "lost" in samples[1].error.lower()
            assert samples[1].temperature_c is None
            assert samples[1].gpu.uuid == box.gpus[1].v["uuid"]  # identity read at start is kept
            assert [s.temperature_c for s in (samples[0], samples[2])] == [61, 61]
        box.gpus[1].lost = False  # a GPU that answers again is read again
        assert not backend.sample()[1].lost


def test_driver_gone_mid_run_makes_readings_unknown_without_raising(box):
    with NvmlBackend() as backend:
        for gpu in box.gpus:
            gpu.failing["temp"] = pynvml.NVMLError_Uninitialized
        samples = backend.sample()
    assert all(not s.lost and s.error and s.temperature_c is None and s.power_w is None for s in samples)


def test_gpu_lost_before_start_is_lost_from_the_first_sample(box):
    box.gpus[2].lost = True
    with NvmlBackend() as backend:
        assert [g.uuid is None for g in backend.gpus()] == [False, False, True]
        samples = backend.sample()
    assert samples[2].lost and not samples[0].lost


def test_nvml_is_initialised_once_per_backend_and_shut_down_on_close(box):
    backend = NvmlBackend()
    for _ in range(3):
        backend.sample()
    assert (box.inits, box.shutdowns) == (1, 0)
    backend.close()
    backend.close()
    assert box.shutdowns == 1


@pytest.mark.parametrize(
    "error",
    [
        pynvml.NVMLError_LibraryNotFound,
        pynvml.NVMLError_DriverNotLoaded,
        pynvml.NVMLError_LibRmVersionMismatch,
    ],
)
def test_no_driver_is_backend_unavailable_suggesting_the_simulator(box, error):
    box.init_error = error
    with pytest.raises(BackendUnavailable) as info:
        open_backend("nvml")
    message = str(info.value)
    assert "--backend sim" in message and "\n" not in message


def test_a_driver_without_gpus_is_backend_unavailable(box):
    box.gpus.clear()
    with pytest.raises(BackendUnavailable, match="no GPU"):
        NvmlBackend()
    assert box.shutdowns == 1


def test_this_machine_without_a_driver_says_so_in_one_line():
    try:
        backend = NvmlBackend()
    except BackendUnavailable as exc:
        assert "--backend sim" in str(exc) and "\n" not in str(exc)
    else:  # a real GPU box: nothing to check here
        backend.close()
        pytest.skip("an NVIDIA driver is present")


def test_every_nvml_error_class_maps_to_a_trainguard_error():
    classes = {
        name: cls
        for name, cls in vars(pynvml).items()
        if name.startswith("NVMLError_") and isinstance(cls, type) and issubclass(cls, pynvml.NVMLError)
    }
    assert len(classes) >= 25
    missing = sorted(set(classes) - set(NVML_ERROR_MAP))
    assert missing == [], f"unmapped pynvml errors: {missing}"
    for name, cls in classes.items():
        err = map_nvml_error(cls())
        assert type(err) is NVML_ERROR_MAP[name]
        assert isinstance(err, BackendError) and isinstance(err.__cause__, pynvml.NVMLError)


def test_nvml_errors_map_to_the_meaningful_trainguard_error():
    expect = {
        pynvml.NVMLError_GpuIsLost: GpuLost,
        pynvml.NVMLError_NotSupported: NotSupported,
        pynvml.NVMLError_FunctionNotFound: NotSupported,
        pynvml.NVMLError_NoPermission: NoPermission,
        pynvml.NVMLError_Uninitialized: BackendUnavailable,
        pynvml.NVMLError_DriverNotLoaded: BackendUnavailable,
        pynvml.NVMLError_LibraryNotFound: BackendUnavailable,
        pynvml.NVMLError_Unknown: BackendError,
        pynvml.NVMLError_Timeout: BackendError,
    }
    for nvml_error, ours in expect.items():
        assert type(map_nvml_error(nvml_error())) is ours
    assert type(map_nvml_error(pynvml.NVMLError(12345))) is BackendError  # a code newer than the map
    assert type(map_nvml_error(pynvml.NVMLLibraryMismatchError("x"))) is BackendUnavailable

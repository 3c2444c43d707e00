"""Reading saved ``nvidia-smi -q -x`` snapshots (R550 H100 and R525 A100 schemas)."""

from __future__ import annotations

import calendar
from pathlib import Path

import pytest

from trainguard.errors import InputError
from trainguard.records import RecoveryAction, Throttle
from trainguard.telemetry import TelemetryBackend, open_backend
from trainguard.telemetry.smi_xml import SmiXmlBackend, parse_smi_xml, read_smi_xml

DATA = Path(__file__).parent / "data"
HEALTHY = DATA / "nvidia-smi-h100-healthy.xml"
SICK = DATA / "nvidia-smi-a100-ecc-throttle.xml"


def test_healthy_h100_snapshot_reads_every_gpu():
    samples = read_smi_xml(HEALTHY)
    assert [s.gpu.index for s in samples] == [0, 1, 2, 3]
    assert [s.gpu.pci for s in samples] == ["0000:1b:00", "0000:43:00", "0000:52:00", "0000:61:00"]
    s = samples[1]
    assert s.gpu.uuid == "GPU-0c6f6d5a-2b8e-47a1-93d5-6e2f8b0a7c13" and s.gpu.name == "NVIDIA H100 80GB HBM3"
    assert (s.temperature_c, s.temp_slowdown_c, s.temp_shutdown_c) == (62, 89, 92)
    assert (s.power_w, s.power_limit_w) == (638.07, 700)
    assert (s.sm_clock_mhz, s.sm_clock_max_mhz, s.mem_clock_mhz, s.mem_clock_max_mhz) == (
        1965,
        1980,
        2619,
        2619,
    )
    assert (s.util_gpu_pct, s.mem_used_mib, s.mem_total_mib) == (100, 74215, 81559)
    assert s.throttle == frozenset()
    assert (s.pcie_gen, s.pcie_gen_max, s.pcie_width, s.pcie_width_max, s.pcie_replay) == (5, 5, 16, 16, 12)
    assert (s.remap_correctable, s.remap_uncorrectable, s.remap_pending, s.remap_failure) == (
        0,
        0,
        False,
        False,
    )
    assert s.recovery_action is RecoveryAction.NONE
    assert samples[0].ecc_sbe_aggregate == 3 and samples[0].ecc_dbe_volatile == 0
    assert s.time == calendar.timegm((2025, 11, 20, 14, 31, 7, 0, 0, 0))


def test_na_and_not_supported_values_become_none():
    healthy, sick = read_smi_xml(HEALTHY), read_smi_xml(SICK)
    assert healthy[0].fan_pct is None  # "N/A"
    assert healthy[0].retired_sbe is None and healthy[0].retired_pending is None  # "N/A"
    assert sick[3].util_mem_pct is None  # "[Not Supported]"
    assert sick[3].power_w is None  # "Unknown Error"
    assert all(s.nvlink_crc_errors is None for s in healthy)  # not part of nvidia-smi -q


def test_sick_a100_snapshot_shows_ecc_remap_and_throttle_problems():
    s = read_smi_xml(SICK)
    assert s[0].ecc_dbe_volatile == 0 and s[0].remap_pending is False and s[0].throttle == frozenset()
    assert (s[1].ecc_dbe_volatile, s[1].ecc_dbe_aggregate, s[1].ecc_sbe_volatile) == (2, 2, 14)
    assert (s[1].remap_uncorrectable, s[1].remap_pending) == (1, True)
    assert s[1].recovery_action is RecoveryAction.GPU_RESET  # R525: gpu_reset_status/reset_required
    assert s[2].throttle == {
        Throttle.HW_SLOWDOWN,
        Throttle.HW_THERMAL,
        Throttle.SW_THERMAL,
    }  # clocks_throttle_reasons
    assert s[2].temperature_c == 90 >= s[2].temp_slowdown_c and s[2].sm_clock_mhz == 705
    assert (s[2].pcie_width, s[2].pcie_width_max) == (8, 16)
    assert s[3].remap_failure is True and s[3].throttle == {Throttle.SW_POWER_CAP}
    assert s[3].power_limit_w == 400


def test_backend_returns_the_snapshot_every_time():
    backend = open_backend("smi-xml", path=SICK)
    assert isinstance(backend, SmiXmlBackend) and isinstance(backend, TelemetryBackend)
    assert backend.sample() == backend.sample()
    assert [g.index for g in backend.gpus()] == [0, 1, 2, 3]
    backend.close()


def test_invalid_xml_is_an_input_error_naming_the_file(tmp_path):
    bad = tmp_path / "smi.xml"
    bad.write_text("<nvidia_smi_log><gpu id='00000000:1B:00.0'><uuid>GPU-1</uuid></gpu>")  # truncated
    with pytest.raises(InputError, match=r"smi\.xml: not valid XML"):
        read_smi_xml(bad)


def test_missing_file_is_an_input_error_naming_it(tmp_path):
    with pytest.raises(InputError, match=r"nope\.xml: cannot read"):
        SmiXmlBackend(tmp_path / "nope.xml")


def test_xml_that_is_not_nvidia_smi_output_is_an_input_error():
    with pytest.raises(InputError, match="not `nvidia-smi -q -x`"):
        parse_smi_xml("<html><body/></html>", source="page.html")
    with pytest.raises(InputError, match="no <gpu>"):
        parse_smi_xml("<nvidia_smi_log><attached_gpus>0</attached_gpus></nvidia_smi_log>")


def test_r565_recovery_action_and_lost_gpu():
    text = """<nvidia_smi_log><timestamp>garbled</timestamp>
      <gpu id="00000000:1B:00.0"><uuid>GPU-aaaaaaaa-1111-2222-3333-444444444444</uuid>
        <gpu_recovery_action>Reset</gpu_recovery_action></gpu>
      <gpu id="00000000:43:00.0"><uuid>[GPU is lost]</uuid></gpu>
      <gpu id="00000000:52:00.0"><uuid>GPU-bbbbbbbb-1111-2222-3333-444444444444</uuid>
        <gpu_recovery_action>N/A</gpu_recovery_action></gpu></nvidia_smi_log>"""
    a, b, c = parse_smi_xml(text, default_time=5.0)
    assert a.recovery_action is RecoveryAction.GPU_RESET and a.time == 5.0 and not a.lost
    assert b.lost and b.gpu.pci == "0000:43:00" and b.gpu.uuid is None
    assert c.recovery_action is None and c.temperature_c is None

"""The simulated node: plausible healthy readings, determinism, and the evidence of every fault."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from trainguard.clock import VirtualClock
from trainguard.errors import ConfigError
from trainguard.records import RecoveryAction, Throttle
from trainguard.telemetry import TelemetryBackend, open_backend
from trainguard.telemetry.sim import SimNode, faults, write_xid_line

UUID = re.compile(r"^GPU-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")
DMESG = re.compile(r"^\[ *\d+\.\d{6}\] ")


def make(tmp_path: Path, **kw) -> tuple[SimNode, VirtualClock, Path]:
    clock = VirtualClock()
    kmsg = tmp_path / "kmsg.log"
    return SimNode(clock=clock, kmsg_path=kmsg, **kw), clock, kmsg


def new_lines(kmsg: Path, before: int) -> list[str]:
    return kmsg.read_text().splitlines()[before:]


def test_fleet_is_a_telemetry_backend(tmp_path):
    sim, _, _ = make(tmp_path)
    assert isinstance(sim, TelemetryBackend)
    assert isinstance(open_backend("sim", n_gpus=2, clock=VirtualClock()), SimNode)


def test_healthy_h100_readings_are_plausible(tmp_path):
    sim, clock, _ = make(tmp_path)
    for _ in range(20):
        clock.advance(1.0)
        for s in sim.sample():
            assert not s.lost and s.error is None
            assert 35 <= s.temperature_c <= 72
            assert s.temperature_c < s.temp_slowdown_c < s.temp_shutdown_c
            assert 0.6 * s.power_limit_w <= s.power_w <= s.power_limit_w == 700
            assert s.sm_clock_mhz >= 0.9 * s.sm_clock_max_mhz
            assert s.util_gpu_pct >= 90 and 0 < s.mem_used_mib < s.mem_total_mib
            assert s.throttle == frozenset()
            assert (s.pcie_gen, s.pcie_width) == (s.pcie_gen_max, s.pcie_width_max) == (5, 16)
            assert (s.nvlink_up, s.nvlink_total) == (18, 18)
            assert s.ecc_dbe_volatile == s.ecc_dbe_aggregate == s.remap_uncorrectable == 0
            assert s.remap_pending is False and s.remap_failure is False
            assert s.pcie_replay == s.nvlink_crc_errors == 0
            assert s.recovery_action is RecoveryAction.NONE
            assert s.fan_pct is None  # SXM boards have no fan of their own: unknown, as NVML says


def test_readings_vary_with_time_but_not_between_runs_of_one_seed(tmp_path):
    def run(seed: int) -> list:
        sim = SimNode(seed=seed, clock=(clock := VirtualClock()))
        out = []
        for _ in range(5):
            clock.advance(1)
            out.append([(s.temperature_c, s.power_w, s.sm_clock_mhz) for s in sim.sample()])
        return out

    first, again, other = run(7), run(7), run(8)
    assert first == again
    assert first != other
    assert len({tuple(step) for step in first}) > 1  # noise: not frozen in time


def test_gpus_have_distinct_pci_addresses_and_uuids(tmp_path):
    sim, _, _ = make(tmp_path, n_gpus=16)
    gpus = sim.gpus()
    assert [g.index for g in gpus] == list(range(16))
    assert len({g.pci for g in gpus}) == 16 and len({g.uuid for g in gpus}) == 16
    assert all(UUID.match(g.uuid) for g in gpus)
    assert all(re.match(r"^[0-9a-f]{4}:[0-9a-f]{2}:00$", g.pci) for g in gpus)
    assert SimNode(hostname="node1").gpus()[0].uuid != SimNode(hostname="node0").gpus()[0].uuid


def test_fleet_start_writes_driver_gpu_map_lines(tmp_path):
    sim, _, kmsg = make(tmp_path)
    text = kmsg.read_text()
    for gpu in sim.gpus():
        assert f"NVRM: GPU at PCI:{gpu.pci}: {gpu.uuid}" in text
    assert all(DMESG.match(line) for line in text.splitlines())


def test_xid79_loses_the_gpu_from_then_on_and_the_others_keep_reading(tmp_path):
    sim, clock, kmsg = make(tmp_path)
    before = len(kmsg.read_text().splitlines())
    sim.at(10).xid(79, gpu=3)
    clock.advance(9.9)
    assert not sim.sample()[3].lost
    clock.advance(0.2)
    for _ in range(3):
        samples = sim.sample()
        assert samples[3].lost and samples[3].temperature_c is None and "79" in samples[3].error
        assert all(not s.lost and s.temperature_c is not None for i, s in enumerate(samples) if i != 3)
        clock.advance(5)
    lines = new_lines(kmsg, before)
    pci = sim.gpus()[3].pci
    assert (
        lines[0]
        == f"[   10.000000] NVRM: Xid (PCI:{pci}): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus."
    )
    assert f"NVRM: GPU {pci}.0: GPU has fallen off the bus." in lines[1]


def test_dbe_raises_counters_and_leaves_a_remap_pending(tmp_path):
    sim, clock, kmsg = make(tmp_path)
    before = len(kmsg.read_text().splitlines())
    sim.at(5).dbe(gpu=2)
    clock.advance(6)
    s = sim.sample()[2]
    assert (s.ecc_dbe_volatile, s.ecc_dbe_aggregate, s.remap_uncorrectable) == (1, 1, 1)
    assert s.remap_pending is True and s.remap_failure is False
    lines = new_lines(kmsg, before)
    assert ": 48, " in lines[0] and "uncorrectable double bit error (DBE)" in lines[0]
    assert ": 63, " in lines[1] and "marked for remapping, reset gpu to activate" in lines[1]
    assert sim.sample()[1].ecc_dbe_volatile == 0


def test_gpu_reset_activates_the_pending_remap_and_clears_volatile_counts(tmp_path):
    sim, clock, _ = make(tmp_path)
    sim.at(1).dbe(gpu=2).recovery_action(gpu=2)
    sim.at(2).reset_gpu(gpu=2)
    clock.advance(3)
    s = sim.sample()[2]
    assert s.remap_pending is False and s.ecc_dbe_volatile == 0
    assert s.ecc_dbe_aggregate == 1 and s.remap_uncorrectable == 1  # aggregates live in the InfoROM
    assert s.recovery_action is RecoveryAction.NONE


def test_row_remap_failure_sets_the_failure_flag_and_logs_xid64(tmp_path):
    sim, clock, kmsg = make(tmp_path)
    sim.at(1).xid(64, gpu=6)
    clock.advance(2)
    assert sim.sample()[6].remap_failure is True
    assert re.search(r"NVRM: Xid \(PCI:[0-9a-f:]+\): 64, .*Row Remapper Error", kmsg.read_text())


def test_uncontained_error_logs_xid95_and_counts_an_uncorrectable_error(tmp_path):
    sim, clock, kmsg = make(tmp_path)
    sim.at(1).uncontained(gpu=1)
    clock.advance(2)
    assert sim.sample()[1].ecc_dbe_volatile == 1
    assert re.search(r"\): 95, .*Uncontained: .*RST: Yes", kmsg.read_text())


def test_xid154_sets_the_recovery_action_field_and_says_so_in_the_log(tmp_path):
    sim, clock, kmsg = make(tmp_path)
    sim.at(1).recovery_action(gpu=4, action=RecoveryAction.NODE_REBOOT)
    clock.advance(2)
    assert sim.sample()[4].recovery_action is RecoveryAction.NODE_REBOOT
    pci = sim.gpus()[4].pci
    assert (
        f"NVRM: Xid (PCI:{pci}): 154, GPU recovery action changed from 0x0 (None) to 0x2 (Node Reboot Required)"
        in kmsg.read_text()
    )


def test_thermal_runaway_climbs_past_slowdown_with_hw_thermal_throttle_and_low_clocks(tmp_path):
    sim, clock, kmsg = make(tmp_path)
    before = len(kmsg.read_text().splitlines())
    sim.at(5).thermal_runaway(gpu=1, rate_c_per_s=2.0)
    temps = []
    for _ in range(40):
        clock.advance(1)
        temps.append(sim.sample()[1].temperature_c)
    s = sim.sample()[1]
    assert temps[10] > temps[3]  # climbing
    assert s.temperature_c >= s.temp_slowdown_c
    assert s.temperature_c < s.temp_shutdown_c
    assert {Throttle.HW_THERMAL, Throttle.HW_SLOWDOWN} <= s.throttle
    assert s.sm_clock_mhz <= 0.6 * s.sm_clock_max_mhz
    assert new_lines(kmsg, before) == []  # real boards log no Xid for this


def test_power_brake_throttles_and_drops_clocks_until_it_ends(tmp_path):
    sim, clock, _ = make(tmp_path)
    sim.at(2).power_brake(gpu=0, duration_s=10)
    clock.advance(3)
    s = sim.sample()[0]
    assert {Throttle.HW_POWER_BRAKE, Throttle.HW_SLOWDOWN} <= s.throttle
    assert s.sm_clock_mhz <= 0.4 * s.sm_clock_max_mhz and s.power_w < 0.4 * s.power_limit_w
    clock.advance(10)
    assert sim.sample()[0].throttle == frozenset()


def test_pcie_replay_storm_climbs_fast_and_logs_aer_errors(tmp_path):
    sim, clock, kmsg = make(tmp_path)
    sim.at(1).pcie_replay_storm(gpu=5, rate_per_s=100).after(4).pcie_downtrain(gpu=5)
    clock.advance(3)
    first = sim.sample()[5]
    clock.advance(10)
    later = sim.sample()[5]
    assert later.pcie_replay - first.pcie_replay >= 900
    assert (first.pcie_width, later.pcie_width, later.pcie_width_max) == (16, 8, 16)
    pci = sim.gpus()[5].pci
    assert f"AER: Corrected error received: {pci}.0" in kmsg.read_text()
    assert f"nvidia {pci}.0: PCIe Bus Error: severity=Corrected, type=Data Link Layer" in kmsg.read_text()


def test_nvlink_crc_storm_climbs_counters_and_a_fatal_link_error_drops_a_link(tmp_path):
    sim, clock, kmsg = make(tmp_path)
    sim.at(1).nvlink_crc_storm(gpu=7, rate_per_s=500)
    sim.at(1).nvlink_down(gpu=6)
    clock.advance(11)
    s7, s6 = sim.sample()[7], sim.sample()[6]
    assert s7.nvlink_crc_errors >= 5000 and s7.nvlink_replay_errors > 0
    assert s7.nvlink_up == 18 and s6.nvlink_up == 17
    assert re.search(r"\): 74, .*NVLink: fatal error detected on link", kmsg.read_text())


def test_straggler_runs_at_full_load_with_low_clocks_and_no_throttle_reason(tmp_path):
    sim, clock, _ = make(tmp_path)
    sim.at(1).straggler(gpu=3)
    clock.advance(2)
    s = sim.sample()[3]
    assert s.util_gpu_pct == 100 and s.throttle == frozenset()
    assert s.sm_clock_mhz <= 0.55 * s.sm_clock_max_mhz


def test_app_xid_burst_is_one_process_then_a_sympathetic_xid45(tmp_path):
    sim, clock, kmsg = make(tmp_path)
    before = len(kmsg.read_text().splitlines())
    sim.at(10).app_xid_burst(gpu=2, codes=(13, 31, 13), interval_s=2.0)
    clock.advance(20)
    sim.poll()
    lines = new_lines(kmsg, before)
    codes = [int(m.group(1)) for m in (re.search(r"\): (\d+), pid=", line) for line in lines)]
    assert codes[0] == 13 and 31 in codes and codes[-1] == 45
    assert len({re.search(r"pid=(\d+)", line).group(1) for line in lines}) == 1
    assert "Graphics SM Warp Exception" in lines[0]
    stamps = [float(line[1:13]) for line in lines]
    assert stamps == sorted(stamps) and stamps[0] == 10.0 and stamps[-1] == pytest.approx(14.4)
    assert sim.sample()[2].ecc_dbe_volatile == 0  # an application fault leaves NVML untouched


def test_inject_now_fires_at_once_with_the_current_time(tmp_path):
    sim, clock, kmsg = make(tmp_path)
    clock.advance(42.5)
    sim.inject_now(faults.FallOffBus(gpu=0))
    assert sim.sample()[0].lost
    assert "[   42.500000] NVRM: Xid" in kmsg.read_text()


def test_faults_fire_in_time_order_however_they_were_scripted(tmp_path):
    sim, clock, kmsg = make(tmp_path)
    sim.at(20).xid(45, gpu=1)
    sim.at(10).xid(13, gpu=1)
    assert len(sim.pending()) == 2
    clock.advance(30)
    sim.poll()
    xids = [line for line in kmsg.read_text().splitlines() if "Xid" in line]
    assert "): 13, " in xids[0] and "): 45, " in xids[-1]
    assert sim.pending() == []


def test_scripting_a_gpu_the_fleet_does_not_have_is_a_config_error(tmp_path):
    sim, _, _ = make(tmp_path, n_gpus=4)
    with pytest.raises(ConfigError, match="no GPU 7"):
        sim.at(1).xid(79, gpu=7)
    with pytest.raises(ConfigError):
        SimNode(n_gpus=0)


def test_idle_fleet_reads_idle(tmp_path):
    sim, clock, _ = make(tmp_path, load=0.0)
    clock.advance(1)
    s = sim.sample()[0]
    assert s.util_gpu_pct == 0 and s.sm_clock_mhz < 0.3 * s.sm_clock_max_mhz and s.power_w < 150


def test_write_xid_line_appends_one_real_format_line(tmp_path):
    path = tmp_path / "kmsg.log"
    path.write_text("[    1.000000] something else\n")
    line = write_xid_line(path, "00000000:3B:00.0", 79, "GPU has fallen off the bus.", uptime=1234.5678901)
    assert (
        line
        == "[ 1234.567890] NVRM: Xid (PCI:0000:3b:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus."
    )
    assert path.read_text().splitlines() == ["[    1.000000] something else", line]
    named = write_xid_line(path, "0000:3b:00", 13, "Graphics Exception", pid=4242, name="python3", uptime=2)
    assert named.endswith("NVRM: Xid (PCI:0000:3b:00): 13, pid=4242, name=python3, Graphics Exception")
    with pytest.raises(ValueError):
        write_xid_line(path, "not-a-bus", 79, "x")


def test_write_xid_line_defaults_to_the_drivers_own_text(tmp_path):
    path = tmp_path / "kmsg.log"
    assert write_xid_line(path, "0000:3b:00", 79, uptime=7).endswith(
        "NVRM: Xid (PCI:0000:3b:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus."
    )
    assert "Row Remapper Error" in write_xid_line(path, "0000:3b:00", 64, uptime=8)
    assert write_xid_line(
        path,
        "0000:3b:00",
        154,
        "GPU recovery action changed from 0x0 (None) to 0x1 (GPU Reset Required)",
        uptime=9,
    ).endswith(
        "NVRM: Xid (PCI:0000:3b:00): 154, GPU recovery action changed from 0x0 (None) to 0x1 (GPU Reset Required)"
    )


def test_node_reboot_brings_a_lost_gpu_back_but_not_a_failed_remap(tmp_path):
    sim, clock, kmsg = make(tmp_path)
    sim.at(1).xid(79, gpu=3).row_remap_failure(gpu=2).thermal_runaway(gpu=1)
    sim.at(5).reboot_node()
    clock.advance(4)
    assert sim.sample()[3].lost
    clock.advance(2)
    samples = sim.sample()
    assert not samples[3].lost and samples[3].temperature_c is not None
    assert samples[2].remap_failure is True
    assert samples[1].throttle == frozenset()
    assert kmsg.read_text().count(f"NVRM: GPU at PCI:{sim.gpus()[3].pci}") == 2

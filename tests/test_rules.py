"""Health rules over hand-built readings: each rule fires on its fault, with numbers, and not on health."""

from __future__ import annotations

from dataclasses import replace

import pytest

from trainguard.actions import Advice
from trainguard.detect.rules import RuleState, sample_findings
from trainguard.detect.thresholds import Thresholds
from trainguard.records import Category, Gpu, Health, RecoveryAction, Sample, Throttle

TH = Thresholds()


def healthy(index: int = 0, t: float = 0.0, **kw: object) -> Sample:
    base = Sample(
        Gpu(index, uuid=f"GPU-{index}", pci=f"0000:{index + 0x10:02x}:00"),
        time=t,
        temperature_c=62.0,
        temp_slowdown_c=90.0,
        temp_shutdown_c=95.0,
        power_w=550.0,
        power_limit_w=700.0,
        sm_clock_mhz=1950.0,
        sm_clock_max_mhz=1980.0,
        util_gpu_pct=97.0,
        throttle=frozenset(),
        ecc_sbe_volatile=0,
        ecc_dbe_volatile=0,
        retired_sbe=0,
        retired_dbe=0,
        retired_pending=False,
        remap_correctable=0,
        remap_uncorrectable=0,
        remap_pending=False,
        remap_failure=False,
        pcie_gen=5,
        pcie_gen_max=5,
        pcie_width=16,
        pcie_width_max=16,
        pcie_replay=0,
        nvlink_up=18,
        nvlink_total=18,
        nvlink_crc_errors=0,
        nvlink_replay_errors=0,
        nvlink_recovery_errors=0,
        recovery_action=RecoveryAction.NONE,
    )
    return replace(base, **kw)  # type: ignore[arg-type]


def only(s: Sample, prev: Sample | None = None):
    found = sample_findings(s, prev, TH)
    assert len(found) == 1, found
    return found[0]


def test_healthy_reading_has_no_findings():
    assert sample_findings(healthy(), healthy(t=-10.0), TH) == ()


def test_volatile_dbe_fails_the_gpu_and_asks_for_a_reset():
    f = only(healthy(ecc_dbe_volatile=2))
    assert (f.rule, f.health, f.action, f.gpu) == ("ecc_dbe", Health.FAILED, Advice.RESET_GPU, 0)
    assert "2 uncorrectable" in f.reason and f.category is Category.GPU_MEMORY_ECC


def test_new_uncorrectable_remap_degrades_and_asks_for_a_reset():
    f = only(healthy(t=10, remap_uncorrectable=3), healthy(remap_uncorrectable=1))
    assert (f.rule, f.health, f.action) == ("remap_uncorrectable", Health.DEGRADED, Advice.RESET_GPU)
    assert "2 new" in f.reason and "3 in total" in f.reason


def test_row_remap_failure_fails_and_calls_support_without_a_pending_duplicate():
    f = only(healthy(remap_failure=True, remap_pending=True))
    assert (f.rule, f.health, f.action) == ("remap_failure", Health.FAILED, Advice.CONTACT_SUPPORT)


def test_pending_remap_says_reset_needed():
    f = only(healthy(remap_pending=True))
    assert (f.health, f.action) == (Health.DEGRADED, Advice.RESET_GPU)
    assert "reset needed" in f.reason


def test_63_retired_pages_wear_the_gpu_out_but_62_do_not():
    assert sample_findings(healthy(retired_sbe=40, retired_dbe=22), None, TH) == ()
    f = only(healthy(retired_sbe=40, retired_dbe=23))
    assert (f.rule, f.health, f.action) == ("retired_pages_total", Health.FAILED, Advice.CONTACT_SUPPORT)
    assert "63 retired pages" in f.reason


def test_pending_page_retirement_degrades_with_reset():
    f = only(healthy(retired_pending=True))
    assert (f.rule, f.health, f.action) == ("retired_pages_pending", Health.DEGRADED, Advice.RESET_GPU)


def test_two_new_retirements_in_a_week_past_15_fail_the_gpu():
    state = RuleState(TH)
    day = 86_400.0
    assert state.evaluate([healthy(t=0, retired_sbe=16)]) == []
    assert state.evaluate([healthy(t=day, retired_sbe=17)]) == []  # one new this week: allowed
    found = state.evaluate([healthy(t=2 * day, retired_sbe=18)])
    assert [(f.rule, f.health) for f in found] == [("retired_pages_rate", Health.FAILED)]
    assert "2 pages retired within a week" in found[0].reason


def test_retirements_a_week_apart_or_below_15_do_not_fail():
    state, week = RuleState(TH), 7 * 86_400.0
    assert state.evaluate([healthy(t=0, retired_sbe=16)]) == []
    assert state.evaluate([healthy(t=1, retired_sbe=17)]) == []
    assert state.evaluate([healthy(t=week + 10, retired_sbe=18)]) == []
    low = RuleState(TH)
    low.evaluate([healthy(t=0, retired_sbe=2)])
    assert low.evaluate([healthy(t=1, retired_sbe=9)]) == []


def test_temperature_at_slowdown_threshold_degrades():
    f = only(healthy(temperature_c=90.0))
    assert (f.rule, f.health, f.category) == ("thermal", Health.DEGRADED, Category.THERMAL_POWER)
    assert "90 C" in f.reason


def test_hw_thermal_slowdown_degrades_even_below_threshold():
    f = only(healthy(throttle=frozenset({Throttle.HW_THERMAL, Throttle.HW_SLOWDOWN})))
    assert f.rule == "thermal" and "HW thermal slowdown" in f.reason


def test_temperature_at_shutdown_degrades_and_drains():
    f = only(healthy(temperature_c=96.0))
    assert (f.health, f.action) == (Health.DEGRADED, Advice.DRAIN)


def test_power_brake_degrades():
    f = only(healthy(throttle=frozenset({Throttle.HW_POWER_BRAKE, Throttle.HW_SLOWDOWN})))
    assert (f.rule, f.health) == ("power_brake", Health.DEGRADED)


def test_unexplained_hw_slowdown_degrades():
    f = only(healthy(throttle=frozenset({Throttle.HW_SLOWDOWN})))
    assert f.rule == "hw_slowdown"


def test_pcie_replay_storm_is_a_rate_between_two_readings():
    f = only(healthy(t=10, pcie_replay=1500), healthy(pcie_replay=1000))
    assert (f.rule, f.health, f.category) == ("pcie_replay", Health.DEGRADED, Category.INTERCONNECT)
    assert "500 replays in 10 s" in f.reason


def test_a_few_pcie_replays_seconds_apart_are_not_a_storm():
    assert sample_findings(healthy(t=1, pcie_replay=1003), healthy(pcie_replay=1000), TH) == ()
    # a high but old counter with no new replays is history, not a storm
    assert sample_findings(healthy(t=60, pcie_replay=10**6), healthy(pcie_replay=10**6), TH) == ()


def test_pcie_counter_reset_is_not_a_storm():
    assert sample_findings(healthy(t=10, pcie_replay=0), healthy(pcie_replay=5000), TH) == ()


def test_pcie_downtraining_under_load_degrades_but_not_when_idle():
    f = only(healthy(pcie_gen=3, pcie_width=8))
    assert f.rule == "pcie_downtrain" and "gen 3/5" in f.reason and "x8/x16" in f.reason
    # idle GPUs drop to gen 1 to save power
    assert sample_findings(healthy(pcie_gen=1, util_gpu_pct=0.0, sm_clock_mhz=345.0), None, TH) == ()


def test_nvlink_crc_storm_degrades():
    f = only(healthy(t=30, nvlink_crc_errors=5000), healthy(nvlink_crc_errors=0))
    assert (f.rule, f.health) == ("nvlink_errors", Health.DEGRADED)
    assert "5000 CRC errors" in f.reason


def test_nvlink_links_down_degrades():
    f = only(healthy(nvlink_up=16))
    assert f.rule == "nvlink_down" and "2 of 18" in f.reason


def test_clocks_stuck_low_under_load_without_throttle_is_a_straggler():
    f = only(healthy(sm_clock_mhz=900.0))
    assert (f.rule, f.health, f.action) == ("straggler", Health.DEGRADED, Advice.RUN_DIAGNOSTICS)
    assert "900/1980" in f.reason


def test_low_clocks_explained_by_a_power_cap_are_not_a_straggler():
    assert (
        sample_findings(healthy(sm_clock_mhz=900.0, throttle=frozenset({Throttle.SW_POWER_CAP})), None, TH)
        == ()
    )


def test_lost_gpu_fails_and_asks_for_a_reboot():
    s = Sample(Gpu(4), time=1.0, lost=True, error="GPU is lost")
    f = only(s)
    assert (f.rule, f.health, f.action, f.gpu) == ("gpu_lost", Health.FAILED, Advice.REBOOT_NODE, 4)


def test_gpu_without_any_reading_is_unknown_not_healthy():
    f = only(Sample(Gpu(2), time=1.0))
    assert (f.rule, f.health) == ("no_readings", Health.UNKNOWN)


@pytest.mark.parametrize(
    ("ra", "health", "action"),
    [
        (RecoveryAction.GPU_RESET, Health.FAILED, Advice.RESET_GPU),
        (RecoveryAction.NODE_REBOOT, Health.FAILED, Advice.REBOOT_NODE),
        (RecoveryAction.DRAIN_P2P, Health.DEGRADED, Advice.DRAIN),
        (RecoveryAction.DRAIN_AND_RESET, Health.FAILED, Advice.DRAIN),
    ],
)
def test_driver_recovery_action_field_sets_the_verdict(ra, health, action):
    f = only(healthy(recovery_action=ra))
    assert (f.rule, f.health, f.action) == ("recovery_action", health, action)


def test_garbage_reading_becomes_unknown_instead_of_raising():
    f = only(replace(healthy(), temperature_c="hot"))  # type: ignore[arg-type]
    assert (f.rule, f.health, f.gpu) == ("bad_reading", Health.UNKNOWN, 0)


def test_rule_state_measures_rates_across_ticks():
    state = RuleState(TH)
    assert state.evaluate([healthy(t=0, pcie_replay=0)]) == []
    assert state.evaluate([healthy(t=1, pcie_replay=3)]) == []
    found = state.evaluate([healthy(t=2, pcie_replay=400)])
    assert [f.rule for f in found] == ["pcie_replay"]
    assert "400 replays in 2 s" in found[0].reason  # measured against the oldest reading kept


def test_rule_state_forgets_readings_older_than_the_rate_window():
    state = RuleState(TH)
    state.evaluate([healthy(t=0, pcie_replay=0)])
    for t in range(10, 200, 10):
        state.evaluate([healthy(t=float(t), pcie_replay=t // 10)])  # slow trickle: no storm
    assert state.evaluate([healthy(t=200.0, pcie_replay=20)]) == []
    assert state.previous(0) is not None and state.previous(0).time == 200.0

"""Judgement of the diagnostics: pure functions from measured figures and readings to verdicts."""

from __future__ import annotations

import json
import subprocess
import sys

from trainguard.diagnose.expected import spec_for
from trainguard.diagnose.interconnect import pairs
from trainguard.diagnose.judge import ThermalTrace, judge_against_peers, judge_sdc, judge_thermal
from trainguard.diagnose.level1 import Software, gpu_checks, node_checks
from trainguard.diagnose.result import GpuReport, Report, TestResult, Verdict
from trainguard.records import DriverInfo, Gpu, GpuModes, RecoveryAction, Sample, Throttle


def test_import_trainguard_diagnose_imports_no_torch():
    code = "import sys, trainguard.diagnose, trainguard.cli.diagnose; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_a_gpu_at_half_the_rate_of_its_peers_fails_compute_and_the_peers_pass():
    results = judge_against_peers("compute", {0: 100.0, 1: 98.0, 2: 50.0, 3: 101.0}, "TFLOPS")
    assert {g: r.verdict for g, r in results.items()} == {
        0: Verdict.PASS,
        1: Verdict.PASS,
        2: Verdict.FAIL,
        3: Verdict.PASS,
    }
    assert "50% of peers" in results[2].reason and results[2].expected == 100.0


def test_with_two_gpus_only_the_slow_one_fails():
    results = judge_against_peers("compute", {0: 100.0, 1: 45.0}, "TFLOPS")
    assert results[0].verdict is Verdict.PASS and results[1].verdict is Verdict.FAIL


def test_peers_are_compared_round_by_round_so_a_busy_moment_is_not_blamed_on_one_gpu():
    # Beside two hogs: GPU 0's best round came before a wedged GPU's 1 s timeout, GPU 2's rounds
    # all after it, in a busy second that slowed GPU 0 as much; best against best said 75%: warn.
    busy = {0: [100.0, 74.0, 76.0], 2: [75.0, 75.0, 74.0]}
    best = {g: max(v) for g, v in busy.items()}
    assert judge_against_peers("compute", best, "TFLOPS")[2].verdict is Verdict.WARN  # the old way
    results = judge_against_peers("compute", best, "TFLOPS", rounds=busy)
    assert {g: r.verdict for g, r in results.items()} == {0: Verdict.PASS, 2: Verdict.PASS}
    # A GPU at half speed fails every round, also when its peer was slowed in one of them.
    slow = {0: [100.0, 50.0, 100.0], 2: [50.0, 50.0, 50.0]}
    results = judge_against_peers("compute", {g: max(v) for g, v in slow.items()}, "TFLOPS", rounds=slow)
    assert results[2].verdict is Verdict.FAIL and "50% of peers (100 TFLOPS)" in results[2].reason
    assert results[0].verdict is Verdict.PASS


def test_the_model_table_fails_a_gpu_its_peers_would_pass():
    # Every GPU equally slow: the peers agree, the datasheet does not.
    results = judge_against_peers(
        "compute", {0: 200.0, 1: 205.0}, "TFLOPS", peak={0: 989.0, 1: 989.0}, peak_floor=(0.45, 0.3)
    )
    assert all(r.verdict is Verdict.FAIL for r in results.values())
    assert "of the model's peak 989" in results[0].reason


def test_a_single_cpu_device_is_compared_with_the_machine_itself():
    ok = judge_against_peers("compute", {0: 0.1}, "TFLOPS", own_reference=0.11)[0]
    slow = judge_against_peers("compute", {0: 0.02}, "TFLOPS", own_reference=0.11)[0]
    assert ok.verdict is Verdict.PASS and slow.verdict is Verdict.FAIL
    assert "plain loop on this machine" in ok.reason


def test_gpu_table_matches_nvml_names_without_confusing_a10_and_a100():
    assert spec_for("NVIDIA H100 80GB HBM3").tflops["bf16"] == 989.0
    assert spec_for("NVIDIA A100-SXM4-80GB").hbm_gbps == 2039.0
    assert spec_for("NVIDIA A10").name == "A10"
    assert spec_for("NVIDIA L40") is None
    assert spec_for("cpu (2 cores)") is None


def test_sdc_names_the_gpu_whose_results_differ():
    good, bad = "a" * 32, "b" * 32
    digests = {0: [good] * 5, 1: [good] * 5, 2: [good, bad, good, bad, bad], 3: [good] * 5}
    results = judge_sdc(digests, dict.fromkeys(digests, "H100"))
    assert [g for g, r in results.items() if r.verdict is Verdict.FAIL] == [2]
    assert results[2].value == 3 and "3 of 5 rounds differ" in results[2].reason


def test_sdc_fails_a_gpu_that_is_consistently_wrong():
    # Its own rounds agree with each other (its golden checksum), but not with the node's.
    digests = {0: ["a"] * 4, 1: ["a"] * 4, 2: ["z"] * 4}
    results = judge_sdc(digests, dict.fromkeys(digests, "H100"))
    assert results[2].verdict is Verdict.FAIL and results[0].verdict is Verdict.PASS


def _reading(temp: float = 60, throttle: frozenset[Throttle] = frozenset(), power: float = 600) -> Sample:
    return Sample(
        Gpu(0),
        0.0,
        temperature_c=temp,
        temp_slowdown_c=89,
        power_w=power,
        power_limit_w=700,
        throttle=throttle,
    )


def test_thermal_fails_with_the_time_the_hardware_slowdown_set_in():
    hot = frozenset({Throttle.HW_THERMAL, Throttle.HW_SLOWDOWN})
    trace = ThermalTrace(((0.0, _reading()), (1.0, _reading(80)), (2.5, _reading(90, hot))))
    result = judge_thermal(trace)
    assert result.verdict is Verdict.FAIL
    assert "after 2.5 s under load" in result.reason and result.value == 90


def test_power_capping_under_load_is_not_a_thermal_failure():
    capped = frozenset({Throttle.SW_POWER_CAP})
    result = judge_thermal(ThermalTrace(((0.0, _reading(70, capped, 700)), (1.0, _reading(72, capped, 700)))))
    assert result.verdict is Verdict.PASS and "no throttling" in result.reason


def test_a_software_thermal_slowdown_warns():
    soft = frozenset({Throttle.SW_THERMAL})
    result = judge_thermal(ThermalTrace(((0.0, _reading()), (3.0, _reading(86, soft)))))
    assert result.verdict is Verdict.WARN and "sw_thermal after 3.0 s" in result.reason


def test_pairs_cover_every_pair_of_gpus_once_in_disjoint_rounds():
    for n in (2, 3, 5, 8):
        rounds = pairs(n)
        flat = [p for r in rounds for p in r]
        assert sorted(flat) == [(i, j) for i in range(n) for j in range(i + 1, n)]
        for r in rounds:
            used = [g for p in r for g in p]
            assert len(used) == len(set(used))


# -- level 1 ------------------------------------------------------------------------------------


def _sw(torch_cuda: str | None = "12.4", driver_cuda: str = "12.4") -> Software:
    return Software(
        "cuda", "2.5.1+cu124", torch_cuda, "2.21.5", 8, DriverInfo("550.90.07", driver_cuda, "12.550")
    )


def _by_name(results: list[TestResult]) -> dict[str, TestResult]:
    return {r.name: r for r in results}


def test_torch_built_for_a_newer_cuda_major_than_the_driver_fails():
    checks = _by_name(node_checks(_sw("13.0", "12.4"), 8, None))
    assert checks["cuda_compat"].verdict is Verdict.FAIL
    assert "upgrade the driver" in checks["cuda_compat"].reason
    assert _by_name(node_checks(_sw("12.6", "12.4"), 8, None))["cuda_compat"].verdict is Verdict.WARN
    assert _by_name(node_checks(_sw("12.1", "12.4"), 8, None))["cuda_compat"].verdict is Verdict.PASS


def test_fewer_gpus_than_expected_fails_the_count():
    assert _by_name(node_checks(_sw(), 7, 8))["gpu_count"].verdict is Verdict.FAIL
    assert _by_name(node_checks(_sw(), 8, 8))["gpu_count"].verdict is Verdict.PASS


def _sample(**kw: object) -> Sample:
    base: dict[str, object] = dict(
        pcie_gen=5, pcie_gen_max=5, pcie_width=16, pcie_width_max=16, recovery_action=RecoveryAction.NONE
    )
    return Sample(Gpu(0), 0.0, **{**base, **kw})  # type: ignore[arg-type]


_GOOD = GpuModes(persistence=True, ecc=True, ecc_pending=True, mig=False)


def test_a_healthy_gpu_passes_every_settings_check():
    assert all(r.verdict is Verdict.PASS for r in gpu_checks(_sample(), _GOOD))


def test_settings_checks_fail_or_warn_with_the_fix():
    checks = _by_name(
        gpu_checks(
            _sample(remap_pending=True, recovery_action=RecoveryAction.GPU_RESET, pcie_width=8),
            GpuModes(persistence=False, ecc=False, ecc_pending=False, mig=True),
        )
    )
    assert (
        checks["memory_errors"].verdict is Verdict.FAIL and "reset the GPU" in checks["memory_errors"].reason
    )
    assert checks["recovery_action"].verdict is Verdict.FAIL
    assert checks["ecc_mode"].verdict is Verdict.FAIL
    assert (
        checks["persistence_mode"].verdict is Verdict.WARN
        and "nvidia-smi -pm 1" in checks["persistence_mode"].reason
    )
    assert checks["mig_mode"].verdict is Verdict.WARN
    assert checks["pcie_link"].verdict is Verdict.WARN and "x8 of x16" in checks["pcie_link"].reason


def test_an_idle_link_in_a_lower_generation_is_power_saving_not_a_fault():
    assert (
        _by_name(gpu_checks(_sample(pcie_gen=1, util_gpu_pct=0), _GOOD))["pcie_link"].verdict is Verdict.PASS
    )
    assert (
        _by_name(gpu_checks(_sample(pcie_gen=3, util_gpu_pct=90), _GOOD))["pcie_link"].verdict is Verdict.WARN
    )


def test_a_lost_gpu_fails_and_its_other_checks_are_skipped():
    checks = gpu_checks(Sample(Gpu(0), 0.0, lost=True, error="GPU is lost"), _GOOD)
    assert checks[0].verdict is Verdict.FAIL and all(c.verdict is Verdict.SKIP for c in checks[1:])


# -- the report ---------------------------------------------------------------------------------


def test_node_verdict_is_the_worst_test_and_maps_to_the_exit_code():
    def report(*verdicts: Verdict) -> Report:
        tests = tuple(TestResult(f"t{k}", v) for k, v in enumerate(verdicts))
        return Report(2, "sim", (GpuReport(0, "gpu", tests),))

    assert report(Verdict.PASS, Verdict.SKIP).exit_code == 0
    assert report(Verdict.PASS, Verdict.WARN).exit_code == 1
    assert report(Verdict.WARN, Verdict.FAIL).exit_code == 2
    assert report(Verdict.SKIP, Verdict.SKIP).exit_code == 3  # nothing ran: could not diagnose
    assert Report(2, "cuda", error="no GPU").exit_code == 3


def test_json_has_the_documented_shape():
    t = TestResult("compute", Verdict.FAIL, 48.123456, 100.0, "TFLOPS", "48% of peers")
    d = Report(2, "sim", (GpuReport(3, "H100", (t,)),)).to_dict()
    assert d["verdict"] == "fail"
    assert d["gpus"][0]["index"] == 3
    assert set(d["gpus"][0]["tests"][0]) >= {"name", "value", "expected", "unit", "verdict", "reason"}
    assert d["summary"] == "GPU 3 compute fail: 48% of peers"


def test_cli_usage_errors_exit_3_not_fail(capsys):
    from trainguard.cli import main

    assert main(["diagnose", "--backend", "sim", "--gpu-ids", "0,9"]) == 3
    try:
        main(["diagnose", "--no-such-flag"])
    except SystemExit as exc:
        assert exc.code == 3
    else:
        raise AssertionError("an unknown flag must exit")
    assert "no GPU 9" in capsys.readouterr().err


def test_cli_lists_the_level_2_tests_by_their_names(capsys):
    from trainguard.cli import main

    assert main(["diagnose", "--list-tests", "--json"]) == 0
    names = {t["name"] for t in json.loads(capsys.readouterr().out) if t["level"] == 2}
    assert names == {"compute", "sdc", "memory_bandwidth", "memory_pattern", "interconnect", "thermal_power"}


def test_sdc_against_a_golden_checksum_fails_a_gpu_that_agrees_with_itself():
    results = judge_sdc({0: ["x"] * 3}, {0: "H100"}, golden={"H100": "a"})
    assert results[0].verdict is Verdict.FAIL and "golden checksum" in results[0].reason
    assert judge_sdc({0: ["a"] * 3}, {0: "H100"}, golden={"H100": "a"})[0].verdict is Verdict.PASS

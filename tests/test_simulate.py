"""The cluster failure simulator: Llama 3's Table 5 at the default calibration, agreement with
the expected-ETTR model, recovery costs, and the CLI."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from trainguard.cli import main
from trainguard.errors import ConfigError
from trainguard.reliability import models
from trainguard.reliability.simulate import (
    LLAMA3_TABLE5,
    SimConfig,
    disagreements,
    llama3_categories,
    simulate,
    with_costs,
)

pytest.importorskip("numpy")

LLAMA3 = SimConfig(gpus=16_384, days=54, trials=1000, seed=0)


@pytest.fixture(scope="module")
def llama3():
    return simulate(LLAMA3)


def test_default_calibration_reproduces_table5_total_and_every_category(llama3):
    s = llama3.summary()
    # 1,000 trials: the standard error of the mean total is sqrt(419 / 1000) = 0.65.
    assert s["interruptions_mean"] == pytest.approx(419, abs=4 * (419 / 1000) ** 0.5)
    assert s["interruptions_sd"] == pytest.approx(419**0.5, rel=0.1)  # Poisson spread
    for name, count, _ in LLAMA3_TABLE5:
        assert s["by_category"][name] == pytest.approx(count, abs=4 * (count / 1000) ** 0.5), name
    assert disagreements(llama3) == []
    assert s["mttf_hours"] == pytest.approx(54 * 24 / 419, rel=0.01)


def test_the_table5_check_fails_a_miscalibrated_simulator():
    five_percent_high = tuple(replace(c, per_gpu_day=c.per_gpu_day * 1.05) for c in llama3_categories())
    assert "total" in disagreements(simulate(replace(LLAMA3, categories=five_percent_high, trials=300)))
    # The paper's misprinted 30.1% for faulty GPUs (126 of 419) instead of the count, 148.
    cats = tuple(
        replace(c, per_gpu_day=c.per_gpu_day * 126 / 148) if c.name == "faulty_gpu" else c
        for c in llama3_categories()
    )
    misprint = simulate(replace(LLAMA3, categories=cats, trials=300))
    assert "faulty_gpu" in disagreements(misprint)


def test_simulated_ettr_agrees_with_the_exact_expected_ettr_model(llama3):
    # Poisson failures, one restart cost, no detection delay: the model's assumptions hold.
    s = llama3.summary()
    cfg = llama3.config
    model = models.exact_ettr(cfg.rate_per_s, cfg.restart_s, cfg.interval_s, cfg.write_s)
    se = s["ettr_sd"] / cfg.trials**0.5
    assert abs(s["ettr_mean"] - model) < 4 * se + 1e-4  # 1e-4: the final partial period kept
    assert s["ettr_model"] == pytest.approx(model, abs=1e-5)


def test_simulated_ettr_agrees_with_kokolis_first_order_model_when_failures_are_rare():
    # 256 GPUs: MTTF ~200 h >> restart + interval, where the first-order model holds.
    cfg = SimConfig(gpus=256, days=54, interval_s=1800, write_s=30, restart_s=600, trials=2000, seed=3)
    s = simulate(cfg).summary()
    kokolis = models.expected_ettr(cfg.rate_per_s, cfg.restart_s, cfg.interval_s, cfg.write_s)
    assert s["ettr_mean"] == pytest.approx(kokolis, abs=0.002)


def test_a_blocking_checkpoint_write_costs_its_share_of_every_period():
    free = simulate(SimConfig(gpus=8, days=10, interval_s=600, write_s=0, trials=50)).summary()
    blocking = simulate(SimConfig(gpus=8, days=10, interval_s=600, write_s=60, trials=50)).summary()
    assert blocking["ettr_mean"] < free["ettr_mean"]
    assert blocking["ettr_mean"] == pytest.approx(free["ettr_mean"] * 600 / 660, abs=0.01)


def test_slow_hang_detection_lowers_ettr_with_the_same_failures():
    fast = simulate(with_costs(LLAMA3, detect_hang_s=3, restart_s=300))
    slow = simulate(with_costs(LLAMA3, detect_hang_s=600, restart_s=300))
    assert (fast.interruptions == slow.interruptions).all()  # same seed, same failures
    assert slow.ettr.mean() < fast.ettr.mean()


def test_simulated_ettr_agrees_with_the_model_when_recovery_costs_differ_by_category():
    cfg = with_costs(LLAMA3, detect_hang_s=600, restart_s=300, node_fault_extra_s=1800)
    s = simulate(cfg).summary()
    assert s["ettr_mean"] == pytest.approx(s["ettr_model"], abs=4 * s["ettr_sd"] / cfg.trials**0.5 + 1e-4)


def test_a_fault_that_stays_with_its_node_costs_more_without_a_spare():
    spare = simulate(with_costs(LLAMA3, detect_hang_s=3, restart_s=300)).ettr.mean()
    no_spare = simulate(
        with_costs(LLAMA3, detect_hang_s=3, restart_s=300, node_fault_extra_s=7200)
    ).ettr.mean()
    assert no_spare < spare - 0.1


def test_no_failures_leaves_only_the_checkpoint_cost():
    cfg = SimConfig(gpus=8, days=1, interval_s=600, write_s=60, trials=3, categories=())
    r = simulate(cfg)
    assert (r.interruptions == 0).all()
    assert r.ettr.mean() == pytest.approx(600 / 660, abs=0.01)


def test_impossible_sizes_are_config_errors():
    with pytest.raises(ConfigError):
        SimConfig(gpus=0, days=1)
    with pytest.raises(ConfigError):
        SimConfig(gpus=8, days=1, interval_s=0)


def test_simulate_cli_prints_the_issue_keys(capsys):
    assert main(["simulate", "--gpus", "16384", "--days", "54", "--trials", "200", "--json"]) == 0
    s = json.loads(capsys.readouterr().out)
    for key in (
        "interruptions_mean",
        "interruptions_sd",
        "by_category",
        "mttf_hours",
        "ettr_mean",
        "ettr_sd",
    ):
        assert key in s
    assert s["by_category"]["faulty_gpu"] == pytest.approx(148, abs=4)


def _bench(tmp_path, name="recovery.json", **figures):
    path = tmp_path / name
    path.write_text(json.dumps(figures))
    return str(path)


def _from_bench(path, capsys, *extra):
    argv = ["simulate", "--gpus", "16384", "--days", "54", "--trials", "100", "--from-bench", path, "--json"]
    assert main([*argv, *extra]) == 0
    return json.loads(capsys.readouterr().out)


def test_from_bench_takes_each_launchers_figures_as_measured(tmp_path, capsys):
    bench = _bench(
        tmp_path, mttr_s=0.5, hang_recover_s=33.5, torchrun_mttr_s=2.2, torchrun_hang_recover_s=95.2
    )
    out = _from_bench(bench, capsys, "--restart-minutes", "5")
    tg, tr = out["from_bench"]["trainguard"], out["from_bench"]["torchrun"]
    # The same formula for both: restart = job restart + measured kill-to-first-step; a hang
    # costs what its measured recovery took beyond that; no floor, no extra restart invented.
    assert tg["restart_s"] == pytest.approx(300.5) and tr["restart_s"] == pytest.approx(302.2)
    assert tg["detect_hang_s"] == pytest.approx(33.0) and tr["detect_hang_s"] == pytest.approx(93.0)
    assert tg["node_fault_extra_s"] == tr["node_fault_extra_s"] == 0.0
    assert out["from_bench_ettr_gain"]["mean"] > 0  # faster on both counts: trainguard ahead


def test_from_bench_lets_torchrun_win_when_it_measured_faster(tmp_path, capsys):
    # The same figures with the launchers' roles swapped: the simulator must now favour torchrun,
    # by the same margin (same seed, same failures).
    fast, slow = {"mttr": 0.5, "hang": 33.5}, {"mttr": 2.2, "hang": 95.2}
    bench = _bench(
        tmp_path,
        mttr_s=slow["mttr"],
        hang_recover_s=slow["hang"],
        torchrun_mttr_s=fast["mttr"],
        torchrun_hang_recover_s=fast["hang"],
    )
    out = _from_bench(bench, capsys, "--restart-minutes", "5")
    s, gain = out["from_bench"], out["from_bench_ettr_gain"]
    assert s["torchrun"]["ettr_mean"] > s["trainguard"]["ettr_mean"]
    assert gain["ci95"][1] < 0  # resolved: torchrun ahead
    swapped = _bench(
        tmp_path,
        "swapped.json",
        mttr_s=fast["mttr"],
        hang_recover_s=fast["hang"],
        torchrun_mttr_s=slow["mttr"],
        torchrun_hang_recover_s=slow["hang"],
    )
    assert _from_bench(swapped, capsys, "--restart-minutes", "5")["from_bench_ettr_gain"]["mean"] == (
        pytest.approx(-gain["mean"], abs=1e-6)
    )


def test_from_bench_with_equal_figures_is_a_tie(tmp_path, capsys):
    bench = _bench(tmp_path, mttr_s=1.0, hang_recover_s=40, torchrun_mttr_s=1.0, torchrun_hang_recover_s=40)
    out = _from_bench(bench, capsys, "--no-spare-nodes")
    assert out["from_bench"]["trainguard"]["ettr_mean"] == out["from_bench"]["torchrun"]["ettr_mean"]
    assert out["from_bench_ettr_gain"]["mean"] == 0.0
    assert out["from_bench"]["torchrun"]["node_fault_extra_s"] == 7200.0  # the same wait for both


def test_simulate_from_bench_draws_both_launchers(tmp_path, capsys):
    bench = _bench(
        tmp_path, mttr_s=0.5, hang_recover_s=33.5, torchrun_mttr_s=2.2, torchrun_hang_recover_s=95.2
    )
    plot = tmp_path / "sim.png"
    assert "from_bench" in _from_bench(bench, capsys, "--plot", str(plot))
    assert plot.stat().st_size > 10_000


def test_simulate_from_a_file_that_is_not_the_bench_output_is_an_input_error(tmp_path, capsys):
    bad = tmp_path / "x.json"
    bad.write_text("{}")
    assert main(["simulate", "--gpus", "8", "--days", "1", "--from-bench", str(bad)]) == 2
    assert "bench_recovery.py --json" in capsys.readouterr().err
    # a run with --no-hang has no hang figures: the error says how to get them
    bad.write_text(json.dumps({"mttr_s": 0.5, "torchrun_mttr_s": 2.2}))
    assert main(["simulate", "--gpus", "8", "--days", "1", "--from-bench", str(bad)]) == 2
    assert "without --no-hang" in capsys.readouterr().err

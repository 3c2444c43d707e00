"""The closed forms and the planner, against cases computed by hand."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import pytest

from trainguard.errors import ConfigError
from trainguard.reliability import models, need
from trainguard.reliability.planner import PlanInputs, plan, rate_from_mttf

# 100 nodes failing at 0.01 per node-day: one job failure per day, MTTF 24 h.
CASE = PlanInputs(nodes=100, failures_per_node_day=0.01, write_s=60.0, restart_s=600.0, interval_s=3600.0)


def test_series_system_mttf_is_one_over_n_times_the_node_rate():
    assert models.job_mttf_hours(100, 0.01) == pytest.approx(24.0)
    assert models.failures_per_day(100, 0.01) == pytest.approx(1.0)
    assert models.p_failure(1 / 86_400, 86_400) == pytest.approx(1 - math.exp(-1))


def test_llama3_rate_gives_its_published_mean_time_between_interruptions():
    # 54 days x 24 h / 419 interruptions = 3.093 h for the 2,048-node job.
    assert models.job_mttf_hours(2048, models.LLAMA3_FAILURES_PER_NODE_DAY) == pytest.approx(54 * 24 / 419)


def test_plan_matches_the_hand_computed_case():
    p = plan(CASE)
    assert p["mttf_hours"] == pytest.approx(24.0)
    assert p["failures_per_day"] == pytest.approx(1.0)
    # Young: sqrt(2 x 60 s x 86,400 s) = 3,219.9 s = 53.67 min.
    assert p["young_interval_minutes"] == pytest.approx(53.6656, abs=1e-3)
    # Daly: 3,219.9 x (1 + sqrt(60/172,800)/3 + 60/(9 x 172,800)) - 60 = 3,180.1 s = 53.00 min.
    assert p["daly_interval_minutes"] == pytest.approx(53.0010, abs=1e-3)
    assert p["recommended_interval_minutes"] == p["daly_interval_minutes"]
    # At T = 60 min: 3600/3660 x (1 - (600 + 1830)/86,400) = 0.95594 (first order);
    # exact 1/24 x e^(-600/86,400) / (e^(3660/86,400) - 1) = 0.95626.
    assert p["expected_ettr"] == pytest.approx(0.955943, abs=1e-6)
    assert p["expected_ettr_exact"] == pytest.approx(0.956257, abs=1e-6)
    assert p["expected_ettr_recommended"] > p["expected_ettr"]


def test_kokolis_form_without_a_write_cost_is_one_minus_rate_times_restart_plus_half_interval():
    rate = 2 / 86_400  # 2 failures a day
    assert models.expected_ettr(rate, 300, 1800) == pytest.approx(1 - rate * (300 + 900))


def test_first_order_ettr_approaches_the_exact_one_when_failures_are_rare():
    for mttf_h in (10, 100, 1000):
        rate = 1 / (mttf_h * 3600)
        gap = models.exact_ettr(rate, 600, 1800, 30) - models.expected_ettr(rate, 600, 1800, 30)
        assert 0 <= gap < (rate * 3000) ** 2  # second order in lambda x (u0 + T)


def test_daly_interval_is_the_optimum_of_the_exact_model():
    rate = 1 / (3 * 3600)
    daly = models.daly_interval(60, 1 / rate)
    assert models.best_interval(rate, 600, 60) == pytest.approx(daly, rel=0.01)


def test_daly_interval_is_the_mttf_when_the_write_takes_longer_than_two_mttfs():
    assert models.daly_interval(write_s=500, mttf_s=200) == 200


def test_mttf_flag_converts_to_the_node_rate():
    assert plan(PlanInputs(nodes=50, failures_per_node_day=rate_from_mttf(50, 12.0)))[
        "mttf_hours"
    ] == pytest.approx(12.0)
    with pytest.raises(ConfigError):
        rate_from_mttf(50, 0)


def test_a_free_checkpoint_recommends_no_interval_and_costs_only_the_restart():
    p = plan(PlanInputs(nodes=100, failures_per_node_day=0.01, write_s=0.0, restart_s=600.0))
    assert p["recommended_interval_minutes"] is None
    assert p["expected_ettr_recommended_exact"] == pytest.approx(math.exp(-600 / 86_400))


def test_ten_degrees_hotter_doubles_the_failure_rate_at_0_7_ev():
    assert models.arrhenius_factor(70, 60, 0.7) == pytest.approx(2.035, abs=1e-3)
    assert models.arrhenius_factor(60, 60) == 1.0


def test_a_power_cap_trades_throughput_for_a_lower_failure_rate():
    cap = models.power_cap(600, tdp_w=700)
    assert cap.temp_c < cap.tdp_temp_c
    assert cap.rate_factor < 1.0
    assert cap.throughput == pytest.approx((600 / 700) ** (1 / 3))
    with pytest.raises(ConfigError):
        models.power_cap(800, tdp_w=700)


def test_a_non_positive_interval_is_a_config_error():
    with pytest.raises(ConfigError, match="interval"):
        models.expected_ettr(1e-5, 600, 0)


def test_a_missing_optional_dependency_names_the_extra():
    with pytest.raises(ImportError, match=r"pip install 'trainguard\[analytics\]'"):
        need("no_such_module_for_trainguard")


def test_the_reliability_package_and_its_cli_modules_import_without_heavy_dependencies():
    heavy = ["numpy", "scipy", "lifelines", "pandas", "sklearn", "matplotlib"]
    code = (
        "import sys, trainguard.reliability, trainguard.reliability.models, trainguard.reliability.planner,"
        " trainguard.reliability.fleet, trainguard.cli.plan, trainguard.cli.simulate, trainguard.cli.reliability;"
        f"print([m for m in {heavy!r} if m in sys.modules])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_plan_cli_cites_the_published_figures_when_no_rate_is_given():
    out = subprocess.run(
        [sys.executable, "-m", "trainguard.cli", "plan", "--gpus", "16384", "--json"],
        capture_output=True,
        text=True,
        check=True,
    )
    p = json.loads(out.stdout)
    for key in (
        "mttf_hours",
        "failures_per_day",
        "young_interval_minutes",
        "daly_interval_minutes",
        "expected_ettr",
        "expected_ettr_recommended",
    ):
        assert isinstance(p[key], float), key
    assert "Llama 3" in p["rate_source"] and "Table 5" in p["rate_source"]
    assert p["mttf_hours"] == pytest.approx(54 * 24 / 419)
    # No interval given: expected_ettr is the one at the recommended interval.
    assert p["expected_ettr"] == p["expected_ettr_recommended"]


@pytest.mark.parametrize("name", ["models", "planner", "simulate"])
def test_docstring_examples_run(name):
    import doctest
    import importlib

    if name == "simulate":
        pytest.importorskip("numpy")
    result = doctest.testmod(importlib.import_module(f"trainguard.reliability.{name}"))
    assert result.attempted > 0 and result.failed == 0


def test_a_power_cap_pays_off_only_when_failures_dominate():
    from trainguard.reliability.planner import power_cap_tradeoff

    rate = models.LLAMA3_FAILURES_PER_NODE_DAY
    small = power_cap_tradeoff(PlanInputs(nodes=2048, failures_per_node_day=rate), cap_w=600)
    huge = power_cap_tradeoff(PlanInputs(nodes=16_384, failures_per_node_day=rate, restart_s=1200), cap_w=600)
    assert small["failure_rate_factor"] == huge["failure_rate_factor"] < 1
    assert not small["worth_it"]  # 5% slower for 24% fewer failures: not at 16k GPUs
    assert huge["worth_it"]  # at 131k GPUs with 20 min restarts, fewer failures win
    assert huge["useful_work"] == pytest.approx(huge["throughput"] * huge["expected_ettr_recommended"])

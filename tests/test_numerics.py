"""The pure numerics policy: non-finite losses, robust spikes, data problem vs transient."""

from __future__ import annotations

import math
import random
import sys

import pytest

from trainguard.actions import Advice
from trainguard.detect.numerics import (
    Anomaly,
    NumericsMonitor,
    Policy,
    SpikeConfig,
    check_loss,
    robust_stats,
)
from trainguard.records import Category, Health
from trainguard.rundir import append_finding, read_findings


def _noisy_losses(n: int, seed: int = 0) -> list[float]:
    rng = random.Random(seed)
    return [2.0 + rng.gauss(0, 0.05) for _ in range(n)]


def _warm(monitor: NumericsMonitor, n: int = 40) -> int:
    for step, loss in enumerate(_noisy_losses(n)):
        assert monitor.observe(step, loss).action is Policy.PROCEED
    return n


def test_nan_and_inf_are_nonfinite_under_the_nan_policy():
    m = NumericsMonitor(on_nan="skip", on_spike="stop")
    for bad in (math.nan, math.inf, -math.inf):
        d = m.observe(3, bad)
        assert d.check.anomaly is Anomaly.NONFINITE
        assert d.action is Policy.SKIP
        assert d.findings[0].rule == "numerics.nonfinite_loss"
        assert d.findings[0].category is Category.NUMERICS


def test_nonfinite_gradients_with_a_finite_loss_are_reported_as_grad():
    d = NumericsMonitor(on_nan="stop").observe(5, 1.0, grads_finite=False)
    assert d.action is Policy.STOP
    assert d.findings[0].rule == "numerics.nonfinite_grad"


def test_a_tenfold_loss_jump_is_a_spike_and_noise_is_not():
    m = NumericsMonitor(on_spike="rollback")
    step = _warm(m, 200)
    d = m.observe(step, 20.0)
    assert d.check.anomaly is Anomaly.SPIKE and d.action is Policy.ROLLBACK
    assert d.check.zscore is not None and d.check.zscore > 10
    assert "loss spike" in d.findings[0].reason


def test_no_spike_verdict_before_min_history():
    m = NumericsMonitor(spike=SpikeConfig(min_history=20))
    for step in range(5):
        m.observe(step, 1.0)
    assert m.observe(5, 1000.0).action is Policy.PROCEED


def test_a_decreasing_loss_is_never_a_spike():
    m = NumericsMonitor()
    for step in range(300):
        assert m.observe(step, 5.0 * math.exp(-step / 30)).action is Policy.PROCEED


def test_minibatch_noise_of_a_converged_classifier_is_not_a_spike():
    # per-batch losses near zero jump 5-10x from batch to batch: noise in log space
    history = [0.003 * (1 + 2 * (i % 7)) for i in range(100)]
    assert check_loss(100, 0.2, robust_stats(history), SpikeConfig()).anomaly is Anomaly.NONE
    assert check_loss(100, 50.0, robust_stats(history), SpikeConfig()).anomaly is Anomaly.SPIKE


def test_a_language_model_loss_jumping_from_two_to_three_is_a_spike():
    history = [2.0 + 0.01 * ((i * 7) % 5 - 2) for i in range(100)]
    check = check_loss(100, 3.0, robust_stats(history), SpikeConfig())
    assert check.anomaly is Anomaly.SPIKE and check.median == pytest.approx(2.0)


def test_the_relative_floor_holds_a_high_z_on_a_flat_history_back():
    flat = robust_stats([1.0] * 50)
    assert check_loss(50, 1.05, flat, SpikeConfig(min_rel_jump=0.2)).anomaly is Anomaly.NONE
    assert check_loss(50, 1.5, flat, SpikeConfig(min_rel_jump=0.2)).anomaly is Anomaly.SPIKE


def test_robust_stats_survive_flat_negative_and_bad_values():
    stats = robust_stats([1.0] * 10 + [math.nan])
    assert stats is not None and stats.median == 1.0 and stats.scale > 0
    linear = robust_stats([-1.0, 0.5, 2.0], log_scale=True)  # not all positive: linear scale
    assert linear is not None and not linear.log and linear.median == 0.5
    assert robust_stats([]) is None


def test_spikes_do_not_enter_the_window():
    m = NumericsMonitor(on_spike="skip")
    step = _warm(m, 40)
    for i in range(30):  # a plateau of spikes stays spikes: the window is not polluted
        assert m.observe(step + i, 50.0).check.anomaly is Anomaly.SPIKE


def test_a_spike_that_repeats_after_rollback_is_a_data_problem_and_is_skipped():
    m = NumericsMonitor(on_spike="rollback")
    step = _warm(m)
    first = m.observe(step, 40.0)
    assert first.action is Policy.ROLLBACK
    m.rolled_back(first.check)
    for s in range(step - 10, step):  # the replay of the steps before the bad one is clean
        assert m.observe(s, 2.0).action is Policy.PROCEED
    again = m.observe(step, 40.0)
    assert again.action is Policy.SKIP  # not another rollback: that would loop forever
    data = [f for f in again.findings if f.rule == "numerics.data_problem"]
    assert data and "data problem" in data[0].reason and data[0].health is Health.OK


def test_a_spike_that_does_not_repeat_after_rollback_is_a_transient_sdc_suspect():
    m = NumericsMonitor(on_spike="rollback", gpu=3)
    step = _warm(m)
    first = m.observe(step, 40.0)
    m.rolled_back(first.check)
    clean = m.observe(step, 2.01)
    assert clean.action is Policy.PROCEED
    (finding,) = clean.findings
    assert finding.rule == "numerics.transient"
    assert finding.action is Advice.RUN_DIAGNOSTICS and finding.category is Category.GPU_HARDWARE
    assert finding.gpu == 3 and "silent data corruption" in finding.reason


def test_bad_input_is_not_an_anomaly_and_does_not_raise():
    m = NumericsMonitor()
    assert m.observe(0, None).action is Policy.PROCEED
    assert m.observe(1, "garbage").action is Policy.PROCEED  # type: ignore[arg-type]


def test_findings_round_trip_through_the_run_dir(tmp_path):
    m = NumericsMonitor(on_nan="skip", gpu=1)
    d = m.observe(7, math.nan, time=123.0)
    append_finding(tmp_path, 1, d.findings[0], step=7)
    with open(tmp_path / "findings" / "rank1.jsonl", "a") as f:
        f.write('{"torn": ')
    [(rank, step, finding)] = read_findings(tmp_path)
    assert (rank, step) == (1, 7)
    assert finding == d.findings[0]


def test_the_fast_path_agrees_with_the_full_check():
    rng = random.Random(1)
    fast, full = NumericsMonitor(on_spike="skip"), NumericsMonitor(on_spike="skip")
    for step in range(2000):
        loss = rng.lognormvariate(0, 0.3) * (30 if rng.random() < 0.02 else 1)
        if rng.random() < 0.01:
            loss = math.nan
        slow = full.observe(step, loss).action
        quick = Policy.PROCEED if fast.clean(loss) else fast.observe(step, loss).action
        assert quick is slow, (step, loss)


def test_the_lane_agrees_with_the_full_check_and_rejects_every_nonfinite_loss():
    rng = random.Random(2)
    laned, full = NumericsMonitor(on_spike="skip"), NumericsMonitor(on_spike="skip")
    bound, left = laned.lane()
    for step in range(2000):
        loss = rng.lognormvariate(0, 0.3) * (30 if rng.random() < 0.02 else 1)
        if rng.random() < 0.02:
            loss = rng.choice([math.nan, math.inf, -math.inf])
        slow = full.observe(step, loss).action
        if left and -sys.float_info.max <= loss <= bound:  # the Guard's inline test
            left -= 1
            laned.history.append(loss)
            quick = Policy.PROCEED
        elif laned.clean(loss):
            quick = Policy.PROCEED
            bound, left = laned.lane()
        else:
            quick = laned.observe(step, loss).action
            left = 0
        assert quick is slow, (step, loss)
        if not math.isfinite(loss):
            assert quick is not Policy.PROCEED


def test_no_lane_while_a_rolled_back_step_awaits_its_replay():
    monitor = NumericsMonitor()
    step = _warm(monitor)
    decision = monitor.observe(step, math.nan)
    monitor.rolled_back(decision.check)
    assert monitor.lane()[1] == 0

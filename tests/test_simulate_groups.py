"""`trainguard simulate`'s third recovery mode: replica groups that train on while one heals."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("numpy")

from trainguard.cli import main
from trainguard.errors import ConfigError
from trainguard.reliability.simulate import SimConfig, simulate, simulate_groups

CFG = SimConfig(gpus=16_384, days=54, trials=100, seed=0)


def test_replica_groups_lose_a_share_of_the_downtime_instead_of_the_job():
    restart = float(simulate(CFG).ettr.mean())
    groups = simulate_groups(CFG, groups=128, heal_s=CFG.restart_s, lost_s=10.0)
    assert float(groups.mean()) > restart
    assert 0.99 < float(groups.mean()) < 1.0


def test_one_group_heals_no_better_than_a_restart_without_rollback():
    one = float(simulate_groups(CFG, groups=1, heal_s=CFG.restart_s, lost_s=0.0).mean())
    more = float(simulate_groups(CFG, groups=8, heal_s=CFG.restart_s, lost_s=0.0).mean())
    assert one < more
    assert one < 0.99  # each failure's whole downtime is lost with a single group


def test_the_steps_the_healthy_groups_discard_are_charged():
    none = float(simulate_groups(CFG, groups=128, heal_s=60.0, lost_s=0.0).mean())
    some = float(simulate_groups(CFG, groups=128, heal_s=60.0, lost_s=60.0).mean())
    assert some < none


def test_bad_group_settings_are_a_clear_error():
    with pytest.raises(ConfigError, match="1 or more groups"):
        simulate_groups(CFG, groups=0, heal_s=1.0, lost_s=0.0)


def test_a_slower_step_makes_the_restart_mode_win():
    """The failure case: replica groups lose every step's torchft overhead, and at a 20% slower
    step that costs more than the restarts they save (restart mode 0.87 here)."""
    restart = float(simulate(CFG).ettr.mean())
    free = float(simulate_groups(CFG, groups=128, heal_s=CFG.restart_s, lost_s=10.0).mean())
    slow = float(simulate_groups(CFG, groups=128, heal_s=CFG.restart_s, lost_s=10.0, step_cost=1.2).mean())
    assert slow == pytest.approx(free / 1.2)
    assert slow < restart < free


def test_a_step_cost_below_one_is_a_clear_error():
    with pytest.raises(ConfigError, match="step cost >= 1"):
        simulate_groups(CFG, groups=2, heal_s=1.0, lost_s=0.0, step_cost=0.9)


def _bench(tmp_path, **over):
    """A bench_no_restart --json with the keys the simulator reads (the shape it writes)."""
    figures = {
        "heal_s": 2.8,
        "restart_recovery_s": 7.7,
        "healthy_group_pause_s": 1.1,
        "healthy_group_pause_clean_s": 0.1,
        "steps_lost_per_failure": 0.0,
        "step_overhead_ms": 5.0,
    }
    figures.update(over)
    path = tmp_path / "no_restart.json"
    path.write_text(json.dumps({k: {"mean": v, "ci95": 0.1, "n": 3} for k, v in figures.items()}))
    return str(path)


def _simulate(capsys, bench, *extra):
    argv = ["simulate", "--gpus", "16384", "--days", "54", "--trials", "100", "--json"]
    assert main([*argv, "--replica-groups", "128", "--from-no-restart", bench, *extra]) == 0
    return json.loads(capsys.readouterr().out)["replica_groups"]


def test_from_no_restart_takes_the_measured_heal_loss_and_step_cost(tmp_path, capsys):
    g = _simulate(capsys, _bench(tmp_path), "--step-seconds", "5")
    assert g["heal_minutes"] == pytest.approx(10 + 2.8 / 60, abs=1e-3)  # the job's restart + the heal
    assert g["from_no_restart"]["restart_minutes"] == pytest.approx(10 + 7.7 / 60, abs=1e-3)
    assert g["lost_seconds"] == pytest.approx(1.0)  # the pause beyond a fault-free run's
    assert g["step_cost"] == pytest.approx(1.001)  # 5 ms on a 5 s step
    assert g["ettr_vs_restart"] > 1.1


def test_from_no_restart_lets_the_restart_mode_win_when_steps_cost_too_much(tmp_path, capsys):
    """Measured figures can decide against replica groups: 1.5 s of torchft per 5 s step."""
    g = _simulate(capsys, _bench(tmp_path, step_overhead_ms=1500.0), "--step-seconds", "5")
    assert g["step_cost"] == pytest.approx(1.3)
    assert g["ettr_vs_restart"] < 1.0
    assert g["ettr_mean"] < g["restart_ettr_mean"]


def test_from_no_restart_charges_discarded_steps_at_the_simulated_step_time(tmp_path, capsys):
    none = _simulate(capsys, _bench(tmp_path), "--step-seconds", "60")
    some = _simulate(capsys, _bench(tmp_path, steps_lost_per_failure=1.0), "--step-seconds", "60")
    assert some["lost_seconds"] == pytest.approx(none["lost_seconds"] + 60.0)
    assert some["ettr_mean"] < none["ettr_mean"]


def test_from_no_restart_with_bad_input_is_an_input_error(tmp_path, capsys):
    argv = ["simulate", "--gpus", "8", "--days", "1", "--trials", "10"]
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"heal_s": {"mean": 1.0}}))
    assert main([*argv, "--replica-groups", "2", "--from-no-restart", str(bad)]) == 2
    assert "bench_no_restart.py --json" in capsys.readouterr().err
    good = _bench(tmp_path)
    assert main([*argv, "--from-no-restart", good]) == 2
    assert "--replica-groups" in capsys.readouterr().err
    assert main([*argv, "--replica-groups", "2", "--from-no-restart", good, "--heal-minutes", "3"]) == 2
    assert "--heal-minutes" in capsys.readouterr().err
    assert main([*argv, "--replica-groups", "2", "--from-no-restart", good, "--step-seconds", "0"]) == 2
    assert "--step-seconds" in capsys.readouterr().err

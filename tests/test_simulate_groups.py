"""`trainguard simulate`'s third recovery mode: replica groups that train on while one heals."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

pytest.importorskip("numpy")

from trainguard.cli import main
from trainguard.errors import ConfigError
from trainguard.incidents.taxonomy import JOB_WIDE_CAUSES, RootCause
from trainguard.reliability.groups import Estimate, GroupModel, interval, job_wide_share, simulate_groups
from trainguard.reliability.simulate import SimConfig, llama3_categories, simulate

CFG = SimConfig(gpus=16_384, days=54, trials=100, seed=0)
LOCAL = replace(CFG, categories=llama3_categories(frozenset()))  # every failure stays in its group


def _groups(cfg=CFG, **over):
    kw = {"groups": 128, "heal_s": cfg.restart_s, "stall_s": Estimate(10.0), **over}
    return simulate_groups(cfg, GroupModel(**kw))


def test_replica_groups_lose_a_share_of_the_downtime_instead_of_the_job():
    restart = float(simulate(CFG).ettr.mean())
    local = float(_groups(LOCAL).mean())
    assert local > restart
    assert 0.99 < local < 1.0


def test_one_group_heals_no_better_than_a_restart_without_rollback():
    one = float(_groups(LOCAL, groups=1, stall_s=Estimate(0.0)).mean())
    more = float(_groups(LOCAL, groups=8, stall_s=Estimate(0.0)).mean())
    assert one < more
    assert one < 0.99  # each failure's whole downtime is lost with a single group


def test_the_healthy_groups_stall_is_charged():
    none = float(_groups(LOCAL, heal_s=60.0, stall_s=Estimate(0.0)).mean())
    some = float(_groups(LOCAL, heal_s=60.0, stall_s=Estimate(60.0)).mean())
    assert some < none


def test_bad_group_settings_are_a_clear_error():
    with pytest.raises(ConfigError, match="1 or more groups"):
        GroupModel(groups=0, heal_s=1.0, stall_s=Estimate(0.0))


def test_a_slower_step_makes_the_restart_mode_win():
    """The failure case: replica groups lose every step's torchft overhead, and at a 20% slower
    step (1 s of overhead on a 5 s step) that costs more than the restarts they save."""
    restart = float(simulate(CFG).ettr.mean())
    free = float(_groups().mean())
    slow = float(_groups(overhead_ms=Estimate(1000.0), step_s=5.0).mean())
    assert slow == pytest.approx(free / 1.2)
    assert slow < restart < free


# -- job-wide failure kinds, from the taxonomy ---------------------------------------------------


def test_the_job_wide_kinds_are_the_taxonomys():
    wide = {c.name for c in llama3_categories() if c.job_wide}
    assert wide == {"software_bug", "network_switch_cable", "silent_data_corruption", "dependency"}
    assert RootCause.SOFTWARE_BUG in JOB_WIDE_CAUSES and RootCause.FAULTY_GPU not in JOB_WIDE_CAUSES
    assert job_wide_share(CFG) == pytest.approx((54 + 35 + 6 + 2) / 419)


def test_job_wide_failures_restart_the_whole_job_as_in_the_restart_mode():
    """Every kind job-wide: the replica groups are the restart mode, failure for failure."""
    every = replace(CFG, categories=llama3_categories(frozenset(RootCause)))
    assert _groups(every) == pytest.approx(simulate(CFG).ettr, abs=1e-12)
    # Llama 3's mix: a quarter of its failures restart the job, which costs most of the gain.
    mixed, local = float(_groups().mean()), float(_groups(LOCAL).mean())
    assert float(simulate(CFG).ettr.mean()) < mixed < local - 0.02


def test_the_job_wide_share_is_drawn_from_the_counts_behind_it():
    exact = _groups(share_obs=0, stall_s=Estimate(1.0))
    drawn = _groups(stall_s=Estimate(1.0))
    assert float(drawn.std()) > float(exact.std())


# -- uncertain inputs ------------------------------------------------------------------------------


def test_estimates_parse_a_number_a_half_width_and_a_range():
    assert Estimate.parse("18.8") == Estimate(18.8)
    assert Estimate.parse("18.8+-48.3") == Estimate(18.8, 48.3)
    assert Estimate.parse("18.8 +/- 48.3") == Estimate(18.8, 48.3)
    assert Estimate.parse("1..600") == Estimate(1.0, hi=600.0)
    for bad in ("fast", "600..1", "0..5", "1+-x", "5+--1"):
        with pytest.raises(ConfigError, match=r"lo\.\.hi"):
            Estimate.parse(bad)


def test_an_uncertain_overhead_widens_the_trials_range():
    known = _groups(LOCAL, overhead_ms=Estimate(18.8), step_s=1.0)
    unsure = _groups(LOCAL, overhead_ms=Estimate(18.8, 48.3), step_s=1.0)
    assert _spread(unsure) > 5 * _spread(known)
    assert float(unsure.max()) <= float(_groups(LOCAL, step_s=1.0).max())  # never below 0 ms


def _spread(x):
    lo, hi = interval(x)
    return hi - lo


def test_an_unknown_stall_spans_its_range():
    ettr = _groups(LOCAL, stall_s=Estimate(1.0, hi=600.0))
    at_1, at_600 = (
        float(_groups(LOCAL, stall_s=Estimate(1.0)).mean()),
        float(_groups(LOCAL, stall_s=Estimate(600.0)).mean()),
    )
    assert at_600 < float(ettr.mean()) < at_1
    assert float(ettr.min()) < at_1 - 0.02 and float(ettr.max()) > at_600 + 0.02


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
    assert g["stall_seconds"] == "1"  # the pause beyond a fault-free run's
    assert g["step_overhead_ms"] == "5 +/- 0.1"  # with its 95% half-width
    assert g["sources"]["stall"].startswith("measured here") and "not at scale" in g["sources"]["stall"]
    assert g["ettr_vs_restart"] > 1.05
    assert g["ettr_vs_restart_range95"][0] > 1.0


def test_from_no_restart_lets_the_restart_mode_win_when_steps_cost_too_much(tmp_path, capsys):
    """Measured figures can decide against replica groups: 1.5 s of torchft per 5 s step."""
    g = _simulate(capsys, _bench(tmp_path, step_overhead_ms=1500.0), "--step-seconds", "5")
    assert g["step_overhead_ms"] == "1500 +/- 0.1"
    assert g["ettr_vs_restart"] < 1.0 and g["ettr_vs_restart_range95"][1] < 1.0
    assert g["ettr_mean"] < g["restart_ettr_mean"]


def test_from_no_restart_charges_discarded_steps_at_the_simulated_step_time(tmp_path, capsys):
    none = _simulate(capsys, _bench(tmp_path), "--step-seconds", "60")
    some = _simulate(capsys, _bench(tmp_path, steps_lost_per_failure=1.0), "--step-seconds", "60")
    assert (none["stall_seconds"], some["stall_seconds"]) == ("1", "61")
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


def test_an_assumed_stall_overrides_the_measured_one_and_says_so(tmp_path, capsys):
    g = _simulate(capsys, _bench(tmp_path), "--stall-seconds", "180", "--step-overhead-ms", "18.8+-48.3")
    assert (g["stall_seconds"], g["step_overhead_ms"]) == ("180", "18.8 +/- 48.3")
    assert g["sources"]["stall"] == "assumed (--stall-seconds)"
    assert g["ettr_range95"][0] < g["ettr_mean"] < g["ettr_range95"][1]
    assert 0 < g["ettr_mc_se"] < g["ettr_range95"][1] - g["ettr_range95"][0]


def test_the_table_over_the_stall_is_printed(capsys):
    argv = ["simulate", "--gpus", "16384", "--days", "54", "--trials", "100", "--replica-groups", "128"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    rows = [line.split() for line in out.splitlines()[-4:]]
    assert [" ".join(r[:2]) for r in rows] == ["1 s", "30 s", "3 min", "10 min"]
    ettrs = [float(r[2]) for r in rows]
    assert ettrs == sorted(ettrs, reverse=True) and ettrs[0] - ettrs[-1] > 0.02
    assert "stalls the rest 1..600 s" in out  # the default stall: unknown within a range
    assert "stall: assumed (range)" in out


def test_job_wide_kinds_can_be_given(capsys):
    argv = [
        "simulate",
        "--gpus",
        "16384",
        "--days",
        "54",
        "--trials",
        "100",
        "--replica-groups",
        "128",
        "--json",
    ]
    assert main([*argv, "--job-wide", "none"]) == 0
    none = json.loads(capsys.readouterr().out)["replica_groups"]
    assert main([*argv, "--job-wide", "software_bug"]) == 0
    bugs = json.loads(capsys.readouterr().out)["replica_groups"]
    assert (none["job_wide_share"], bugs["job_wide_share"]) == (0.0, round(54 / 419, 4))
    assert none["ettr_mean"] > bugs["ettr_mean"]
    assert main([*argv, "--job-wide", "cosmic_rays"]) == 2
    assert "software_bug" in capsys.readouterr().err

"""The simulator's slow failure precursors: each shows in the readings a real one changes, no
health rule fires on it before the failure, and the failure leaves its usual evidence."""

from __future__ import annotations

import itertools
import random

import pytest

from trainguard.clock import VirtualClock
from trainguard.detect.kernel_log import parse_kernel_line
from trainguard.detect.rules import RuleState
from trainguard.telemetry.sim import SimNode, wearout

H = 3600.0


def watch(condition, hours: float, step_s: float = 300.0):
    """Readings of GPU 0 every step for ``hours``, with ``condition`` attached at t=0, and every
    finding the fixed rules made on them."""
    clock = VirtualClock()
    node = SimNode(n_gpus=2, clock=clock)
    node.schedule(0.0, wearout.Wear(0, condition))
    rules, readings, findings = RuleState(), [], []
    for _ in range(int(hours * H / step_s)):
        clock.advance(step_s)
        samples = node.sample()
        readings.append(samples[0])
        findings += [f for f in rules.evaluate(samples) if f.gpu == 0]
    return readings, findings


def test_correctable_ecc_creep_accelerates_and_no_rule_fires():
    readings, findings = watch(wearout.SbeCreep(0.0, start_per_h=0.5, tau_h=4.0), hours=12)
    sbe = [r.ecc_sbe_aggregate for r in readings]
    first, last = sbe[len(sbe) // 2] - sbe[0], sbe[-1] - sbe[len(sbe) // 2]
    assert sbe == sorted(sbe) and last > 3 * first > 0  # ever faster
    assert readings[-1].ecc_dbe_volatile == 0
    assert findings == []


def test_remapped_rows_pile_up_without_a_pending_remap():
    readings, findings = watch(wearout.RemapCreep(0.0, rows=10, span_h=10.0), hours=10)
    assert readings[-1].remap_correctable == 10 and readings[0].remap_correctable == 0
    assert not any(r.remap_pending for r in readings)
    assert findings == []


def test_thermal_drift_stays_under_the_slowdown_threshold():
    readings, findings = watch(wearout.ThermalDrift(0.0, c_per_h=5.0), hours=10)
    temps = [r.temperature_c for r in readings]
    assert temps[-1] - temps[0] > 15
    assert max(temps) < readings[0].temp_slowdown_c
    assert findings == []


def test_slow_pcie_replay_growth_fires_the_replay_rule_only_past_its_rate():
    readings, findings = watch(wearout.ReplayCreep(0.0, start_per_min=0.05, tau_h=1.5), hours=10)
    replays = [r.pcie_replay for r in readings]
    per_min = [(b - a) / 5 for a, b in itertools.pairwise(replays)]
    fired = [f.time for f in findings if f.rule == "pcie_replay"]
    assert fired, "the creep reaches the rule's 8/min within 10 h"
    assert all(r < 8 for r, f in zip(per_min, readings[1:], strict=True) if f.time < fired[0] - 300)


def test_scrape_decay_empties_ever_more_readings_and_no_rule_degrades():
    readings, findings = watch(wearout.ScrapeDecay(0.0, end_share=0.6, span_h=6.0), hours=6, step_s=60.0)
    empty = [r.temperature_c is None and r.error is not None for r in readings]
    half = len(empty) // 2
    assert sum(empty[half:]) > 3 * max(1, sum(empty[:half]))
    assert {f.health.value for f in findings} <= {"unknown"}  # "no readings", never a failure


def test_a_hang_loses_the_gpu_with_xid_119():
    clock = VirtualClock()
    node = SimNode(n_gpus=2, clock=clock)
    node.schedule(10.0, wearout.Hang(1))
    clock.advance(11)
    assert node.sample()[1].lost
    events = [parse_kernel_line(line) for line in node.kernel_log]
    assert [e.xid for e in events if e is not None and e.xid] == [119]


@pytest.mark.parametrize("kind", sorted(wearout.KINDS))
def test_a_planned_life_fails_once_after_its_precursor(kind):
    life = wearout.plan_gpu(random.Random(3), kind, life_s=72 * H, gpu=2)
    assert life.kind == kind and 12 * H <= life.failure_s < 72 * H
    terminal = [t for t, f in life.faults if not isinstance(f, wearout.Wear)]
    assert terminal == [life.failure_s]
    precursors = [
        f.condition for _, f in life.faults if isinstance(f, wearout.Wear) and f.condition.since != 0.0
    ]
    assert (len(precursors) == 1) == (wearout.KINDS[kind].lead_h is not None)
    assert all(c.since < life.failure_s for c in precursors)


def test_a_healthy_life_has_noise_and_no_failure():
    lives = [wearout.plan_gpu(random.Random(s), "healthy", life_s=72 * H) for s in range(200)]
    assert all(life.failure_s is None for life in lives)
    kinds = {type(f.condition).__name__ for life in lives for _, f in life.faults}
    assert {"SteadySbe", "OldRemaps", "ReplayBursts", "FlakyScrape"} <= kinds


@pytest.mark.parametrize(
    "name",
    ["trainguard.telemetry.sim.wearout", "trainguard.predictor.series", "trainguard.predictor.simfleet"],
)
def test_the_examples_in_the_docstrings_run(name):
    import doctest
    import importlib

    result = doctest.testmod(importlib.import_module(name))
    assert result.attempted > 0 and result.failed == 0


@pytest.mark.parametrize("name", ["trainguard.predictor", "trainguard.predictor.simfleet"])
def test_the_series_and_the_simulated_fleet_need_no_third_party_module(name):
    import json
    import subprocess
    import sys

    probe = (
        "import importlib, json, sys; before = set(sys.modules); importlib.import_module(sys.argv[1]); "
        "print(json.dumps(sorted({m.split('.')[0] for m in set(sys.modules) - before} - set(sys.stdlib_module_names) - {'trainguard'})))"
    )
    out = subprocess.run([sys.executable, "-c", probe, name], capture_output=True, text=True, check=True)
    assert json.loads(out.stdout) == []

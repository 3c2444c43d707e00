"""Chaos plans: parsing, validation with errors that name the field, and the shipped examples."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from trainguard.chaos import ChaosExecutor, FaultKind, corrupt_newest_checkpoint, load_plan, parse_plan
from trainguard.errors import ConfigError

EXAMPLES = sorted((Path(__file__).parents[1] / "examples" / "chaos").glob("*.toml"))


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_every_shipped_example_plan_is_valid(path):
    assert load_plan(path).faults


def test_examples_cover_every_fault_kind():
    kinds = {f.kind for p in EXAMPLES for f in load_plan(p).faults}
    assert kinds >= set(FaultKind) - {FaultKind.EXIT}


def test_a_plan_parses_triggers_and_kind_fields():
    plan = parse_plan(
        '[[fault]]\nkind = "slow"\nrank = 2\nstep = 30\ndelay_s = 0.5\nsteps = 4\n'
        '[[fault]]\nkind = "kill"\nrank = 0\nat_s = 12\nsignal = "SIGTERM"\n'
    )
    slow, kill = plan.faults
    assert (slow.kind, slow.rank, slow.step, slow.delay_s, slow.steps) == (FaultKind.SLOW, 2, 30, 0.5, 4)
    assert (kill.at_s, kill.signal, kill.step) == (12.0, "SIGTERM", None)


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ('[[fault]]\nkind = "meteor"\nrank = 0\nstep = 1\n', "field 'kind'"),
        ('[[fault]]\nkind = "kill"\nstep = 1\n', "field 'rank' is required"),
        ('[[fault]]\nkind = "kill"\nrank = 0\n', "exactly one trigger"),
        ('[[fault]]\nkind = "kill"\nrank = 0\nstep = 1\nat_s = 2\n', "exactly one trigger"),
        ('[[fault]]\nkind = "nan"\nrank = 0\nat_s = 2\n', "field 'at_s' is not allowed"),
        ('[[fault]]\nkind = "xid"\nrank = 0\nstep = 2\nxid = "79"\n', "field 'xid' must be int"),
        ('[[fault]]\nkind = "kill"\nrank = 0\nstep = 2\ndelay_s = 1\n', "unknown field 'delay_s'"),
        ('[[fault]]\nkind = "kill"\nrank = -1\nstep = 2\n', "field 'rank' must not be negative"),
        ('[[fault]]\nkind = "kill"\nrank = 0\nstep = 2\nsignal = "SIGNOPE"\n', "field 'signal'"),
        ('[faults]\nkind = "kill"\n', "unknown top-level key"),
        ("[[fault]\n", "not valid TOML"),
    ],
)
def test_bad_plans_are_rejected_with_the_field_named(text, needle):
    with pytest.raises(ConfigError) as err:
        parse_plan(text, source="plan.toml")
    assert needle in str(err.value)
    assert "plan.toml" in str(err.value)


def test_in_process_faults_are_written_for_the_guard_before_start(tmp_path):
    plan = parse_plan(
        '[[fault]]\nkind = "xid"\nrank = 1\nxid = 48\nstep = 9\n'
        '[[fault]]\nkind = "kill"\nrank = 0\nstep = 3\n'
        '[[fault]]\nkind = "nan"\nrank = 0\nstep = 4\n'
    )
    ChaosExecutor(plan, tmp_path, started=0.0).prepare()
    faults = json.loads((tmp_path / "chaos.json").read_text())["faults"]
    assert [f["kind"] for f in faults] == ["raise", "nan"]
    assert faults[0]["message"].splitlines()[0] == "CUDA error: uncorrectable ECC error encountered"
    assert (faults[0]["rank"], faults[0]["step"]) == (1, 9)


def test_external_faults_fire_once_when_their_step_is_reached(tmp_path):
    import subprocess
    import sys

    victim = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        plan = parse_plan('[[fault]]\nkind = "kill"\nrank = 1\nstep = 5\n')
        ex = ChaosExecutor(plan, tmp_path, started=0.0)
        assert ex.tick(1.0, 4, {1: victim.pid}, lambda r: r) == []
        fired = ex.tick(2.0, 5, {1: victim.pid}, lambda r: r)
        assert [f.rank for f in fired] == [1]
        assert victim.wait(timeout=10) == -9
        assert ex.tick(3.0, 6, {1: victim.pid}, lambda r: r) == []
    finally:
        victim.kill()


def test_corrupting_the_newest_checkpoint_makes_it_fail_verification(tmp_path):
    from trainguard.checkpoint import newest_valid

    torch = pytest.importorskip("torch")
    from trainguard.torch import Checkpointer, TrainState

    model = torch.nn.Linear(64, 64)
    state = TrainState(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1))
    ckpt = Checkpointer(tmp_path, async_save=False)
    ckpt.save(5, state)
    ckpt.save(10, state)
    ckpt.close()
    assert newest_valid(tmp_path).step == 10
    detail = corrupt_newest_checkpoint(tmp_path)
    assert "flipped" in detail
    assert newest_valid(tmp_path).step == 5


def test_step_triggered_faults_are_named_with_what_to_do_instead():
    from trainguard.chaos.plan import refusal, step_triggered

    plan = parse_plan(
        '[[fault]]\nkind = "kill"\nrank = 1\nat_s = 5\n'
        '[[fault]]\nkind = "kill"\nrank = 0\nstep = 40\n'
        '[[fault]]\nkind = "nan"\nrank = 0\nstep = 7\n',
        source="p.toml",
    )
    assert step_triggered(plan) == (1, 2)
    text = refusal(plan, (1, 2))
    assert "#2 (kill rank 0, step = 40)" in text and "#3 (nan rank 0, step = 7)" in text
    assert "#1" not in text and "at_s" in text and "Guard" in text


def test_wrong_products_make_the_rank_gpu_fail_the_sdc_test_and_nothing_else(tmp_path):
    from trainguard.agent import Agent
    from trainguard.diagnose import preflight
    from trainguard.records import Health
    from trainguard.telemetry.sim import SimNode

    sim = SimNode(n_gpus=3, load=0.0)
    plan = parse_plan('[[fault]]\nkind = "wrong_products"\nrank = 0\nat_s = 5\nrate = 1.0\n')
    ex = ChaosExecutor(plan, tmp_path, started=0.0, sim=sim)
    assert ex.tick(4.0, None, {0: 1}, lambda r: 2) == []
    [fired] = ex.tick(5.0, None, {0: 1}, lambda r: 2)  # rank 0 runs on GPU 2
    assert fired.gpu == 2 and "wrong matrix products" in fired.detail
    verdict = Agent(sim).tick()
    assert all(g.health is Health.OK for g in verdict.gpus)  # no telemetry symptom
    report = preflight([0, 1, 2], backend="sim", sim=sim)
    assert [report.gpu_health(g) for g in (0, 1, 2)] == [Health.OK, Health.OK, Health.FAILED]
    assert report.gpu(2).test("sdc").verdict.value == "fail"

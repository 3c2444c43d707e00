"""The demo's root-cause checks can fail: for each, the case where the other answer is right.

- F1: a NaN that does not come back when its step is replayed is the machine's (silent data
  corruption suspect); one that comes back with the same data is the program's (software_bug).
- F4: a committed checkpoint whose bytes changed at rest is storage's (dependency); one that never
  reached the disk whole (a file or the manifest missing, a size off) was torn mid-save: unknown,
  suspects host (a writer killed before storage kept its data) and software_bug.
- F5: a hang's "unknown" is earned by evidence (a laggard outside any collective: its code, host
  or GPU), not the fallback (no laggard: the network or the host); a stopped laggard is the host's.
"""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest

from trainguard.demo.match import judge
from trainguard.demo.plan import build_plan
from trainguard.incidents import Incident, RootCause
from trainguard.rundir import read_findings

torch = pytest.importorskip("torch")

PLAN = build_plan(quick=True)


class _Memory:
    def __init__(self) -> None:
        self.saved: dict[int, Any] = {}

    def save(self, step: int, state: Any) -> None:
        self.saved[step] = copy.deepcopy((state.model.state_dict(), state.optimizer.state_dict()))

    def wait(self) -> None:
        pass

    def resume(self, state: Any) -> int:
        step = max(self.saved, default=0)
        if self.saved:
            state.model.load_state_dict(self.saved[step][0])
            state.optimizer.load_state_dict(self.saved[step][1])
        return step


class _State:
    def __init__(self) -> None:
        torch.manual_seed(0)
        self.model = torch.nn.Linear(4, 1)
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.05)


def _drill(tmp_path, recurs: bool) -> tuple[list[tuple[int, str]], list[Any]]:
    """The Guard under a chaos plan's NaN at step 7 (checkpoints every 5 steps)."""
    from trainguard.torch.guard import Guard

    nan = {"kind": "nan", "rank": 0, "step": 7, **({"recurs": True} if recurs else {})}
    (tmp_path / "chaos.json").write_text(json.dumps({"faults": [nan]}))
    state, trace = _State(), []
    with Guard(_Memory(), state, run_dir=tmp_path, checkpoint_every=5, watchdog=False) as guard:
        for step in guard.range(0, 12):
            loss = ((state.model(torch.randn(16, 4)) - 1.0) ** 2).mean()
            loss = guard.loss(loss, step)
            loss.backward()
            action = guard.step(step, loss)
            trace.append((step, action.value))
            if action == "proceed":
                state.optimizer.step()
            state.optimizer.zero_grad()
    return trace, read_findings(tmp_path)


def _verdict(findings: list[Any]) -> RootCause:
    """What the supervisor makes of the Guard's findings (`assess.numerics_verdicts`)."""
    from trainguard.supervisor.assess import numerics_verdicts
    from trainguard.supervisor.attempt import History
    from trainguard.supervisor.observe import Observation
    from trainguard.supervisor.watch import ProgressView

    history = History()
    history.numerics_incidents[7] = Incident(
        job="j", time=1.0, root_cause=RootCause.UNKNOWN, action="continue"
    )
    rows = tuple(((rank, step, f.rule, f.time), rank, step, f) for rank, step, f in findings)
    prog = ProgressView(12, 12, 1.0, 1.0, 30.0, False, (), 0.1, 1.0)
    obs = Observation(time=10.0, codes={0: None}, progress=prog, findings=rows)
    causes = [u.changes["root_cause"] for u in numerics_verdicts(obs, history) if "root_cause" in u.changes]
    assert len(causes) == 1, causes
    return causes[0]


def test_a_nan_that_vanishes_on_replay_is_silent_data_corruption(tmp_path):
    trace, findings = _drill(tmp_path, recurs=False)
    assert (7, "rollback") in trace and trace.count((7, "proceed")) == 1  # replayed cleanly
    assert [f.rule for _, _, f in findings][-1] == "numerics.transient"
    cause = _verdict(findings)
    assert cause is RootCause.SILENT_DATA_CORRUPTION
    assert judge(_incident(cause), PLAN.fault("F1"))[0]


def test_a_nan_that_comes_back_on_replay_is_the_programs_and_fails_the_demos_sdc_check(tmp_path):
    trace, findings = _drill(tmp_path, recurs=True)
    assert (7, "rollback") in trace and (7, "skip") in trace  # the same batch again: skipped
    rules = [f.rule for _, _, f in findings]
    assert "numerics.data_problem" in rules and "numerics.transient" not in rules
    assert (tmp_path / "chaos-fired").is_dir()  # the drill's ground truth, written once
    cause = _verdict(findings)
    assert cause is RootCause.SOFTWARE_BUG
    ok, why = judge(_incident(cause), PLAN.fault("F1"))
    assert not ok and "root cause software_bug, expected silent_data_corruption" in why


def _incident(cause: RootCause, evidence: tuple[Any, ...] = ()) -> Incident:
    return Incident(
        job="j", time=1.0, root_cause=cause, action="rollback", rank=0, gpu=0, id=1, evidence=evidence
    )


def test_a_hang_is_unknown_only_with_the_suspects_its_evidence_leaves():
    from trainguard.supervisor.assess import hang_cause
    from trainguard.supervisor.hang import HangReport

    spec = PLAN.fault("F5")

    def judged(report: HangReport) -> tuple[bool, str]:
        cause, why = hang_cause(report, [])
        inc = Incident(job="j", time=1.0, root_cause=cause, action="restart", rank=2, id=4, evidence=why)
        return judge(inc, spec)

    outside = HangReport((2,), {2: "stack is not inside a collective"}, (), "stacks")
    assert judged(outside) == (True, "root cause unknown, action restart")
    stopped = HangReport((2,), {2: "process stopped (state T)"}, (), "proc_state")
    assert "root cause host, expected unknown" in judged(stopped)[1]
    nobody = HangReport((), {}, (), "none")  # the fallback: every rank waits, nothing stands out
    ok, why = judged(nobody)
    assert not ok and "unknown with suspects network_switch_cable, host" in why


def test_a_recurring_nan_is_a_chaos_plan_field_passed_to_the_guard():
    from trainguard.chaos import parse_plan
    from trainguard.chaos.executor import _in_process_entry
    from trainguard.errors import ConfigError

    [fault] = parse_plan('[[fault]]\nkind = "nan"\nrank = 1\nstep = 9\nrecurs = true\n').faults
    assert fault.recurs and _in_process_entry(fault, 9) == {
        "rank": 1,
        "step": 9,
        "kind": "nan",
        "recurs": True,
    }
    [once] = parse_plan('[[fault]]\nkind = "nan"\nrank = 1\nstep = 9\n').faults
    assert not once.recurs and "recurs" not in _in_process_entry(once, 9)
    with pytest.raises(ConfigError, match="'recurs' must be bool"):
        parse_plan('[[fault]]\nkind = "nan"\nrank = 1\nstep = 9\nrecurs = 1\n')
    with pytest.raises(ConfigError, match="unknown field 'recurs'"):
        parse_plan('[[fault]]\nkind = "hang"\nrank = 1\nstep = 9\nrecurs = true\n')


def _committed(directory, step: int):
    import time

    from trainguard.checkpoint import Manifest, commit, describe_files, new_tmp_dir

    tmp = new_tmp_dir(directory, step)
    (tmp / "state.pt").write_bytes(bytes(range(256)) * 40)
    return commit(tmp, Manifest(step=step, files=describe_files(tmp), time=time.time()))


@pytest.mark.parametrize(
    ("how", "cause"),
    [
        ("flip", RootCause.DEPENDENCY),  # sizes intact, bytes changed at rest: storage
        ("truncate", RootCause.UNKNOWN),  # a save that never reached the disk whole
        ("delete-file", RootCause.UNKNOWN),
        ("delete-manifest", RootCause.UNKNOWN),
    ],
)
def test_a_checkpoint_torn_mid_save_and_one_corrupted_on_disk_get_different_root_causes(tmp_path, how, cause):
    import random

    from trainguard.checkpoint import damage, verify
    from trainguard.supervisor.torn import torn_cause

    path = _committed(tmp_path, 10)
    damage(path, how, random.Random(1))
    result = verify(path)
    assert not result.ok
    got, why = torn_cause(result.reason)
    assert got is cause, (how, result.reason)
    inc = Incident(job="j", time=1.0, root_cause=got, action="skip_torn_checkpoint", id=5, evidence=why)
    ok, reason = judge(inc, PLAN.fault("F4"))  # the demo's bit flip expects storage
    assert ok is (cause is RootCause.DEPENDENCY), reason
    if cause is RootCause.UNKNOWN:
        assert "suspects: host" in why[0] and "software_bug" in why[0]


def test_the_resume_points_skip_reasons_tell_storage_from_a_torn_save(tmp_path):
    """The supervisor records each checkpoint the resume skips with `torn_cause` of its reason."""
    import random

    from trainguard.checkpoint import damage
    from trainguard.supervisor.resume import resume_point
    from trainguard.supervisor.torn import torn_cause

    _committed(tmp_path, 5)
    damage(_committed(tmp_path, 10), "flip", random.Random(1))
    damage(_committed(tmp_path, 15), "truncate", random.Random(1))
    point = resume_point(tmp_path)
    assert point.step == 5
    causes = {step: torn_cause(reason)[0] for step, reason in point.skipped}
    assert causes == {15: RootCause.UNKNOWN, 10: RootCause.DEPENDENCY}


def test_the_torn_modules_examples_run():
    import doctest

    import trainguard.supervisor.torn as torn

    result = doctest.testmod(torn)
    assert result.attempted > 0 and result.failed == 0

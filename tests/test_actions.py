"""One action vocabulary: every action an incident records is a value of one scope's type, no value
means two things, and ``--gpus`` counts GPUs in every command (which GPUs is ``--gpu-ids``)."""

from __future__ import annotations

import argparse
import ast
from itertools import combinations
from pathlib import Path

import pytest

from trainguard.actions import (
    Advice,
    GroupAction,
    JobAction,
    NodeAction,
    PersonAction,
    Scope,
    StepAction,
    scope_of,
)
from trainguard.cli import build_parser, main
from trainguard.demo.plan import build_keras_plan, build_plan
from trainguard.incidents import Incident

SRC = Path(__file__).resolve().parents[1] / "src" / "trainguard"
SCOPES = {
    Scope.ADVICE: Advice,
    Scope.STEP: StepAction,
    Scope.JOB: JobAction,
    Scope.GROUP: GroupAction,
    Scope.NODE: NodeAction,
    Scope.PERSON: PersonAction,
}
# A finding advises the very acts the agent takes: the incident records the act.
SHARED = {("advice", "node"): {"none", "reset_gpu", "reboot_node", "drain"}}


def test_no_value_means_two_things_but_the_acts_a_finding_advises():
    for (a, ka), (b, kb) in combinations(SCOPES.items(), 2):
        common = {x.value for x in ka} & {x.value for x in kb}
        assert common == SHARED.get((a.value, b.value), set()), (a, b, common)
    assert scope_of("reset_gpu") is Scope.NODE and scope_of("restart_app") is Scope.ADVICE
    assert Incident(job="j", time=0.0, action=GroupAction.REPLACE).scope is Scope.GROUP


def _recorded_action_literals() -> list[tuple[str, int, str]]:
    """Every string written as an incident's action in the source: ``action="..."`` in a call
    (not argparse's, nor a table's ``format``) and ``{"action": "..."}`` in a dict."""
    found = []
    for path in SRC.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            values: list[ast.expr] = []
            if isinstance(node, ast.Call) and not (
                isinstance(node.func, ast.Attribute) and node.func.attr in ("add_argument", "format")
            ):
                values = [k.value for k in node.keywords if k.arg == "action"]
            elif isinstance(node, ast.Dict):
                values = [
                    v
                    for k, v in zip(node.keys, node.values, strict=True)
                    if isinstance(k, ast.Constant) and k.value == "action"
                ]
            for v in values:
                if isinstance(v, ast.Constant) and isinstance(v.value, str):
                    found.append((str(path.relative_to(SRC)), v.lineno, v.value))
    return found


def test_every_action_the_code_records_belongs_to_a_scope():
    literals = _recorded_action_literals()
    unknown = [x for x in literals if x[2] != "none" and scope_of(x[2]) is None]
    assert unknown == [], "add the action to its scope's type in trainguard/actions.py"


def test_the_scan_sees_a_hand_written_action(tmp_path, monkeypatch):
    # The check above must be able to fail: a literal outside the vocabulary is found.
    (tmp_path / "m.py").write_text('Incident(job="j", time=0.0, action="restart_excluding_gpu")\n')
    monkeypatch.setattr(__import__(__name__), "SRC", tmp_path)
    assert [x[2] for x in _recorded_action_literals()] == ["restart_excluding_gpu"]
    assert scope_of("restart_excluding_gpu") is None


@pytest.mark.parametrize("plan", [build_plan, build_keras_plan])
def test_the_demos_expected_actions_are_in_the_vocabulary(plan):
    expected = {a for f in plan(quick=True).faults for a in f.expected_actions}
    assert expected and all(scope_of(a) in (Scope.JOB, Scope.STEP) for a in expected), expected


def _gpus_flags() -> dict[str, argparse.Action]:
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    out = {}
    for name, p in sub.choices.items():
        for a in p._actions:
            if "--gpus" in a.option_strings and a.help is not argparse.SUPPRESS:
                out[name] = a
    return out


def test_gpus_counts_gpus_in_every_command():
    flags = _gpus_flags()
    assert {"check", "monitor", "agent", "diagnose", "simulate", "plan"} <= set(flags)
    for name, action in flags.items():
        assert action.metavar == "N", name
        assert action.type in (int,) or getattr(action.type, "__name__", "") == "gpu_count", name


def test_a_list_given_to_gpus_is_refused_with_the_flag_that_takes_it(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["diagnose", "--backend", "sim", "--gpus", "0,3"])
    assert exit_.value.code == 3 and "use --gpu-ids 0,3" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_:
        main(["run", "--standalone", "--gpus", "2,3", "--", "python", "t.py"])
    assert exit_.value.code != 0 and "use --gpu-ids 2,3" in capsys.readouterr().err


def test_diagnose_gpus_sizes_the_simulated_node_and_gpu_ids_picks(capsys):
    import json

    assert main(["diagnose", "--backend", "sim", "--gpus", "4", "--gpu-ids", "1,3", "--json", "--quiet"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert [g["index"] for g in out["gpus"]] == [1, 3]
    assert main(["diagnose", "--backend", "sim", "--gpus", "2", "--gpu-ids", "3", "--quiet"]) == 3

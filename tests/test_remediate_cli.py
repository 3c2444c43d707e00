"""`trainguard remediate ...` and `trainguard agent set-healthy`: --help, --json, and what they change."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from trainguard.cli import main
from trainguard.incidents.store import IncidentStore
from trainguard.remediate import BreakerFile, admit
from trainguard.remediate.escalation import EscalationFile, EscalationState, in_inspection
from trainguard.remediate.policy import BreakerLimits

VERBS = [
    ["remediate", "breaker", "status"],
    ["remediate", "breaker", "reset"],
    ["remediate", "resume"],
    ["remediate", "policy"],
    ["remediate", "set-healthy"],
    ["agent", "set-healthy"],
]


@pytest.mark.parametrize("verb", VERBS, ids=" ".join)
def test_every_verb_has_help_and_json(verb: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        main([*verb, "--help"])
    assert done.value.code == 0
    assert "--json" in capsys.readouterr().out


def _open_breaker(tmp_path: Path) -> None:
    lim = BreakerLimits(max_nodes=1, max_fraction=1.0)
    with BreakerFile(tmp_path / "breaker.json").update() as box:
        for node in ("a", "b"):
            _, _, box[0] = admit(box[0], lim, node, None, 1.0, 0)


def test_breaker_status_and_reset(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _open_breaker(tmp_path)
    common = ["--state-dir", str(tmp_path), "--db", str(tmp_path / "tg.db"), "--json"]
    assert main(["remediate", "breaker", "status", *common]) == 1  # open: non-zero, for scripts
    status = json.loads(capsys.readouterr().out)
    assert status["open"] and status["held"] == 1
    assert main(["remediate", "breaker", "reset", *common]) == 0
    reset = json.loads(capsys.readouterr().out)
    assert reset["reset"] == "the fleet breaker" and "limit 1" in reset["was"]
    assert main(["remediate", "breaker", "status", *common]) == 0
    assert json.loads(capsys.readouterr().out)["open"] is False
    with IncidentStore(tmp_path / "tg.db") as store:
        (rec,) = store.incidents()
    assert rec.action == "breaker_reset" and rec.detected_by == "person" and rec.evidence[0].startswith("by ")


def test_set_healthy_takes_a_node_out_of_inspection(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    f = EscalationFile(tmp_path / "escalation.json")
    f.save(EscalationState(inspection=(("n1", 3, "Xid 79 three times"), ("n1", 5, "Xid 48 often"))))
    args = ["agent", "set-healthy", "--node", "n1", "--gpu", "3", "--state-dir", str(tmp_path),
            "--db", str(tmp_path / "tg.db"), "--json"]  # fmt: skip
    assert main(args) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["was"] == "Xid 79 three times" and out["gpu"] == 3
    state = f.load()
    assert in_inspection(state, "n1", 3) is None and in_inspection(state, "n1", 5) == "Xid 48 often"


def test_policy_check_reports_and_refuses(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    good = tmp_path / "p.toml"
    good.write_text('[remediation]\nenforce = true\n[remediation.actions]\nxid = "drain"\n')
    assert main(["remediate", "policy", "check", str(good)]) == 0
    assert "ENFORCING" in capsys.readouterr().out
    bad = tmp_path / "bad.toml"
    bad.write_text('[remediation.actions]\nxid = "nuke"\n')
    assert main(["remediate", "policy", "check", str(bad)]) == 2
    assert "'nuke' is not a remedy" in capsys.readouterr().err

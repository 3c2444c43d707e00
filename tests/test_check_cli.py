"""`trainguard check`: every scenario gives its documented verdict; exit codes; JSON shape."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from trainguard.cli import main
from trainguard.records import Health
from trainguard.telemetry.sim import SCENARIOS

DATA = Path(__file__).parent / "data"


def check_json(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, dict]:
    code = main(["check", *argv, "--json"])
    return code, json.loads(capsys.readouterr().out)


def test_every_documented_verdict_is_the_brief_s():
    documented = {
        "healthy": "ok",
        "xid79": "failed",
        "dbe": "failed",
        "row-remap-failure": "failed",
        "uncontained-xid95": "failed",
        "xid154-reset": "failed",
        "thermal": "degraded",
        "power-brake": "degraded",
        "pcie-replay": "degraded",
        "nvlink-crc": "degraded",
        "straggler": "degraded",
        "app-xid13": "degraded",
    }
    assert {name: SCENARIOS[name].expected.value for name in documented} == documented


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_scenario_gives_its_documented_verdict(capsys, name):
    scenario = SCENARIOS[name]
    code, out = check_json(capsys, "--backend", "sim", "--scenario", name)
    assert out["verdict"] == scenario.expected.value, out["reasons"]
    assert code == scenario.expected.exit_code
    # the right GPUs, and only them (a fail-slow GPU the faults hit may rightly read ok)
    verdicts = {g["index"]: g["verdict"] for g in out["gpus"]}
    expected = {g: h.value for g, h in scenario.expected_gpus(len(verdicts)).items()}
    assert verdicts == expected, out["reasons"]


def test_json_has_verdict_action_reasons_and_per_gpu_identity(capsys):
    code, out = check_json(capsys, "--scenario", "xid79")
    assert code == 2 and out["verdict"] == "failed" and out["action"] == "reboot_node"
    assert any("Xid 79" in r for r in out["reasons"])
    assert len(out["gpus"]) == 8
    gpu3 = out["gpus"][3]
    assert set(gpu3) >= {"index", "uuid", "pci", "verdict", "reasons", "action"}
    assert gpu3["index"] == 3 and gpu3["uuid"].startswith("GPU-") and gpu3["pci"] == "0000:61:00"
    assert gpu3["verdict"] == "failed" and gpu3["reasons"]
    gpu0 = out["gpus"][0]
    assert (gpu0["verdict"], gpu0["action"], gpu0["reasons"]) == ("ok", "none", [])


def test_app_xid13_asks_for_diagnostics_and_ignores_the_sympathetic_xid45(capsys):
    _, out = check_json(capsys, "--scenario", "app-xid13")
    gpu2 = out["gpus"][2]
    assert gpu2["action"] == "run_diagnostics"
    assert not any("Xid 45" in r for r in gpu2["reasons"])


def test_list_scenarios_names_each_with_its_verdict(capsys):
    assert main(["check", "--list-scenarios"]) == 0
    text = capsys.readouterr().out
    for name, scenario in SCENARIOS.items():
        line = next(line for line in text.splitlines() if line.startswith(name + " "))
        assert scenario.expected.value in line
    assert main(["check", "--list-scenarios", "--json"]) == 0
    listed = {s["name"]: s["expected"] for s in json.loads(capsys.readouterr().out)}
    assert listed == {n: s.expected.value for n, s in SCENARIOS.items()}


def test_human_output_is_a_table_and_a_node_line(capsys):
    assert main(["check", "--backend", "sim", "--scenario", "thermal"]) == 1
    out = capsys.readouterr().out
    assert "GPU  VERDICT" in out and "node: DEGRADED" in out and "\x1b[" not in out  # no colour into a pipe
    assert any(line.startswith("1 ") and "degraded" in line for line in out.splitlines())


def test_without_a_gpu_nvml_says_so_in_one_line_and_exits_3(capsys):
    pytest.importorskip("pynvml")
    from trainguard.errors import BackendUnavailable
    from trainguard.telemetry import open_backend

    try:
        open_backend("nvml").close()
        pytest.skip("this machine has a GPU")
    except BackendUnavailable:
        pass
    assert main(["check"]) == 3
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--backend sim" in err


def test_unknown_scenario_or_bad_flag_is_could_not_check(capsys):
    assert main(["check", "--scenario", "no-such-thing"]) == 3
    assert "no-such-thing" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exc:
        main(["check", "--no-such-flag"])
    assert exc.value.code == 3  # a probe must not read a typo as "failed" (2)


def test_nvidia_smi_snapshot_is_triaged_offline(capsys):
    code, out = check_json(capsys, "--from-nvidia-smi", str(DATA / "nvidia-smi-a100-ecc-throttle.xml"))
    assert out["verdict"] == "failed" and code == 2 and out["backend"] == "smi-xml"
    code, out = check_json(capsys, "--from-nvidia-smi", str(DATA / "nvidia-smi-h100-healthy.xml"))
    assert out["verdict"] == "ok" and code == 0


def test_missing_snapshot_file_is_could_not_check(capsys, tmp_path):
    assert main(["check", "--from-nvidia-smi", str(tmp_path / "nope.xml")]) == 3
    assert "nope.xml" in capsys.readouterr().err


def test_sim_kernel_log_lands_where_asked_but_never_in_an_existing_log(capsys, tmp_path):
    log = tmp_path / "kern.log"
    code, _ = check_json(capsys, "--scenario", "xid79", "--kernel-log", str(log))
    assert code == 2 and "Xid (PCI:0000:61:00): 79" in log.read_text()
    before = log.read_text()
    assert main(["check", "--scenario", "dbe", "--kernel-log", str(log)]) == 3
    assert "exists" in capsys.readouterr().err and log.read_text() == before


def test_console_script_exit_code_is_the_verdict():
    exe = Path(sys.executable).with_name("trainguard")
    cmd = [str(exe)] if exe.exists() else [sys.executable, "-m", "trainguard.cli"]
    env = {**os.environ, "NO_COLOR": "1"}
    argv = [*cmd, "check", "--backend", "sim", "--scenario", "dbe", "--json"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60, env=env)
    assert done.returncode == Health.FAILED.exit_code == 2, done.stderr
    assert json.loads(done.stdout)["verdict"] == "failed"


def test_snapshot_plus_kernel_log_combines_both(capsys, tmp_path):
    log = tmp_path / "kern.log"
    xid = "NVRM: Xid (PCI:0000:1b:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus."
    log.write_text(f"[  100.000000] {xid}\n[  101.000000] NVRM: Xid (PCI:0000:ee:00): 48, DBE\n")
    snapshot = DATA / "nvidia-smi-h100-healthy.xml"
    code, out = check_json(capsys, "--from-nvidia-smi", str(snapshot), "--kernel-log", str(log))
    assert code == 2 and out["verdict"] == "failed"
    assert [g["verdict"] for g in out["gpus"]] == ["failed", "ok", "ok", "ok"]  # 0000:1b:00 is GPU 0
    assert "0000:ee:00" in out["findings"][0]["reason"]  # a GPU the snapshot lacks: node-scoped


def test_missing_kernel_log_is_could_not_check(capsys, tmp_path):
    snapshot = DATA / "nvidia-smi-h100-healthy.xml"
    assert main(["check", "--from-nvidia-smi", str(snapshot), "--kernel-log", str(tmp_path / "nope")]) == 3
    assert "nope" in capsys.readouterr().err

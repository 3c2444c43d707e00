"""tools/gpu_check.py judges the runs it makes: fed a wrong outcome, each judgement fails.

`make test` runs the whole check in its dry mode (CPU and the simulated node); these tests feed
its judges the outcomes a broken GPU path would produce.
"""

from __future__ import annotations

import contextlib
import importlib.util
import sys
from pathlib import Path

import pytest

_PATH = Path(__file__).resolve().parent.parent / "tools" / "gpu_check.py"
_spec = importlib.util.spec_from_file_location("gpu_check", _PATH)
assert _spec is not None and _spec.loader is not None
gpu_check = importlib.util.module_from_spec(_spec)
sys.modules["gpu_check"] = gpu_check  # dataclasses look their module up
_spec.loader.exec_module(gpu_check)

REFERENCE = {"exit_code": 0, "weights": "abc", "incidents": []}


def _run(**changes):
    run = {
        "exit_code": 0,
        "weights": "abc",
        "stack_dumps": ["rank0-1.txt"],
        "incidents": [{"rank": 0, "action": "rollback", "detected_by": "numerics"}],
    }
    return {**run, **changes}


def test_a_clean_nan_drill_passes():
    assert gpu_check._judge_drill("nan", _run(), REFERENCE, 1) == []


@pytest.mark.parametrize(
    ("name", "changes", "problem"),
    [
        ("nan", {"weights": "abd"}, "final weights differ"),
        ("nan", {"weights": None}, "final weights differ"),
        ("nan", {"exit_code": 1}, "exit 1"),
        ("nan", {"incidents": [{"rank": 0, "action": "restart", "detected_by": "numerics"}]}, "no rollback"),
        ("kill", {"incidents": [{"rank": 0, "action": "restart", "detected_by": "exit_code"}]}, "rank 1"),
        ("kill", {"incidents": []}, "rank 1"),
        ("hang", {"incidents": [{"rank": 1, "action": "restart", "detected_by": "exit_code"}]}, "no hang"),
        ("hang", {"stack_dumps": []}, "no stack dump"),
    ],
)
def test_a_wrong_outcome_fails_its_drill(name, changes, problem):
    base = (
        _run()
        if name == "nan"
        else _run(incidents=[{"rank": 1, "action": "restart", "detected_by": "heartbeat"}])
    )
    problems = gpu_check._judge_drill(name, {**base, **changes}, REFERENCE, 2)
    assert any(problem in p for p in problems), problems


def test_on_a_gpu_a_hang_without_an_nccl_flight_recorder_dump_fails():
    hang = _run(
        incidents=[{"rank": 1, "action": "restart", "detected_by": "heartbeat"}],
        flight_recorder_dumps=[],
    )
    assert gpu_check._judge_drill("hang", hang, REFERENCE, 2) == []  # dry mode: gloo, best effort
    problems = gpu_check._judge_drill("hang", hang, REFERENCE, 2, flight=True)
    assert any("flight-recorder" in p for p in problems), problems
    dumped = {**hang, "flight_recorder_dumps": ["fr_rank_1"]}
    assert gpu_check._judge_drill("hang", dumped, REFERENCE, 2, flight=True) == []


def test_junit_counts_read_pytests_report(tmp_path):
    xml = tmp_path / "r.xml"
    xml.write_text(
        '<testsuites><testsuite tests="5" failures="1" errors="0" skipped="2"></testsuite></testsuites>'
    )
    assert gpu_check._junit_counts(xml) == {"tests": 5, "failures": 1, "errors": 0, "skipped": 2}
    assert gpu_check._junit_counts(tmp_path / "missing.xml")["tests"] == 0


def test_the_last_json_document_is_found_after_log_lines():
    assert gpu_check._json('warning: x\n{"verdict": "pass"}\n') == {"verdict": "pass"}
    assert gpu_check._json("no json at all") is None


def test_a_stage_whose_module_is_missing_fails_naming_the_fix():
    missing = {"pytest": "ModuleNotFoundError: No module named 'pytest'"}
    why = gpu_check.missing_for("pytest", missing)
    assert why is not None and "pytest" in why and "make gpu-check-wheels" in why
    assert gpu_check.missing_for("diagnose", missing) is None  # diagnose needs no pytest
    assert gpu_check.missing_for("agent", {"aiohttp": "x"}) is not None
    no_torch = gpu_check.missing_for("diagnose", {"torch": "ModuleNotFoundError"})
    assert no_torch is not None and "GPU image" in no_torch and "gpu-check-wheels" not in no_torch


def test_wheels_for_another_python_are_not_unpacked(tmp_path):
    import zipfile

    wheels = tmp_path / "wheels"
    wheels.mkdir()
    here = f"cp{sys.version_info.major}{sys.version_info.minor}"
    for name, module in (
        ("purepkg-1.0-py3-none-any.whl", "purepkg"),
        (f"nativepkg-1.0-{here}-{here}-manylinux_2_17_x86_64.whl", "nativepkg"),
        ("otherpkg-1.0-cp39-cp39-manylinux_2_17_x86_64.whl", "otherpkg"),
    ):
        with zipfile.ZipFile(wheels / name, "w") as zf:
            zf.writestr(f"{module}/__init__.py", "VALUE = 1\n")
    site = tmp_path / "site"
    got = gpu_check._unpack_wheels(wheels, site)
    assert sorted(p.name for p in site.iterdir()) == ["nativepkg", "purepkg"]
    assert len(got) == 2
    assert gpu_check._unpack_wheels(tmp_path / "none", site) == []


def test_skips_are_read_from_pytests_report(tmp_path):
    xml = tmp_path / "r.xml"
    xml.write_text(
        '<testsuites><testsuite tests="2" skipped="2"><testcase name="a">'
        '<skipped type="pytest.skip" message="hardware: needs two GPUs"/></testcase>'
        '<testcase name="b"><skipped message="no nvidia-smi here"/></testcase></testsuite></testsuites>'
    )
    assert gpu_check._junit_skips(xml) == ["hardware: needs two GPUs", "no nvidia-smi here"]


def test_a_gpu_the_driver_lists_is_a_gpu_run_even_when_torch_cannot_use_it(tmp_path, monkeypatch):
    """Not a silent dry run: with nvidia-smi listing a GPU the check runs in GPU mode, and its env
    stage then fails because torch sees none."""
    import torch

    smi = tmp_path / "nvidia-smi"
    smi.write_text("#!/bin/sh\necho 'GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-1234)'\n")
    smi.chmod(0o755)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setenv("PATH", str(tmp_path))
    assert gpu_check.driver_gpus() == ["GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-1234)"]
    assert gpu_check.has_nvidia_gpu()
    smi.write_text("#!/bin/sh\necho 'No devices were found'\n")
    assert not gpu_check.has_nvidia_gpu()


def test_the_wheelhouse_the_makefile_downloads_is_what_the_check_expects():
    import re

    makefile = (_PATH.parent.parent / "Makefile").read_text()
    line = next(x for x in makefile.splitlines() if x.startswith("GPU_WHEELS :="))
    requirements = re.findall(r'"([^"]+)"', line)
    by_requirement = {req: name for name, (req, _) in gpu_check.NEEDED.items()}
    assert {by_requirement.get(r) for r in requirements} == gpu_check.WHEELHOUSE, requirements


def test_a_stopped_check_stops_the_command_its_stage_started(tmp_path):
    # A stage's command runs in its own session (so a timeout can kill its whole group); SIGTERM to
    # the check (a CI job's timeout) used to end the check alone and leave that command running.
    import os
    import signal
    import subprocess
    import time

    pidfile = tmp_path / "pid"
    sleeper = f"import os, pathlib, time; pathlib.Path({str(pidfile)!r}).write_text(str(os.getpid())); time.sleep(600)"
    script = "\n".join(
        [
            "import importlib.util, sys",
            f"spec = importlib.util.spec_from_file_location('gpu_check', {str(_PATH)!r})",
            "g = importlib.util.module_from_spec(spec)",
            "sys.modules['gpu_check'] = g",
            "spec.loader.exec_module(g)",
            f"g.STAGES['sleep'] = lambda check, stage: check.run(stage, [sys.executable, '-c', {sleeper!r}], 600)",
            f"g.main(['--dry', '--stages', 'sleep', '--out', {str(tmp_path / 'out')!r}])",
        ]
    )
    proc = subprocess.Popen([sys.executable, "-c", script])
    pid = None
    try:
        deadline = time.monotonic() + 300  # a ceiling: the loop waits for the command to start
        while not (pidfile.exists() and pidfile.read_text()):
            assert proc.poll() is None and time.monotonic() < deadline, "the stage's command never started"
            time.sleep(0.05)
        pid = int(pidfile.read_text())
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(120) == 128 + signal.SIGTERM
        with pytest.raises(ProcessLookupError):  # killed and reaped by the check
            os.kill(pid, 0)
    finally:
        proc.kill()
        proc.wait()
        if pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)

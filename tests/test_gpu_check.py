"""tools/gpu_check.py judges the runs it makes: fed a wrong outcome, each judgement fails.

`make test` runs the whole check in its dry mode (CPU and the simulated node); these tests feed
its judges the outcomes a broken GPU path would produce.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import sys
import time
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


def _smi(tmp_path, body):
    smi = tmp_path / "bin" / "nvidia-smi"
    smi.parent.mkdir(exist_ok=True)
    smi.write_text("#!/bin/sh\n" + body + "\n")
    smi.chmod(0o755)
    return smi


def test_a_gpu_is_here_when_its_device_files_the_driver_or_nvidia_smi_say_so(tmp_path, monkeypatch):
    dev, proc = tmp_path / "dev", tmp_path / "proc-gpus"
    dev.mkdir()
    (dev / "nvidiactl").touch()  # the control node alone: no GPU
    monkeypatch.setenv("PATH", str(tmp_path / "bin"))
    assert gpu_check.gpu_present(dev, proc) == []
    (dev / "nvidia0").touch()
    assert gpu_check.gpu_present(dev, proc) == [str(dev / "nvidia0")]
    (dev / "nvidia0").unlink()
    (proc / "0000:1a:00.0").mkdir(parents=True)
    assert gpu_check.gpu_present(dev, proc) == [str(proc / "0000:1a:00.0")]
    (proc / "0000:1a:00.0").rmdir()
    _smi(tmp_path, "echo 'GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-1234)'")
    assert gpu_check.gpu_present(dev, proc) == ["nvidia-smi -L: 1 GPU(s)"]
    # a driver that does not answer is a GPU machine that is broken, not a machine without a GPU
    _smi(
        tmp_path,
        'echo "NVIDIA-SMI has failed because it couldn\'t communicate with the NVIDIA driver"; exit 9',
    )
    assert gpu_check.gpu_present(dev, proc)[0].startswith("nvidia-smi -L: exit 9")
    _smi(tmp_path, "echo 'No devices were found'; exit 6")
    assert gpu_check.gpu_present(dev, proc) == []


def test_a_gpu_that_cpu_torch_cannot_use_fails_the_check_instead_of_a_quiet_dry_run(tmp_path, monkeypatch):
    """/dev/nvidia0 and the driver's /proc entry, no nvidia-smi, this CPU build of torch: the check
    runs in GPU mode and fails at env, naming torch and NVML (it used to run dry and pass)."""
    dev, proc = tmp_path / "dev", tmp_path / "proc-gpus"
    dev.mkdir()
    (dev / "nvidia0").touch()
    (proc / "0000:1a:00.0").mkdir(parents=True)
    monkeypatch.setattr(gpu_check, "DEV", dev)
    monkeypatch.setattr(gpu_check, "PROC_GPUS", proc)
    monkeypatch.setenv("PATH", str(tmp_path / "bin"))
    out = tmp_path / "out"
    assert gpu_check.main(["--out", str(out), "--stages", "env,check"]) == 1
    report = json.loads((out / "report.json").read_text())
    assert report["mode"] == "gpu" and report["result"] == "fail"
    [env] = report["stages"]  # nothing after a failed env
    assert (
        env["verdict"] == "fail"
        and "CPU-only build" in env["reason"]
        and str(dev / "nvidia0") in env["reason"]
    )
    assert "NVML cannot open" in env["reason"]


def test_a_cuda_torch_that_sees_no_gpu_or_an_nvml_that_fails_is_unusable():
    cuda_blind = {
        "torch": "2.11.0+cu128",
        "cuda": "12.8",
        "gpus": [],
        "nvml": "ok",
        "gpu_present": ["/dev/nvidia0"],
    }
    [why, fix] = gpu_check.unusable(cuda_blind)
    assert "sees no GPU" in why and "/dev/nvidia0" in why and "--dry" in fix
    no_nvml = {**cuda_blind, "gpus": ["NVIDIA H200"], "nvml": "NVML Shared Library Not Found"}
    assert "NVML cannot open the GPUs: NVML Shared Library Not Found" in gpu_check.unusable(no_nvml)[0]
    assert gpu_check.unusable({**no_nvml, "nvml": "ok"}) == []


def test_hardware_skips_on_a_gpu_make_the_check_partial_not_passed():
    counts = {"tests": 21, "failures": 0, "errors": 0, "skipped": 2}
    two = [
        "hardware: needs two GPUs to exclude one (this machine has 1)",
        "hardware: the NCCL pair test needs two GPUs",
    ]
    verdict, reason = gpu_check.pytest_verdict(0, counts, two, dry=False)
    assert verdict == "partial" and "19 passed" in reason and "NCCL pair" in reason
    assert gpu_check.pytest_verdict(0, counts, [*two[:1], "no nvidia-smi here"], dry=False)[0] == "fail"
    assert gpu_check.pytest_verdict(0, {**counts, "skipped": 0}, [], dry=False)[0] == "pass"
    assert (
        gpu_check.pytest_verdict(0, {**counts, "skipped": 20}, ["needs an NVIDIA GPU (CUDA)"] * 20, dry=True)[
            0
        ]
        == "pass"
    )
    assert gpu_check.overall(["pass", "partial", "pass"], dry=False, left_out=[]) == "partial"
    assert gpu_check.overall(["pass", "pass"], dry=False, left_out=["bench"]) == "partial"
    assert gpu_check.overall(["pass", "pass"], dry=False, left_out=[]) == "pass"
    assert gpu_check.overall(["pass", "partial", "fail"], dry=False, left_out=[]) == "fail"
    assert gpu_check.overall(["pass", "skip"], dry=True, left_out=["bench"]) == "pass"
    assert (gpu_check.EXIT["pass"], gpu_check.EXIT["fail"], gpu_check.EXIT["partial"]) == (0, 1, 2)


def _check(tmp_path, gpus, dry=False, quick=False):
    c = object.__new__(gpu_check.Check)
    c.dry, c.quick, c.gpus, c.logs = dry, quick, gpus, tmp_path
    return c


def test_on_one_gpu_the_train_stage_is_partial_and_quick_runs_only_the_kill_drill(tmp_path, monkeypatch):
    ran = []

    def fake_run(c, s, name, fault, steps, every, nproc):
        ran.append(name)
        incidents = [] if fault is None else [{"rank": fault["rank"], "action": "rollback" if name == "nan" else "restart",
                                                "detected_by": "heartbeat" if name == "hang" else "exit_code"}]  # fmt: skip
        return {
            "exit_code": 0,
            "weights": "w",
            "incidents": incidents,
            "stack_dumps": ["s"],
            "flight_recorder_dumps": ["f"],
        }

    monkeypatch.setattr(gpu_check, "_train_run", fake_run)
    s = gpu_check.Stage("train")
    gpu_check.stage_train(_check(tmp_path, gpus=1), s)
    assert (
        ran == ["reference", "nan", "kill", "hang"]
        and s.verdict == "partial"
        and "hardware" in s.figures["ddp"]
    )
    s, ran[:] = gpu_check.Stage("train"), []
    gpu_check.stage_train(_check(tmp_path, gpus=2), s)
    assert s.verdict == "pass" and "ddp" not in s.figures
    s, ran[:] = gpu_check.Stage("train"), []
    gpu_check.stage_train(_check(tmp_path, gpus=0, dry=True, quick=True), s)
    assert ran == ["reference", "kill"] and s.verdict == "pass"


def test_a_missed_benchmark_target_fails_the_bench_stage_on_a_gpu(tmp_path, monkeypatch):
    """The bench stage used to pass whatever the targets said; on a GPU a miss now fails it."""
    script = tmp_path / "bench_x.py"
    script.write_text(
        "import json, sys\n"
        "print('bench_x: target stall_ratio <= 0.1: 0.4 MISSED', file=sys.stderr)\n"
        "print(json.dumps({'stall_ratio': 0.4}))\nsys.exit(1)\n"
    )
    monkeypatch.setattr(gpu_check, "benches", lambda dry: {"x": [str(script)]})
    c = _check(tmp_path, gpus=1)
    c.env, c.budget_s, c.started = dict(os.environ), 60.0, time.monotonic()
    s = gpu_check.Stage("bench")
    gpu_check.stage_bench(c, s)
    assert s.verdict == "fail" and "stall_ratio <= 0.1" in s.reason, s
    c.dry = True  # tiny CPU runs: the figures are reported, the GPU's targets not judged
    gpu_check.stage_bench(c, s)
    assert s.verdict == "pass" and "not judged" in s.reason and s.figures["targets_missed"]


def test_quick_is_refused_on_a_gpu(tmp_path, monkeypatch):
    dev = tmp_path / "dev"
    dev.mkdir()
    (dev / "nvidia0").touch()
    monkeypatch.setattr(gpu_check, "DEV", dev)
    with pytest.raises(SystemExit) as exc:
        gpu_check.main(["--quick", "--out", str(tmp_path / "out")])
    assert exc.value.code == 2


def test_the_wheelhouse_the_makefile_downloads_is_what_the_check_expects():
    import re

    makefile = (_PATH.parent.parent / "Makefile").read_text()
    line = next(x for x in makefile.splitlines() if x.startswith("GPU_WHEELS :="))
    requirements = re.findall(r'"([^"]+)"', line)
    by_requirement = {req: name for name, (req, _) in gpu_check.NEEDED.items()}
    assert {by_requirement.get(r) for r in requirements} == gpu_check.WHEELHOUSE, requirements


@pytest.mark.slow
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

"""A missing real part (Debian server, browser, shared data) fails `make test-all` and CI with how to
install it, and is a skip that `make test` lists in its summary: never a silent pass."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent
NEEDS = """
from real_parts import require_real

def test_needs_a_missing_tool():
    require_real("trainguard-no-such-tool", install="apt-get install no-such-tool")

def test_needs_a_present_tool():
    assert require_real("sh", install="apt-get install dash").endswith("/sh")
"""


def _pytest(tmp_path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    (tmp_path / "conftest.py").write_text((TESTS / "conftest.py").read_text())
    (tmp_path / "test_needs.py").write_text(NEEDS)
    clean = {k: v for k, v in os.environ.items() if k not in ("CI", "TRAINGUARD_REQUIRE_REAL")}
    clean["PYTHONPATH"] = os.pathsep.join([str(TESTS), clean.get("PYTHONPATH", "")])
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--rootdir", str(tmp_path)],
        cwd=tmp_path,
        env={**clean, **env},
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.parametrize("env", [{"TRAINGUARD_REQUIRE_REAL": "1"}, {"CI": "true"}])
def test_a_missing_real_part_fails_the_run_in_strict_mode(tmp_path, env):
    done = _pytest(tmp_path, **env)
    assert done.returncode == 1, done.stdout
    assert "1 failed, 1 passed" in done.stdout
    assert "missing real part: trainguard-no-such-tool (install: apt-get install no-such-tool)" in done.stdout


@pytest.mark.parametrize("env", [{}, {"CI": "true", "TRAINGUARD_REQUIRE_REAL": "0"}])
def test_a_missing_real_part_is_a_skip_the_summary_names(tmp_path, env):
    done = _pytest(tmp_path, **env)
    assert done.returncode == 0, done.stdout
    assert "1 passed, 1 skipped" in done.stdout
    summary = done.stdout[done.stdout.index("real parts missing: these tests did not run") :]
    assert "test_needs.py::test_needs_a_missing_tool: missing real part: trainguard-no-such-tool" in summary


def test_make_test_all_runs_strict_and_integration_deps_cannot_fail_quietly():
    def dry_run(target: str) -> str:
        env = {k: v for k, v in os.environ.items() if not k.startswith("MAKE")}  # also under `make test`
        done = subprocess.run(
            ["make", "-n", "--no-print-directory", target],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=60,
            env=env,
        )
        assert done.returncode == 0, done.stderr
        return done.stdout

    [pytest_line] = [line for line in dry_run("test-all").splitlines() if "pytest" in line]
    assert "TRAINGUARD_REQUIRE_REAL=1" in pytest_line
    deps = dry_run("integration-deps")
    assert "|| echo" not in deps and "|| true" not in deps
    packages = deps.split("apt-get install -y -q ")[1].split(";")[0].split()
    assert {"chromium", "chromium-driver", "prometheus", "strace", "postgresql", "slurm-wlm", "munge"} <= set(
        packages
    )


def test_the_crash_benchmark_fails_when_strace_is_missing(tmp_path):
    bench = ROOT / "benchmarks" / "bench_crash_consistency.py"
    bin_dir = tmp_path / "bin"  # PATH without strace
    bin_dir.mkdir()
    env = {**os.environ, "PATH": str(bin_dir)}
    args = [sys.executable, str(bench), "--kills", "1", "--corruptions", "1", "--async-kills", "0"]
    done = subprocess.run(
        [*args, "--power-loss-saves", "1"], env=env, capture_output=True, text=True, timeout=240
    )
    assert done.returncode == 1 and "strace not found" in done.stdout, done.stdout + done.stderr
    assert shutil.which("strace", path=str(bin_dir)) is None


# Tests whose real part is an extra `make install` installs (torchft) or a Debian package (the
# browser): each must go through require_real/require_module, never a skip of its own.
ROUTED = [
    "tests/test_ft_ddp.py",
    "tests/test_replicas_run.py",
    "tests/test_demo_groups.py::test_the_replica_groups_demo_passes_its_self_test",
    "tests/test_remediate_agent.py::test_dashboard_shows_an_open_breaker",
]


def _without_torchft_or_browser(tmp_path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    """pytest over ROUTED on a machine without torchft (``None`` in sys.modules: not importable,
    no spec) and with nothing on PATH (no chromium, no chromedriver)."""
    script = "import sys; sys.modules['torchft'] = None; import pytest; sys.exit(pytest.main(sys.argv[1:]))"
    clean = {k: v for k, v in os.environ.items() if k not in ("CI", "TRAINGUARD_REQUIRE_REAL")}
    (tmp_path / "bin").mkdir()
    return subprocess.run(
        [
            sys.executable,
            "-c",
            script,
            "-q",
            "-p",
            "no:cacheprovider",
            "-m",
            "",
            "--continue-on-collection-errors",
            *ROUTED,
        ],
        cwd=ROOT,
        env={**clean, "PATH": str(tmp_path / "bin"), **env},
        capture_output=True,
        text=True,
        timeout=240,
    )


@pytest.mark.slow
def test_a_missing_torchft_or_browser_fails_a_strict_run(tmp_path):
    done = _without_torchft_or_browser(tmp_path, TRAINGUARD_REQUIRE_REAL="1")
    assert done.returncode != 0, done.stdout[-3000:]
    assert "2 failed" in done.stdout and "2 errors" in done.stdout, done.stdout[-3000:]
    assert "missing real part: python module torchft" in done.stdout
    assert "missing real part: chromium" in done.stdout


@pytest.mark.slow
def test_a_missing_torchft_or_browser_is_a_listed_skip_in_make_test(tmp_path):
    done = _without_torchft_or_browser(tmp_path)
    assert done.returncode == 0, done.stdout[-3000:]
    summary = done.stdout[done.stdout.index("real parts missing: these tests did not run") :]
    for target in ROUTED:
        assert target.split("::")[0] in summary, summary


def test_no_test_skips_a_missing_part_on_its_own():
    """Every skip in tests/ for something missing goes through real_parts (so CI fails on it): the
    other hand-written skips are for GPU hardware, judged by `make gpu-check` on a GPU machine, or
    for a kernel capability the machine withholds (CAP_SYS_NICE: Docker's root has none).
    (A bare ``importorskip("numpy")`` guards an import the package itself needs; one that says how
    to install its module is a real part and must be a ``require_module``.)"""
    # GPU hardware, or a kernel capability a container may withhold (nothing a package installs)
    gpu_only = re.compile(r"hardware:|GPU|NVIDIA|NVML|nvidia-smi|CUDA|driver|/proc|CAP_SYS_NICE")
    offenders = []
    for path in sorted(TESTS.glob("*.py")):
        if path.name in ("real_parts.py", "test_gpu_paths.py"):  # the helper; the gpu-marked file
            continue
        text = path.read_text()
        for m in re.finditer(
            r"pytest\.skip\([^\n]*|\.skipif\([^\n]*|importorskip\((?:[^()]|\([^()]*\))*\)", text
        ):
            call = m.group(0)
            if call.startswith("importorskip") and "reason=" not in call:
                continue
            if not gpu_only.search(call):
                offenders.append(f"{path.name}:{text[: m.start()].count(chr(10)) + 1}: {call}")
    assert offenders == []

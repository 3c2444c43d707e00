"""A missing real part (Debian server, browser, shared data) fails `make test-all` and CI with how to
install it, and is a skip that `make test` lists in its summary: never a silent pass."""

from __future__ import annotations

import os
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

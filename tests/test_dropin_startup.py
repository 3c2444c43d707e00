"""A failure that is the same on every try, under `trainguard run`, for scripts that never import
trainguard (tests/workers/startup_*.py, flaky_start.py): the second identical failure before any
step stops the job with the crash-loop exit code (3) and the cause on one line; a failure that
differs from try to try is retried as before."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

WORKERS = Path(__file__).parent / "workers"
pytestmark = pytest.mark.slow


def run(tmp_path: Path, *argv: str, nproc: int = 2) -> tuple[int, dict, str]:
    args = [sys.executable, "-m", "trainguard.cli", "run", "--standalone", "--nproc-per-node", str(nproc)]
    args += ["--db", str(tmp_path / "tg.db"), "--runs-dir", str(tmp_path / "runs")]
    args += ["--json", str(tmp_path / "result.json"), "--max-restarts", "5", "--backoff-base", "0.1", *argv]
    proc = subprocess.run(args, capture_output=True, text=True, timeout=600, cwd=tmp_path)
    result_file = tmp_path / "result.json"
    assert result_file.exists(), proc.stderr[-3000:]
    return proc.returncode, json.loads(result_file.read_text()), proc.stderr


def last_line(stderr: str) -> str:
    return stderr.strip().splitlines()[-1]


def assert_stopped_on_second_try(code: int, result: dict, stderr: str, *cause: str) -> None:
    assert code == 3, stderr[-3000:]
    assert result["status"] == "crash_loop" and result["attempts"] == 2
    assert [i["action"] for i in result["incidents"]] == ["restart", "stop_crash_loop"]
    final = last_line(stderr)
    assert final.startswith("trainguard run: crash_loop (exit 3): "), final
    for text in cause:
        assert text in final, final


def test_the_worker_scripts_never_import_trainguard():
    for script in ("startup_import_error.py", "startup_config_error.py", "flaky_start.py"):
        code = [line.strip() for line in (WORKERS / script).read_text().splitlines()]
        assert not [line for line in code if line.startswith(("import trainguard", "from trainguard"))]


def test_a_missing_module_stops_on_the_second_try(tmp_path):
    code, result, err = run(tmp_path, str(WORKERS / "startup_import_error.py"))
    assert_stopped_on_second_try(
        code,
        result,
        err,
        "ModuleNotFoundError: No module named 'webdataset_that_is_not_installed'",
        "@ startup_import_error.py:12",
    )


@pytest.mark.parametrize("record", [False, True], ids=["stderr", "torchelastic-error-file"])
def test_a_config_error_before_the_first_step_stops_on_the_second_try(tmp_path, record):
    flags = ["--record"] if record else []
    code, result, err = run(tmp_path, str(WORKERS / "startup_config_error.py"), *flags)
    assert_stopped_on_second_try(code, result, err, "KeyError: 'lr' @ startup_config_error.py:27")


def test_a_syntax_error_stops_on_the_second_try(tmp_path):
    script = tmp_path / "train.py"  # written here: a broken file under tests/ would break the linters
    script.write_text("import os\n\ndef main(:\n    pass\n")
    code, result, err = run(tmp_path, str(script), nproc=1)
    assert_stopped_on_second_try(code, result, err, "SyntaxError: ", "@ train.py:3")


def test_a_missing_script_stops_on_the_second_try_naming_it(tmp_path):
    code, result, err = run(tmp_path, "no_such_train.py", nproc=1)
    assert_stopped_on_second_try(code, result, err, "can't open file", "no_such_train.py")


@pytest.mark.parametrize("launcher", ["torch", "local"])
def test_a_missing_command_is_named_without_a_traceback(tmp_path, launcher):
    code, result, err = run(tmp_path, "--launcher", launcher, "--", "no-such-trainer", nproc=1)
    assert_stopped_on_second_try(code, result, err, "cannot run 'no-such-trainer': command not found")
    assert "Traceback" not in err


def test_a_start_that_fails_differently_each_try_is_retried_until_it_works(tmp_path):
    tries = tmp_path / "tries"
    code, result, err = run(tmp_path, str(WORKERS / "flaky_start.py"), "--tries", str(tries), nproc=1)
    assert code == 0, err[-3000:]
    assert result["attempts"] == 3 and tries.read_text() == "3"
    assert [i["action"] for i in result["incidents"]] == ["restart", "restart"]

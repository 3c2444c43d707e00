"""Exit codes and errors the docs state, for input a user gets wrong or a node that cannot be
tested: `diagnose` with no usable GPU, `logs scan` on a binary file, a store URL of an unknown
scheme, an unknown `--scenario`, `logs follow` on a binary file (issue 36, point 5)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from trainguard.cli import main


def test_diagnose_with_no_usable_gpu_could_not_run_instead_of_passing(tmp_path: Path) -> None:
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}  # torch sees no GPU, as with a broken driver
    proc = subprocess.run(
        [sys.executable, "-m", "trainguard.cli", "diagnose"],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert proc.returncode == 3, proc.stdout + proc.stderr
    assert "could not run: no usable GPU" in proc.stderr and "--backend sim" in proc.stderr
    assert "PASS" not in proc.stdout


def test_open_target_auto_as_a_library_call_tests_the_cpu_where_no_gpu_is_usable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # docs/diagnose.md: the library's open_target("auto") falls back to the CPU, the CLI (a gate)
    # does not; the target says which it opened.
    from trainguard.diagnose import open_target, torch_device
    from trainguard.errors import BackendError

    monkeypatch.setattr(torch_device, "cuda_count", lambda: 0)  # no usable GPU, on any host
    target = open_target("auto")
    try:
        assert (target.kind, target.gpus_found, len(target.devices)) == ("cpu", 0, 1)
    finally:
        target.close()
    with pytest.raises(BackendError, match="no usable GPU: torch sees no CUDA device"):
        open_target("auto", cpu_fallback=False)


def test_diagnose_on_the_simulated_node_still_runs_and_passes(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["diagnose", "--backend", "sim", "--quiet"]) == 0
    assert main(["diagnose", "--scenario", "healthy", "--quiet"]) == 0
    assert "verdict: PASS (exit 0)" in capsys.readouterr().out


def test_logs_scan_of_a_binary_file_is_an_error_naming_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    binary = tmp_path / "model.bin"
    binary.write_bytes(Path(sys.executable).read_bytes()[:65536])
    assert main(["logs", "scan", str(binary)]) == 2
    err = capsys.readouterr().err
    assert f"error: {binary}: a binary file, not a log" in err


@pytest.mark.parametrize("from_start", [[], ["--from-start"]])
def test_logs_follow_of_a_binary_file_is_the_same_error_naming_it(
    from_start: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    binary = tmp_path / "model.bin"
    binary.write_bytes(Path(sys.executable).read_bytes()[:65536])
    assert main(["logs", "follow", str(binary), "--max-seconds", "0.2", *from_start]) == 2
    err = capsys.readouterr().err
    assert f"error: {binary}: a binary file, not a log" in err


def test_logs_follow_of_a_log_with_a_few_nul_lines_still_follows_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    log = tmp_path / "syslog"
    xid = b"NVRM: Xid (PCI:0000:3b:00): 79, pid=1, GPU has fallen off the bus.\n"
    log.write_bytes(b"boot\n" + b"\0" * 4096 + b"\n" + xid + b"line\n")
    assert main(["logs", "follow", str(log), "--from-start", "--max-seconds", "0.2"]) == 0
    assert "fallen off the bus" in capsys.readouterr().out


def test_logs_scan_of_a_log_with_a_few_nul_lines_still_reads_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    log = tmp_path / "syslog"  # a log after a power loss: a block of NULs among the lines
    xid = b"NVRM: Xid (PCI:0000:3b:00): 79, pid=1, GPU has fallen off the bus.\n"
    log.write_bytes(b"boot\n" + b"\0" * 4096 + b"\n" + xid + b"line\n")
    assert main(["logs", "scan", str(log)]) == 0
    captured = capsys.readouterr()
    assert "fallen off the bus" in captured.out and "skipped 1 binary" in captured.err


@pytest.mark.parametrize(
    "command",  # the flag where each command takes it: run's trailing words are the script's
    [
        ["incidents", "list", "--db", "URL"],
        ["report", "job", "--db", "URL"],
        ["run", "--db", "URL", "train.py"],
    ],
)
def test_a_store_url_of_an_unknown_scheme_names_the_ones_that_work(
    command: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    assert main([w.replace("URL", "mysql://tg@db.example/fleet") for w in command]) == 2
    err = capsys.readouterr().err
    assert "mysql:// is not a store" in err and "postgresql://" in err and "SQLite" in err
    assert list(tmp_path.iterdir()) == []  # not taken for a file name, nothing started


def test_an_unknown_store_scheme_in_the_environment_stops_a_run_before_it_starts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("TRAINGUARD_DB", "mysql://tg@db.example/fleet")
    assert main(["run", "--nproc-per-node", "1", "train.py"]) == 2
    assert "mysql:// is not a store" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    ("command", "code"),
    # check and diagnose are gates whose 2 means "failed": a bad flag there is 3 (could not
    # check / could not run), so a typo never drains a node; elsewhere a bad flag is 2 (usage).
    [(["check"], 3), (["diagnose"], 3), (["monitor", "--once"], 2)],
)
def test_an_unknown_scenario_exits_with_the_documented_usage_code(
    command: list[str], code: int, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main([*command, "--scenario", "no-such-scenario"]) == code
    assert "unknown scenario 'no-such-scenario'" in capsys.readouterr().err

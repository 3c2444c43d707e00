"""`trainguard logs scan|follow`: output formats, exit codes, errors."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

from trainguard.cli import main

DATA = Path(__file__).parent / "data"
KERNEL = DATA / "kernel" / "variants.log"
TRAINING = DATA / "training" / "rank_failures.log"
KEYS = {"path", "line_no", "kind", "xid", "pci", "category", "severity", "action", "sympathetic", "text"}


def _json_lines(text: str) -> list[dict]:
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def test_scan_json_prints_one_object_per_finding(capsys):
    assert main(["logs", "scan", "--json", str(KERNEL), str(TRAINING)]) == 0
    rows = _json_lines(capsys.readouterr().out)
    assert all(row.keys() >= KEYS for row in rows)
    kernel = [r for r in rows if r["path"] == str(KERNEL)]
    assert len(kernel) == 29
    first = kernel[0]
    assert (first["line_no"], first["kind"], first["xid"], first["pci"]) == (1, "xid", 79, "0000:3b:00")
    assert (first["severity"], first["action"], first["sympathetic"]) == ("fatal", "reboot_node", False)
    assert {r["kind"] for r in kernel} == {"xid", "sxid", "gpu_lost", "gpu_map"}
    training = [r for r in rows if r["path"] == str(TRAINING)]
    assert {r["kind"] for r in training} == {"training"} and all(r["xid"] is None for r in training)
    assert any(r["xid"] == 45 and r["sympathetic"] for r in kernel)


def test_scan_table_has_a_header_and_a_row_per_finding(capsys):
    assert main(["logs", "scan", str(KERNEL)]) == 0
    out, err = capsys.readouterr()
    lines = out.splitlines()
    assert lines[0].startswith("PATH:LINE") and "SEVERITY" in lines[0]
    assert len(lines) == 1 + 29
    assert f"{KERNEL}:1 " in lines[1] and "reboot_node" in lines[1]
    assert "29 finding(s)" in err


def test_missing_path_is_named_and_exits_2(tmp_path, capsys):
    missing = tmp_path / "nope.log"
    assert main(["logs", "scan", "--json", str(missing), str(KERNEL)]) == 2
    out, err = capsys.readouterr()
    assert str(missing) in err
    assert len(_json_lines(out)) == 29  # the readable file is still scanned


def test_garbage_is_counted_on_stderr_not_a_crash(tmp_path, capsys):
    path = tmp_path / "bin.log"
    # a log with garbage in it (most lines text): a file mostly not text is refused (test_cli_exits)
    path.write_bytes(b"\x00\xff" * 100 + b"\nNVRM \xc3\x28\nKilled\nstep 1\nstep 2\n")
    assert main(["logs", "scan", "--json", str(path)]) == 0
    out, err = capsys.readouterr()
    assert [r["line_no"] for r in _json_lines(out)] == [3]
    assert "skipped 2" in err


def test_logs_without_an_action_prints_usage(capsys):
    assert main(["logs"]) == 2
    assert "scan" in capsys.readouterr().out


def test_follow_classifies_a_file_until_the_deadline(tmp_path, capsys):
    log = tmp_path / "kern.log"
    log.write_text(KERNEL.read_text(encoding="utf-8"), encoding="utf-8")
    argv = [
        "logs",
        "follow",
        str(log),
        "--json",
        "--from-start",
        "--max-seconds",
        "0.3",
        "--interval",
        "0.05",
    ]
    assert main(argv) == 0
    rows = _json_lines(capsys.readouterr().out)
    assert len(rows) == 29 and rows[0]["line_no"] == 1 and rows[0]["xid"] == 79


def test_console_script_scans_stdin():
    exe = shutil.which("trainguard", path=str(Path(sys.executable).parent))
    cmd = (
        [exe, "logs", "scan", "--json", "-"]
        if exe
        else [sys.executable, "-m", "trainguard.cli", "logs", "scan", "--json", "-"]
    )
    line = (
        "[ 1234.567890] NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python, GPU has fallen off the bus.\n"
    )
    done = subprocess.run(cmd, input=line.encode(), capture_output=True, timeout=60)
    assert done.returncode == 0, done.stderr
    row = json.loads(done.stdout)
    assert (row["path"], row["xid"], row["pci"]) == ("-", 79, "0000:3b:00")


def test_follow_of_a_missing_path_is_an_error_naming_it(tmp_path, capsys):
    missing = tmp_path / "nope.log"
    assert main(["logs", "follow", str(missing), "--max-seconds", "0.1"]) == 2
    assert str(missing) in capsys.readouterr().err


def test_scan_prints_one_finding_per_failure_unless_every_line_is_asked(tmp_path, capsys):
    log = tmp_path / "rank2.log"
    log.write_text(
        "[rank2]: RuntimeError: CUDA error: uncorrectable ECC error encountered\n"
        "[rank2]: Compile with `TORCH_USE_CUDA_DSA` to enable device-side assertions.\n"
        "[rank2]:[E1124 10:14:02.5 1 ProcessGroupNCCL.cpp:1895] [PG ID 0 PG GUID 0(default_pg) Rank 2] Process group "
        "watchdog thread terminated with exception: CUDA error: uncorrectable ECC error encountered\n"
    )
    assert main(["logs", "scan", "--json", str(log)]) == 0
    assert [json.loads(line)["line_no"] for line in capsys.readouterr().out.splitlines()] == [1]
    assert main(["logs", "scan", "--json", "--every-line", str(log)]) == 0
    assert [json.loads(line)["line_no"] for line in capsys.readouterr().out.splitlines()] == [1, 3]


def test_merge_docstring_example_runs():
    import doctest

    import trainguard.detect.merge as merge

    result = doctest.testmod(merge)
    assert result.attempted > 0 and result.failed == 0

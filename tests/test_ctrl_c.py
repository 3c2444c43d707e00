"""Ctrl-C quits the commands that run until it, also when they were started with SIGINT ignored
(`cmd &` in a script or a CI runner), where Python installs no KeyboardInterrupt handler."""

from __future__ import annotations

import signal
import subprocess
import sys

from trainguard.cli.interrupt import CtrlC


def test_ctrl_c_ends_a_sleep_early_and_the_previous_handler_comes_back():
    before = signal.getsignal(signal.SIGINT)
    with CtrlC() as ctrl_c:
        assert not ctrl_c.sleep(0.01)
        signal.raise_signal(signal.SIGINT)
        assert ctrl_c.sleep(3600) and ctrl_c.pressed  # at once: an hour's wait would time the test out
    assert signal.getsignal(signal.SIGINT) == before


def test_logs_follow_quits_on_sigint_when_started_with_sigint_ignored(tmp_path):
    log = tmp_path / "kern.log"
    log.write_text("")
    proc = subprocess.Popen(
        [sys.executable, "-m", "trainguard.cli", "logs", "follow", str(log), "--interval", "0.05"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN),
    )
    try:
        assert proc.stdout is not None
        header = proc.stdout.readline()  # printed once it is following (its handler is in place)
        assert b"PATH:LINE" in header
        proc.send_signal(signal.SIGINT)
        code = proc.wait(timeout=20)
        rest = proc.stdout.read()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert code == 130  # interrupted, as with a default SIGINT
    assert b"Traceback" not in rest


def test_logs_follow_loads_its_scan_engine_before_it_says_it_follows(tmp_path, monkeypatch):
    # The header tells a user (and the test above) that Ctrl-C now quits cleanly: it comes once the
    # engine's import is done (where a Ctrl-C would meet CPython's defect in cli.interrupt).
    from trainguard.cli import logs, main
    from trainguard.detect import prefilter

    prefilter._hyperscan_db.cache_clear()
    seen: list[int] = []
    header = logs.emit_header
    monkeypatch.setattr(
        logs,
        "emit_header",
        lambda *a: (seen.append(prefilter._hyperscan_db.cache_info().currsize), header(*a)),
    )
    log = tmp_path / "kern.log"
    log.write_text("")
    assert main(["logs", "follow", str(log), "--max-seconds", "0"]) == 0
    assert seen == [1]


def test_python_m_exits_with_the_status_main_chose_after_a_ctrl_c_caught_in_an_exec(tmp_path):
    # CPython (3.11) marks a KeyboardInterrupt that left an exec of a string as unhandled, and under
    # `python -m` it then ends the process by SIGINT (-2) whatever main returned (cli.interrupt).
    # The Ctrl-C lands in an exec here as it can in any import that builds a namedtuple.
    (tmp_path / "caught.py").write_text(
        "import runpy\n"
        "import trainguard.cli\n"
        "def main():\n"
        "    try:\n"
        "        exec('raise KeyboardInterrupt')\n"
        "    except KeyboardInterrupt:\n"
        "        return 130\n"
        "trainguard.cli.main = main\n"
        "runpy.run_module('trainguard.cli', run_name='__main__')\n"
    )
    run = subprocess.run([sys.executable, "-m", "caught"], cwd=tmp_path, capture_output=True, timeout=60)
    assert run.returncode == 130, run.stderr.decode()

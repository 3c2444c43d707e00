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
    # A Ctrl-C that lands in hyperscan's first import makes CPython (3.11.7) exit by SIGINT although
    # main returned 130 (cli.interrupt): the header, which tells a user (and the test above) that
    # Ctrl-C now quits cleanly, comes only once that import is done.
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

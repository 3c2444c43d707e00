"""trainguard.procs: every process we start dies with its parent; stop-signal handlers come and go."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

from trainguard.procs import DIE_WITH_PARENT_EXEC, install, stop_signals

# A middle process that starts a sleeper with `parent_death()`, says its pid, then waits.
_MIDDLE = """
import subprocess, sys
from trainguard.procs import parent_death
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], preexec_fn=parent_death())
print(child.pid, flush=True)
child.wait()
"""


def _gone(pid: int, within_s: float = 60.0) -> bool:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.05)
    return False


def test_a_child_dies_with_its_parent():
    middle = subprocess.Popen([sys.executable, "-c", _MIDDLE], stdout=subprocess.PIPE, text=True)
    try:
        assert middle.stdout is not None
        child = int(middle.stdout.readline())
        middle.kill()
        middle.wait()
        assert _gone(child), f"pid {child} outlived its parent"
    finally:
        if middle.poll() is None:
            middle.kill()
            middle.wait()


def test_a_process_whose_parent_is_already_gone_dies_at_once():
    # The parent it was told of (pid 1) is not its parent: that one died before the signal was armed.
    code = "from trainguard.procs import die_with_parent; die_with_parent(1); print('ran')"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == -signal.SIGKILL and "ran" not in out.stdout


def test_the_exec_snippet_becomes_the_program_only_under_its_parent():
    ok = subprocess.run(
        [sys.executable, "-S", "-c", DIE_WITH_PARENT_EXEC, str(os.getpid()), "echo", "hello"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert (ok.returncode, ok.stdout) == (0, "hello\n")
    orphan = subprocess.run(
        [sys.executable, "-S", "-c", DIE_WITH_PARENT_EXEC, "1", "echo", "hello"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert (orphan.returncode, orphan.stdout) == (1, "")


def test_stop_signal_handlers_are_put_back_after_the_block():
    before = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)}
    seen: list[int] = []
    with stop_signals(lambda signum, _frame: seen.append(signum)):
        signal.raise_signal(signal.SIGHUP)
    assert seen == [signal.SIGHUP]
    assert {s: signal.getsignal(s) for s in before} == before


def test_handlers_are_installed_only_from_the_main_thread():
    before = signal.getsignal(signal.SIGTERM)
    seen: list[object] = []

    def off_main() -> None:
        restore = install([signal.SIGTERM], signal.SIG_IGN)
        seen.append(signal.getsignal(signal.SIGTERM))
        restore()

    t = threading.Thread(target=off_main)
    t.start()
    t.join()
    assert seen == [before]


def test_die_with_parent_with_a_poll_keeps_running_under_a_live_parent():
    code = (
        "import os; from trainguard.procs import die_with_parent; "
        "die_with_parent(os.getppid(), poll_s=0.01); import time; time.sleep(0.2); print('alive')"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert (out.returncode, out.stdout) == (0, "alive\n")

"""The session's leak check (tests/conftest.py) finds what a test left running, and only that."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from conftest import MARK_VAR, leaked

ROOT = 100


def fake_proc(tmp_path: Path, procs: dict[int, tuple[int, str, str, dict[str, str]]]) -> Path:
    """A /proc with pid -> (ppid, state, cmdline, environ)."""
    for pid, (ppid, state, cmd, env) in procs.items():
        d = tmp_path / "proc" / str(pid)
        d.mkdir(parents=True)
        (d / "stat").write_text(f"{pid} ({cmd.split()[0][:15]} x) {state} {ppid} 1 1 0 -1\n")
        (d / "cmdline").write_bytes(cmd.replace(" ", "\0").encode() + b"\0")
        (d / "environ").write_bytes(b"\0".join(f"{k}={v}".encode() for k, v in env.items()) + b"\0")
    (tmp_path / "proc" / "self").mkdir()
    return tmp_path / "proc"


def test_orphans_with_the_sessions_mark_descendants_and_tmp_users_are_leaks(tmp_path):
    mark = {MARK_VAR: "100-abc"}
    proc = fake_proc(
        tmp_path,
        {
            ROOT: (1, "S", "python -m pytest", mark),
            201: (ROOT, "S", "python worker.py", {}),  # a child that dropped the environment
            202: (201, "S", "python grandchild.py", {}),
            301: (1, "S", "python standby.py", mark),  # reparented to init, still marked
            302: (1, "S", "python run.py --dir /tmp/pytest-7/test_x0/ckpt", {}),
            401: (1, "S", "python other_session.py", {MARK_VAR: "999-zzz"}),
            402: (1, "S", "python run.py --dir /tmp/pytest-71/test_x0", {}),  # another session's tmp
            403: (ROOT, "Z", "python reaped_soon.py", mark),  # a zombie is already dead
            404: (1, "S", "bash", {"HOME": "/root"}),
        },
    )
    found = {p.pid for p in leaked("100-abc", ROOT, "/tmp/pytest-7", proc)}
    assert found == {201, 202, 301, 302}


def test_a_real_child_left_running_is_found_until_it_is_reaped():
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        assert child.pid in {p.pid for p in leaked(os.environ[MARK_VAR], os.getpid())}
    finally:
        child.kill()
        child.wait()
    assert child.pid not in {p.pid for p in leaked(os.environ[MARK_VAR], os.getpid())}

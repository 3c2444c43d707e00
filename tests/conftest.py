"""Session-wide guard: no process started by a test outlives the test run.

Every process the run starts inherits ``TRAINGUARD_TEST_SESSION`` (set here, before any test);
at the end, a process still alive that carries this session's mark in its environment, runs
under the pytest process, or names the session's temporary directory in its command line, is a
leak. Leaks get a few seconds to exit (a supervisor's teardown may still be reaping), then
are killed, listed, and fail the run.
"""

from __future__ import annotations

import contextlib
import multiprocessing.forkserver
import multiprocessing.resource_tracker
import os
import shutil
import signal
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest

MARK_VAR = "TRAINGUARD_TEST_SESSION"
GRACE_S = 5.0
_PROC = Path("/proc")


@dataclass(frozen=True, slots=True)
class Proc:
    pid: int
    cmdline: str


def _ppid_and_state(pid: int, proc: Path) -> tuple[int, str] | None:
    try:
        stat = (proc / str(pid) / "stat").read_text()
    except OSError:
        return None
    # The command name (field 2) is in parentheses and may contain spaces or ')'.
    fields = stat[stat.rindex(")") + 2 :].split()
    return int(fields[1]), fields[0]


def leaked(mark: str, root: int, tmp_dir: str | None = None, proc: Path = _PROC) -> list[Proc]:
    """Live processes (not zombies, not ``root`` itself) started by the test run that ``mark``
    and ``root`` (the pytest pid) identify."""
    needle = f"{MARK_VAR}={mark}".encode()
    table: dict[int, tuple[int, str]] = {}
    for entry in proc.iterdir():
        if entry.name.isdigit() and (info := _ppid_and_state(int(entry.name), proc)) is not None:
            table[int(entry.name)] = info
    out = []
    for pid, (_ppid, state) in table.items():
        if pid == root or state in ("Z", "X"):
            continue
        try:
            environ = (proc / str(pid) / "environ").read_bytes()
            cmdline = (proc / str(pid) / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:  # gone, or another user's
            continue
        ours = needle in environ.split(b"\0") or (tmp_dir is not None and f"{tmp_dir}/" in cmdline)
        if ours or _descends_from(pid, root, table):
            out.append(Proc(pid, cmdline.strip()))
    return out


def _descends_from(pid: int, root: int, table: dict[int, tuple[int, str]]) -> bool:
    seen = set()
    while pid in table and pid not in seen:
        seen.add(pid)
        pid = table[pid][0]
        if pid == root:
            return True
    return False


def pytest_configure(config: pytest.Config) -> None:
    os.environ[MARK_VAR] = f"{os.getpid()}-{uuid.uuid4().hex[:12]}"
    # Checkpoints are signed with the user's key (~/.config/trainguard/checkpoint.key, made on
    # the first save): the tests, and every process they start, use one of their own instead.
    keys = Path(tempfile.mkdtemp(prefix="tg-keys-"))
    os.environ["TRAINGUARD_CHECKPOINT_KEY_FILE"] = str(keys / "checkpoint.key")
    for name in (
        "TRAINGUARD_CHECKPOINT_KEY",
        "TRAINGUARD_CHECKPOINT_ALLOW_UNSIGNED",
        "TRAINGUARD_CHECKPOINT_ENCRYPT",
    ):
        os.environ.pop(name, None)
    config.add_cleanup(lambda: shutil.rmtree(keys, ignore_errors=True))


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    # multiprocessing's forkserver and resource tracker serve this pytest process and end when it
    # does (they read a pipe to it); stop them now so that only real leaks remain.
    multiprocessing.forkserver._forkserver._stop()  # type: ignore[attr-defined]
    multiprocessing.resource_tracker._resource_tracker._stop()  # type: ignore[attr-defined]
    mark = os.environ.get(MARK_VAR, "")
    # The session's temporary directory, if a test asked for one (never create it here).
    basetemp = getattr(getattr(session.config, "_tmp_path_factory", None), "_basetemp", None)
    tmp_dir = str(basetemp) if basetemp is not None else None
    deadline = time.monotonic() + GRACE_S
    left = leaked(mark, os.getpid(), tmp_dir)
    while left and time.monotonic() < deadline:
        time.sleep(0.2)
        left = leaked(mark, os.getpid(), tmp_dir)
    if not left:
        return
    for p in left:
        with contextlib.suppress(OSError):  # it ended meanwhile
            os.kill(p.pid, signal.SIGKILL)
    session.config.stash[_LEAKS] = left
    session.exitstatus = pytest.ExitCode.TESTS_FAILED


_LEAKS = pytest.StashKey[list[Proc]]()


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter, config: pytest.Config) -> None:
    _summarize_missing_real_parts(terminalreporter)
    left = config.stash.get(_LEAKS, [])
    if left:
        terminalreporter.section("processes left running by the tests (killed now)", red=True)
        for p in left:
            terminalreporter.line(f"pid {p.pid}: {p.cmdline[:200]}")
        terminalreporter.line("Every process a test starts must end with it (see tests/conftest.py).")


def _summarize_missing_real_parts(terminalreporter: pytest.TerminalReporter) -> None:
    """Tests skipped for a missing real part (tests/real_parts.py): said, never silent. Under
    TRAINGUARD_REQUIRE_REAL=1 or CI=true (`make test-all`) they failed instead."""
    from real_parts import MISSING

    skipped = [
        (r.nodeid, str(r.longrepr[2]) if isinstance(r.longrepr, tuple) else str(r.longrepr))
        for r in terminalreporter.stats.get("skipped", [])
    ]
    missing = [(node, why) for node, why in skipped if MISSING in why]
    if not missing:
        return
    terminalreporter.section("real parts missing: these tests did not run", yellow=True)
    for node, why in missing:
        terminalreporter.line(f"{node}: {why[why.index(MISSING) :]}")
    terminalreporter.line(
        "`make test-all` (CI) fails on each of these; `make integration-deps` installs the Debian ones."
    )

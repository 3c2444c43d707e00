"""A warm standby runs a script as `python script.py` would: exit codes, tracebacks, threads,
atexit, files; and it dies with its supervisor. No torch here: the standby preloads nothing."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from real_parts import require_real


def job_line(tmp_path: Path, *argv: str) -> str:
    """The line the pool hands a standby: run ``argv`` in ``tmp_path``, output to out.txt, err.txt."""
    job = {
        "argv": list(argv),
        "env": {**os.environ},
        "cwd": str(tmp_path),
        "stdout": str(tmp_path / "out.txt"),
        "stderr": str(tmp_path / "err.txt"),
    }
    return json.dumps(job) + "\n"


def run_in_standby(tmp_path: Path, script: str, *args: str) -> tuple[int, str]:
    path = tmp_path / "script.py"
    path.write_text(textwrap.dedent(script))
    proc = subprocess.run(
        [sys.executable, "-m", "trainguard.supervisor.standby"],
        input=job_line(tmp_path, str(path), *args),
        text=True,
        timeout=60,
    )
    return proc.returncode, (tmp_path / "err.txt").read_text()


def hand_job(proc: subprocess.Popen[bytes], script: Path, tmp_path: Path) -> None:
    """Hand ``script`` to the waiting standby ``proc``, as the pool does, and wait for the rank."""
    assert proc.stdin is not None
    proc.stdin.write(job_line(tmp_path, str(script)).encode())
    proc.stdin.close()
    assert proc.wait(60) == 0, (tmp_path / "err.txt").read_text()


def test_a_finished_script_exits_0_after_its_threads_and_atexit_handlers(tmp_path):
    code, _ = run_in_standby(
        tmp_path,
        """
        import atexit, threading, time
        log = open("log.txt", "w")          # never closed: still on disk afterwards
        log.write("unflushed line")
        atexit.register(lambda: open("atexit.txt", "w").write("ran"))
        def late():
            time.sleep(0.3)
            open("thread.txt", "w").write("joined")
        threading.Thread(target=late).start()
        """,
    )
    assert code == 0
    assert (tmp_path / "thread.txt").read_text() == "joined"
    assert (tmp_path / "atexit.txt").read_text() == "ran"
    assert (tmp_path / "log.txt").read_text() == "unflushed line"


@pytest.mark.parametrize(
    ("call", "expected"), [("sys.exit(3)", 3), ("sys.exit()", 0), ("sys.exit('bye')", 1)]
)
def test_sys_exit_gives_the_exit_code_python_gives(tmp_path, call, expected):
    code, err = run_in_standby(tmp_path, f"import sys\n{call}\n")
    assert code == expected
    assert ("bye" in err) == (call == "sys.exit('bye')")


def test_a_user_traceback_starts_at_the_script_without_standby_or_runpy_frames(tmp_path):
    code, err = run_in_standby(
        tmp_path,
        """
        def train():
            raise ValueError("bad batch")
        train()
        """,
    )
    assert code == 1
    assert err.startswith("Traceback (most recent call last):\n")
    frames = [line for line in err.splitlines() if line.lstrip().startswith("File ")]
    assert len(frames) == 2 and all("script.py" in f for f in frames), err
    assert "runpy" not in err and "standby" not in err
    assert err.rstrip().endswith("ValueError: bad batch")


def test_the_script_sees_its_own_argv_and_main_name(tmp_path):
    code, _ = run_in_standby(
        tmp_path,
        """
        import sys
        assert __name__ == "__main__"
        open("argv.txt", "w").write(" ".join(sys.argv[1:]))
        """,
        "--epochs",
        "3",
    )
    assert code == 0
    assert (tmp_path / "argv.txt").read_text() == "--epochs 3"


def test_a_standby_dies_when_its_parent_is_killed(tmp_path):
    # The parent starts a standby (idle) and a second one that became a rank, then is killed -9.
    (tmp_path / "rank.py").write_text("import time\ntime.sleep(120)\n")
    job = {
        "argv": [str(tmp_path / "rank.py")],
        "env": dict(os.environ),
        "cwd": str(tmp_path),
        "stdout": str(tmp_path / "o"),
        "stderr": str(tmp_path / "e"),
    }
    parent = textwrap.dedent(
        f"""
        import json, subprocess, sys, time
        from trainguard.supervisor.warm import WarmPool
        pool = WarmPool(preload=(), refill_delay_s=0.0)
        pool.fill(1)
        rank, _ = pool._take()
        rank.stdin.write((json.dumps({job!r}) + "\\n").encode()); rank.stdin.close()
        pool.fill(1)
        deadline = time.monotonic() + 120
        while not pool._idle and time.monotonic() < deadline:  # the refill has started
            time.sleep(0.05)
        print(rank.pid, *[s.proc.pid for s in pool._idle], flush=True)
        time.sleep(120)
        """
    )
    proc = subprocess.Popen([sys.executable, "-c", parent], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    pids = [int(p) for p in proc.stdout.readline().split()]
    assert len(pids) == 2 and all(_alive(p) for p in pids)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and any(_alive(p) for p in pids):
        time.sleep(0.05)
    left = [p for p in pids if _alive(p)]
    for p in left:
        os.kill(p, signal.SIGKILL)
    assert left == []


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[-1].split()[0]
    except OSError:
        return False
    return state != "Z"


def test_when_no_standby_can_start_the_ranks_start_cold_and_the_pool_lives_on(tmp_path):
    # exec of a standby can fail (EFAULT, EAGAIN, ENOMEM): the agent must get None, never wait.
    from trainguard.supervisor.warm import WarmPool

    pool = WarmPool(preload=(), refill_delay_s=0.0)

    def cannot_start(nice: int = 0) -> subprocess.Popen[bytes]:
        raise OSError(14, "Bad address")

    pool._spawn = cannot_start  # type: ignore[method-assign]
    try:
        pool.fill(2)
        script = tmp_path / "train.py"
        script.write_text("")
        for _ in range(2):  # the spawner thread survived the first failure
            assert pool.start("trainer", sys.executable, {0: (str(script),)}, {0: {}}, None) is None
        assert pool._spawner.is_alive()
    finally:
        pool.close()
    assert not pool._spawner.is_alive()


def test_a_pool_not_filled_yet_starts_the_ranks_cold_and_starts_no_standby(tmp_path):
    # The job's first start (the pool fills once an attempt has settled): a standby started
    # now would import its preloads beside the ranks, and then the script: torch's cold start.
    from trainguard.supervisor.logs import make_logs_specs
    from trainguard.supervisor.warm import WarmPool

    script = tmp_path / "train.py"
    script.write_text("print('ran', flush=True)\n")
    specs = make_logs_specs(lambda: tmp_path / "logs")
    pool = WarmPool(preload=(), refill_delay_s=600.0)
    spawned: list[int] = []
    spawn = pool._spawn

    def counted(nice: int = 0) -> subprocess.Popen[bytes]:
        proc = spawn(nice)
        spawned.append(proc.pid)
        return proc

    pool._spawn = counted  # type: ignore[method-assign]
    try:
        assert pool.start("trainer", sys.executable, {0: (str(script),)}, {0: {}}, specs) is None
        assert spawned == [] and pool.take_use() is None
        pool.fill(1)
        deadline = time.monotonic() + 60
        while not spawned and time.monotonic() < deadline:  # the fill's standby, not one for the start
            time.sleep(0.05)
        warm = pool.start("trainer", sys.executable, {0: (str(script),)}, {0: {}}, specs)
        assert warm is not None and len(spawned) == 1
        assert warm.subprocess_handlers[0].proc.wait(60) == 0
    finally:
        pool.close()
    assert (tmp_path / "logs" / "rank0.stdout").read_text() == "ran\n"


def test_a_rank_killed_while_its_standby_still_imports_keeps_its_log_files(tmp_path, monkeypatch):
    # A standby opens the rank's log files when it reads its job, after its imports: the files
    # must exist from the rank's start (as torch's start_processes makes them), outlive a kill
    # that comes first, and outlive the next attempt.
    from trainguard.supervisor.logs import make_logs_specs
    from trainguard.supervisor.warm import WarmPool

    gate = tmp_path / "gate"
    (tmp_path / "slow_import.py").write_text(
        f"import os, time\nwhile not os.path.exists({str(gate)!r}):\n    time.sleep(0.05)\n"
    )
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))  # the pool's standbys take this environment
    script = tmp_path / "train.py"
    script.write_text("import os\nprint('rank', os.environ['RANK'], 'started', flush=True)\n")
    attempt = [0]
    specs = make_logs_specs(lambda: tmp_path / "logs" / f"attempt{attempt[0]}")
    args = {lr: (str(script),) for lr in (0, 1)}
    files = ["rank0.stderr", "rank0.stdout", "rank1.stderr", "rank1.stdout"]
    pool = WarmPool(preload=("slow_import",), refill_delay_s=600.0)
    pool.fill(2)
    try:
        first = pool.start("trainer", sys.executable, args, {lr: {"RANK": str(lr)} for lr in args}, specs)
        assert first is not None
        assert sorted(p.name for p in (tmp_path / "logs" / "attempt0").iterdir()) == files
        first.close(signal.SIGKILL)  # both ranks die before their script's first line
        attempt[0] = 1
        second = pool.start("trainer", sys.executable, args, {lr: {"RANK": str(lr)} for lr in args}, specs)
        assert second is not None
        gate.touch()
        codes = [h.proc.wait(60) for h in second.subprocess_handlers.values()]
    finally:
        pool.close()
    assert codes == [0, 0]
    assert sorted(p.name for p in (tmp_path / "logs" / "attempt0").iterdir()) == files
    assert (tmp_path / "logs" / "attempt1" / "rank1.stdout").read_text() == "rank 1 started\n"


def test_a_standby_imports_at_low_priority_and_runs_its_job_at_the_priority_it_started_with(tmp_path):
    from trainguard.supervisor.standby import NICE_ENV
    from trainguard.supervisor.warm import can_restore_priority

    if not can_restore_priority():
        pytest.skip("going back from nice 19 needs CAP_SYS_NICE or RLIMIT_NICE: the pool does not nice here")
    script = tmp_path / "script.py"
    script.write_text(
        "import os\n"
        "nices = [int(open(f'/proc/self/task/{t}/stat').read().rsplit(')', 1)[1].split()[16])\n"
        "         for t in os.listdir('/proc/self/task')]\n"
        "open('nice.txt', 'w').write(' '.join(map(str, nices)))\n"
    )
    start = os.getpriority(os.PRIO_PROCESS, 0)
    proc = subprocess.Popen(
        [sys.executable, "-m", "trainguard.supervisor.standby"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, env={**os.environ, NICE_ENV: "19"},
    )  # fmt: skip
    try:
        assert proc.stdout is not None and proc.stdout.readline() == b"ready\n"
        idle = Path(f"/proc/{proc.pid}/stat").read_text().rsplit(")", 1)[1].split()[16]
        assert int(idle) == 19  # importing (here: nothing) and waiting, at low priority
        hand_job(proc, script, tmp_path)
    finally:
        proc.kill()
        proc.wait()
    nices = [int(n) for n in (tmp_path / "nice.txt").read_text().split()]
    assert nices and all(n == start for n in nices)  # every thread of the rank, the main one included


def test_the_pool_imports_at_the_jobs_priority_where_it_could_not_go_back(monkeypatch):
    from trainguard.supervisor import warm

    assert warm.can_restore_priority("CapEff:\t0000000000800000\n", nice_limit=0)  # CAP_SYS_NICE
    assert not warm.can_restore_priority("CapEff:\t0000000000000000\n", nice_limit=0)  # a user's default
    assert warm.can_restore_priority("CapEff:\t0000000000000000\n", nice_limit=20)  # RLIMIT_NICE allows 0
    monkeypatch.setattr(warm, "can_restore_priority", lambda: False)
    pool = warm.WarmPool(preload=(), refill_nice=19)
    try:
        assert pool.refill_nice == 0
    finally:
        pool.close()
    monkeypatch.setattr(warm, "can_restore_priority", lambda: True)
    pool = warm.WarmPool(preload=(), refill_nice=19)
    try:
        assert pool.refill_nice == 19
    finally:
        pool.close()


def test_a_standby_in_its_own_session_lowers_its_autogroup_too_and_its_rank_runs_at_the_start_one(tmp_path):
    # With autogroup scheduling every session gets an equal CPU share and nice counts only inside
    # a session: a standby (its own session, as the pool starts it) at nice 19 alone imported
    # torch at full weight beside the first start's ranks.
    from trainguard.supervisor.standby import AUTOGROUP, NICE_ENV
    from trainguard.supervisor.warm import can_restore_priority

    def group_nice(pid: int) -> int:
        return int(Path(f"/proc/{pid}/autogroup").read_text().rsplit("nice", 1)[1])

    if not can_restore_priority():
        pytest.skip("going back from nice 19 needs CAP_SYS_NICE or RLIMIT_NICE: the pool does not nice here")
    require_real(
        "autogroup scheduling", install="a kernel with CONFIG_SCHED_AUTOGROUP", found=Path(AUTOGROUP).exists()
    )
    script = tmp_path / "script.py"
    script.write_text("open('group.txt', 'w').write(open('/proc/self/autogroup').read())\n")
    # This process's group, as the kernel shows it: empty where its session never left the
    # default group (no setsid since init, as under a CI runner); the standby's is its own.
    own = Path(AUTOGROUP).read_text()
    proc = subprocess.Popen(
        [sys.executable, "-m", "trainguard.supervisor.standby"], start_new_session=True,
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, env={**os.environ, NICE_ENV: "19"},
    )  # fmt: skip
    try:
        assert proc.stdout is not None and proc.stdout.readline() == b"ready\n"
        assert group_nice(proc.pid) == 19  # waiting, its session at low weight
        hand_job(proc, script, tmp_path)
    finally:
        proc.kill()
        proc.wait()
    assert Path(AUTOGROUP).read_text() == own  # the supervisor's own session untouched
    text = (tmp_path / "group.txt").read_text()
    assert int(text.rsplit("nice", 1)[1]) == 0, text  # the rank ran at its group's start weight (a new one's: 0)

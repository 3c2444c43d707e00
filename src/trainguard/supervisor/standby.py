"""A warm standby worker: an interpreter that has already imported torch, waiting to become a rank.

    python -m trainguard.supervisor.standby torch torch.distributed

Imports the named modules, says ``ready`` on stdout (the pool hands out ready standbys first),
then reads ONE JSON job from stdin (``argv``, ``env``, ``cwd``,
``stdout``, ``stderr``), redirects its output into the rank's log files, takes the rank's
environment and runs the training script as ``__main__`` — what ``python script.py`` would do,
minus the seconds of interpreter start and ``import torch``. An empty stdin means "not needed":
it exits quietly.

The script ends as under ``python script.py``: its exit code, its traceback (without this
module's and runpy's frames), then Python's own shutdown steps: non-daemon threads are joined,
atexit handlers run, files still open for writing are flushed. What is left after that,
finalising the modules this standby preloaded (torch's C++ objects among them), is skipped:
nothing of the script's is left to lose there, and it is where torch can hang a finished
process (C++ threads of gloo and the autograd engine releasing Python objects while the
interpreter is torn down: pytorch/pytorch#190489). torch sized its thread pool at import, before
the rank's environment arrived; the rank's OMP_NUM_THREADS is applied when the job arrives.

A standby the pool starts to fill or refill itself imports at low priority (nice 19, where the
pool may go back: ``TRAINGUARD_STANDBY_NICE``; with Linux's autogroup scheduling, its session's
group at nice 19 too, `set_autogroup_nice`) and returns to its start priority, every thread of
it, the moment a job arrives.

A standby dies with the supervisor that started it (parent-death signal, and a parent poll for
the case where the parent died before the signal was armed), also once it has become a rank.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import runpy
import select
import signal
import sys
import threading
import time
from types import TracebackType
from typing import NoReturn

from trainguard.procs import die_of, die_with_parent

PARENT_ENV = "TRAINGUARD_STANDBY_PARENT"  # the pid of the supervisor that started it
NICE_ENV = "TRAINGUARD_STANDBY_NICE"  # import at this nice value; the rank runs at the parent's
READY = b"ready\n"  # written to stdout once the preloads are imported


def main(modules: list[str]) -> int:
    # Killed when the pool's thread that started it exits; the poll covers non-Linux hosts.
    die_with_parent(int(os.environ.pop(PARENT_ENV, "") or os.getppid()), poll_s=1.0)
    low = _import_at_low_priority(os.environ.pop(NICE_ENV, ""))
    for name in modules:
        with contextlib.suppress(ImportError):  # a missing preload only costs the time it saves
            importlib.import_module(name)
    with contextlib.suppress(OSError):  # the pool may have stopped listening: it only ranks standbys
        os.write(1, READY)
    line = sys.stdin.readline()
    if low is not None:
        low.back()  # the watcher thread may not have run yet
    if not line.strip():
        return 0
    job = json.loads(line)
    _redirect(1, job["stdout"])
    _redirect(2, job["stderr"])
    os.environ.clear()
    os.environ.update(job["env"])
    os.chdir(job.get("cwd") or os.getcwd())
    _apply_thread_env()
    if os.environ.get("PYTHONFAULTHANDLER"):
        import faulthandler

        faulthandler.enable(all_threads=True)
    _exit(_run(job["argv"]))


def _run(argv: list[str]) -> int:
    """Run the script as ``__main__``; its exit code as ``python`` would give it."""
    try:
        if argv[0] == "-m":
            sys.argv = argv[1:]
            sys.path.insert(0, os.getcwd())
            runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
        else:
            sys.argv = argv
            sys.path.insert(0, os.path.dirname(os.path.abspath(argv[0])))
            runpy.run_path(argv[0], run_name="__main__")
    except SystemExit as exc:
        return _exit_status(exc.code)
    except KeyboardInterrupt as exc:
        _report(exc)
        return -int(signal.SIGINT)
    except BaseException as exc:  # an uncaught error of the script: its traceback, exit 1
        _report(exc)
        return 1
    return 0


def _exit_status(code: object) -> int:
    """``sys.exit(code)`` as the interpreter maps it: None -> 0, int -> itself, else print -> 1."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    print(code, file=sys.stderr)
    return 1


def _report(exc: BaseException) -> None:
    """Print the traceback through ``sys.excepthook`` (the script may have set its own),
    starting at the script's frame, as ``python script.py`` shows it."""
    tb = _user_frames(exc.__traceback__)
    sys.excepthook(type(exc), exc.with_traceback(tb), tb)  # the default hook prints exc's own


def _user_frames(tb: TracebackType | None) -> TracebackType | None:
    """The traceback without its leading frames in this module and in runpy."""
    ours = {os.path.abspath(__file__), os.path.abspath(runpy.__file__)}
    while tb is not None and (
        os.path.abspath(tb.tb_frame.f_code.co_filename) in ours
        or tb.tb_frame.f_code.co_filename.startswith("<frozen runpy")
    ):
        tb = tb.tb_next
    return tb


def _exit(code: int) -> NoReturn:
    """Python's own exit steps for a finished script, then leave (see the module docstring)."""
    shutdown = getattr(threading, "_shutdown", None)
    if shutdown is not None:
        shutdown()  # joins non-daemon threads, as the interpreter does at exit
    import atexit

    atexit._run_exitfuncs()
    _flush_files()
    if code < 0:  # died of a signal (Ctrl-C): die of it again, as python does
        die_of(-code)
    os._exit(code)


def _flush_files() -> None:
    """Flush every file still open for writing, as finalising them would (a script that never
    closed its log file still finds all of it on disk)."""
    import gc
    import io

    for obj in gc.get_objects():
        # type(), not isinstance(): isinstance reads the object's __class__, and that runs code of
        # the object's own (torch.distributed.reduce_op warns on every attribute it is asked for)
        if issubclass(type(obj), io.IOBase):
            with contextlib.suppress(Exception):
                if not obj.closed and obj.writable():
                    obj.flush()


def _apply_thread_env() -> None:
    """torch sized its thread pool at import, before the rank's environment arrived: apply the
    rank's OMP_NUM_THREADS now (torchrun sets 1 per process by default)."""
    value = os.environ.get("OMP_NUM_THREADS", "")
    torch = sys.modules.get("torch")
    if value.isdigit() and int(value) > 0 and torch is not None:
        torch.set_num_threads(int(value))


def _import_at_low_priority(nice: str) -> _LowPriority | None:
    """Import at ``nice`` (the pool's refill must not take the CPU the ranks need), and go back to
    the priority it started with as soon as a job arrives on stdin, imports finished or not: a
    rank never runs, nor waits on its imports, at low priority. The pool asks for it only where
    going back is allowed (``warm.can_restore_priority``)."""
    if not nice.lstrip("-").isdigit():
        return None
    start = os.getpriority(os.PRIO_PROCESS, 0)
    with contextlib.suppress(OSError):
        os.setpriority(os.PRIO_PROCESS, 0, int(nice))  # this thread: those it starts inherit it
    group = _own_autogroup_nice()  # going back to a value >= 0 needs no privilege
    lowered = group is not None and 0 <= group < int(nice) and set_autogroup_nice(int(nice))
    low = _LowPriority(start, group if lowered else None)

    def restore_when_a_job_arrives() -> None:
        with contextlib.suppress(OSError, ValueError):
            select.select([0], [], [])  # a job line, or EOF: either ends the wait
        low.back()

    threading.Thread(target=restore_when_a_job_arrives, daemon=True, name="standby-priority").start()
    return low


class _LowPriority:
    """The priority a standby started with, to go back to once: its nice value, and its session's
    autogroup nice value when it lowered that too (see `set_autogroup_nice`)."""

    def __init__(self, start: int, group_start: int | None) -> None:
        self.start, self.group_start = start, group_start
        self._lock = threading.Lock()
        self._nice_back = False
        self._group_back = group_start is None

    def back(self) -> None:
        """Back to the start priority before the rank runs (the group's within ~0.1 s: see
        `set_autogroup_nice`)."""
        with self._lock:
            if not self._nice_back:
                restore_priority(self.start)
                self._nice_back = True
            if not self._group_back and self.group_start is not None:
                self._group_back = set_autogroup_nice(self.group_start)


AUTOGROUP = "/proc/self/autogroup"


def _own_autogroup_nice() -> int | None:
    """This session's autogroup nice value, when this process leads a session of its own (the
    pool starts each standby in one) and the kernel schedules by autogroup; else None."""
    if os.getsid(0) != os.getpid():
        return None  # the group is the parent's session's: never ours to change
    try:
        with open(AUTOGROUP) as f:
            return int(f.read().rsplit("nice", 1)[1])
    except (OSError, ValueError, IndexError):
        return None


def set_autogroup_nice(nice: int, tries: int = 50) -> bool:
    """Set this session's autogroup nice value; whether it was set.

    With autogroup scheduling (Linux's default where ``sched_autogroup_enabled`` is 1), every
    session is a scheduling group that gets an equal share of the CPU, and a process's own nice
    value weighs only against the processes of its session. A standby leads a session of its own,
    as each of torch's ranks does, so nice 19 alone left its ``import torch`` an equal share
    beside every rank; the group's nice value is what lowers it. The kernel refuses a change
    within 0.1 s of the last one (EAGAIN) to a process without CAP_SYS_ADMIN: tried again every
    20 ms, ``tries`` times."""
    for attempt in range(tries):
        try:
            fd = os.open(AUTOGROUP, os.O_WRONLY)
            try:
                os.write(fd, str(nice).encode())
            finally:
                os.close(fd)
            return True
        except BlockingIOError:
            if attempt + 1 < tries:
                time.sleep(0.02)
        except OSError:
            return False
    return False


def restore_priority(nice: int) -> None:
    """Every thread of this process back to ``nice`` (Linux keeps a nice value per thread)."""
    try:
        tids = [int(t) for t in os.listdir("/proc/self/task")]
    except OSError:
        tids = [0]
    for tid in tids:
        with contextlib.suppress(OSError):
            os.setpriority(os.PRIO_PROCESS, tid, nice)


def _redirect(fd: int, path: str) -> None:
    target = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(target, fd)
    os.close(target)
    stream = sys.stdout if fd == 1 else sys.stderr
    stream.reconfigure(line_buffering=True)  # type: ignore[union-attr]


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

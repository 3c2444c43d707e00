"""A warm standby worker: an interpreter that has already imported torch, waiting to become a rank.

    python -m trainguard.supervisor.standby torch torch.distributed

Imports the named modules, then reads ONE JSON job from stdin (``argv``, ``env``, ``cwd``,
``stdout``, ``stderr``), redirects its output into the rank's log files, takes the rank's
environment and runs the training script as ``__main__`` — what ``python script.py`` would do,
minus the seconds of interpreter start and ``import torch``. An empty stdin means "not needed":
it exits quietly.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import runpy
import sys
import threading


def main(modules: list[str]) -> int:
    assigned = threading.Event()
    threading.Thread(target=_exit_if_orphaned, args=(os.getppid(), assigned), daemon=True).start()
    for name in modules:
        with contextlib.suppress(ImportError):  # a missing preload only costs the time it saves
            importlib.import_module(name)
    line = sys.stdin.readline()
    if not line.strip():
        return 0
    job = json.loads(line)
    assigned.set()
    _redirect(1, job["stdout"])
    _redirect(2, job["stderr"])
    os.environ.clear()
    os.environ.update(job["env"])
    os.chdir(job.get("cwd") or os.getcwd())
    if os.environ.get("PYTHONFAULTHANDLER"):
        import faulthandler

        faulthandler.enable(all_threads=True)
    argv: list[str] = job["argv"]
    if argv[0] == "-m":
        sys.argv = argv[1:]
        sys.path.insert(0, os.getcwd())
        runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
    else:
        sys.argv = argv
        sys.path.insert(0, os.path.dirname(os.path.abspath(argv[0])))
        runpy.run_path(argv[0], run_name="__main__")
    return 0


def _exit_if_orphaned(parent: int, assigned: threading.Event) -> None:
    """A standby whose supervisor died (killed, not closed) must not linger."""
    while not assigned.wait(1.0):
        if os.getppid() != parent:
            os._exit(0)


def _redirect(fd: int, path: str) -> None:
    target = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(target, fd)
    os.close(target)
    stream = sys.stdout if fd == 1 else sys.stderr
    stream.reconfigure(line_buffering=True)  # type: ignore[union-attr]


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

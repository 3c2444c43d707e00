"""Warm standby workers: restarts without paying interpreter start and ``import torch`` again.

Most of a torchrun restart is process start plus ``import torch`` (seconds on a busy host). The
pool keeps one pre-imported interpreter (`trainguard.supervisor.standby`) per local rank; when the
agent starts a group, each rank's job (argv, torch's environment, log files) is handed to a
standby, which becomes the worker. The pool then refills itself a few seconds later, off the
restart's critical path. Process management stays torch's: the context below has the shape of
torch's ``SubprocessContext`` (``pids``, ``close``, ``subprocess_handlers[i].proc``).

Only ``python [-u] script.py ...`` and ``python -m module ...`` commands run warm (the standby is
a Python interpreter); anything else starts cold, exactly as torchrun would.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import queue
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)


class _Handle:
    """What torch's code and ours read from a worker handle: ``proc`` (a Popen)."""

    def __init__(self, proc: subprocess.Popen[bytes]) -> None:
        self.proc = proc

    def close(self, death_sig: signal.Signals) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, death_sig)


class WarmContext:
    """The running group, shaped like torch's SubprocessContext for the agent's purposes."""

    def __init__(self, handlers: dict[int, _Handle]) -> None:
        self.subprocess_handlers = handlers

    def pids(self) -> dict[int, int]:
        return {lr: h.proc.pid for lr, h in self.subprocess_handlers.items()}

    def close(self, death_sig: signal.Signals | None = None, timeout: float = 30) -> None:
        sig = death_sig or signal.SIGTERM
        for h in self.subprocess_handlers.values():
            if h.proc.poll() is None:
                h.close(sig)
        deadline = time.monotonic() + timeout
        for h in self.subprocess_handlers.values():
            try:
                h.proc.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                h.close(signal.SIGKILL)
                try:
                    h.proc.wait(5)
                except subprocess.TimeoutExpired:
                    log.error("worker %s did not exit after SIGKILL (uninterruptible?)", h.proc.pid)


class WarmPool:
    """Idle standbys, one per local rank. Every standby is started by one long-lived thread of
    the pool: the kernel's parent-death signal a standby arms fires when the *thread* that
    forked it exits, so a short-lived refill timer would kill the standbys it made."""

    def __init__(
        self, preload: tuple[str, ...] = ("torch", "torch.distributed"), refill_delay_s: float = 2.0
    ):
        self.preload = preload
        self.refill_delay_s = refill_delay_s
        self._idle: list[subprocess.Popen[bytes]] = []
        self._lock = threading.Lock()
        self._requests: queue.Queue[tuple[str, int] | None] = queue.Queue()
        self._spawned: queue.Queue[subprocess.Popen[bytes] | OSError] = queue.Queue()
        self._closed = False
        # Our own copy of the environment, taken before the spawner thread exists. Popen with no
        # env hands the C ``environ`` to a vfork'd child; torchrun's main thread sets
        # OMP_NUM_THREADS meanwhile, setenv may move that array, and exec fails with EFAULT.
        # (A standby's environment at start only matters for its imports: the rank's arrives
        # with the job.)
        self._env = dict(os.environ)
        self._spawner = threading.Thread(target=self._serve, name="trainguard-standby-spawner", daemon=True)
        self._spawner.start()

    def fill(self, n: int) -> None:
        """Start standbys until ``n`` are idle (they import in the background)."""
        self._requests.put(("fill", n))

    def can_run(self, entrypoint: Any, args: tuple[Any, ...]) -> bool:
        return isinstance(entrypoint, str) and _is_python(entrypoint) and _script_argv(args) is not None

    def start(
        self,
        role: str,
        entrypoint: str,
        args: dict[int, tuple[Any, ...]],
        envs: dict[int, dict[str, str]],
        logs_specs: Any,
    ) -> WarmContext | None:
        """The ranks started from standbys; None when no standby could be had (start them cold)."""
        taken: list[subprocess.Popen[bytes]] = []
        try:
            for _ in args:
                taken.append(self._take())
        except OSError as e:
            log.warning("%s: no warm standby (%s); starting the workers cold", role, e)
            for proc in taken:
                _kill(proc)
            return None
        dest = logs_specs.reify(envs)  # also sets TORCHELASTIC_ERROR_FILE in each env
        handlers: dict[int, _Handle] = {}
        for lr, proc in zip(sorted(args), taken, strict=True):
            env = {**os.environ, **{k: str(v) for k, v in envs[lr].items() if v is not None}}
            job = {
                "argv": _script_argv(args[lr]),
                "env": env,
                "cwd": os.getcwd(),
                "stdout": dest.stdouts[lr],
                "stderr": dest.stderrs[lr],
            }
            assert proc.stdin is not None
            proc.stdin.write((json.dumps(job) + "\n").encode())
            proc.stdin.close()
            handlers[lr] = _Handle(proc)
        self._schedule_refill(len(args))
        log.info("%s: %d workers started from warm standbys", role, len(handlers))
        return WarmContext(handlers)

    def close(self) -> None:
        """Kill the idle standbys: they hold nothing but imported modules."""
        self._closed = True
        self._requests.put(None)
        self._spawner.join(10)
        with self._lock:
            for p in self._idle:
                _kill(p)
            self._idle = []

    def _take(self) -> subprocess.Popen[bytes]:
        """An idle standby, else a fresh one; OSError when none can be started."""
        with self._lock:
            while self._idle:
                p = self._idle.pop(0)
                if p.poll() is None:
                    return p
        self._requests.put(("one", 1))  # none idle: a standby for the caller, cold
        spawned = self._spawned.get()
        if isinstance(spawned, OSError):
            raise spawned
        return spawned

    def _schedule_refill(self, n: int) -> None:
        # Later, not now: two fresh interpreters importing torch would slow the restarted ranks.
        self._requests.put(("later", n))

    def _serve(self) -> None:
        """The spawner thread; lives as long as the pool."""
        refill_at: float | None = None
        refill_n = 0
        while True:
            timeout = None if refill_at is None else max(0.0, refill_at - time.monotonic())
            try:
                request = self._requests.get(timeout=timeout)
            except queue.Empty:
                request, refill_at = ("fill", refill_n), None
            if request is None:
                return
            what, n = request
            if what == "later":  # the newest refill replaces a pending one
                refill_at, refill_n = time.monotonic() + self.refill_delay_s, n
            elif what == "one":
                try:
                    self._spawned.put(self._spawn())
                except OSError as e:  # the caller starts its ranks cold; this thread lives on
                    self._spawned.put(e)
            else:
                with self._lock:
                    self._idle = [p for p in self._idle if p.poll() is None]
                    try:
                        while len(self._idle) < n and not self._closed:
                            self._idle.append(self._spawn())
                    except OSError as e:
                        log.warning("could not start a warm standby: %s", e)

    def _spawn(self) -> subprocess.Popen[bytes]:
        from trainguard.supervisor.standby import PARENT_ENV

        cmd = [sys.executable, "-m", "trainguard.supervisor.standby", *self.preload]
        return subprocess.Popen(
            cmd,
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
            env={**self._env, PARENT_ENV: str(os.getpid())},  # who it must die with
        )


def _kill(proc: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(OSError):
        proc.kill()
    with contextlib.suppress(OSError, subprocess.TimeoutExpired):
        proc.wait(5)


def _is_python(entrypoint: str) -> bool:
    """The same interpreter as ours (a standby runs under sys.executable)."""
    resolved = shutil.which(entrypoint) or entrypoint
    try:
        return Path(resolved).resolve() == Path(sys.executable).resolve()
    except OSError:
        return False


def _script_argv(args: tuple[Any, ...]) -> list[str] | None:
    """``[-u] script.py a b`` -> ``[script.py, a, b]``; ``-m mod a`` -> ``[-m, mod, a]``; else None."""
    rest = [str(a) for a in args]
    while rest and rest[0] in ("-u", "-B", "-O"):
        rest = rest[1:]
    if len(rest) >= 2 and rest[0] == "-m":
        return rest
    if rest and rest[0].endswith(".py") and Path(rest[0]).is_file():
        return rest
    return None

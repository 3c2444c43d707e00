"""Warm standby workers: restarts without paying interpreter start and ``import torch`` again.

Most of a torchrun restart is process start plus ``import torch`` (seconds on a busy host). The
pool keeps pre-imported interpreters (`trainguard.supervisor.standby`), as many as the supervisor
asks (two per local rank by default: a second fault that comes before the pool has refilled, the
refill importing torch again, still restarts warm). When the agent starts a group, each rank's job
(argv, torch's environment, log files) is handed to a standby, which becomes the worker: ready
ones first (they say so on stdout once their imports are done), then ones still importing, oldest
first, and only when none is left a fresh one. The pool is filled once the job's first attempt
has settled (its first step: `GuardedAgent.settled`; at launch with ``--warm-fill-at-start``);
until then every start is cold, as torchrun's, and no standby imports torch beside the first
start's ranks. After a start the pool refills itself a few seconds later, off the restart's
critical path, and at low priority (nice 19, and its session's autogroup at nice 19: each standby
leads a session, where nice alone weighs nothing against the ranks') where a standby may go back to the
job's priority when it becomes a rank (``can_restore_priority``): on a node whose cores the
ranks use, a refill at their priority slowed their steps for seconds after every restart. What a
start got is its `StandbyUse`. Process management stays torch's: the context below has the shape of torch's ``SubprocessContext`` (``pids``, ``close``,
``subprocess_handlers[i].proc``).

Only ``python [-u] script.py ...`` and ``python -m module ...`` commands run warm (the standby is
a Python interpreter); anything else starts cold, exactly as torchrun would.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import queue
import select
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trainguard.supervisor.standby import NICE_ENV, PARENT_ENV, READY

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class StandbyUse:
    """How the ranks of one start were started: standbys that were ready (imports done), standbys
    still importing, standbys started for this start (no better than cold)."""

    ready: int = 0
    importing: int = 0
    fresh: int = 0

    def to_dict(self) -> dict[str, int]:
        return {"ready": self.ready, "importing": self.importing, "fresh": self.fresh}


class _Standby:
    """An idle standby and whether it has said it is ready."""

    def __init__(self, proc: subprocess.Popen[bytes]) -> None:
        self.proc = proc
        self.ready = False

    def poll_ready(self) -> bool:
        """Read its ``ready`` line if it has written it (never blocks)."""
        out = self.proc.stdout
        if self.ready or out is None or out.closed:
            return self.ready
        try:
            if select.select([out], [], [], 0)[0]:
                self.ready = os.read(out.fileno(), 64).startswith(READY)
        except (OSError, ValueError):
            pass
        return self.ready

    def hand_out(self) -> subprocess.Popen[bytes]:
        """The process, no longer listened to (a late ``ready`` meets a closed pipe: ignored)."""
        if self.proc.stdout is not None:
            with contextlib.suppress(OSError):
                self.proc.stdout.close()
        return self.proc


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
    """Idle standbys, kept at the count the last ``fill`` asked for (the supervisor asks for
    ``--warm-standby-sets`` per local rank). Every standby is started by one long-lived thread of
    the pool: the kernel's parent-death signal a standby arms fires when the *thread* that
    forked it exits, so a short-lived refill timer would kill the standbys it made."""

    def __init__(
        self,
        preload: tuple[str, ...] = ("torch", "torch.distributed"),
        refill_delay_s: float = 2.0,
        refill_nice: int = 19,
    ):
        self.preload = preload
        self.refill_delay_s = refill_delay_s
        # The standbys of a fill import at this nice value, so their seconds of `import torch` take
        # the CPU the ranks leave (on a node whose cores the ranks use, a refill at the ranks'
        # priority slowed their steps 4x for seconds after each restart); 0, or a host where a
        # standby could not go back to normal priority when it becomes a rank: the job's priority.
        self.refill_nice = refill_nice if refill_nice > 0 and can_restore_priority() else 0
        self._idle: list[_Standby] = []  # oldest first
        self._target = 0  # idle standbys to keep
        self.last_use: StandbyUse | None = None  # what the newest start got (None: not started here)
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
        """Start standbys until ``n`` are idle (they import in the background); refills after a
        start keep ``n``."""
        self._target = n
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
        """The ranks started from standbys; None when no standby could be had, or the pool was
        never filled (the job's first start, and a restart before the first attempt settled):
        start them cold, as torchrun would, rather than on standbys started now that import
        their preloads before the script."""
        self.last_use = None
        if self._target == 0:
            return None
        taken: list[subprocess.Popen[bytes]] = []
        kinds: list[str] = []
        try:
            for _ in args:
                proc, kind = self._take()
                taken.append(proc)
                kinds.append(kind)
        except OSError as e:
            log.warning("%s: no warm standby (%s); starting the workers cold", role, e)
            for proc in taken:
                _kill(proc)
            return None
        dest = logs_specs.reify(envs)  # also sets TORCHELASTIC_ERROR_FILE in each env
        try:
            # The ranks' log files exist from their start, as torch's start_processes makes them:
            # a standby still importing opens them only once it reads its job, and a rank killed
            # before that would leave its attempt without them.
            for lr in args:
                _create(dest.stdouts[lr])
                _create(dest.stderrs[lr])
        except OSError as e:
            log.warning("%s: cannot create the workers' log files (%s); starting them cold", role, e)
            for proc in taken:
                _kill(proc)
            return None
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
        self._schedule_refill(max(self._target, len(args)))
        use = StandbyUse(kinds.count("ready"), kinds.count("importing"), kinds.count("fresh"))
        self.last_use = use
        log.info(
            "%s: %d workers started from standbys: %d ready, %d still importing, %d started now",
            role, len(handlers), use.ready, use.importing, use.fresh,
        )  # fmt: skip
        return WarmContext(handlers)

    def take_use(self) -> StandbyUse | None:
        """What the newest start got from the pool, once (None: it was not started here)."""
        use, self.last_use = self.last_use, None
        return use

    def close(self) -> None:
        """Kill the idle standbys: they hold nothing but imported modules."""
        self._closed = True
        self._requests.put(None)
        self._spawner.join(10)
        with self._lock:
            for standby in self._idle:
                _kill(standby.hand_out())
            self._idle = []

    def _take(self) -> tuple[subprocess.Popen[bytes], str]:
        """A standby and what it was: ``ready``, else ``importing`` (the oldest), else ``fresh``;
        OSError when none can be started."""
        with self._lock:
            self._idle = [s for s in self._idle if s.proc.poll() is None]
            for standby in [s for s in self._idle if s.poll_ready()] + self._idle:
                self._idle.remove(standby)
                return standby.hand_out(), "ready" if standby.ready else "importing"
        self._requests.put(("one", 1))  # none idle: a standby for the caller, cold
        spawned = self._spawned.get()
        if isinstance(spawned, OSError):
            raise spawned
        return _Standby(spawned).hand_out(), "fresh"

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
                    self._idle = [s for s in self._idle if s.proc.poll() is None]
                    try:
                        while len(self._idle) < n and not self._closed:
                            self._idle.append(_Standby(self._spawn(self.refill_nice)))
                    except OSError as e:
                        log.warning("could not start a warm standby: %s", e)

    def _spawn(self, nice: int = 0) -> subprocess.Popen[bytes]:
        """A standby; ``nice`` > 0: it imports at that nice value (a fill's, off the critical path),
        else at the job's priority (one a start is waiting for)."""
        cmd = [sys.executable, "-m", "trainguard.supervisor.standby", *self.preload]
        env = {**self._env, PARENT_ENV: str(os.getpid())}  # who it must die with
        if nice > 0:
            env[NICE_ENV] = str(nice)
        return subprocess.Popen(
            cmd,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,  # its "ready" line
            stderr=subprocess.DEVNULL,
            start_new_session=True,
            env=env,
        )


def can_restore_priority(status: str | None = None, nice_limit: int | None = None) -> bool:
    """Whether a process of ours may raise its priority back to ours after lowering it: with
    CAP_SYS_NICE (``status``: /proc/self/status), or when RLIMIT_NICE (``nice_limit``) allows our
    nice value (Linux: 20 - nice <= the limit). Without either (an unprivileged user's default,
    Docker's root), nice is one-way, and a standby must not import at low priority."""
    import resource

    try:
        status = Path("/proc/self/status").read_text() if status is None else status
        cap_eff = int(next(line.split()[1] for line in status.splitlines() if line.startswith("CapEff:")), 16)
    except (OSError, StopIteration, ValueError, IndexError):
        cap_eff = 0
    if cap_eff >> 23 & 1:  # CAP_SYS_NICE
        return True
    if nice_limit is None:
        nice_limit = resource.getrlimit(resource.RLIMIT_NICE)[0]
    return nice_limit == resource.RLIM_INFINITY or 20 - os.getpriority(os.PRIO_PROCESS, 0) <= nice_limit


def _create(path: str) -> None:
    """Create ``path`` if it is not there; never truncate it (the standby appends to it)."""
    os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644))


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

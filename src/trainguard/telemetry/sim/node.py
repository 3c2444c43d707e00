"""``SimNode``: a simulated node of N GPUs, a ``TelemetryBackend`` driven by a clock.

Readings are realistic and deterministic: a function of the seed, the clock time and the faults
scripted so far. Faults are scheduled in seconds after the node started and fire when the
clock passes them (checked on every ``sample()``, ``gpus()`` or ``poll()``); each leaves the
NVML-shaped evidence and kernel lines (appended to ``kmsg_path``) a real one does::

    >>> from trainguard.clock import VirtualClock
    >>> clock = VirtualClock()
    >>> sim = SimNode(n_gpus=8, seed=0, clock=clock)   # kmsg_path="kmsg.log" to write the log
    >>> _ = sim.at(30).xid(79, gpu=3)
    >>> _ = clock.advance(31)
    >>> sim.sample()[3].lost
    True
    >>> sim.kernel_log[-5]
    "[   30.000000] NVRM: Xid (PCI:0000:61:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus."
"""

from __future__ import annotations

import itertools
import os
import random
import threading
import time
from collections import deque
from typing import Any

from trainguard.clock import Clock, RealClock, VirtualClock
from trainguard.errors import ConfigError
from trainguard.records import DriverInfo, Gpu, GpuModes, GpuProcess, Sample
from trainguard.telemetry.sim import kmsg, profiles
from trainguard.telemetry.sim.faults import Fault
from trainguard.telemetry.sim.profiles import GpuProfile
from trainguard.telemetry.sim.script import At
from trainguard.telemetry.sim.state import GpuState

__all__ = ["SimNode"]

_BUSY = 0.05  # the load from which a GPU counts as busy (profiles.baseline uses the same)


class SimNode:
    """N simulated GPUs of one model on one host.

    ``clock`` defaults to the real clock; pass a ``VirtualClock`` for scripted runs. The kernel
    log's dmesg timestamps are seconds since "boot": the virtual time itself on a VirtualClock,
    the monotonic clock (what printk uses) on a real one. ``load`` (0..1) is how busy the GPUs are.
    """

    def __init__(
        self,
        n_gpus: int = 8,
        seed: int = 0,
        clock: Clock | None = None,
        kmsg_path: str | os.PathLike[str] | None = None,
        hostname: str = "node0",
        model: str = "NVIDIA H100 80GB HBM3",
        load: float = 0.97,
        driver_version: str = "550.90.07",
    ) -> None:
        if n_gpus < 1:
            raise ConfigError(f"a simulated node needs at least one GPU (n_gpus={n_gpus})")
        if not 0.0 <= load <= 1.0:
            raise ConfigError(f"load is a fraction between 0 and 1 (load={load})")
        self.seed, self.hostname, self.load = seed, hostname, load
        self.driver_version = driver_version
        self.clock: Clock = clock if clock is not None else RealClock()
        self.kmsg_path = os.fspath(kmsg_path) if kmsg_path is not None else None
        self._profile = profiles.profile_for(model)
        self.start_time = self.clock.time()
        virtual = isinstance(self.clock, VirtualClock)
        self._boot = 0.0 if virtual else self.start_time - time.monotonic()
        self._gpus = [
            Gpu(i, profiles.uuid(seed, hostname, i), profiles.pci_address(i), self._profile.name)
            for i in range(n_gpus)
        ]
        self._quirks = [profiles.Quirks.draw(seed, hostname, i) for i in range(n_gpus)]
        self._states = [GpuState() for _ in range(n_gpus)]
        self._queue: list[tuple[float, int, Fault]] = []
        self._procs: list[GpuProcess] = []
        self._seq = itertools.count()
        self._lock = threading.RLock()
        self.kernel_log: deque[str] = deque(maxlen=100_000)  # every line written, also without a path
        self._boot_lines = [kmsg.driver_banner(driver_version)]
        for gpu in self._gpus:
            serial = profiles.serial(seed, hostname, gpu.index)
            self._boot_lines += kmsg.gpu_map_lines(gpu.pci or "", gpu.uuid or "", serial)
        self.kernel(self.start_time, self._boot_lines)

    # -- TelemetryBackend -------------------------------------------------------------------
    def gpus(self) -> list[Gpu]:
        self.poll()
        return list(self._gpus)

    def sample(self) -> list[Sample]:
        with self._lock:
            now = self.clock.time()
            self._fire_due(now)
            return [self._read(i, now) for i in range(len(self._gpus))]

    def close(self) -> None:
        """Nothing to release; kept for the protocol."""

    def __enter__(self) -> SimNode:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def modes(self, k: int) -> GpuModes:
        """A well-configured node: persistence on, ECC on, MIG off (as NvmlBackend.modes)."""
        return GpuModes(persistence=True, ecc=True, ecc_pending=True, mig=False)

    def processes(self, k: int) -> list[GpuProcess]:
        """As NvmlBackend.processes: the compute processes on GPU ``k`` (none on a lost GPU)."""
        with self._lock:
            st = self._states[k]
            if st.lost_at is not None and self.clock.time() >= st.lost_at:
                return []
            return [p for p in self._procs if p.gpu == k]

    def start_process(
        self,
        gpu: int,
        pid: int,
        command: str,
        user: str = "root",
        job: str | None = None,
        used_mib: float = 512.0,
    ) -> GpuProcess:
        """A compute process appears on ``gpu``: a job's worker (``job=``) or a stranger's (none)."""
        proc = GpuProcess(pid, gpu, used_mib, user, command, job)
        with self._lock:
            self._procs.append(proc)
        return proc

    def end_process(self, pid: int) -> None:
        with self._lock:
            self._procs = [p for p in self._procs if p.pid != pid]

    def driver_info(self) -> DriverInfo:
        """As NvmlBackend.driver_info: the R550 driver supports CUDA 12.4."""
        return DriverInfo(self.driver_version, "12.4", f"12.{self.driver_version}")

    # -- scripting --------------------------------------------------------------------------
    @property
    def elapsed(self) -> float:
        """Seconds since the node started (the time base of ``at``)."""
        return self.clock.time() - self.start_time

    def at(self, t: float) -> At:
        """Script faults ``t`` seconds after the node started: ``sim.at(10).dbe(gpu=2)``."""
        return At(self, t)

    def now(self) -> At:
        """Script faults to fire at once: ``sim.now().xid(13, gpu=1)``."""
        return At(self, self.elapsed)

    def schedule(self, t: float, fault: Fault) -> None:
        """Queue ``fault`` for ``t`` seconds after start; one already due fires immediately."""
        gpu = getattr(fault, "gpu", None)
        if gpu is not None and not 0 <= gpu < len(self._gpus):
            raise ConfigError(
                f"no GPU {gpu} in a node of {len(self._gpus)} (indices 0..{len(self._gpus) - 1})"
            )
        with self._lock:
            self._queue.append((self.start_time + t, next(self._seq), fault))
            self._queue.sort(key=lambda item: (item[0], item[1]))
        self.poll()

    def inject_now(self, fault: Fault) -> None:
        """Fire ``fault`` now (chaos drills, interactive demos)."""
        self.schedule(self.elapsed, fault)

    def poll(self) -> int:
        """Fire every fault whose time has come; returns how many fired."""
        with self._lock:
            return self._fire_due(self.clock.time())

    def pending(self) -> list[tuple[float, Fault]]:
        """Faults not fired yet, as (seconds after start, fault)."""
        with self._lock:
            return [(t - self.start_time, f) for t, _, f in self._queue]

    def set_load(self, load: float | None, gpu: int | None = None) -> None:
        """Change how busy one GPU (or, with ``gpu=None``, the whole sim) is; ``load=None``
        returns a GPU to the node's load."""
        if load is None and gpu is None:
            raise ConfigError("the node's load must be a number; None only returns one GPU to it")
        if load is not None and not 0.0 <= load <= 1.0:
            raise ConfigError(f"load is a fraction between 0 and 1 (load={load})")
        with self._lock:
            if gpu is None:
                self.load = float(load or 0.0)
                return
            st = self._states[gpu]
            was_busy = st.load is not None and st.load >= _BUSY
            st.load = load
            if load is None or load < _BUSY:
                st.busy_since = None
            elif not was_busy:
                st.busy_since = self.clock.time()

    # -- FaultContext -----------------------------------------------------------------------
    @property
    def n_gpus(self) -> int:
        return len(self._gpus)

    @property
    def profile(self) -> GpuProfile:
        return self._profile

    def state(self, gpu: int) -> GpuState:
        return self._states[gpu]

    def identity(self, gpu: int) -> Gpu:
        return self._gpus[gpu]

    def uptime(self, at: float) -> float:
        """The dmesg timestamp of clock time ``at``."""
        return at - self._boot

    def kernel(self, at: float, messages: list[str]) -> None:
        lines = [kmsg.dmesg_line(self.uptime(at), m) for m in messages]
        self.kernel_log.extend(lines)
        if self.kmsg_path is not None:
            kmsg.append_lines(self.kmsg_path, lines)

    def boot_messages(self) -> list[str]:
        """What the driver prints when it loads: banner, then per GPU its PCI -> UUID map line."""
        return list(self._boot_lines)

    def rng(self, *key: object) -> random.Random:
        return random.Random("/".join(map(str, (self.seed, self.hostname, *key))))

    # -- internals --------------------------------------------------------------------------
    def _fire_due(self, now: float) -> int:
        fired = 0
        while self._queue and self._queue[0][0] <= now:
            when, _, fault = self._queue.pop(0)
            fault.fire(self, when)
            fired += 1
        return fired

    def _read(self, i: int, now: float) -> Sample:
        gpu, st = self._gpus[i], self._states[i]
        if st.lost_at is not None and now >= st.lost_at:
            return Sample(gpu=gpu, time=now, lost=True, error=st.lost_error)
        rng = random.Random(f"{self.seed}/{self.hostname}/{i}/{now:.6f}")
        load = self.load if st.load is None else st.load
        r: dict[str, Any] = profiles.baseline(self._profile, self._quirks[i], load, rng)
        r.update(profiles.counters(self._profile, load, now - self.start_time, self.uptime(now)))
        r.update(st.counters())
        r["_busy_s"] = self._busy_seconds(st, load, now)
        for condition in (*st.conditions, *st.defects):
            condition.apply(r, now, self._profile, rng)
        del r["_busy_s"]
        r["throttle"] = frozenset(r["throttle"])
        return Sample(gpu=gpu, time=now, **r)

    def _busy_seconds(self, st: GpuState, load: float, now: float) -> float | None:
        """How long the GPU has been busy: since its own load was raised, else since the start."""
        if load < _BUSY:
            return None
        return now - (st.busy_since if st.busy_since is not None else self.start_time)

    def __repr__(self) -> str:
        return f"SimNode(n_gpus={len(self._gpus)}, seed={self.seed}, model={self._profile.name!r})"

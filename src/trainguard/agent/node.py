"""One node, opened once: its telemetry backend, its kernel-log line source and, when simulated,
the ``SimNode`` that faults are injected into. Every command that watches a node opens it here.

    >>> from trainguard.clock import VirtualClock
    >>> node = open_node("sim", n_gpus=2, clock=VirtualClock())
    >>> node.sim is node.backend, node.kernel_log is not None
    (True, True)
    >>> [s.gpu.index for s in node.backend.sample()]
    [0, 1]
    >>> node.close()

A simulated node writes its kernel log to ``kernel_log`` (a temporary file, removed by
``close()``, unless one is given), so detection reads the same lines a real node's would.
"""

from __future__ import annotations

import logging
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trainguard.errors import ConfigError

if TYPE_CHECKING:
    from trainguard.clock import Clock
    from trainguard.telemetry import TelemetryBackend
    from trainguard.telemetry.lines import LineSource
    from trainguard.telemetry.resume import Cursor
    from trainguard.telemetry.sim import SimNode

log = logging.getLogger(__name__)

__all__ = ["Node", "driver_version", "open_node"]


@dataclass(slots=True)
class Node:
    """What the loops on a node read. ``close()`` releases all of it (NVML, the log, temp files)."""

    backend: TelemetryBackend
    lines: LineSource | None = None  # the kernel log; None: not watched
    sim: SimNode | None = None  # the simulated node (same object as ``backend``), else None
    kernel_log: Path | None = None
    hostname: str = ""
    _tmp: tempfile.TemporaryDirectory[str] | None = field(default=None, repr=False)

    def close(self) -> None:
        for part in (self.lines, self.backend):
            if part is not None:
                part.close()
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None

    def __enter__(self) -> Node:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def open_node(
    backend: str = "nvml",
    *,
    kernel_log: str | os.PathLike[str] | None = None,
    cursor: Cursor | None = None,
    resume: bool = False,
    n_gpus: int = 8,
    seed: int = 0,
    scenario: str = "",
    clock: Clock | None = None,
    hostname: str = "node0",
    load: float | None = None,
    sim: SimNode | None = None,
    **backend_kw: Any,
) -> Node:
    """Open this node (``backend`` "nvml" or "smi-xml", keyword arguments go to the backend) or a
    simulated one ("sim": ``n_gpus``, ``seed``, ``hostname``, ``load``, and ``scenario``'s faults
    scripted). ``sim=`` wraps a ``SimNode`` built elsewhere (a drill that scripted it already).

    ``kernel_log``: the file or ``/dev/kmsg`` to follow; a simulated node without one writes a
    temporary file. ``resume=True`` starts at ``cursor`` (what the agent saved before a restart).
    """
    tmp = None
    log_path = Path(kernel_log) if kernel_log is not None else None
    if backend == "sim" or sim is not None:
        if sim is None:
            sim, tmp, log_path = _sim_node(n_gpus, seed, scenario, clock, hostname, load, log_path)
        elif log_path is None and sim.kmsg_path is not None:
            log_path = Path(sim.kmsg_path)
        backend_obj: Any = sim
    else:
        from trainguard.telemetry import open_backend

        backend_obj = open_backend(backend, **backend_kw)
    try:
        lines = None
        if log_path is not None:
            from trainguard.telemetry.lines import open_lines

            lines = open_lines(log_path, cursor, resume=resume)
    except BaseException:
        backend_obj.close()
        if tmp is not None:
            tmp.cleanup()
        raise
    return Node(backend_obj, lines, sim, log_path, sim.hostname if sim is not None else hostname, tmp)


def _sim_node(
    n_gpus: int,
    seed: int,
    scenario: str,
    clock: Clock | None,
    hostname: str,
    load: float | None,
    log_path: Path | None,
) -> tuple[SimNode, tempfile.TemporaryDirectory[str] | None, Path]:
    from trainguard.telemetry.sim import SCENARIOS, SimNode

    spec = SCENARIOS.get(scenario or "healthy")
    if spec is None:
        raise ConfigError(f"unknown scenario {scenario!r}: choose one of {', '.join(SCENARIOS)}")
    tmp = None
    if log_path is None:  # the simulated kernel log lives as long as the node
        tmp = tempfile.TemporaryDirectory(prefix="trainguard-node-")
        log_path = Path(tmp.name) / "kmsg.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    log_path.touch()
    kw: dict[str, Any] = {} if load is None else {"load": load}
    node = SimNode(n_gpus=n_gpus, seed=seed, clock=clock, kmsg_path=log_path, hostname=hostname, **kw)
    spec.script(node)
    return node, tmp, log_path


def driver_version(backend: Any) -> str:
    """The NVIDIA driver version (a label on every GPU series); "" when the backend cannot say."""
    info = getattr(backend, "driver_info", None)
    if info is None:
        return ""
    try:
        return info().driver or ""
    except Exception:  # a label is not worth failing the start
        log.debug("driver version unreadable", exc_info=True)
        return ""

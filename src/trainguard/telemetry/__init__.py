"""Telemetry: the first stage of the spine. A backend reads every GPU of one node into ``Sample``s.

    telemetry  ->  detect  ->  diagnose  ->  incidents  ->  recover

Three backends share one ``TelemetryBackend`` protocol:

- ``"nvml"``    real GPUs through nvidia-ml-py (``trainguard.telemetry.nvml``, the only pynvml importer)
- ``"sim"``     a simulated fleet with scripted faults (``trainguard.telemetry.sim``)
- ``"smi-xml"`` a saved ``nvidia-smi -q -x`` snapshot (``trainguard.telemetry.smi_xml``)

Example::

    >>> from trainguard.clock import VirtualClock
    >>> backend = open_backend("sim", n_gpus=2, clock=VirtualClock())
    >>> [s.gpu.index for s in backend.sample()]
    [0, 1]
    >>> backend.close()

Backends are imported lazily, so ``import trainguard.telemetry`` stays stdlib-only.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

from trainguard.errors import ConfigError
from trainguard.records import Gpu, Sample

__all__ = ["BACKENDS", "TelemetryBackend", "open_backend"]

BACKENDS = ("nvml", "sim", "smi-xml")


@runtime_checkable
class TelemetryBackend(Protocol):
    """Reads the GPUs of one node.

    ``sample()`` returns one ``Sample`` per GPU, in ``gpus()`` order, and never raises because one
    GPU failed: that GPU's Sample has ``lost=True`` (or None fields) instead.
    """

    def gpus(self) -> list[Gpu]: ...

    def sample(self) -> list[Sample]: ...

    def close(self) -> None: ...


def open_backend(name: str, **kw: Any) -> TelemetryBackend:
    """Open a backend by name: ``"nvml"``, ``"sim"`` or ``"smi-xml"`` (keyword arguments go to it).

    ``open_backend("nvml")`` raises ``BackendUnavailable`` (one line, suggesting ``--backend sim``)
    on a machine without an NVIDIA driver or GPU.
    """
    if name == "nvml":
        from trainguard.telemetry.nvml import NvmlBackend

        return NvmlBackend(**kw)
    if name == "sim":
        from trainguard.telemetry.sim import SimNode

        return SimNode(**kw)
    if name in ("smi-xml", "nvidia-smi"):
        from trainguard.telemetry.smi_xml import SmiXmlBackend

        return SmiXmlBackend(**kw)
    raise ConfigError(f"unknown telemetry backend {name!r}: choose one of {', '.join(BACKENDS)}")

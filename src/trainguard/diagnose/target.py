"""What a diagnostic run runs on: the devices, the software around them and their telemetry.

``open_target("auto")`` picks CUDA when torch sees a GPU, else the CPU; ``"sim"`` opens the
simulated node (or uses the one given, e.g. the supervisor's). Imports torch when called.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from trainguard.diagnose.device import Device
from trainguard.diagnose.level1 import Software
from trainguard.errors import BackendError, ConfigError
from trainguard.records import GpuModes, Sample

__all__ = ["BACKENDS", "Target", "open_target"]

log = logging.getLogger(__name__)

BACKENDS = ("auto", "cuda", "cpu", "sim")


@dataclass
class Target:
    kind: str  # "cuda", "cpu" or "sim"
    devices: list[Device]
    software: Software
    gpus_found: int  # every GPU of the node, selected or not
    telemetry: Any = None  # NvmlBackend or SimNode: sample(), modes(k), driver_info()
    owned: list[Any] = field(default_factory=list)  # what close() must close
    nvml_index: dict[int, int] = field(default_factory=dict)  # device index -> telemetry position

    def reading(self, index: int) -> Sample | None:
        if self.telemetry is None or index not in self.nvml_index:
            return None
        try:
            return list(self.telemetry.sample())[self.nvml_index[index]]
        except Exception as exc:  # telemetry must not stop a diagnostic
            log.debug("telemetry read failed: %s", exc)
            return None

    def modes(self, index: int) -> GpuModes | None:
        if self.telemetry is None or index not in self.nvml_index:
            return None
        try:
            modes: GpuModes = self.telemetry.modes(self.nvml_index[index])
            return modes
        except Exception as exc:
            log.debug("modes read failed: %s", exc)
            return None

    def close(self) -> None:
        for obj in self.owned:
            try:
                obj.close()
            except Exception as exc:
                log.debug("close failed: %s", exc)


def _select(all_indices: Sequence[int], gpus: Sequence[int] | None) -> list[int]:
    if gpus is None:
        return list(all_indices)
    missing = [g for g in gpus if g not in all_indices]
    if missing:
        raise ConfigError(
            f"no GPU {', '.join(map(str, missing))} here: --gpu-ids takes indices among {list(all_indices)}"
        )
    return list(dict.fromkeys(gpus))


def _software(kind: str, driver: Any) -> Software:
    import torch
    import torch.distributed as dist

    nccl = None
    if torch.cuda.is_available() and dist.is_nccl_available():
        v = torch.cuda.nccl.version()
        nccl = ".".join(map(str, v)) if isinstance(v, tuple) else str(v)
    cuda_devices = torch.cuda.device_count() if torch.cuda.is_available() else 0
    return Software(kind, torch.__version__, torch.version.cuda, nccl, cuda_devices, driver)


def open_target(
    backend: str = "auto",
    gpus: Sequence[int] | None = None,
    *,
    sim: Any = None,
    n_sim: int = 8,
    seed: int = 0,
    cpu_fallback: bool = True,
) -> Target:
    """Open the devices of ``backend`` (``--gpus`` indices as NVML/nvidia-smi number them).

    ``auto`` is CUDA, else the CPU; with ``cpu_fallback=False`` (a gate: ``trainguard diagnose``)
    a machine where torch sees no GPU raises `BackendError` instead: a node whose driver is
    missing or broken must not pass by testing its CPU."""
    if backend not in BACKENDS:
        raise ConfigError(f"unknown diagnostics backend {backend!r}: choose one of {', '.join(BACKENDS)}")
    if backend == "sim":
        return _open_sim(gpus, sim, n_sim, seed)
    from trainguard.diagnose.torch_device import TorchDevice, cuda_count

    if backend == "auto" and not cpu_fallback and not cuda_count():
        raise BackendError(f"no usable GPU: torch sees no CUDA device; {_nvml_says()}; {_NO_GPU_HINT}")
    if backend == "auto":
        backend = "cuda" if cuda_count() else "cpu"
    if backend == "cpu":
        _select([0], gpus)
        return Target("cpu", [TorchDevice.cpu()], _software("cpu", None), 0, owned=[_OneThread()])
    if not cuda_count():
        raise BackendError("torch sees no CUDA GPU here; use --backend cpu or --backend sim")
    return _open_cuda(gpus, TorchDevice)


_NO_GPU_HINT = "--backend cpu tests this machine's CPU, --backend sim the simulated node"


def _nvml_says() -> str:
    """Why NVML sees no GPU (the driver's own words), or that it sees some torch cannot use."""
    from trainguard.telemetry.nvml import NvmlBackend

    try:
        nvml = NvmlBackend()
    except BackendError as exc:
        return str(exc).split("; ", 1)[0]
    try:
        return f"NVML sees {len(nvml.gpus())} GPU(s) that torch cannot use"
    finally:
        nvml.close()


def _open_sim(gpus: Sequence[int] | None, sim: Any, n_sim: int, seed: int) -> Target:
    from trainguard.diagnose.sim_device import SimDevice
    from trainguard.telemetry.sim import SimNode

    owned = []
    if sim is None:
        sim = SimNode(n_gpus=n_sim, seed=seed, load=0.0)  # idle until a test loads a GPU
        owned.append(sim)
    chosen = _select(range(sim.n_gpus), gpus)
    least: dict[tuple[Any, ...], float] = {}  # what a product costs: one host does every GPU's work
    devices: list[Device] = [SimDevice(sim, i, least) for i in chosen]
    owned.append(_OneThread())
    return Target(
        "sim",
        devices,
        _software("sim", sim.driver_info()),
        sim.n_gpus,
        sim,
        owned,
        {i: i for i in chosen},
    )


class _OneThread:
    """One intra-op thread while the CPU or simulated GPUs run: each device's work then runs in the
    thread that times it (their ``clock()`` counts that thread's CPU time). Restored on close."""

    def __init__(self) -> None:
        import torch

        self._before = torch.get_num_threads()
        torch.set_num_threads(1)

    def close(self) -> None:
        import torch

        torch.set_num_threads(self._before)


def _open_cuda(gpus: Sequence[int] | None, device_cls: Any) -> Target:
    import torch

    nvml: Any = None
    try:
        from trainguard.telemetry.nvml import NvmlBackend

        nvml = NvmlBackend()
    except BackendError as exc:
        log.warning("no NVML telemetry for the diagnostics (%s)", exc)
    # torch numbers GPUs fastest-first unless CUDA_DEVICE_ORDER=PCI_BUS_ID; match them by UUID.
    by_uuid = {g.uuid: k for k, g in enumerate(nvml.gpus())} if nvml is not None else {}
    position: dict[int, int] = {}  # NVML index -> torch index
    for t in range(torch.cuda.device_count()):
        uuid = f"GPU-{torch.cuda.get_device_properties(t).uuid}"
        position[by_uuid.get(uuid, t)] = t
    chosen = _select(sorted(position), gpus)
    target = Target("cuda", [], _software("cuda", nvml.driver_info() if nvml else None), len(position), nvml)
    if nvml is not None:
        target.owned.append(nvml)
        target.nvml_index = {i: i for i in chosen}
    for i in chosen:
        dev = device_cls(
            i, f"cuda:{position[i]}", torch.cuda.get_device_name(position[i]), "cuda", target.reading
        )
        target.devices.append(dev)
    return target

"""The real device: a CUDA GPU through torch, or the CPU where there is none. Imports torch.

On the CPU the figures are those of one core, timed in the thread's CPU time, so that a host busy
with other work does not read as a slow device.

>>> dev = TorchDevice.cpu()
>>> import torch
>>> dev.matmul(torch.eye(2), torch.ones(2, 2)).sum().item()
4.0
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Iterator
from typing import Any

import torch

from trainguard.records import Sample

__all__ = ["DTYPES", "TorchDevice", "cuda_count"]

DTYPES: dict[str, torch.dtype] = {
    "fp32": torch.float32,
    "tf32": torch.float32,  # fp32 storage, TF32 tensor-core math (allow_tf32)
    "bf16": torch.bfloat16,
    "fp16": torch.float16,
}


def cuda_count() -> int:
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


class TorchDevice:
    """A device torch drives. ``telemetry(index)`` gives its NVML reading (None without NVML)."""

    def __init__(
        self,
        index: int,
        torch_device: str,
        name: str,
        kind: str,
        telemetry: Callable[[int], Sample | None] | None = None,
        cpu_memory_bytes: int = 256 * 2**20,
    ) -> None:
        self.index, self.torch_device, self.name, self.kind = index, torch_device, name, kind
        self._telemetry = telemetry
        self._cpu_memory_bytes = cpu_memory_bytes

    @classmethod
    def cpu(cls, index: int = 0) -> TorchDevice:
        return cls(index, "cpu", f"cpu ({os.cpu_count()} cores; figures per core)", "cpu")

    @classmethod
    def cuda(cls, index: int, telemetry: Callable[[int], Sample | None] | None = None) -> TorchDevice:
        return cls(index, f"cuda:{index}", torch.cuda.get_device_name(index), "cuda", telemetry)

    def sync(self) -> None:
        if self.kind == "cuda":
            torch.cuda.synchronize(self.torch_device)

    def clock(self) -> float:
        # On the CPU, the thread's CPU time: a host busy with other work must not read as a slow
        # device (busy() keeps the device's work in that one thread).
        return time.thread_time() if self.kind == "cpu" else time.perf_counter()

    def matmul(self, a: Any, b: Any) -> Any:
        return a @ b

    def write(self, dst: Any, src: Any) -> None:
        if isinstance(src, torch.Tensor):
            dst.copy_(src)
        else:
            dst.fill_(src)

    def all_reduce(self, group: Any, tensor: Any) -> None:
        group.allreduce([tensor]).wait()

    def link_seconds(self, nbytes: int, ranks: int, wall_s: float) -> float:
        return wall_s

    @contextlib.contextmanager
    def busy(self) -> Iterator[None]:
        if self.kind == "cpu":
            torch.set_num_threads(1)  # per calling thread in OpenMP; the target restores it on close
        yield

    def reading(self) -> Sample | None:
        return self._telemetry(self.index) if self._telemetry is not None else None

    def memory_free(self) -> int:
        if self.kind == "cuda":
            free, _total = torch.cuda.mem_get_info(self.torch_device)
            return int(free)
        return self._cpu_memory_bytes

    def __repr__(self) -> str:
        return f"TorchDevice({self.index}, {self.torch_device!r}, {self.name!r})"

"""Level-2 measurements on one device: matrix-multiply throughput, the SDC workload, memory
bandwidth, the memory pattern test and load for the thermal test. Imports torch.

Every figure is timed around the device's own operations (``Device.matmul``/``write``), so what a
simulated fault does to them shows in the figure. Judgement is in ``judge.py``.
"""

from __future__ import annotations

import contextlib
import hashlib
import threading
import time
from collections.abc import Iterator, Sequence
from typing import Any

import torch

from trainguard.diagnose.device import Device
from trainguard.diagnose.torch_device import DTYPES
from trainguard.records import Sample

__all__ = [
    "copy_bandwidth",
    "matmul_tflops",
    "pattern_test",
    "plain_copy_gbps",
    "plain_matmul_tflops",
    "sdc_digests",
    "stress",
]

_WINDOWS = 3  # timed windows per figure: the best one is reported (robust to a busy host)


@contextlib.contextmanager
def _tf32(on: bool) -> Iterator[None]:
    before = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = on
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32 = before


def _operands(dev: Device, n: int, dtype: torch.dtype, seed: int) -> tuple[Any, Any]:
    g = torch.Generator().manual_seed(seed)
    a = torch.randn(n, n, generator=g).to(dev.torch_device, dtype)
    b = torch.randn(n, n, generator=g).to(dev.torch_device, dtype)
    return a, b


def _best_rate(seconds: float, work: float, step: Any, sync: Any, clock: Any = time.perf_counter) -> float:
    """``work`` units per second of the best of ``_WINDOWS`` windows of repeated ``step()``."""
    best, window = 0.0, seconds / _WINDOWS
    for _ in range(_WINDOWS):
        sync()
        t0, w0, k = clock(), time.perf_counter(), 0
        while True:
            step()
            k += 1
            if k % 4 == 0 or k == 1:
                sync()
                if time.perf_counter() - w0 >= window:
                    break
        sync()
        best = max(best, k * work / max(clock() - t0, 1e-9))
    return best


def matmul_tflops(dev: Device, n: int, dtype: str, seconds: float) -> float:
    """Sustained ``n x n`` matrix-multiply throughput through the device, in TFLOPS."""
    a, b = _operands(dev, n, DTYPES[dtype], seed=0)
    with _tf32(dtype == "tf32"):
        for _ in range(2):  # warm-up: kernel selection, clocks
            dev.matmul(a, b)
        return _best_rate(seconds, 2 * n**3 / 1e12, lambda: dev.matmul(a, b), dev.sync, dev.clock)


def plain_matmul_tflops(
    torch_device: str, n: int, dtype: str, seconds: float, clock: Any = time.perf_counter
) -> float:
    """The same figure from a bare ``a @ b`` loop: the machine's own reference."""
    g = torch.Generator().manual_seed(0)
    a = torch.randn(n, n, generator=g).to(torch_device, DTYPES[dtype])
    b = torch.randn(n, n, generator=g).to(torch_device, DTYPES[dtype])
    sync = torch.cuda.synchronize if torch_device.startswith("cuda") else (lambda: None)
    with _tf32(dtype == "tf32"):
        a @ b
        return _best_rate(seconds, 2 * n**3 / 1e12, lambda: a @ b, sync, clock)


def sdc_digests(dev: Device, n: int, rounds: int) -> list[str]:
    """The same seeded products and reductions ``rounds`` times; one checksum of the results each."""
    a, b = _operands(dev, n, torch.float32, seed=1234)
    out = []
    for _ in range(rounds):
        c = dev.matmul(a, b)
        d = dev.matmul(c, a)
        sums = torch.stack([c.sum(dim=0), d.sum(dim=1)])
        h = hashlib.blake2b(digest_size=16)
        for t in (c, d, sums):
            h.update(t.detach().contiguous().cpu().view(torch.uint8).numpy().tobytes())
        out.append(h.hexdigest())
    return out


def copy_bandwidth(dev: Device, nbytes: int, seconds: float) -> tuple[float, float]:
    """(copy, write) bandwidth in GB/s through ``Device.write``; a copy reads and writes each byte."""
    n = nbytes // 4
    src = torch.empty(n, dtype=torch.float32, device=dev.torch_device).uniform_()
    dst = torch.empty_like(src)
    dev.write(dst, src)
    copy = _best_rate(seconds / 2, 2 * n * 4 / 1e9, lambda: dev.write(dst, src), dev.sync, dev.clock)
    write = _best_rate(seconds / 2, n * 4 / 1e9, lambda: dev.write(dst, 0.5), dev.sync, dev.clock)
    return copy, write


def plain_copy_gbps(torch_device: str, nbytes: int, seconds: float, clock: Any = time.perf_counter) -> float:
    n = nbytes // 4
    src = torch.empty(n, dtype=torch.float32, device=torch_device).uniform_()
    dst = torch.empty_like(src)
    sync = torch.cuda.synchronize if torch_device.startswith("cuda") else (lambda: None)
    dst.copy_(src)
    return _best_rate(seconds, 2 * n * 4 / 1e9, lambda: dst.copy_(src), sync, clock)


_CHUNK = 64 * 2**20


def pattern_test(dev: Device, nbytes: int) -> tuple[int, int]:
    """Walking ones and zeros over every byte, then two seeded random patterns written in
    chunks and read back; returns (bytes read back wrong, patterns)."""
    buf = torch.empty(nbytes, dtype=torch.uint8, device=dev.torch_device)
    bad, patterns = 0, 0
    for bit in range(8):
        for value in (1 << bit, 0xFF ^ (1 << bit)):
            dev.write(buf, value)
            # Compared chunk by chunk: a mask of the whole buffer would need as much memory again.
            bad += sum(int((buf[k : k + _CHUNK] != value).sum().item()) for k in range(0, nbytes, _CHUNK))
            patterns += 1
    for seed in (1, 2):
        g = torch.Generator(device=dev.torch_device)
        for phase in ("write", "check"):
            g.manual_seed(seed)
            for start in range(0, nbytes, _CHUNK):
                part = buf[start : start + _CHUNK]
                rnd = torch.randint(
                    0, 256, part.shape, dtype=torch.uint8, device=dev.torch_device, generator=g
                )
                if phase == "write":
                    dev.write(part, rnd)
                else:
                    bad += int((part != rnd).sum().item())
        patterns += 1
    dev.sync()
    return bad, patterns


def stress(dev: Device, n: int, stop: threading.Event) -> int:
    """Matrix products until ``stop`` is set (the thermal test's load); returns how many ran."""
    a, b = _operands(dev, n, DTYPES["bf16" if dev.kind == "cuda" else "fp32"], seed=7)
    k = 0
    while not stop.is_set():
        dev.matmul(a, b)
        k += 1
        if k % 8 == 0:
            dev.sync()
    dev.sync()
    return k


def stress_all(
    devices: Sequence[Device], n: int, seconds: float, every_s: float
) -> dict[int, list[tuple[float, Sample | None]]]:
    """Load every device at once for ``seconds``, reading each one's telemetry every ``every_s``
    and once more at the end: (seconds under load, reading) per device. Real GPUs heat and throttle
    together. The time counts from when the last device took its load (a thread that starts late
    on a busy host does not shorten its device's stress), and the last reading is taken after
    ``seconds`` however late the reader wakes."""
    stop = threading.Event()
    loaded = threading.Semaphore(0)  # one release per device: loaded, or failed before it was
    errors: list[BaseException] = []

    def load(dev: Device) -> None:
        try:
            with dev.busy():
                loaded.release()
                stress(dev, n, stop)
        except BaseException as exc:
            errors.append(exc)
            stop.set()
            loaded.release()

    threads = [threading.Thread(target=load, args=(d,), daemon=True) for d in devices]
    traces: dict[int, list[tuple[float, Sample | None]]] = {d.index: [] for d in devices}
    for th in threads:
        th.start()
    for _ in threads:
        loaded.acquire()
    t0 = time.monotonic()
    while not stop.is_set():
        elapsed = time.monotonic() - t0
        for d in devices:
            traces[d.index].append((elapsed, d.reading()))
        if elapsed >= seconds:
            break
        stop.wait(min(every_s, seconds - elapsed))
    stop.set()
    for th in threads:
        th.join()
    if errors:
        raise errors[0]
    return traces

"""Kernel-log lines in the exact format the NVIDIA driver and the Linux kernel print them.

The simulated fleet writes these to its ``kmsg_path`` so the log reader in ``trainguard.detect``
sees the same evidence a real fault leaves. The supervisor's chaos drills use ``write_xid_line``
to emit the evidence of an Xid from another process::

    >>> format_xid(pci="0000:3b:00", xid=79, text="GPU has fallen off the bus.")
    "NVRM: Xid (PCI:0000:3b:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus."
    >>> dmesg_line(1234.5678901, "NVRM: ...")
    '[ 1234.567890] NVRM: ...'
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable

from trainguard.records import normalize_pci

__all__ = [
    "aer_corrected_lines",
    "append_lines",
    "dmesg_line",
    "driver_banner",
    "format_xid",
    "gpu_map_lines",
    "write_xid_line",
]


def dmesg_line(uptime: float, message: str) -> str:
    """``[%5lu.%06lu] message``: the printk timestamp prefix dmesg shows (seconds since boot)."""
    micros = max(0, round(uptime * 1_000_000))
    return f"[{micros // 1_000_000:5d}.{micros % 1_000_000:06d}] {message}"


def format_xid(
    pci: str,
    xid: int,
    text: str,
    *,
    pid: int | None = None,
    name: str | None = None,
    who: bool = True,
) -> str:
    """One ``NVRM: Xid`` message. Since R450 the driver names the process (``pid='<unknown>',
    name=<unknown>`` when the fault has none); a few messages (e.g. Xid 154) carry no process."""
    bus = normalize_pci(pci)
    if bus is None:
        raise ValueError(f"not a PCI address: {pci!r} (expected e.g. 0000:3b:00)")
    head = f"NVRM: Xid (PCI:{bus}): {xid}"
    if not who:
        return f"{head}, {text}"
    process = (
        f"pid={pid}, name={name or '<unknown>'}" if pid is not None else "pid='<unknown>', name=<unknown>"
    )
    return f"{head}, {process}, {text}"


def gpu_map_lines(pci: str, uuid: str, serial: str | None = None) -> list[str]:
    """What the driver prints for each GPU when it initialises it (maps PCI address to UUID)."""
    lines = [f"NVRM: GPU at PCI:{normalize_pci(pci)}: {uuid}"]
    if serial:
        lines.append(f"NVRM: GPU Board Serial Number: {serial}")
    return lines


def driver_banner(version: str = "550.90.07") -> str:
    return f"NVRM: loading NVIDIA UNIX x86_64 Kernel Module  {version}  Fri May 31 09:35:42 UTC 2024"


def aer_corrected_lines(pci: str, device_id: str, bridge: str, *, bit: int = 12) -> list[str]:
    """A corrected PCIe Data Link Layer error as the kernel's AER driver reports it.

    Bit 12 is "Replay Timer Timeout", bit 8 "REPLAY_NUM Rollover": the errors behind NVML's PCIe
    replay counter.
    """
    names = {8: "RolloverOf", 12: "Timeout", 7: "BadDLLP", 6: "BadTLP"}
    dev = f"{normalize_pci(pci)}.0"
    return [
        f"pcieport {bridge}: AER: Corrected error received: {dev}",
        f"nvidia {dev}: PCIe Bus Error: severity=Corrected, type=Data Link Layer, (Transmitter ID)",
        f"nvidia {dev}:   device [{device_id}] error status/mask={1 << bit:08x}/0000e000",
        f"nvidia {dev}:    [{bit:2d}] {names.get(bit, 'Unknown')}",
    ]


def append_lines(path: str | os.PathLike[str], lines: Iterable[str]) -> None:
    """Append whole lines with one ``write`` on an O_APPEND descriptor.

    Small O_APPEND writes do not interleave, so several writers (the fleet, a chaos drill) can
    share one log the way the kernel ring buffer is shared.
    """
    data = "".join(line.rstrip("\n") + "\n" for line in lines).encode()
    if not data:
        return
    fd = os.open(os.fspath(path), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)


def write_xid_line(
    kmsg_path: str | os.PathLike[str],
    pci: str,
    xid: int,
    text: str,
    *,
    pid: int | None = None,
    name: str | None = None,
    uptime: float | None = None,
    who: bool = True,
) -> str:
    """Append one real-format Xid line to ``kmsg_path`` and return it (without the newline).

    ``uptime`` is the dmesg timestamp; by default the monotonic clock, which is what printk uses.
    """
    stamp = time.monotonic() if uptime is None else uptime
    line = dmesg_line(stamp, format_xid(pci, xid, text, pid=pid, name=name, who=who))
    append_lines(kmsg_path, [line])
    return line

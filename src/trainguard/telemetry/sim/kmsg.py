"""Kernel-log lines in the exact format the NVIDIA driver and the Linux kernel print them.

The simulated node writes these to its ``kmsg_path`` so the log reader in ``trainguard.detect``
sees the same evidence a real fault leaves. The supervisor's chaos drills use ``write_xid_line``
to emit the evidence of an Xid from another process::

    >>> format_xid(pci="0000:3b:00", xid=79, text="GPU has fallen off the bus.")
    "NVRM: Xid (PCI:0000:3b:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus."
    >>> dmesg_line(1234.5678901, "NVRM: ...")
    '[ 1234.567890] NVRM: ...'
"""

from __future__ import annotations

import os
import random
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
    "xid_messages",
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


def xid_messages(code: int, rng: random.Random) -> list[str]:
    """The text(s) after ``pid=..., name=...,`` that the driver prints for an Xid, with
    plausible details (GPC/TPC, channel, addresses) drawn from ``rng``."""
    ch = f"Ch {rng.choice((8, 9, 10, 16, 24)):08x}"
    addr = rng.randrange(0x10000000, 0x13FFFFFFF) & ~0x1F
    if code == 13:
        gpc, tpc, sm = rng.randrange(8), rng.randrange(9), rng.randrange(2)
        esr = 0x504648 + gpc * 0x8000 + tpc * 0x800
        return [
            f"Graphics SM Warp Exception on (GPC {gpc}, TPC {tpc}, SM {sm}): Out Of Range Address",
            f"Graphics Exception: ESR 0x{esr:x}=0x102000e 0x{esr + 8:x}=0x20 "
            f"0x{esr - 4:x}=0xd3eff2 0x{esr + 4:x}=0x17f",
        ]
    if code == 31:
        return [
            f"{ch}, intr 00000000. MMU Fault: ENGINE GRAPHICS GPC{rng.randrange(8)} "
            f"GPCCLIENT_T1_{rng.randrange(16)} faulted @ 0x7f{rng.randrange(0x10, 0xFF):02x}_"
            f"{rng.randrange(1 << 32) & ~0xFFF:08x}. Fault is of type FAULT_PDE ACCESS_TYPE_VIRT_READ"
        ]
    texts = {
        48: "An uncorrectable double bit error (DBE) has been detected on GPU in the framebuffer at "
        f"physAddr 0x{addr:x} partition {rng.randrange(16)}, subpartition {rng.randrange(4)}.",
        63: f"Row Remapper: New row (0x{addr:016x}) marked for remapping, reset gpu to activate.",
        64: f"Row Remapper Error: (0x{addr:016x}) - All reserved rows for bank are remapped",
        74: f"NVLink: fatal error detected on link {rng.randrange(18)}(0x0, 0x0, 0x10000, 0x0, 0x0, 0x0, 0x0)",
        79: "GPU has fallen off the bus.",
        94: "Contained: SM (0x1). RST: No, D-RST: No",
        95: "Uncontained: LTC TAG (0x2,0x0). RST: Yes, D-RST: No",
        119: "Timeout after 6s of waiting for RPC response from GPU0 GSP! "
        "Expected function 76 (GSP_RM_CONTROL) (0x20802a02 0x8).",
    }
    return [texts.get(code, ch)]


def append_lines(path: str | os.PathLike[str], lines: Iterable[str]) -> None:
    """Append whole lines with one ``write`` on an O_APPEND descriptor.

    Small O_APPEND writes do not interleave, so several writers (the node, a chaos drill) can
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
    text: str | None = None,
    *,
    pid: int | None = None,
    name: str | None = None,
    uptime: float | None = None,
    who: bool | None = None,
) -> str:
    """Append one real-format Xid line to ``kmsg_path`` and return it (without the newline).

    ``text`` defaults to what the driver prints for ``xid`` (see ``xid_messages``); ``uptime`` is
    the dmesg timestamp, by default the monotonic clock (what printk uses); ``who`` (print
    ``pid=..., name=...``) defaults to True except for Xid 154, which names no process.
    """
    stamp = time.monotonic() if uptime is None else uptime
    if text is None:
        text = xid_messages(xid, random.Random(f"{pci}/{xid}/{stamp}"))[0]
    who = xid != 154 if who is None else who
    line = dmesg_line(stamp, format_xid(pci, xid, text, pid=pid, name=name, who=who))
    append_lines(kmsg_path, [line])
    return line

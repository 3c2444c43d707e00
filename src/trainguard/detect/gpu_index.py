"""Which GPU a kernel-log event is about: by its PCI address or UUID.

NVML names each GPU's PCI address and UUID (``set_gpus``); the driver's ``GPU at PCI:... :
GPU-<uuid>`` lines map an address to a UUID (``learn``), for events that print only one of them::

    >>> from trainguard.records import Event, EventKind, Gpu
    >>> index = GpuIndex()
    >>> index.set_gpus([Gpu(3, uuid="GPU-a", pci="0000:3b:00")])
    >>> index.gpu_of(Event(EventKind.XID, "NVRM: Xid (PCI:0000:3b:00): 79", xid=79, pci="0000:3b:00"))
    3
    >>> index.learn(Event(EventKind.GPU_MAP, "NVRM: GPU at PCI:0000:9a:00: GPU-a", pci="0000:9a:00", uuid="GPU-a"))
    >>> index.gpu_of(Event(EventKind.XID, "NVRM: Xid (PCI:0000:9a:00): 48", xid=48, pci="0000:9a:00"))
    3
"""

from __future__ import annotations

from collections.abc import Iterable

from trainguard.records import Event, EventKind, Gpu

__all__ = ["GpuIndex"]


class GpuIndex:
    def __init__(self) -> None:
        self._by_pci: dict[str, int] = {}
        self._by_uuid: dict[str, int] = {}
        self._pci_uuid: dict[str, str] = {}  # from the driver's "GPU at PCI:... : GPU-<uuid>" lines

    def set_gpus(self, gpus: Iterable[Gpu]) -> None:
        for g in gpus:
            if g.pci:
                self._by_pci[g.pci] = g.index
            if g.uuid:
                self._by_uuid[g.uuid] = g.index

    def learn(self, ev: Event) -> None:
        """Remember the address -> UUID of a driver's GPU-map line (other events: nothing)."""
        if ev.kind is EventKind.GPU_MAP and ev.pci and ev.uuid:
            self._pci_uuid[ev.pci] = ev.uuid

    def gpu_of(self, ev: Event) -> int | None:
        """The GPU index an event is about, from its PCI address or UUID; None when unknown."""
        if ev.pci is not None:
            index = self._by_pci.get(ev.pci)
            if index is not None:
                return index
            uuid = self._pci_uuid.get(ev.pci)
            if uuid is not None:
                return self._by_uuid.get(uuid)
        return self._by_uuid.get(ev.uuid) if ev.uuid else None

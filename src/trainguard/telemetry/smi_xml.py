"""Snapshot backend: the GPUs of a saved ``nvidia-smi -q -x`` file (what users attach to bug reports).

    telemetry (here) -> detect -> verdict:   trainguard check --from-nvidia-smi smi.xml

Reads every schema from R470 to R565+ (``clocks_throttle_reasons`` and ``clocks_event_reasons``,
``power_readings`` and ``gpu_power_readings``, old single/double-bit and new SRAM/DRAM ECC
counters). "N/A", "Not Supported" and friends become None ("unknown"). NVLink counters are not
part of ``nvidia-smi -q`` and stay None. ``sample()`` returns the snapshot, stamped with the
file's own timestamp (read as UTC)::

    >>> backend = SmiXmlBackend("smi.xml")
    >>> [s.remap_pending for s in backend.sample()]
    [False, True, False, False]
"""

from __future__ import annotations

import calendar
import os
import re
import time
import xml.etree.ElementTree as ET
from typing import Any

from trainguard.errors import InputError
from trainguard.records import Gpu, RecoveryAction, Sample, Throttle, normalize_pci

__all__ = ["SmiXmlBackend", "parse_smi_xml", "read_smi_xml"]

_UNKNOWN = {"", "n/a", "not supported", "unknown", "unknown error", "not available", "gpu is lost"}
_LOST = {"gpu is lost", "unknown error"}
_NUMBER = re.compile(r"[-+]?\d+(?:\.\d+)?")
_THROTTLE_NAMES = {
    "sw_power_cap": Throttle.SW_POWER_CAP,
    "hw_slowdown": Throttle.HW_SLOWDOWN,
    "hw_thermal_slowdown": Throttle.HW_THERMAL,
    "hw_power_brake_slowdown": Throttle.HW_POWER_BRAKE,
    "sw_thermal_slowdown": Throttle.SW_THERMAL,
}
_RECOVERY = {
    "none": RecoveryAction.NONE,
    "reset": RecoveryAction.GPU_RESET,
    "gpu reset required": RecoveryAction.GPU_RESET,
    "reboot": RecoveryAction.NODE_REBOOT,
    "node reboot required": RecoveryAction.NODE_REBOOT,
    "drain p2p": RecoveryAction.DRAIN_P2P,
    "drain and reset": RecoveryAction.DRAIN_AND_RESET,
}


def _text(el: ET.Element, path: str) -> str | None:
    """The text at ``path``; None if missing or one of nvidia-smi's "no value" words."""
    raw = el.findtext(path)
    if raw is None:
        return None
    text = raw.strip()
    return None if text.strip("[]").lower() in _UNKNOWN else text


def _num(el: ET.Element, *paths: str) -> float | None:
    for path in paths:
        text = _text(el, path)
        match = _NUMBER.search(text) if text else None
        if match:
            return float(match.group())
    return None


def _int(el: ET.Element, *paths: str) -> int | None:
    value = _num(el, *paths)
    return None if value is None else int(value)


def _flag(el: ET.Element, path: str) -> bool | None:
    text = (_text(el, path) or "").lower()
    if text in ("yes", "active", "enabled", "true"):
        return True
    if text in ("no", "not active", "disabled", "false"):
        return False
    return None


def _sum(el: ET.Element, base: str, names: tuple[str, ...]) -> int | None:
    values = [_int(el, f"{base}/{name}") for name in names]
    known = [v for v in values if v is not None]
    return sum(known) if known else None


def _ecc(g: ET.Element, counter: str) -> tuple[int | None, int | None]:
    base = f"ecc_errors/{counter}"
    if g.find(f"{base}/single_bit") is not None:  # R470 and older: per-unit counters with a total
        return _int(g, f"{base}/single_bit/total"), _int(g, f"{base}/double_bit/total")
    sbe = _sum(g, base, ("sram_correctable", "dram_correctable"))
    dbe = _sum(
        g,
        base,
        (
            "sram_uncorrectable",
            "sram_uncorrectable_parity",
            "sram_uncorrectable_secded",
            "dram_uncorrectable",
        ),
    )
    return sbe, dbe


def _throttle(g: ET.Element) -> frozenset[Throttle] | None:
    for container, prefix in (
        ("clocks_event_reasons", "clocks_event_reason_"),
        ("clocks_throttle_reasons", "clocks_throttle_reason_"),
    ):
        el = g.find(container)
        if el is None:
            continue
        states = {reason: _flag(el, prefix + name) for name, reason in _THROTTLE_NAMES.items()}
        if all(v is None for v in states.values()):
            return None
        return frozenset(reason for reason, active in states.items() if active)
    return None


def _recovery(g: ET.Element) -> RecoveryAction | None:
    if g.find("gpu_recovery_action") is not None:  # R565 and later
        text = _text(g, "gpu_recovery_action")
        return None if text is None else _RECOVERY.get(text.lower())
    reset, drain = (
        _flag(g, "gpu_reset_status/reset_required"),
        _flag(g, "gpu_reset_status/drain_and_reset_recommended"),
    )
    if drain:
        return RecoveryAction.DRAIN_AND_RESET
    if reset:
        return RecoveryAction.GPU_RESET
    return RecoveryAction.NONE if reset is False else None


# Sample field -> the XML paths that may hold it, first present wins (names moved between
# driver releases). "{power}" is the power block: gpu_power_readings (R535+) or power_readings.
_NUMBERS: dict[str, tuple[str, ...]] = {
    "temperature_c": ("temperature/gpu_temp",),
    "temp_slowdown_c": ("temperature/gpu_temp_slow_threshold",),
    "temp_shutdown_c": ("temperature/gpu_temp_max_threshold",),
    "power_w": ("{power}/power_draw", "{power}/instant_power_draw", "{power}/average_power_draw"),
    "power_limit_w": ("{power}/current_power_limit", "{power}/enforced_power_limit", "{power}/power_limit"),
    "fan_pct": ("fan_speed",),
    "sm_clock_mhz": ("clocks/sm_clock",),
    "sm_clock_max_mhz": ("max_clocks/sm_clock",),
    "mem_clock_mhz": ("clocks/mem_clock",),
    "mem_clock_max_mhz": ("max_clocks/mem_clock",),
    "util_gpu_pct": ("utilization/gpu_util",),
    "util_mem_pct": ("utilization/memory_util",),
    "mem_used_mib": ("fb_memory_usage/used",),
    "mem_total_mib": ("fb_memory_usage/total",),
}
_COUNTS: dict[str, str] = {
    "retired_sbe": "retired_pages/multiple_single_bit_retirement/retired_count",
    "retired_dbe": "retired_pages/double_bit_retirement/retired_count",
    "remap_correctable": "remapped_rows/remapped_row_corr",
    "remap_uncorrectable": "remapped_rows/remapped_row_unc",
    "pcie_gen": "pci/pci_gpu_link_info/pcie_gen/current_link_gen",
    "pcie_gen_max": "pci/pci_gpu_link_info/pcie_gen/max_link_gen",
    "pcie_width": "pci/pci_gpu_link_info/link_widths/current_link_width",
    "pcie_width_max": "pci/pci_gpu_link_info/link_widths/max_link_width",
    "pcie_replay": "pci/replay_counter",
}
_FLAGS: dict[str, tuple[str, ...]] = {
    "retired_pending": ("retired_pages/pending_retirement", "retired_pages/pending_blacklist"),
    "remap_pending": ("remapped_rows/remapped_row_pending",),
    "remap_failure": ("remapped_rows/remapped_row_failure",),
}


def _first_flag(g: ET.Element, *paths: str) -> bool | None:
    for path in paths:
        value = _flag(g, path)
        if value is not None:
            return value
    return None


def _sample(g: ET.Element, index: int, when: float) -> Sample:
    uuid = _text(g, "uuid")
    gpu = Gpu(index, uuid, normalize_pci(g.get("id") or _text(g, "pci/pci_bus_id")), _text(g, "product_name"))
    raw_id = (g.findtext("uuid") or "").strip().strip("[]").lower()
    if raw_id in _LOST:
        return Sample(gpu=gpu, time=when, lost=True, error=f"nvidia-smi: {g.findtext('uuid', '').strip()}")
    power = "gpu_power_readings" if g.find("gpu_power_readings") is not None else "power_readings"
    sbe_v, dbe_v = _ecc(g, "volatile")
    sbe_a, dbe_a = _ecc(g, "aggregate")
    fields: dict[str, Any] = {
        name: _num(g, *(p.format(power=power) for p in paths)) for name, paths in _NUMBERS.items()
    }
    fields |= {name: _int(g, path) for name, path in _COUNTS.items()}
    fields |= {name: _first_flag(g, *paths) for name, paths in _FLAGS.items()}
    return Sample(
        gpu=gpu,
        time=when,
        throttle=_throttle(g),
        ecc_sbe_volatile=sbe_v,
        ecc_dbe_volatile=dbe_v,
        ecc_sbe_aggregate=sbe_a,
        ecc_dbe_aggregate=dbe_a,
        recovery_action=_recovery(g),
        **fields,
    )


def _timestamp(root: ET.Element) -> float | None:
    text = _text(root, "timestamp")
    if text is None:
        return None
    try:  # nvidia-smi prints local time without a zone; read as UTC
        return float(calendar.timegm(time.strptime(" ".join(text.split()), "%a %b %d %H:%M:%S %Y")))
    except ValueError:
        return None


def parse_smi_xml(text: str | bytes, source: str = "<string>", default_time: float = 0.0) -> list[Sample]:
    """Samples from the text of an ``nvidia-smi -q -x`` file; ``InputError`` naming ``source``."""
    try:
        root = ET.fromstring(text)
    except ET.ParseError as exc:
        raise InputError(
            f"{source}: not valid XML ({exc}); expected the output of `nvidia-smi -q -x`"
        ) from None
    if root.tag != "nvidia_smi_log":
        raise InputError(
            f"{source}: root element is <{root.tag}>, not <nvidia_smi_log>: not `nvidia-smi -q -x` output"
        )
    gpus = root.findall("gpu")
    if not gpus:
        raise InputError(f"{source}: no <gpu> element: the snapshot lists no GPU")
    when = _timestamp(root)
    return [_sample(g, i, default_time if when is None else when) for i, g in enumerate(gpus)]


def read_smi_xml(path: str | os.PathLike[str]) -> list[Sample]:
    """Samples from a saved ``nvidia-smi -q -x`` file (time: its timestamp, else its mtime)."""
    try:
        with open(path, "rb") as f:
            data = f.read()
        mtime = os.stat(path).st_mtime
    except OSError as exc:
        raise InputError(f"{os.fspath(path)}: cannot read ({exc.strerror or exc})") from None
    return parse_smi_xml(data, source=os.fspath(path), default_time=mtime)


class SmiXmlBackend:
    """A ``TelemetryBackend`` over one snapshot: ``sample()`` always returns the file's readings."""

    def __init__(self, path: str | os.PathLike[str], clock: object = None) -> None:
        # ``clock`` is accepted for a uniform signature: a snapshot carries its own time.
        self.path = os.fspath(path)
        self._samples = read_smi_xml(path)

    def gpus(self) -> list[Gpu]:
        return [s.gpu for s in self._samples]

    def sample(self) -> list[Sample]:
        return list(self._samples)

    def close(self) -> None:
        """Nothing to release."""

    def __enter__(self) -> SmiXmlBackend:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

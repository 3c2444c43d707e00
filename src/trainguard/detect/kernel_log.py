"""Kernel-log lines -> ``Event``: NVIDIA Xid, NVSwitch SXid, fallen-off-the-bus and GPU-map lines.

First step of detect for the kernel side. Accepts a line as any tool prints it: raw ``/dev/kmsg``
records, ``dmesg`` (plain, ``-T``, ``--time-format iso``, ``-x``), syslog files and every
``journalctl -o short*`` flavour; the prefix only contributes the line's timestamp::

    >>> e = parse_kernel_line("[ 1234.567890] NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python, "
    ...                       "GPU has fallen off the bus.")
    >>> e.kind.value, e.xid, e.pci, e.time, e.action.value
    ('xid', 79, '0000:3b:00', 1234.56789, 'reboot_node')

Times: a wall-clock prefix gives seconds since the epoch (no time zone in the prefix = local time,
no year = the year of ``now``); a ``[seconds.micros]`` or kmsg prefix alone gives seconds since
boot, plus ``boot_time`` when the caller knows it; no prefix gives ``now``.
"""

from __future__ import annotations

import logging
import re
import time as _time
from datetime import UTC, datetime

from trainguard.actions import Advice
from trainguard.records import (
    RECOVERY_ACTION_CODES,
    Category,
    Event,
    EventKind,
    Health,
    RecoveryAction,
    Severity,
    normalize_pci,
)

log = logging.getLogger(__name__)

__all__ = ["line_time", "parse_kernel_line", "recovery_action_of"]

_BUS = r"(?:[0-9a-fA-F]{1,8}:)?[0-9a-fA-F]{1,2}:[0-9a-fA-F]{1,2}(?:\.[0-7])?"
_XID = re.compile(r"NVRM:\s*Xid\s*\((?P<inner>[^)]{0,80})\)\s*:?\s*(?P<code>\d{1,6})\b\s*,?\s*(?P<rest>.*)")
_INNER_PCI = re.compile(rf"(?:PCI:)?(?P<pci>{_BUS})")
_WHO = re.compile(r"pid\s*=\s*'?(?P<pid><?[\w ]*?>?)'?\s*,\s*name\s*=\s*(?P<name>[^,]*?)\s*(?:,\s*|$)")
_SXID = re.compile(
    rf"nvidia-nvswitch(?P<sw>\d*):\s*SXid\s*\((?:PCI:)?(?P<pci>{_BUS})\)\s*:?\s*(?P<code>\d{{1,6}})\b\s*,?\s*(?P<rest>.*)"
)
_MAP = re.compile(rf"NVRM:\s*GPU at (?:PCI:)?(?P<pci>{_BUS})\s*:\s*(?P<uuid>GPU-[0-9a-fA-F-]{{8,}})")
_LOST_PCI = re.compile(rf"(?:PCI:)?\b(?P<pci>{_BUS})\b")
_RA_TO = re.compile(r"\bto\s+(?:0x(?P<hex>[0-9a-fA-F]+))?\s*\(?(?P<words>[^)]*)", re.I)

# timestamp prefixes, tried in order on the text before the message
_KMSG = re.compile(r"^\s*\d{1,3},\d+,(?P<us>\d+),[^;]*;")
_DMESG_X = re.compile(r"^\s*[a-z]+\s*:\s*[a-z]+\s*:\s*")
_ISO = re.compile(
    r"^\s*(?P<d>\d{4}-\d{2}-\d{2})[T ](?P<t>\d{2}:\d{2}:\d{2})(?:[.,](?P<f>\d{1,9}))?\s*(?P<z>Z|[+-]\d{2}:?\d{2}|UTC)?"
)
_DMESG_T = re.compile(
    r"^\s*\[\s*\w{3}\s+(?P<mon>\w{3})\s+(?P<day>\d{1,2})\s+(?P<t>\d{2}:\d{2}:\d{2})\s+(?P<y>\d{4})\]"
)
_FULL = re.compile(
    r"^\s*\w{3}\s+(?P<d>\d{4}-\d{2}-\d{2})\s+(?P<t>\d{2}:\d{2}:\d{2})(?:\.(?P<f>\d+))?\s+(?P<z>UTC|GMT)?"
)
_BSD = re.compile(
    r"^\s*(?P<mon>[A-Z][a-z]{2})\s+(?P<day>\d{1,2})\s+(?P<t>\d{2}:\d{2}:\d{2})(?:\.(?P<f>\d{1,9}))?\b"
)
_MONO = re.compile(r"\[\s*(?P<s>\d{1,10})\.(?P<f>\d{1,9})\s*\]")
_MONTHS = {
    m: i
    for i, m in enumerate(
        ["Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"], 1
    )
}
_RA_WORDS = (
    ("drain and reset", RecoveryAction.DRAIN_AND_RESET),
    ("drain p2p", RecoveryAction.DRAIN_P2P),
    ("reboot", RecoveryAction.NODE_REBOOT),
    ("reset", RecoveryAction.GPU_RESET),
    ("none", RecoveryAction.NONE),
)
_SEVERITY_OF = {Health.FAILED: Severity.FATAL, Health.DEGRADED: Severity.ERROR}


def _wall(date: str, clock: str, frac: str | None, zone: str | None) -> float | None:
    try:
        dt = datetime.fromisoformat(f"{date}T{clock}")
        if zone in ("Z", "UTC", "GMT"):
            dt = dt.replace(tzinfo=UTC)
        elif zone:
            dt = datetime.fromisoformat(f"{date}T{clock}{zone[:3]}:{zone[-2:]}")
        seconds = dt.timestamp()  # naive = local time, as syslog and journalctl print it
    except (ValueError, OverflowError, OSError):
        return None
    return seconds + (int(frac) / 10 ** len(frac) if frac else 0.0)


def _year(now: float | None) -> int:
    try:
        return datetime.fromtimestamp(now if now is not None else _time.time()).year
    except (ValueError, OverflowError, OSError):
        return datetime.now().year


def line_time(prefix: str, now: float | None = None, boot_time: float | None = None) -> float | None:
    """The timestamp carried by a log line's prefix (the text before the message), if any."""
    m = _KMSG.match(prefix)
    if m:
        mono = int(m["us"]) / 1e6
        return mono + boot_time if boot_time is not None else mono
    prefix = _DMESG_X.sub("", prefix, count=1)
    wall: float | None = None
    if m := _ISO.match(prefix):
        wall = _wall(m["d"], m["t"], m["f"], m["z"])
    elif m := _DMESG_T.match(prefix):
        month = _MONTHS.get(m["mon"])
        wall = _wall(f"{m['y']}-{month:02d}-{int(m['day']):02d}", m["t"], None, None) if month else None
    elif m := _FULL.match(prefix):
        wall = _wall(m["d"], m["t"], m["f"], m["z"])
    elif (m := _BSD.match(prefix)) and m["mon"] in _MONTHS:
        year, month, day = _year(now), _MONTHS[m["mon"]], int(m["day"])
        wall = _wall(f"{year}-{month:02d}-{day:02d}", m["t"], m["f"], None)
        if wall is not None and now is not None and wall > now + 86400:  # a December line read in January
            wall = _wall(f"{year - 1}-{month:02d}-{day:02d}", m["t"], m["f"], None)
    if wall is not None:
        return wall
    if m := _MONO.search(prefix):
        mono = int(m["s"]) + int(m["f"]) / 10 ** len(m["f"])
        return mono + boot_time if boot_time is not None else mono
    return None


def recovery_action_of(text: str) -> RecoveryAction | None:
    """The action an Xid 154 line announces: "... changed from 0x0 (None) to 0x1 (GPU Reset Required)"."""
    m = _RA_TO.search(text)
    if not m:
        return None
    if m["hex"]:
        return RECOVERY_ACTION_CODES.get(int(m["hex"], 16))
    words = m["words"].lower()
    return next((ra for key, ra in _RA_WORDS if key in words), None)


def _recovery(rest: str) -> tuple[Advice, Severity] | None:
    """The action and severity of an Xid 154 line: the verdict of the action it announces."""
    ra = recovery_action_of(rest)
    if ra is None:
        return None
    if ra is RecoveryAction.NONE:
        return Advice.NONE, Severity.INFO
    from trainguard.detect.rules import RECOVERY_VERDICTS  # here: `logs scan` starts without the rules

    health, action, _ = RECOVERY_VERDICTS[ra]
    return action, _SEVERITY_OF.get(health, Severity.WARNING)


def _xid_event(m: re.Match[str], line: str, when: float | None) -> Event | None:
    code = int(m["code"])
    inner = _INNER_PCI.match(m["inner"].strip())
    pci = normalize_pci(inner["pci"]) if inner else None
    rest = m["rest"]
    pid: int | None = None
    process: str | None = None
    if who := _WHO.match(rest):
        pid = int(who["pid"]) if who["pid"].isdigit() else None
        process = who["name"] if who["name"] and who["name"] != "<unknown>" else None
        rest = rest[who.end() :]
    from trainguard.detect.xid import xid_info  # here: `logs scan` starts without the catalog

    info = xid_info(code)
    action, severity = info.action, info.severity
    if code == 154 and (decoded := _recovery(rest)):
        action, severity = decoded
    elif 144 <= code <= 150 and re.search(r"\bnon-?fatal\b", rest, re.I):
        action, severity = Advice.IGNORE, Severity.WARNING  # NVLink5 says it needs nothing
    return Event(EventKind.XID, line, when, xid=code, pci=pci, pid=pid, process=process,
                 category=info.category, severity=severity, action=action)  # fmt: skip


def _sxid_event(m: re.Match[str], line: str, when: float | None) -> Event:
    rest = m["rest"].lstrip().lower()
    if rest.startswith(("non-fatal", "nonfatal", "non fatal")):
        severity, action = Severity.WARNING, Advice.NONE
    elif rest.startswith("fatal"):
        severity, action = Severity.FATAL, Advice.REBOOT_NODE  # the switch and its GPUs need a reset
    else:
        severity, action = Severity.INFO, Advice.NONE  # detail lines ("Severity 0 Engine instance ...")
    return Event(EventKind.SXID, line, when, xid=int(m["code"]), pci=normalize_pci(m["pci"]),
                 category=Category.INTERCONNECT, severity=severity, action=action)  # fmt: skip


def _parse(line: str, now: float | None, boot_time: float | None) -> Event | None:
    text = line.rstrip("\r\n")
    nvrm = text.find("NVRM")
    if nvrm < 0:
        nvswitch = text.find("nvidia-nvswitch")
        if nvswitch < 0 or "SXid" not in text:
            return None
        m = _SXID.search(text, nvswitch)
        if not m:
            return None
        return _sxid_event(m, text, _when(text[:nvswitch], now, boot_time))
    when = _when(text[:nvrm], now, boot_time)
    if m := _XID.search(text, nvrm):
        return _xid_event(m, text, when)
    body = text[nvrm:]
    if "fallen off the bus" in body:
        bus = _LOST_PCI.search(body, 5)
        return Event(EventKind.GPU_LOST, text, when, pci=normalize_pci(bus["pci"]) if bus else None,
                     category=Category.GPU_HARDWARE, severity=Severity.FATAL, action=Advice.REBOOT_NODE)  # fmt: skip
    if m := _MAP.search(body):
        return Event(EventKind.GPU_MAP, text, when, pci=normalize_pci(m["pci"]), uuid=m["uuid"])
    return None


def _when(prefix: str, now: float | None, boot_time: float | None) -> float | None:
    stamp = line_time(prefix, now, boot_time)
    return stamp if stamp is not None else now


def parse_kernel_line(line: str, now: float | None = None, *, boot_time: float | None = None) -> Event | None:
    """One kernel-log line -> an ``Event``, or None when it says nothing about a GPU. Never raises."""
    try:
        return _parse(line, now, boot_time)
    except Exception:  # a parser bug must not take the agent down; the line is just not a finding
        log.debug("unparseable kernel line %r", line[:200], exc_info=True)
        return None

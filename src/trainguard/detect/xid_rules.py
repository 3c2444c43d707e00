"""Stateful rules over kernel-log events (Xid, SXid, fallen-off-the-bus): ``Event`` -> ``Finding``.

Sits in the detect step beside ``detect.rules``. A single Xid line means little on its own: Xid 45
is usually the echo of another Xid in the same burst, one Xid 13 is the application's bug while a
run of them on one GPU points at the hardware, and a GPU that keeps failing needs support. So this
module remembers recent events per GPU (``XidState``) and derives the findings that hold *now*::

    >>> from trainguard.records import Event, EventKind, Gpu
    >>> state = XidState()
    >>> state.set_gpus([Gpu(3, pci="0000:3b:00")])
    >>> state.observe(Event(EventKind.XID, "NVRM: Xid (PCI:0000:3b:00): 79, ...", xid=79, pci="0000:3b:00"), now=5.0)
    >>> [(f.gpu, f.health.value, f.action.value) for f in state.findings(now=6.0)]
    [(3, 'failed', 'reboot_node')]

Times: windows between events use each line's own timestamp (``Event.time``) when it has one;
how long a finding is held uses the caller's clock (``now``). A GPU that re-initialises (the driver
prints its ``GPU at PCI:...`` line again) starts with a clean slate, except for the 24-hour count
of fatal bursts.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from trainguard.actions import Advice
from trainguard.detect.gpu_index import GpuIndex
from trainguard.detect.kernel_log import recovery_action_of
from trainguard.detect.rules import RECOVERY_VERDICTS
from trainguard.detect.thresholds import Thresholds
from trainguard.detect.xid import xid_info
from trainguard.records import Category, Event, EventKind, Finding, Gpu, Health, RecoveryAction, Severity

if TYPE_CHECKING:
    from trainguard.detect.detector import Window

_EPOCH_2001 = 978_307_200.0  # any later time is wall-clock time, not an uptime
_MAX_KEPT = 256  # records per GPU; a log storm must not grow memory without bound
_NOISE = re.compile(r"^.*?\bS?Xid\b\s*(?:\([^)]*\))?:?\s*\d+,?\s*(?:pid=[^,]*,\s*)?(?:name=[^,]*,\s*)?", re.I)


@dataclass(frozen=True, slots=True)
class _Rec:
    """One remembered event: its code, its own time ``t``, when we saw it, and its verdict."""

    event: Event
    code: int | None
    t: float
    seen: float
    health: Health
    action: Advice


def _message(ev: Event) -> str:
    text = _NOISE.sub("", ev.text.strip(), count=1)
    return text if len(text) <= 120 else text[:117] + "..."


class XidState:
    """Remembers kernel-log events per GPU and derives the Xid findings that hold at a given time.

    A `Detector` (detect/detector.py): ``detect(window)`` observes the window's events and
    returns the findings that hold at its time.
    """

    name = "xid_rules"

    def __init__(self, thresholds: Thresholds | None = None) -> None:
        self.th = thresholds or Thresholds()
        self.index = GpuIndex()
        self._recs: dict[int | None, list[_Rec]] = {}  # None: node-scoped (SXid, unmapped GPUs)
        self._fatal_times: dict[int, list[tuple[float, float]]] = {}  # (t, seen); survives re-init
        self.skipped = 0  # events that could not be used

    def detect(self, window: Window) -> list[Finding]:
        self.th = window.thresholds  # a reload: judged by the new thresholds from now on
        self.index.set_gpus(window.gpus)
        for ev in window.events:
            self.observe(ev, window.time)
        return self.findings(window.time)

    def set_gpus(self, gpus: Iterable[Gpu]) -> None:
        self.index.set_gpus(gpus)

    def clear(self, index: int) -> None:
        """Forget a GPU's kernel-log history after a reset we know of (the 24 h burst count stays)."""
        self._recs.pop(index, None)

    forget = clear

    def gpu_of(self, ev: Event) -> int | None:
        """The GPU index an event is about, from its PCI address or UUID; None when unknown."""
        return self.index.gpu_of(ev)

    def observe(self, ev: Event, now: float) -> None:
        """Remember one event. Never raises: an event that makes no sense is counted and skipped."""
        try:
            self._observe(ev, now)
        except Exception:
            self.skipped += 1

    def _observe(self, ev: Event, now: float) -> None:
        t = ev.time if ev.time is not None else now
        if ev.kind is EventKind.GPU_MAP:
            self.index.learn(ev)
            index = self.gpu_of(ev)
            if index is not None:
                self._recs.pop(index, None)  # the GPU (re)initialised: earlier errors are behind it
            return
        if ev.kind is EventKind.XID and ev.xid is not None:
            health, action = xid_policy(ev.xid, ev, self.th.app_xids)
            code: int | None = ev.xid
        elif ev.kind is EventKind.GPU_LOST:
            health, action, code = Health.FAILED, Advice.REBOOT_NODE, None
        elif ev.kind is EventKind.SXID:
            health, action = _sxid_policy(ev)
            code = ev.xid
        else:
            return  # training-log lines are not this module's business
        index = None if ev.kind is EventKind.SXID else self.gpu_of(ev)
        recs = self._recs.setdefault(index, [])
        last = recs[-1] if recs else None
        if (
            last is not None
            and last.code == code
            and last.event.kind is ev.kind
            and last.event.pci == ev.pci
            and abs(t - last.t) <= self.th.xid_same_event_s
        ):
            return  # the driver prints one error as several lines (Xid 13: warp + ESR): one occurrence
        # A line stamped with wall-clock time ages from that time (an old journal line is old);
        # dmesg uptimes and virtual clocks are not comparable with ``now``: they age from now.
        seen = min(now, t) if t > _EPOCH_2001 and now > _EPOCH_2001 else now
        recs.append(_Rec(ev, code, t, seen, health, action))
        if len(recs) > _MAX_KEPT:
            del recs[: len(recs) - _MAX_KEPT]
        if index is not None and health is Health.FAILED:
            times = self._fatal_times.setdefault(index, [])
            times.append((t, seen))
            cutoff = t - self.th.fatal_xid_support_window_s
            times[:] = [x for x in times if x[0] >= cutoff][-_MAX_KEPT:]

    def findings(self, now: float) -> list[Finding]:
        out: list[Finding] = []
        for index, recs in self._recs.items():
            live = [r for r in recs if now - r.seen <= self._hold(r.health)]
            recs[:] = live
            out.extend(self._gpu_findings(index, live))
        window = self.th.fatal_xid_support_window_s
        for index, times in self._fatal_times.items():
            times[:] = [x for x in times if now - x[1] <= window]  # a day without failures: forgiven
            found = self._fatal_repeat(index, [t for t, _ in times])
            if found is not None:
                out.append(found)
        return out

    def _hold(self, health: Health) -> float:
        th = self.th
        return th.xid_hold_s if health in (Health.FAILED, Health.DEGRADED) else th.app_xid_hold_s

    def _gpu_findings(self, index: int | None, recs: list[_Rec]) -> list[Finding]:
        th = self.th
        out: list[Finding] = []
        app = [r for r in recs if r.code in th.app_xids and r.event.kind is EventKind.XID]
        others = [r for r in recs if r.code != 45 and r.event.kind is EventKind.XID]
        app_ids = {id(r) for r in app} if len(app) >= th.app_xid_repeat else set()
        latest_ra: _Rec | None = None
        groups: dict[tuple[EventKind, int | None], list[_Rec]] = {}
        off_bus = any(r.code == 79 for r in others)
        for r in recs:
            kind = r.event.kind
            if kind is EventKind.GPU_LOST and off_bus:
                continue  # the Xid 79 already says it
            if kind is EventKind.XID and r.code == 154:
                latest_ra = r if latest_ra is None or r.t >= latest_ra.t else latest_ra
                continue
            if kind is EventKind.XID and r.code == 45 and _has_company(r, others, th.xid_burst_window_s):
                continue  # a sympathetic echo of another Xid in the same burst adds nothing
            if id(r) in app_ids:
                continue  # reported together below
            groups.setdefault((kind, r.code), []).append(r)
        for (kind, code), group in groups.items():
            out.append(_group_finding(index, kind, code, group))
        repeat = _app_repeat(index, app, th)
        if repeat is not None:
            out.append(repeat)
        if latest_ra is not None:
            found = _recovery_finding(index, latest_ra)
            if found is not None:
                out.append(found)
        return out

    def _fatal_repeat(self, index: int, times: list[float]) -> Finding | None:
        th = self.th
        if len(times) < th.fatal_xid_support_bursts:
            return None
        bursts, last = 0, None
        for t in sorted(times):
            if last is None or t - last > th.xid_burst_window_s:
                bursts += 1
            last = t
        if bursts < th.fatal_xid_support_bursts:
            return None
        hours = th.fatal_xid_support_window_s / 3600
        why = f"{bursts} separate fatal Xid bursts within {hours:g} h: this GPU keeps failing"
        return Finding(
            "xid_fatal_repeat",
            Health.FAILED,
            Advice.CONTACT_SUPPORT,
            why,
            gpu=index,
            time=last,
            category=Category.GPU_HARDWARE,
        )


def _has_company(r: _Rec, others: list[_Rec], window: float) -> bool:
    return any(abs(o.t - r.t) <= window for o in others)


def _group_finding(index: int | None, kind: EventKind, code: int | None, group: list[_Rec]) -> Finding:
    last = group[-1]
    ev = last.event
    times = f" (x{len(group)})" if len(group) > 1 else ""
    where = f" on {ev.pci}" if index is None and ev.pci else ""
    if kind is EventKind.GPU_LOST:
        rule, why = "gpu_lost_log", f"kernel log: GPU has fallen off the bus{where}{times}"
    elif kind is EventKind.SXID:
        rule, why = "sxid", f"NVSwitch SXid {code}{times}: {_message(ev)}"
    else:
        rule, why = "xid", f"Xid {code}{where}{times}: {_message(ev)}"
    category = ev.category if ev.category is not Category.INFO else Category.GPU_HARDWARE
    return Finding(
        rule, last.health, last.action, why, gpu=index, time=last.t, category=category, evidence=(ev.text,)
    )


def _app_repeat(index: int | None, app: list[_Rec], th: Thresholds) -> Finding | None:
    if len(app) < th.app_xid_repeat:
        return None
    app = sorted(app, key=lambda r: r.t)
    best = max(sum(1 for o in app if 0 <= r.t - o.t <= th.app_xid_window_s) for r in app)
    codes = ", ".join(str(c) for c in sorted({r.code for r in app if r.code is not None}))
    if best < th.app_xid_repeat:
        why = f"{len(app)} application Xids ({codes}), spread out: the application's problem"
        return Finding(
            "xid_app",
            Health.OK,
            Advice.RESTART_APP,
            why,
            gpu=index,
            time=app[-1].t,
            category=Category.APPLICATION_BUG,
        )
    why = (
        f"{best} application Xids ({codes}) on one GPU within {th.app_xid_window_s / 60:g} min: "
        "possible hardware fault, run diagnostics"
    )
    return Finding(
        "xid_app_repeat",
        Health.DEGRADED,
        Advice.RUN_DIAGNOSTICS,
        why,
        gpu=index,
        time=app[-1].t,
        category=Category.GPU_HARDWARE,
        evidence=tuple(r.event.text for r in app[-5:]),
    )


def _recovery_finding(index: int | None, r: _Rec) -> Finding | None:
    ra = recovery_action_of(r.event.text)
    if ra is None or ra is RecoveryAction.NONE:
        return None
    health, action, text = RECOVERY_VERDICTS[ra]
    return Finding(
        "xid_recovery_action",
        health,
        action,
        f"Xid 154: {text}",
        gpu=index,
        time=r.t,
        category=Category.GPU_HARDWARE,
        evidence=(r.event.text,),
    )


_APP_XIDS = Thresholds().app_xids
_BY_SEVERITY = {
    Severity.FATAL: Health.FAILED,
    Severity.ERROR: Health.DEGRADED,
    Severity.WARNING: Health.OK,
    Severity.INFO: Health.OK,
}


def xid_policy(
    code: int, ev: Event | None = None, app_xids: tuple[int, ...] = _APP_XIDS
) -> tuple[Health, Advice]:
    """Health and action for one Xid seen alone: the Xid catalog's (``detect.xid``), the
    configured application Xids', or, where the line's own text decides (NVLink5 Fatal/Nonfatal, a
    code newer than the catalog), the parser's classification of the line."""
    info = xid_info(code)
    if code in app_xids and info.health in (Health.OK, None):
        return Health.OK, Advice.RESTART_APP
    if info.known and info.health is not None:
        return info.health, info.action
    if ev is None:
        return Health.DEGRADED, Advice.RUN_DIAGNOSTICS
    return _BY_SEVERITY.get(ev.severity, Health.DEGRADED), ev.action


def _sxid_policy(ev: Event) -> tuple[Health, Advice]:
    """NVSwitch errors are the node's (the fabric's), never one GPU's."""
    if ev.severity is Severity.FATAL:
        return Health.FAILED, Advice.REBOOT_NODE  # a fatal NVSwitch error takes the fabric down
    if ev.severity is Severity.ERROR:
        return Health.DEGRADED, Advice.RUN_DIAGNOSTICS
    return Health.OK, Advice.IGNORE

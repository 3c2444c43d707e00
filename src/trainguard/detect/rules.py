"""Health rules over telemetry readings: ``Sample`` -> ``Finding``.

Sits in the detect step of the spine (telemetry -> **detect** -> diagnose). Every rule is a pure
function ``rule(sample, prev, th) -> Finding | None``; ``prev`` is an older reading of the same GPU
(or None) for the rules that need a counter rate. ``sample_findings`` runs them all;
``RuleState`` is the small imperative shell that remembers the older readings::

    >>> from trainguard.records import Gpu, Sample
    >>> from trainguard.detect.thresholds import Thresholds
    >>> f = sample_findings(Sample(Gpu(0), time=0.0, ecc_dbe_volatile=2), None, Thresholds())
    >>> f[0].rule, f[0].health.value, f[0].action.value
    ('ecc_dbe', 'failed', 'reset_gpu')

Rules are written for throughput (bench_detect: >= 100k readings/s/core): plain attribute reads,
early exits, and no allocation unless a rule fires.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

from trainguard.actions import Advice
from trainguard.detect.thresholds import Thresholds
from trainguard.records import Category, Finding, Health, RecoveryAction, Sample, Throttle

if TYPE_CHECKING:
    from trainguard.detect.detector import Window

Rule = Callable[[Sample, "Sample | None", Thresholds], "Finding | None"]

_NO_FINDINGS: tuple[Finding, ...] = ()
_MEM, _HW, _LINK, _HEAT = (
    Category.GPU_MEMORY_ECC,
    Category.GPU_HARDWARE,
    Category.INTERCONNECT,
    Category.THERMAL_POWER,
)
# Fields whose absence together means "we could not read this GPU at all".
_METRICS = tuple(
    name
    for name in Sample.__dataclass_fields__
    if name not in ("gpu", "time", "lost", "error", "throttle", "recovery_action")
)


def _f(rule: str, s: Sample, health: Health, action: Advice, reason: str, cat: Category) -> Finding:
    return Finding(rule, health, action, reason, gpu=s.gpu.index, time=s.time, category=cat)


def _rate(cur: int | None, old: int | None, dt: float, per_min: float, th: Thresholds) -> int:
    """The counter delta when it exceeds ``per_min`` (measured over at least rate_min_span_s), else 0."""
    if cur is None or old is None:
        return 0
    delta = cur - old
    if delta <= 0:  # no change, or the counter was reset
        return 0
    span = dt if dt > th.rate_min_span_s else th.rate_min_span_s
    return delta if delta * 60.0 / span > per_min else 0


# --- memory -----------------------------------------------------------------------------------


def ecc_dbe(s: Sample, prev: Sample | None, th: Thresholds) -> Finding | None:
    n = s.ecc_dbe_volatile
    if not n or n <= 0:
        return None
    why = f"{n} uncorrectable (double-bit) ECC error(s) since the last reset"
    return _f("ecc_dbe", s, Health.FAILED, Advice.RESET_GPU, why, _MEM)


def remap_uncorrectable(s: Sample, prev: Sample | None, th: Thresholds) -> Finding | None:
    """A new row remapped for an uncorrectable error: the data it held was lost; reset to apply."""
    n, old = s.remap_uncorrectable, prev.remap_uncorrectable if prev is not None else None
    if n is None or old is None or n <= old:
        return None
    why = f"{n - old} new row remap(s) for uncorrectable errors ({n} in total)"
    return _f("remap_uncorrectable", s, Health.DEGRADED, Advice.RESET_GPU, why, _MEM)


def remap_failure(s: Sample, prev: Sample | None, th: Thresholds) -> Finding | None:
    if not s.remap_failure:
        return None
    why = "row remapping failed: no spare rows left, the GPU needs replacing"
    return _f("remap_failure", s, Health.FAILED, Advice.CONTACT_SUPPORT, why, _MEM)


def remap_pending(s: Sample, prev: Sample | None, th: Thresholds) -> Finding | None:
    if not s.remap_pending or s.remap_failure:
        return None  # a failure already says more than "reset needed"
    why = "row remap pending: reset needed to apply it"
    return _f("remap_pending", s, Health.DEGRADED, Advice.RESET_GPU, why, _MEM)


def retired_pages_total(s: Sample, prev: Sample | None, th: Thresholds) -> Finding | None:
    sbe, dbe = s.retired_sbe, s.retired_dbe
    if sbe is None and dbe is None:
        return None
    total = (sbe or 0) + (dbe or 0)
    if total < th.retired_pages_max:
        return None
    why = f"{total} retired pages (limit {th.retired_pages_max}): the GPU is worn out"
    return _f("retired_pages_total", s, Health.FAILED, Advice.CONTACT_SUPPORT, why, _MEM)


def retired_pages_pending(s: Sample, prev: Sample | None, th: Thresholds) -> Finding | None:
    if not s.retired_pending:
        return None
    why = "page retirement pending: reset needed to apply it"
    return _f("retired_pages_pending", s, Health.DEGRADED, Advice.RESET_GPU, why, _MEM)


# --- thermal and power ------------------------------------------------------------------------


def thermal(s: Sample, prev: Sample | None, th: Thresholds) -> Finding | None:
    t, slow, shut, thr = s.temperature_c, s.temp_slowdown_c, s.temp_shutdown_c, s.throttle
    if t is not None and shut is not None and t >= shut - th.shutdown_margin_c:
        why = f"temperature {t:g} C at or past the shutdown threshold {shut:g} C"
        return _f("thermal", s, Health.DEGRADED, Advice.DRAIN, why, _HEAT)  # lost next: then failed
    hot = t is not None and slow is not None and t >= slow - th.thermal_margin_c
    active = bool(thr and Throttle.HW_THERMAL in thr)
    if not hot and not active:
        return None
    parts = [f"temperature {t:g} C at or past the slowdown threshold {slow:g} C"] if hot else []
    if active:
        parts.append("HW thermal slowdown active")
    return _f("thermal", s, Health.DEGRADED, Advice.RUN_DIAGNOSTICS, "; ".join(parts), _HEAT)


def power_brake(s: Sample, prev: Sample | None, th: Thresholds) -> Finding | None:
    thr = s.throttle
    if not thr or Throttle.HW_POWER_BRAKE not in thr:
        return None
    why = "HW power brake active: the board or PSU asserted a power brake"
    return _f("power_brake", s, Health.DEGRADED, Advice.RUN_DIAGNOSTICS, why, _HEAT)


def hw_slowdown(s: Sample, prev: Sample | None, th: Thresholds) -> Finding | None:
    """HW slowdown that neither the thermal nor the power-brake reason explains."""
    thr = s.throttle
    if not thr or Throttle.HW_SLOWDOWN not in thr:
        return None
    if Throttle.HW_THERMAL in thr or Throttle.HW_POWER_BRAKE in thr:
        return None
    t, slow = s.temperature_c, s.temp_slowdown_c
    if t is not None and slow is not None and t >= slow - th.thermal_margin_c:
        return None  # the thermal rule reports it
    why = "HW slowdown active (clocks halved or worse)"
    return _f("hw_slowdown", s, Health.DEGRADED, Advice.RUN_DIAGNOSTICS, why, _HEAT)


# --- interconnect -----------------------------------------------------------------------------


def pcie_replay(s: Sample, prev: Sample | None, th: Thresholds) -> Finding | None:
    if prev is None or s.pcie_replay is None:
        return None
    dt = s.time - prev.time
    if dt <= 0:
        return None
    n = _rate(s.pcie_replay, prev.pcie_replay, dt, th.pcie_replay_per_min, th)
    if not n:
        return None
    per_min = n * 60.0 / dt
    why = (
        f"PCIe replay storm: {n} replays in {dt:.0f} s ({per_min:.0f}/min, limit {th.pcie_replay_per_min:g})"
    )
    return _f("pcie_replay", s, Health.DEGRADED, Advice.RUN_DIAGNOSTICS, why, _LINK)


def pcie_downtrain(s: Sample, prev: Sample | None, th: Thresholds) -> Finding | None:
    util = s.util_gpu_pct
    if util is None or util < th.load_util_pct:
        return None  # idle GPUs drop the link speed on purpose
    gen, gmax, wid, wmax = s.pcie_gen, s.pcie_gen_max, s.pcie_width, s.pcie_width_max
    low_gen = gen is not None and gmax is not None and gen < gmax
    low_wid = wid is not None and wmax is not None and wid < wmax
    if not low_gen and not low_wid:
        return None
    why = f"PCIe link downtrained under load: gen {gen}/{gmax}, x{wid}/x{wmax}"
    return _f("pcie_downtrain", s, Health.DEGRADED, Advice.RUN_DIAGNOSTICS, why, _LINK)


def nvlink_down(s: Sample, prev: Sample | None, th: Thresholds) -> Finding | None:
    up, total = s.nvlink_up, s.nvlink_total
    if up is None or not total or up >= total:
        return None
    why = f"{total - up} of {total} NVLink links down"
    return _f("nvlink_down", s, Health.DEGRADED, Advice.RESET_GPU, why, _LINK)


def nvlink_errors(s: Sample, prev: Sample | None, th: Thresholds) -> Finding | None:
    if prev is None or (s.nvlink_crc_errors is None and s.nvlink_replay_errors is None):
        return None
    dt = s.time - prev.time
    if dt <= 0:
        return None
    crc = _rate(s.nvlink_crc_errors, prev.nvlink_crc_errors, dt, th.nvlink_crc_per_min, th)
    rep = _rate(s.nvlink_replay_errors, prev.nvlink_replay_errors, dt, th.nvlink_replay_per_min, th)
    rec = _rate(s.nvlink_recovery_errors, prev.nvlink_recovery_errors, dt, th.nvlink_recovery_per_min, th)
    if not (crc or rep or rec):
        return None
    parts = [
        f"{n} {what} ({n * 60.0 / dt:.0f}/min)"
        for n, what in ((crc, "CRC errors"), (rep, "replays"), (rec, "recoveries"))
        if n
    ]
    why = f"NVLink error storm in {dt:.0f} s: " + ", ".join(parts)
    return _f("nvlink_errors", s, Health.DEGRADED, Advice.RUN_DIAGNOSTICS, why, _LINK)


# --- the GPU as a whole -----------------------------------------------------------------------


def straggler(s: Sample, prev: Sample | None, th: Thresholds) -> Finding | None:
    """Clocks far below max under load with no throttle reason: this GPU slows every collective."""
    util, clk, cmax = s.util_gpu_pct, s.sm_clock_mhz, s.sm_clock_max_mhz
    if util is None or clk is None or not cmax or util < th.load_util_pct:
        return None
    if clk >= cmax * th.straggler_clock_ratio or s.throttle:
        return None  # fast enough, or a throttle reason explains it (and has its own rule)
    why = "no throttle reason" if s.throttle is not None else "throttle reasons unknown"
    why = f"SM clock {clk:g}/{cmax:g} MHz ({clk / cmax:.0%}) at {util:g}% load, {why}: straggler suspect"
    return _f("straggler", s, Health.DEGRADED, Advice.RUN_DIAGNOSTICS, why, _HW)


RECOVERY_VERDICTS = {
    RecoveryAction.GPU_RESET: (Health.FAILED, Advice.RESET_GPU, "the driver requires a GPU reset"),
    RecoveryAction.NODE_REBOOT: (Health.FAILED, Advice.REBOOT_NODE, "the driver requires a node reboot"),
    RecoveryAction.DRAIN_P2P: (
        Health.DEGRADED,
        Advice.DRAIN,
        "the driver asks to drain peer-to-peer traffic",
    ),
    RecoveryAction.DRAIN_AND_RESET: (
        Health.FAILED,
        Advice.DRAIN,
        "the driver asks to drain and reset the GPU",
    ),
}


def recovery_action(s: Sample, prev: Sample | None, th: Thresholds) -> Finding | None:
    ra = s.recovery_action
    if ra is None or ra is RecoveryAction.NONE:
        return None
    entry = RECOVERY_VERDICTS.get(ra)
    if entry is None:
        return None
    health, action, text = entry
    return _f("recovery_action", s, health, action, f"{text} (recovery action {ra.value})", _HW)


SAMPLE_RULES: tuple[Rule, ...] = (
    ecc_dbe,
    remap_failure,
    remap_pending,
    remap_uncorrectable,
    retired_pages_total,
    retired_pages_pending,
    thermal,
    power_brake,
    hw_slowdown,
    pcie_replay,
    pcie_downtrain,
    nvlink_down,
    nvlink_errors,
    straggler,
    recovery_action,
)


def sample_findings(s: Sample, prev: Sample | None, th: Thresholds) -> tuple[Finding, ...]:
    """Every finding for one reading. Never raises: a malformed reading becomes an "unknown"."""
    try:
        if s.lost:
            return (
                _f(
                    "gpu_lost",
                    s,
                    Health.FAILED,
                    Advice.REBOOT_NODE,
                    f"GPU stopped answering: {s.error or 'lost'}",
                    _HW,
                ),
            )
        if s.temperature_c is None and all(getattr(s, n) is None for n in _METRICS):
            return (
                _f(
                    "no_readings",
                    s,
                    Health.UNKNOWN,
                    Advice.NONE,
                    f"no readings from this GPU{': ' + s.error if s.error else ''}",
                    _HW,
                ),
            )
        out: list[Finding] | None = None
        for rule in SAMPLE_RULES:
            found = rule(s, prev, th)
            if found is not None:
                if out is None:
                    out = []
                out.append(found)
        return _NO_FINDINGS if out is None else tuple(out)
    except Exception as exc:  # bad input is a finding, never a crash
        index = getattr(getattr(s, "gpu", None), "index", None)
        return (
            Finding(
                "bad_reading",
                Health.UNKNOWN,
                Advice.NONE,
                f"reading could not be evaluated: {type(exc).__name__}: {exc}",
                gpu=index if isinstance(index, int) else None,
            ),
        )


class RuleState:
    """The imperative shell around the pure rules: remembers each GPU's recent readings.

    Rates are measured against the oldest reading of the last ``rate_window_s``; page retirements
    are timed as they appear, for DCGM's "more than one a week once past 15" limit. A `Detector`
    (detect/detector.py): ``detect(window)`` judges the window's readings.
    """

    name = "sample_rules"

    def __init__(self, thresholds: Thresholds | None = None) -> None:
        self.th = thresholds or Thresholds()
        self._recent: dict[int, deque[Sample]] = {}
        self._retired: dict[int, int] = {}  # last seen total of retired pages
        self._retired_at: dict[int, list[float]] = {}  # when new retirements were first seen
        self.skipped = 0  # readings that could not be evaluated (each also a bad_reading finding)

    def detect(self, window: Window) -> list[Finding]:
        if window.thresholds is not self.th and window.thresholds != self.th:
            self.th = window.thresholds  # a reload: judged by the new ones, rate windows afresh
            self._recent.clear()
            self._retired.clear()
            self._retired_at.clear()
        found = self.evaluate(window.samples)
        self.skipped += sum(f.rule == "bad_reading" for f in found)
        return found

    def evaluate(self, samples: Iterable[Sample]) -> list[Finding]:
        out: list[Finding] = []
        th = self.th
        for s in samples:
            index = s.gpu.index
            recent = self._recent.get(index)
            if recent is None:
                recent = self._recent[index] = deque()
            elif recent and s.time < recent[-1].time:
                recent.clear()  # the clock went backwards (a new run): old readings mean nothing
            out.extend(sample_findings(s, recent[0] if recent else None, th))
            if s.lost:
                continue
            rate = self._retirement_rate(s)
            if rate is not None:
                out.append(rate)
            recent.append(s)
            while len(recent) > 1 and s.time - recent[0].time > th.rate_window_s:
                recent.popleft()
        return out

    def clear(self, index: int) -> None:
        """Forget a GPU's recent readings (after a reset its counters start over)."""
        self._recent.pop(index, None)

    forget = clear

    def previous(self, index: int) -> Sample | None:
        """The newest reading kept for a GPU (None before the first)."""
        recent = self._recent.get(index)
        return recent[-1] if recent else None

    def _retirement_rate(self, s: Sample) -> Finding | None:
        if s.retired_sbe is None and s.retired_dbe is None:
            return None
        th, index = self.th, s.gpu.index
        total = (s.retired_sbe or 0) + (s.retired_dbe or 0)
        last = self._retired.get(index)
        self._retired[index] = total
        times = self._retired_at.setdefault(index, [])
        if last is not None and total > last:
            times.extend([s.time] * (total - last))
        if times:
            cutoff = s.time - th.retired_pages_window_s
            times[:] = [t for t in times if t >= cutoff]
        if total <= th.retired_pages_rate_floor or len(times) <= th.retired_pages_per_week:
            return None
        why = (
            f"{len(times)} pages retired within a week, {total} in total "
            f"(limit: {th.retired_pages_per_week} a week past {th.retired_pages_rate_floor})"
        )
        return _f("retired_pages_rate", s, Health.FAILED, Advice.CONTACT_SUPPORT, why, _MEM)

"""Every number the health rules compare against, in one frozen dataclass.

Sits beside the rules (``detect.rules``, ``detect.xid_rules``): they take a ``Thresholds`` and
never read a constant of their own, so a site can tune one field without touching code::

    >>> from trainguard.detect.thresholds import Thresholds
    >>> Thresholds(pcie_replay_per_min=20).thermal_margin_c
    0.0

Defaults follow DCGM's health watches and NVIDIA's Xid catalog where they have a number.
"""

from __future__ import annotations

from dataclasses import dataclass

DAY_S = 86_400.0
WEEK_S = 7 * DAY_S


@dataclass(frozen=True, slots=True)
class Thresholds:
    # --- memory (DCGM's page-retirement limits; pre-Ampere GPUs) ---
    retired_pages_max: int = 63  # total retired pages at which the GPU is worn out (DCGM)
    retired_pages_rate_floor: int = 15  # past this many, retirements are also rate-limited (DCGM)
    retired_pages_per_week: int = 1  # more new retirements than this within a week fails the GPU
    retired_pages_window_s: float = WEEK_S  # the "week" of the rate limit above

    # --- thermal and power ---
    thermal_margin_c: float = 0.0  # degraded when temperature >= slowdown threshold - margin
    shutdown_margin_c: float = 0.0  # failed when temperature >= shutdown threshold - margin

    # --- load-dependent rules (idle GPUs legitimately drop clocks and PCIe speed) ---
    load_util_pct: float = 50.0  # GPU utilisation at which a GPU counts as "under load"
    straggler_clock_ratio: float = 0.7  # SM clock below this fraction of max, under load, unexplained

    # --- counter rates (cumulative counters; rates need two samples) ---
    pcie_replay_per_min: float = 8.0  # DCGM's PCIe replay-rate limit
    nvlink_crc_per_min: float = 100.0  # CRC errors (flit + data) summed over links
    nvlink_replay_per_min: float = 10.0  # replays summed over links
    nvlink_recovery_per_min: float = 1.0  # link recoveries: each one stalls traffic
    rate_window_s: float = 60.0  # rates are measured over the samples of the last minute
    rate_min_span_s: float = 60.0  # a delta never counts as a rate over less than this span:
    #                                one replay seen 1 s apart is not "60 per minute"

    # --- kernel-log (Xid) rules ---
    xid_same_event_s: float = 1.0  # lines of one code on one GPU this close are one occurrence
    xid_burst_window_s: float = 30.0  # Xids on one GPU closer than this are one burst (Xid 45 echo)
    app_xids: tuple[int, ...] = (13, 31, 43)  # application-class Xids: the app's problem when alone
    app_xid_repeat: int = 3  # this many application Xids on one GPU ...
    app_xid_window_s: float = 600.0  # ... within this window call for diagnostics
    fatal_xid_support_bursts: int = 3  # this many fatal-Xid bursts on one GPU ...
    fatal_xid_support_window_s: float = DAY_S  # ... within this window call for support
    xid_hold_s: float = DAY_S  # a fatal Xid keeps its GPU failed this long, unless the GPU re-inits
    app_xid_hold_s: float = 600.0  # an application Xid stays visible (as ok) this long

"""How simulated GPUs wear out: slow precursors before a failure, and the harmless noise of
healthy GPUs, with every parameter in one place (`KINDS`, `NOISE`, `LOAD`).

Where it sits: a failure predictor learns from series of readings (trainguard.predictor); these
are the failure physics it learns, and none of them is a reading a health rule reads
(detect/rules.py) until the failure itself, except where the table says so::

    kind            precursor (what the readings show before the failure)     failure (its evidence)
    dbe             correctable ECC errors creep, ever faster                 Xid 48 + 63, DBE counters
    remap_failure   rows remapped for correctable errors pile up              Xid 64, remap failure
    thermal         the temperature drifts up under the same load             HW thermal slowdown
    off_bus         PCIe replays grow (crossing the replay rule's 8/min       Xid 79, the GPU is lost
                    only near the end, if at all)
    hang            ever more readings time out (NVML answers nothing)        Xid 119, the GPU is lost
    off_bus_sudden  nothing                                                   Xid 79, the GPU is lost
    dbe_sudden      nothing                                                   Xid 48 + 63

Healthy GPUs are not clean: the inlet air follows the day, jobs come and go (idle GPUs run
cool), some GPUs have a steady trickle of correctable errors, a few old remapped rows, bursts
of PCIe replays, or an hour of slow answers from a busy host (`NOISE`). A precursor is a
``Condition`` attached by `Wear` (it survives GPU resets, as a wearing part does); the failure
is an ordinary fault (faults.py) or `Hang`. A planned life (`plan_gpu`) is what a generator
schedules; a model must never read it, only the readings it produces.

    >>> import random
    >>> life = plan_gpu(random.Random(0), "thermal", life_s=72 * 3600.0)
    >>> life.kind, life.failure_s is not None, [type(f).__name__ for _, f in life.faults]
    ('thermal', True, ['Wear', 'Wear', 'ThermalRunaway'])
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field
from typing import Any

from trainguard.telemetry.sim import kmsg
from trainguard.telemetry.sim.profiles import GpuProfile
from trainguard.telemetry.sim.state import Condition, FaultContext

__all__ = [
    "KINDS",
    "LOAD",
    "NOISE",
    "Ambient",
    "FlakyScrape",
    "Hang",
    "Kind",
    "Life",
    "OldRemaps",
    "RemapCreep",
    "ReplayBursts",
    "ReplayCreep",
    "SbeCreep",
    "ScrapeDecay",
    "SteadySbe",
    "ThermalDrift",
    "Wear",
    "ambient",
    "load_schedule",
    "plan_gpu",
]

H = 3600.0


# -- the parameters, in one place ---------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Kind:
    """One failure kind: its share of the failing GPUs, how long before the failure its
    precursor begins (hours, uniform; None: no precursor) and the precursor's strength."""

    share: float
    lead_h: tuple[float, float] | None
    strength: dict[str, tuple[float, float]] = field(default_factory=dict)  # uniform ranges


KINDS: dict[str, Kind] = {
    # correctable errors at 0.3/h at onset, growing exponentially to end_per_h at the failure
    "dbe": Kind(1 / 7, (6, 60), {"start_per_h": (0.2, 0.5), "end_per_h": (8, 120)}),
    # rows remapped for correctable errors, accelerating to `rows` at the failure (a bank has 8-16 spares)
    "remap_failure": Kind(1 / 7, (12, 72), {"rows": (6, 14)}),
    # the temperature rises by `rise_c` over the lead (held 1 C under the SW slowdown target)
    "thermal": Kind(1 / 7, (4, 36), {"rise_c": (10, 24)}),
    # replays from 0.02/min growing to end_per_min (the replay rule fires past 8/min)
    "off_bus": Kind(1 / 7, (3, 48), {"start_per_min": (0.01, 0.04), "end_per_min": (1.5, 14)}),
    # the share of readings that time out grows from 1% to `end_share`
    "hang": Kind(1 / 7, (1, 12), {"end_share": (0.25, 0.8)}),
    "off_bus_sudden": Kind(1 / 7, None),
    "dbe_sudden": Kind(1 / 7, None),
}


@dataclass(frozen=True, slots=True)
class Noise:
    """What healthy GPUs (and failing ones, before and beside their precursor) show."""

    ambient_c: tuple[float, float] = (0.5, 2.5)  # amplitude of the daily inlet swing, per node
    steady_sbe_share: float = 0.15  # GPUs with a steady trickle of correctable errors ...
    steady_sbe_per_h: tuple[float, float] = (0.05, 3.0)  # ... at this rate
    old_remaps_share: float = 0.08  # GPUs with rows remapped long ago ...
    old_remaps: tuple[int, int] = (1, 4)  # ... this many
    replay_bursts_share: float = 0.10  # GPUs with bursts of PCIe replays ...
    replay_bursts_per_day: tuple[float, float] = (0.5, 4.0)
    replay_burst_size: tuple[int, int] = (3, 150)  # replays per burst (a big one trips the rule)
    flaky_scrape_share: float = 0.06  # GPUs whose readings time out for a while (a busy host) ...
    flaky_scrape_hours: tuple[float, float] = (0.5, 6.0)
    flaky_scrape_p: tuple[float, float] = (0.03, 0.25)  # ... this share of them
    missed_p: float = 0.002  # any reading of any GPU times out this often


NOISE = Noise()


@dataclass(frozen=True, slots=True)
class Load:
    """Jobs come and go: a node alternates busy spells and idle gaps (hours, uniform)."""

    busy_h: tuple[float, float] = (2.0, 20.0)
    idle_h: tuple[float, float] = (0.2, 2.5)
    busy: float = 0.97
    idle: float = 0.0


LOAD = Load()


# -- precursors and noise: conditions on the readings --------------------------------------------


def _hours(since: float, now: float) -> float:
    return max(0.0, now - since) / H


def _add(r: dict[str, Any], keys: tuple[str, ...], n: int) -> None:
    for k in keys:
        if r.get(k) is not None:
            r[k] += n


_SBE = ("ecc_sbe_volatile", "ecc_sbe_aggregate")


@dataclass(frozen=True, slots=True)
class SbeCreep:
    """Correctable ECC errors at ``start_per_h``, growing exponentially (e-folding ``tau_h``)."""

    since: float
    start_per_h: float
    tau_h: float

    def apply(self, r: dict[str, Any], now: float, p: GpuProfile, rng: random.Random) -> None:
        h = _hours(self.since, now)
        _add(r, _SBE, int(self.start_per_h * self.tau_h * math.expm1(h / self.tau_h)))


@dataclass(frozen=True, slots=True)
class SteadySbe:
    """A harmless trickle of correctable errors at a constant rate."""

    since: float
    per_h: float

    def apply(self, r: dict[str, Any], now: float, p: GpuProfile, rng: random.Random) -> None:
        _add(r, _SBE, int(self.per_h * _hours(self.since, now)))


@dataclass(frozen=True, slots=True)
class RemapCreep:
    """Rows remapped for correctable errors, accelerating to ``rows`` after ``span_h``."""

    since: float
    rows: int
    span_h: float

    def apply(self, r: dict[str, Any], now: float, p: GpuProfile, rng: random.Random) -> None:
        x = min(1.0, _hours(self.since, now) / self.span_h)
        _add(r, ("remap_correctable",), int(self.rows * x * x))


@dataclass(frozen=True, slots=True)
class OldRemaps:
    """Rows remapped before the series began (the count persists in the InfoROM)."""

    since: float
    rows: int

    def apply(self, r: dict[str, Any], now: float, p: GpuProfile, rng: random.Random) -> None:
        _add(r, ("remap_correctable",), self.rows)


@dataclass(frozen=True, slots=True)
class ThermalDrift:
    """Cooling degrading: the temperature rises ``c_per_h`` over the readings the load gives,
    held 1 C under the SW slowdown target (the failure, `faults.ThermalRunaway`, crosses it)."""

    since: float
    c_per_h: float

    def apply(self, r: dict[str, Any], now: float, p: GpuProfile, rng: random.Random) -> None:
        t = r.get("temperature_c")
        if t is None:
            return
        rise = self.c_per_h * _hours(self.since, now)
        r["temperature_c"] = round(min(t + rise, max(t, p.temp_max_operating_c - 1)))
        if r.get("memory_temp_c") is not None:
            r["memory_temp_c"] = round(r["memory_temp_c"] + rise)


@dataclass(frozen=True, slots=True)
class Ambient:
    """The inlet air follows the day: +-``amplitude_c`` over 24 hours from ``phase`` (radians)."""

    since: float
    amplitude_c: float
    phase: float

    def apply(self, r: dict[str, Any], now: float, p: GpuProfile, rng: random.Random) -> None:
        d = self.amplitude_c * math.sin(2 * math.pi * now / (24 * H) + self.phase)
        for k in ("temperature_c", "memory_temp_c"):
            if r.get(k) is not None:
                r[k] = round(r[k] + d)


@dataclass(frozen=True, slots=True)
class ReplayCreep:
    """PCIe replays at ``start_per_min``, growing exponentially (e-folding ``tau_h``)."""

    since: float
    start_per_min: float
    tau_h: float

    def apply(self, r: dict[str, Any], now: float, p: GpuProfile, rng: random.Random) -> None:
        h = _hours(self.since, now)
        _add(r, ("pcie_replay",), int(60 * self.start_per_min * self.tau_h * math.expm1(h / self.tau_h)))


@dataclass(frozen=True, slots=True)
class ReplayBursts:
    """Harmless bursts of PCIe replays: ``bursts`` is ((time, replays), ...)."""

    since: float
    bursts: tuple[tuple[float, int], ...]

    def apply(self, r: dict[str, Any], now: float, p: GpuProfile, rng: random.Random) -> None:
        _add(r, ("pcie_replay",), sum(n for t, n in self.bursts if t <= now))


def _time_out(r: dict[str, Any]) -> None:
    """NVML timed out on this GPU: the reading holds nothing."""
    for k in list(r):
        if not k.startswith("_"):
            r[k] = None
    r["throttle"] = set()  # the node freezes it; the metrics' None already says nothing was read
    r["error"] = "NVML: Timeout (the GPU did not answer in time)"


@dataclass(frozen=True, slots=True)
class ScrapeDecay:
    """Ever more readings time out: from 1% at ``since`` to ``end_share`` after ``span_h``."""

    since: float
    end_share: float
    span_h: float

    def apply(self, r: dict[str, Any], now: float, p: GpuProfile, rng: random.Random) -> None:
        x = min(1.0, _hours(self.since, now) / self.span_h)
        if rng.random() < 0.01 * (self.end_share / 0.01) ** x:
            _time_out(r)


@dataclass(frozen=True, slots=True)
class FlakyScrape:
    """Readings time out with probability ``p`` from ``since`` until ``until`` (None: always)."""

    since: float
    p: float
    until: float | None = None

    def apply(self, r: dict[str, Any], now: float, p: GpuProfile, rng: random.Random) -> None:
        if now >= self.since and (self.until is None or now < self.until) and rng.random() < self.p:
            _time_out(r)


# -- faults that start them, and the hang ---------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Wear:
    """Attach a lasting condition to a GPU (its ``since`` says when it began; a reset keeps it)."""

    gpu: int
    condition: Condition

    def fire(self, ctx: FaultContext, at: float) -> None:
        ctx.state(self.gpu).defects.append(self.condition)


@dataclass(frozen=True, slots=True)
class Hang:
    """Xid 119: the GSP stops answering RPCs; from now on NVML gets nothing from the GPU."""

    gpu: int

    def fire(self, ctx: FaultContext, at: float) -> None:
        st = ctx.state(self.gpu)
        st.lost_at, st.lost_error = at, "GPU is lost (Xid 119: GSP RPC timeout)"
        pci = ctx.identity(self.gpu).pci or "0000:00:00"
        texts = kmsg.xid_messages(119, ctx.rng("xid119", self.gpu, at))
        ctx.kernel(at, [kmsg.format_xid(pci, 119, t) for t in texts])


# -- planning a life --------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Life:
    """One simulated GPU's plan: its kind ("healthy" or a `KINDS` key), when it fails (seconds
    after the series starts; None: it does not) and the faults to schedule, as (seconds, fault)."""

    kind: str
    failure_s: float | None
    faults: tuple[tuple[float, Any], ...]


def _u(rng: random.Random, lo_hi: tuple[float, float]) -> float:
    return rng.uniform(*lo_hi)


def _noise(rng: random.Random, gpu: int, life_s: float) -> list[tuple[float, Any]]:
    n = NOISE
    out: list[tuple[float, Any]] = [(0.0, Wear(gpu, FlakyScrape(0.0, n.missed_p)))]
    if rng.random() < n.steady_sbe_share:
        out.append((0.0, Wear(gpu, SteadySbe(0.0, _u(rng, n.steady_sbe_per_h)))))
    if rng.random() < n.old_remaps_share:
        out.append((0.0, Wear(gpu, OldRemaps(0.0, rng.randint(*n.old_remaps)))))
    if rng.random() < n.replay_bursts_share:
        k = max(1, round(_u(rng, n.replay_bursts_per_day) * life_s / (24 * H)))
        bursts = tuple(sorted((rng.uniform(0, life_s), rng.randint(*n.replay_burst_size)) for _ in range(k)))
        out.append((0.0, Wear(gpu, ReplayBursts(0.0, bursts))))
    if rng.random() < n.flaky_scrape_share:
        start = rng.uniform(0, life_s)
        until = start + _u(rng, n.flaky_scrape_hours) * H
        out.append((0.0, Wear(gpu, FlakyScrape(start, _u(rng, n.flaky_scrape_p), until))))
    return out


def plan_gpu(
    rng: random.Random, kind: str, life_s: float, gpu: int = 0, min_failure_s: float = 12 * H
) -> Life:
    """The plan of one GPU of ``kind`` observed for ``life_s``: its noise and, unless healthy,
    a failure at a uniform time in [min_failure_s, life_s) after its precursor's onset (which
    may fall before the series starts: the precursor is then already under way)."""
    plan = _noise(rng, gpu, life_s)
    if kind == "healthy":
        return Life(kind, None, tuple(plan))
    k = KINDS[kind]
    fail = rng.uniform(min(min_failure_s, life_s / 2), life_s)
    s = {name: _u(rng, lo_hi) for name, lo_hi in k.strength.items()}
    if k.lead_h is not None:
        lead_h = _u(rng, k.lead_h)
        onset = fail - lead_h * H
        if kind == "dbe":
            tau = lead_h / math.log(s["end_per_h"] / s["start_per_h"])
            plan.append((onset, Wear(gpu, SbeCreep(onset, s["start_per_h"], tau))))
        elif kind == "remap_failure":
            plan.append((onset, Wear(gpu, RemapCreep(onset, round(s["rows"]), lead_h))))
        elif kind == "thermal":
            plan.append((onset, Wear(gpu, ThermalDrift(onset, s["rise_c"] / lead_h))))
        elif kind == "off_bus":
            tau = lead_h / math.log(s["end_per_min"] / s["start_per_min"])
            plan.append((onset, Wear(gpu, ReplayCreep(onset, s["start_per_min"], tau))))
        elif kind == "hang":
            plan.append((onset, Wear(gpu, ScrapeDecay(onset, s["end_share"], lead_h))))
    plan.append((fail, _terminal(kind, gpu)))
    return Life(kind, fail, tuple(plan))


def _terminal(kind: str, gpu: int) -> Any:
    from trainguard.telemetry.sim import faults as F  # faults.py names Wear and Hang in its union

    return {
        "dbe": F.DoubleBitEcc(gpu),
        "dbe_sudden": F.DoubleBitEcc(gpu),
        "remap_failure": F.RowRemapFailure(gpu),
        "thermal": F.ThermalRunaway(gpu, rate_c_per_s=0.2),
        "off_bus": F.FallOffBus(gpu),
        "off_bus_sudden": F.FallOffBus(gpu),
        "hang": Hang(gpu),
    }[kind]


def ambient(rng: random.Random, gpus: int) -> list[tuple[float, Any]]:
    """One node's daily inlet swing, on each of its GPUs."""
    amp, phase = _u(rng, NOISE.ambient_c), rng.uniform(0, 2 * math.pi)
    return [(0.0, Wear(g, Ambient(0.0, amp, phase))) for g in range(gpus)]


def load_schedule(rng: random.Random, life_s: float) -> list[tuple[float, float]]:
    """(seconds, load) changes of one node: busy spells and idle gaps, starting busy."""
    t, busy, out = 0.0, True, []
    while t < life_s:
        out.append((t, LOAD.busy if busy else LOAD.idle))
        t += _u(rng, LOAD.busy_h if busy else LOAD.idle_h) * H
        busy = not busy
    return out

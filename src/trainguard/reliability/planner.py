"""`trainguard plan`: how often a job of N GPUs fails, how often it should checkpoint, and the
ETTR it can expect, from the closed forms in `models`.

Pure: `plan()` takes a `PlanInputs` and returns a JSON-ready dict; `inputs_from_job()` reads a
job's measured checkpoint and restart costs from the incident store (its goodput ledger)::

    >>> p = plan(PlanInputs(nodes=2048, failures_per_node_day=0.0038, write_s=60, restart_s=600))
    >>> round(p["mttf_hours"], 2), round(p["daly_interval_minutes"], 1)
    (3.08, 18.6)
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace
from typing import Any

from trainguard.errors import ConfigError, InputError
from trainguard.reliability import models

TABLE_MINUTES = (5, 10, 15, 20, 30, 45, 60, 90, 120, 180, 240)


@dataclass(frozen=True, slots=True)
class PlanInputs:
    nodes: float
    failures_per_node_day: float
    write_s: float = 60.0  # blocking part of one checkpoint save
    restart_s: float = 600.0  # failure -> training again (detection, relaunch, reload, warm-up)
    interval_s: float | None = None  # the job's current checkpoint interval, if it has one
    gpus_per_node: int = 8
    rate_source: str = models.LLAMA3_SOURCE  # where the failure rate comes from
    cost_source: str = "defaults"


def rate_from_mttf(nodes: float, mttf_hours: float) -> float:
    """Per-node-day rate that gives this job MTTF."""
    if mttf_hours <= 0:
        raise ConfigError(f"--mttf-hours {mttf_hours}: must be above 0")
    return 24.0 / mttf_hours / nodes


def plan(inp: PlanInputs) -> dict[str, Any]:
    if inp.nodes <= 0 or inp.failures_per_node_day < 0:
        raise ConfigError("plan needs a positive job size and a non-negative failure rate")
    rate = models.job_rate_per_s(inp.nodes, inp.failures_per_node_day)
    mttf_s = math.inf if rate == 0 else 1.0 / rate
    young = models.young_interval(inp.write_s, mttf_s) if rate else None
    daly = models.daly_interval(inp.write_s, mttf_s) if rate else None
    # With a free (non-blocking) save, more often is always better: the limit is the restart alone.
    recommended = daly if inp.write_s > 0 and rate > 0 else None

    def ettr(interval_s: float) -> dict[str, float]:
        return {
            "first_order": models.expected_ettr(rate, inp.restart_s, interval_s, inp.write_s),
            "exact": models.exact_ettr(rate, inp.restart_s, interval_s, inp.write_s),
        }

    if recommended is not None:
        at_recommended = ettr(recommended)
    else:
        at_recommended = {
            "first_order": max(0.0, 1.0 - rate * inp.restart_s),
            "exact": math.exp(-rate * inp.restart_s),
        }
    current = ettr(inp.interval_s) if inp.interval_s else None
    chosen = current or at_recommended
    return {
        "nodes": inp.nodes,
        "gpus": round(inp.nodes * inp.gpus_per_node),
        "failures_per_node_day": inp.failures_per_node_day,
        "mttf_hours": mttf_s / 3600.0 if rate else None,
        "failures_per_day": models.failures_per_day(inp.nodes, inp.failures_per_node_day),
        "p_failure_24h": models.p_failure(rate, models.DAY_S),
        "checkpoint_write_seconds": inp.write_s,
        "restart_minutes": inp.restart_s / 60.0,
        "young_interval_minutes": young / 60.0 if young is not None else None,
        "daly_interval_minutes": daly / 60.0 if daly is not None else None,
        "recommended_interval_minutes": recommended / 60.0 if recommended is not None else None,
        "checkpoint_interval_minutes": inp.interval_s / 60.0 if inp.interval_s else None,
        "expected_ettr": chosen["first_order"],
        "expected_ettr_exact": chosen["exact"],
        "expected_ettr_recommended": at_recommended["first_order"],
        "expected_ettr_recommended_exact": at_recommended["exact"],
        "table": [
            {"interval_minutes": m, "expected_ettr": e["first_order"], "expected_ettr_exact": e["exact"]}
            for m in TABLE_MINUTES
            for e in [ettr(m * 60.0)]
        ],
        "rate_source": inp.rate_source,
        "cost_source": inp.cost_source,
        "model": "E[ETTR] = T/(T+W) (1 - N r_f (u0 + (T+W)/2)) (Kokolis et al., HPCA 2025, first order); "
        "exact: N r_f T e^(-N r_f u0) / (e^(N r_f (T+W)) - 1) under Poisson failures",
    }


# Share of Llama 3's interruptions that are GPU hardware (faulty GPU, HBM3, SRAM, GSP, SDC,
# thermal interface: 268 of 419), the part a cooler GPU makes rarer.
GPU_HARDWARE_SHARE = 268 / 419


def power_cap_tradeoff(
    inp: PlanInputs, cap_w: float, tdp_w: float = 700.0, hardware_share: float = GPU_HARDWARE_SHARE
) -> dict[str, Any]:
    """Is a power cap worth it? The cap cools the GPU (fewer hardware failures, Arrhenius) and
    slows it (DVFS). Compares useful work per wall-clock hour, throughput x ETTR, each at its
    own Daly interval (checkpoints and restarts take the same wall time either way)."""
    cap = models.power_cap(cap_w, tdp_w=tdp_w)
    factor = 1.0 - hardware_share + hardware_share * cap.rate_factor
    capped = plan(replace(inp, failures_per_node_day=inp.failures_per_node_day * factor, interval_s=None))
    full = plan(replace(inp, interval_s=None))
    work_full = full["expected_ettr_recommended_exact"]
    work_capped = cap.throughput * capped["expected_ettr_recommended_exact"]
    return {
        "cap_w": cap_w,
        "tdp_w": tdp_w,
        "gpu_temp_c": round(cap.temp_c, 1),
        "gpu_temp_c_uncapped": round(cap.tdp_temp_c, 1),
        "throughput": cap.throughput,
        "failure_rate_factor": factor,
        "mttf_hours": capped["mttf_hours"],
        "expected_ettr_recommended": capped["expected_ettr_recommended_exact"],
        "useful_work": work_capped,
        "useful_work_uncapped": work_full,
        "worth_it": work_capped > work_full,
        "assumptions": f"{hardware_share:.0%} of failures are GPU hardware and follow Arrhenius at 0.7 eV; "
        "die temperature linear in power; throughput ~ (cap / TDP)^(1/3)",
    }


@dataclass(frozen=True, slots=True)
class JobCosts:
    """What a recorded job measured: mean blocking checkpoint, mean recovery, mean interval."""

    job: str
    world_size: int | None
    write_s: float | None
    restart_s: float | None
    interval_s: float | None
    checkpoints: int
    interruptions: int

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def job_costs(store: Any, job: str) -> JobCosts:
    """Measured costs of one job from its goodput ledger: checkpoint stall per save, recovery
    (detection + downtime + restart + re-initialisation) per interruption, compute per save."""
    from trainguard.incidents.goodput import IntervalKind

    info = store.get_job(job)
    intervals = store.intervals(job)
    if info is None and not intervals:
        raise InputError(
            f"no job {job!r} in the incident store {store.path}: see `trainguard incidents list`"
        )
    summary = store.goodput(job)
    saves = [i.end - i.start for i in intervals if i.kind == IntervalKind.CHECKPOINT]
    down = (IntervalKind.DETECTION, IntervalKind.DOWNTIME, IntervalKind.RESTART)
    # A restarted attempt's start-up (imports, rendezvous, load) is recovery; the first one is not.
    recovery = sum(
        i.end - i.start
        for i in intervals
        if i.kind in down or (i.kind == IntervalKind.INIT and i.attempt > 0)
    )
    return JobCosts(
        job=job,
        world_size=info.world_size if info else None,
        write_s=sum(saves) / len(saves) if saves else None,
        restart_s=recovery / summary.interruptions if summary.interruptions else None,
        interval_s=(summary.productive_s + summary.lost_s) / len(saves) if saves else None,
        checkpoints=len(saves),
        interruptions=summary.interruptions,
    )

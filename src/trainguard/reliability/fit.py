"""`trainguard reliability fit`: the survival models fitted to real lifetimes.

Two sources, one shape of result (``{"source", "unit", "batches": {name: fit}}``):

- Titan (`fit_titan`): per GPU, years in service until a DBE/OTB removal, per batch (old/new),
  with the DBE/OTB competing risks and the effect of the cage (position in the cabinet).
- An incident store (`fit_store`): per job, the hours between interruptions (from the job's start
  or the previous incident to the next one, censored at the job's end), with the root causes as
  the competing risks and the job as the covariate.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from trainguard.reliability import survival
from trainguard.reliability.titan import TitanGpu


def fit_lifetimes(
    durations: Sequence[float],
    events: Sequence[bool],
    causes: Sequence[str],
    groups: Sequence[Any] | None,
    horizons: Sequence[float],
    unit: str,
) -> dict[str, Any]:
    n, failures = len(durations), int(sum(events))
    out: dict[str, Any] = {"n": n, "failures": failures, f"exposure_{unit}": round(float(sum(durations)), 3)}
    if failures == 0:
        out["note"] = "no failures: nothing to fit"
        return out
    km = survival.kaplan_meier(durations, events)
    band = survival.survival_at(km, horizons)
    out["km"] = {k: (v["s"] if v else None) for k, v in band.items()}
    out["km_ci95"] = {k: ([v["lo"], v["hi"]] if v else None) for k, v in band.items()}
    p = survival.parametric(durations, events)
    out.update(
        {
            "weibull_shape": round(p["weibull_shape"], 4),
            f"weibull_scale_{unit}": round(p["weibull_scale"], 4),
            f"mttf_{unit}_weibull": round(p["weibull_mean"], 4),
            f"mttf_{unit}_exponential": round(p["exponential_mttf"], 4),
            "aic_weibull": round(p["aic_weibull"], 1),
            "aic_exponential": round(p["aic_exponential"], 1),
        }
    )
    counts = {c: sum(1 for x in causes if x == c) for c in sorted({c for c in causes if c})}
    out["causes"] = counts
    out["shares"] = {c: round(k / failures, 4) for c, k in counts.items()}
    # The longest horizon the data reaches (the new batch was watched for ~3.5 years).
    horizon = max((h for h in horizons if h <= max(durations)), default=min(horizons))
    out["cumulative_incidence_at"] = f"{horizon:g}"
    out["cumulative_incidence"] = survival.cumulative_incidence(durations, causes, horizon)
    if groups is not None and len(set(groups)) > 1:
        out["by_group"] = survival.by_group(durations, events, groups, horizon)
    return out


def fit_titan(gpus: Sequence[TitanGpu]) -> dict[str, Any]:
    """Per batch: KM at 1..5 years, Weibull, MTTF, DBE/OTB shares, hazard by cage."""
    batches: dict[str, Any] = {}
    for name in ("old", "new"):
        sel = [g for g in gpus if g.batch == name]
        fit = fit_lifetimes(
            [g.years for g in sel],
            [g.dead for g in sel],
            [g.cause for g in sel],
            [g.cage for g in sel],
            survival.HORIZONS,
            "years",
        )
        fit["dbe_share"] = fit.get("shares", {}).get("dbe", 0.0)
        fit["otb_share"] = fit.get("shares", {}).get("otb", 0.0)
        if "by_group" in fit:
            fit["by_cage"] = fit.pop("by_group")
        batches[name] = fit
    return {"source": "titan", "unit": "years", "batches": batches}


def store_lifetimes(store: Any) -> tuple[list[float], list[bool], list[str], list[str]]:
    """Hours between interruptions per job, censored at the job's end (or its last incident)."""
    durations: list[float] = []
    events: list[bool] = []
    causes: list[str] = []
    jobs: list[str] = []
    for job in store.list_jobs():
        incidents = [i for i in store.incidents(job=job.job) if i.time is not None]
        times = sorted((i.time, i.root_cause.value) for i in incidents)
        start = job.started if job.started is not None else (times[0][0] if times else None)
        if start is None:
            continue
        prev = start
        for t, cause in times:
            if t > prev:
                durations.append((t - prev) / 3600.0)
                events.append(True)
                causes.append(cause)
                jobs.append(job.job)
            prev = max(prev, t)
        if job.ended is not None and job.ended > prev:
            durations.append((job.ended - prev) / 3600.0)
            events.append(False)
            causes.append("")
            jobs.append(job.job)
    return durations, events, causes, jobs


def fit_store(store: Any) -> dict[str, Any]:
    durations, events, causes, jobs = store_lifetimes(store)
    fit = fit_lifetimes(durations, events, causes, jobs, (1, 6, 24), "hours")
    if "by_group" in fit:
        fit["by_job"] = fit.pop("by_group")
    return {"source": f"store:{store.path}", "unit": "hours", "batches": {"all": fit}}

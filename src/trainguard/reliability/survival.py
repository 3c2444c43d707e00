"""Survival analysis with right-censoring, on lifelines: Kaplan-Meier with confidence bands,
exponential and Weibull maximum likelihood, competing risks (Aalen-Johansen) and hazard by a
covariate (per-group rates and a log-rank test).

Pure functions over arrays of durations and event flags; the callers (`fit.py`) choose the data
(Titan, the incident store) and the units. Results are JSON-ready dicts.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from typing import Any

from trainguard.reliability import need

HORIZONS = (1, 2, 3, 4, 5)


def _np() -> Any:
    return need("numpy")


def kaplan_meier(durations: Sequence[float], events: Sequence[bool], label: str = "") -> Any:
    """The fitted lifelines KaplanMeierFitter (95% Greenwood/log-log band)."""
    lifelines = need("lifelines")
    return lifelines.KaplanMeierFitter(label=label or None).fit(durations, event_observed=events)


def survival_at(km: Any, horizons: Sequence[float]) -> dict[str, dict[str, float] | None]:
    """S(t) with its 95% band at each horizon; None past the last observed time (no data there)."""
    out: dict[str, dict[str, float] | None] = {}
    last = float(km.timeline.max())
    ci = km.confidence_interval_survival_function_
    for h in horizons:
        key = f"{h:g}"
        if h > last:
            out[key] = None
            continue
        idx = ci.index.searchsorted(h, side="right") - 1
        out[key] = {
            "s": round(float(km.predict(h)), 4),
            "lo": round(float(ci.iloc[idx, 0]), 4),
            "hi": round(float(ci.iloc[idx, 1]), 4),
        }
    return out


def parametric(durations: Sequence[float], events: Sequence[bool]) -> dict[str, float]:
    """Exponential and Weibull MLE. Weibull S(t) = exp(-(t / scale) ** shape): shape > 1 means
    wear-out (the hazard rises with age), < 1 infant mortality, = 1 exponential."""
    lifelines = need("lifelines")
    np = _np()
    t = np.maximum(np.asarray(durations, dtype=float), 1e-9)  # lifelines needs t > 0
    e = np.asarray(events, dtype=bool)
    expo = lifelines.ExponentialFitter().fit(t, e)
    weib = lifelines.WeibullFitter().fit(t, e)
    shape, scale = float(weib.rho_), float(weib.lambda_)
    return {
        "exponential_mttf": float(expo.lambda_),  # = exposure / failures
        "weibull_shape": shape,
        "weibull_scale": scale,
        "weibull_mean": scale * math.gamma(1.0 + 1.0 / shape),
        "aic_exponential": float(expo.AIC_),
        "aic_weibull": float(weib.AIC_),
    }


def cumulative_incidence(
    durations: Sequence[float], causes: Sequence[str], horizon: float
) -> dict[str, float | None]:
    """Aalen-Johansen cumulative incidence of each cause by ``horizon`` (causes "" = censored):
    the probability of failing of that cause, with the other causes competing."""
    lifelines = need("lifelines")
    np = _np()
    names = sorted({c for c in causes if c})
    codes = np.array([names.index(c) + 1 if c else 0 for c in causes])
    t = np.asarray(durations, dtype=float)
    out: dict[str, float | None] = {}
    for i, name in enumerate(names, start=1):
        if horizon > t.max():
            out[name] = None
            continue
        aj = lifelines.AalenJohansenFitter(calculate_variance=False, seed=0)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "tied event times were jittered": intended
            aj.fit(t, codes, event_of_interest=i)
        cif = aj.cumulative_density_
        out[name] = round(float(cif.iloc[cif.index.searchsorted(horizon, side="right") - 1, 0]), 4)
    return out


def by_group(
    durations: Sequence[float], events: Sequence[bool], groups: Sequence[Any], horizon: float
) -> dict[str, Any]:
    """Hazard by a covariate: per group, failures per unit of exposure (the exponential MLE of
    the rate), its ratio to the overall rate and KM survival at ``horizon``; with a multivariate
    log-rank test of "the groups share one survival curve"."""
    lifelines = need("lifelines")
    np = _np()
    t, e, g = np.asarray(durations, dtype=float), np.asarray(events, dtype=bool), np.asarray(groups)
    overall = e.sum() / t.sum()
    table: dict[str, dict[str, Any]] = {}
    for value in sorted(set(g.tolist())):
        m = g == value
        km = kaplan_meier(t[m], e[m])
        s = survival_at(km, [horizon])[f"{horizon:g}"]
        rate = e[m].sum() / t[m].sum()
        table[str(value)] = {
            "n": int(m.sum()),
            "failures": int(e[m].sum()),
            "rate": round(float(rate), 6),
            "rate_ratio": round(float(rate / overall), 3) if overall > 0 else None,
            "km": s["s"] if s else None,
        }
    test = lifelines.statistics.multivariate_logrank_test(t, g, e)
    return {"groups": table, "logrank_p": float(test.p_value), "logrank_chi2": float(test.test_statistic)}

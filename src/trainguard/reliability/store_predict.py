"""`trainguard reliability predict --store PATH`: which GPUs and nodes of a deployment fail next,
from its own incident history, with the models `predict` fits to Titan.

The store records incidents, not inventories or telemetry series, so the records are built
from what it has. The fleet is every node an incident names times GPUs 0..G-1 (G: the jobs'
GPUs per node, or the highest index seen). Time is job time: hours covered by at least one
job, so idle gaps between jobs count for nothing. That time is cut into `windows` equal parts;
for each part after the first, every unit (GPU or node) gives one record: its covariates from
everything before the part, and the hours into the part until its first failure (an
interrupting incident with a hardware root cause), else censored at the part's end. The units
are split 70/30 with the seed (a unit's records stay together); both models train on the 70%
and are scored by concordance on the 30%; the ranking refits on every unit and scores each on
its whole history (with too few failures, by the ridge-penalised Cox model: choosing a model by
a handful of held-out failures would be noise).

Covariates: node and GPU index; earlier failures, near misses (incidents the workers survived,
e.g. a GPU the node agent found degraded) and telemetry-detected findings on the unit;
incidents on the rest of its node; and the category mix of its earlier incidents. Telemetry
enters only as those findings: the store keeps no time series of temperatures or counters.

Accuracy is claimed only on real fleet data with enough failures: about 10 per covariate in
training (Peduzzi et al., "Importance of events per independent variable in proportional
hazards regression analysis", J Clin Epidemiol 1995). The result always says so (``claims``).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Sequence
from typing import Any

from trainguard.errors import ConfigError, InputError
from trainguard.incidents.goodput import JobInfo
from trainguard.incidents.incident import Incident
from trainguard.incidents.taxonomy import RootCause as RC
from trainguard.reliability import need
from trainguard.reliability.fleet import job_spans
from trainguard.reliability.predict import (
    Design,
    boosting_risk,
    concordance,
    cox_risk,
    design_matrix,
    fit_boosting,
    fit_cox,
    split,
)

GPU_FAILURES = frozenset(
    {RC.FAULTY_GPU, RC.GPU_HBM_MEMORY, RC.GPU_SRAM, RC.GPU_SYSTEM_PROCESSOR, RC.GPU_THERMAL}
)
NODE_FAILURES = GPU_FAILURES | {RC.HOST, RC.NIC, RC.NETWORK_SWITCH_CABLE}
EVENTS_PER_VARIABLE = 10
# Ridge: with about as many model terms as failures, correlated counts need shrinkage
# (Titan, with 3,500 failures, uses 0.01).
COX_PENALIZER = 0.1
CLAIMS = "plumbing only: accuracy is claimed only on real fleet data"
TELEMETRY = (
    "the store keeps no telemetry series; telemetry enters as the findings the node agent "
    "recorded as incidents (detected_by=telemetry) and their categories"
)


def job_hours(spans: Sequence[tuple[float, float]], t: float) -> float:
    """Hours of job time before wall-clock time t."""
    return sum(max(0.0, min(e, t) - s) for s, e in spans) / 3600.0


def _gpu(i: Incident) -> str | None:
    return None if i.gpu is None else f"{i.node or 'local'}/gpu{i.gpu}"


def _node(i: Incident) -> str | None:
    return i.node or ("local" if i.gpu is not None else None)


def _features(
    hist: list[tuple[float, Incident]],
    unit: str,
    key: Callable[[Incident], str | None],
    failures: frozenset[RC],
    categories: Sequence[str],
) -> dict[str, float]:
    own = [i for _, i in hist if key(i) == unit]
    node = unit.split("/")[0]
    f: dict[str, float] = {
        "failures_before": sum(not i.resolved and i.root_cause in failures for i in own),
        "near_misses_before": sum(i.resolved for i in own),
        "telemetry_findings_before": sum(i.detected_by == "telemetry" for i in own),
    }
    if key is _gpu:
        f["node_incidents_before"] = sum(_node(i) == node and key(i) != unit for _, i in hist)
    for c in categories:
        f[f"category_{c}"] = sum(i.category == c for i in own)
    return f


def unit_records(
    incidents: Sequence[Incident], jobs: Sequence[JobInfo], kind: str, windows: int
) -> tuple[Any, Any, Design]:
    """(records for training and scoring, one row per unit on its whole history, the design)."""
    pd = need("pandas")
    spans = job_spans(jobs, incidents)
    total = job_hours(spans, math.inf)
    timed = sorted((job_hours(spans, i.time), i) for i in incidents)
    key, failures = (_gpu, GPU_FAILURES) if kind == "gpu" else (_node, NODE_FAILURES)
    nodes = sorted({n for i in incidents if (n := _node(i))})
    if kind == "gpu":
        per_node = max(
            [j.world_size or 0 for j in jobs] + [i.gpu + 1 for i in incidents if i.gpu is not None]
        )
        units = [f"{n}/gpu{g}" for n in nodes for g in range(per_node)]
    else:
        units = nodes
    if total <= 0 or not units:
        raise InputError(
            f"the store has no incidents that name a {kind} within a job's span: nothing to predict "
            "(the supervisor names the GPU and node when it attributes a failure to one)"
        )
    categories = sorted({i.category for i in incidents if i.category})
    rows, now = [], []
    width = total / windows
    for w in range(1, windows + 1):
        start, end = w * width, min(total, (w + 1) * width)
        hist = [(h, i) for h, i in timed if h < start]
        for u in units:
            row: dict[str, Any] = {"unit": u, **_features(hist, u, key, failures, categories)}
            if w == windows:
                now.append(row)
                continue
            hit = [
                h
                for h, i in timed
                if start <= h < end and key(i) == u and not i.resolved and i.root_cause in failures
            ]
            rows.append({**row, "hours": (hit[0] if hit else end) - start, "dead": int(bool(hit))})
    cat = ("node_code", "gpu_index") if kind == "gpu" else ("node_code",)
    for r in rows + now:
        r["node_code"] = nodes.index(r["unit"].split("/")[0])
        r["gpu_index"] = int(r["unit"].rsplit("gpu", 1)[1]) if kind == "gpu" else 0
    numeric = tuple(k for k in now[0] if k not in ("unit", "node_code", "gpu_index"))
    design = Design(cat, numeric, duration="hours", period=width / 4)
    return pd.DataFrame(rows), pd.DataFrame(now), design


def predict_units(
    incidents: Sequence[Incident],
    jobs: Sequence[JobInfo],
    kind: str = "gpu",
    seed: int = 0,
    windows: int = 4,
    top: int = 10,
) -> dict[str, Any]:
    np = need("numpy")
    df, now, design = unit_records(incidents, jobs, kind, windows)
    units = sorted(set(df["unit"]))
    tr, te = split(len(units), seed)
    held = {units[i] for i in te}
    is_held = df["unit"].isin(held)
    train, test = df[~is_held].reset_index(drop=True), df[is_held].reset_index(drop=True)
    n_vars = len(_varying_columns(train, design))
    out: dict[str, Any] = {
        "unit": kind,
        "seed": seed,
        "windows": windows,
        "window_hours": round(design.period * 4, 3),
        "n_units": len(units),
        "n_train_units": len(tr),
        "n_test_units": len(te),
        "failures_train": int(train["dead"].sum()),
        "failures_test": int(test["dead"].sum()),
        "covariates": [*design.categorical, *design.numeric],
        "concordance_baseline": 0.5,
        "model_terms": n_vars,
        "failures_needed": EVENTS_PER_VARIABLE * n_vars,
    }
    out["enough_failures"] = out["failures_train"] >= out["failures_needed"]
    if out["failures_train"] == 0 or out["failures_test"] == 0:
        raise InputError(
            f"{kind}s: {out['failures_train']} failures among the training {kind}s and {out['failures_test']} "
            f"among the held-out ones; both need some (about {out['failures_needed']} in training): "
            "the store holds too little history to fit or score a model"
        )
    periods = windows * 4
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        cox = fit_cox(train, COX_PENALIZER, design)
        boost = fit_boosting(train, periods, seed, design)
        models = {
            "cox_ph": round(concordance(test, cox_risk(cox, test, design), "hours"), 4),
            "gradient_boosting_discrete_time": round(
                concordance(test, boosting_risk(boost, test, periods, design), "hours"), 4
            ),
        }
        best = max(models, key=lambda k: models[k])
        # The penalised Cox model has far fewer ways to overfit than boosting.
        ranked_by = best if out["enough_failures"] else "cox_ph"
        if ranked_by == "cox_ph":
            risk = cox_risk(fit_cox(df, COX_PENALIZER, design), now, design)
        else:
            risk = boosting_risk(fit_boosting(df, periods, seed, design), now, periods, design)
    rel = risk / max(float(np.median(risk)), 1e-12)
    order = np.argsort(-risk, kind="stable")
    out.update(models=models, best_model=best, concordance_holdout=models[best], ranked_by=ranked_by)
    out["fit_warnings"] = sorted({str(w.message).strip().splitlines()[0] for w in caught})
    out["highest_risk"] = [
        {
            "unit": now["unit"][i],
            "risk": round(float(rel[i]), 3),
            "failures": int(now["failures_before"][i]),
            "near_misses": int(now["near_misses_before"][i]),
        }
        for i in order[:top]
    ]
    return out


def _varying_columns(train: Any, design: Design) -> list[str]:
    x = design_matrix(train, design)
    return [c for c in x.columns if x[c].std() > 0]


def claims(gpus: dict[str, Any]) -> str:
    """What the result may be taken to show: never accuracy, unless real data and enough of it."""
    if gpus["failures_train"] < gpus["failures_needed"]:
        return (
            f"{CLAIMS}; this store has {gpus['failures_train']} GPU failures in training where a model on "
            f"{gpus['model_terms']} terms needs about {gpus['failures_needed']} ({EVENTS_PER_VARIABLE} per term)"
        )
    return f"{CLAIMS}; trainguard cannot tell a simulated store from a real one: only you can"


def predict_store(store: Any, seed: int = 0, windows: int = 4) -> dict[str, Any]:
    if windows < 2:
        raise ConfigError(f"--windows {windows}: at least 2 (the first part is history only)")
    incidents, jobs = store.incidents(), store.list_jobs()
    gpus = predict_units(incidents, jobs, "gpu", seed, windows)
    try:
        nodes: dict[str, Any] = predict_units(incidents, jobs, "node", seed, windows)
    except InputError as exc:
        nodes = {"unit": "node", "note": str(exc)}
    return {
        "source": f"store:{store.path}",
        **gpus,
        "nodes": nodes,
        "telemetry": TELEMETRY,
        "claims": claims(gpus),
    }

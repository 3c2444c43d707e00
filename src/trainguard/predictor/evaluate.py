"""How a failure predictor is scored: per GPU, by its first alarm, as an operator lives it.

A predictor scores every GPU at every step; a GPU's first alarm is the first step whose
probability of failing within the horizon H reaches the threshold (an agent would drain the
node then, so later alarms change nothing). Per GPU life:

    failed, first alarm at most H before the failure   caught (lead time: failure - alarm)
    failed, first alarm more than H before it          early (counted against precision)
    failed, no alarm before it                         missed
    did not fail, an alarm                             false alarm
    did not fail, no alarm                             quiet

Per failure kind: recall = caught / GPUs of the kind, precision = caught / alarms on GPUs of the
kind (caught + early), the median lead time of the caught. Over all GPUs: precision = caught /
every alarm (false alarms on healthy GPUs included; it depends on how many GPUs fail, so the
false alarms per 1,000 healthy GPU-days are reported too, which do not), recall = caught /
failed. The fixed rules are scored the same way with their first degraded or failed finding.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from trainguard.reliability import need

__all__ = ["alarm_table", "best_threshold", "first_alarms", "outcomes", "window_scores"]

DAY_S = 86_400.0


def first_alarms(prob: Any, life: Any, t_end: Any, threshold: float, n_lives: int) -> Any:
    """[n_lives]: the time of each life's first step with prob >= threshold (nan: none)."""
    np = need("numpy")
    out = np.full(n_lives, np.nan)
    hit = np.flatnonzero(prob >= threshold)
    if len(hit):
        # rows are in time order within a life: the first hit per life is its first alarm
        lives, first = np.unique(life[hit], return_index=True)
        out[lives] = t_end[hit[first]]
    return out


def outcomes(alarm_s: Any, failure_s: Any, horizon_s: float) -> tuple[list[str], Any]:
    """Each life's outcome (see the module docstring) and lead time (nan unless caught)."""
    np = need("numpy")
    names, lead = [], np.full(len(alarm_s), np.nan)
    for i, (a, f) in enumerate(zip(alarm_s, failure_s, strict=True)):
        if np.isnan(f):
            names.append("quiet" if np.isnan(a) else "false_alarm")
        elif np.isnan(a) or a >= f:
            names.append("missed")
        elif f - a <= horizon_s:
            names.append("caught")
            lead[i] = f - a
        else:
            names.append("early")
    return names, lead


def alarm_table(
    alarm_s: Any, failure_s: Any, kinds: Sequence[str], observed_s: Any, horizon_s: float
) -> dict[str, Any]:
    """Per kind and over all GPUs, as the module docstring defines them."""
    np = need("numpy")
    names, lead = outcomes(alarm_s, failure_s, horizon_s)
    names_a, kinds_a = np.array(names), np.array(kinds)
    rows: dict[str, Any] = {}
    for kind in sorted(set(kinds)):
        m = kinds_a == kind
        count = {o: int(((names_a == o) & m).sum()) for o in ("caught", "early", "missed", "false_alarm")}
        n = int(m.sum())
        if np.isnan(failure_s[m]).all():
            days = float(observed_s[m].sum()) / DAY_S
            rows[kind] = {
                "n": n,
                "false_alarms": count["false_alarm"],
                "false_alarms_per_1000_gpu_days": round(1000 * count["false_alarm"] / days, 2)
                if days
                else None,
            }
            continue
        alarms = count["caught"] + count["early"]
        leads = lead[m & (names_a == "caught")]
        rows[kind] = {
            "n": n,
            **{k: count[k] for k in ("caught", "early", "missed")},
            "recall": round(count["caught"] / n, 4),
            "precision": round(count["caught"] / alarms, 4) if alarms else None,
            "median_lead_h": round(float(np.median(leads)) / 3600, 2) if len(leads) else None,
        }
    failed = ~np.isnan(failure_s)
    caught = int((names_a == "caught").sum())
    alarms = int(np.isin(names_a, ("caught", "early", "false_alarm")).sum())
    healthy_days = float(observed_s[~failed].sum()) / DAY_S
    false = int((names_a == "false_alarm").sum())
    rows["all"] = {
        "n": len(names),
        "failed": int(failed.sum()),
        "caught": caught,
        "alarms": alarms,
        "recall": round(caught / int(failed.sum()), 4) if failed.any() else None,
        "precision": round(caught / alarms, 4) if alarms else None,
        "false_alarms_per_1000_gpu_days": round(1000 * false / healthy_days, 2) if healthy_days else None,
    }
    return rows


def f1(table: dict[str, Any]) -> float:
    p, r = table["all"]["precision"] or 0.0, table["all"]["recall"] or 0.0
    return 0.0 if p + r == 0 else 2 * p * r / (p + r)


def best_threshold(
    prob: Any,
    life: Any,
    t_end: Any,
    failure_s: Any,
    kinds: Sequence[str],
    observed_s: Any,
    horizon_s: float,
) -> float:
    """The alarm threshold with the best F1 of GPU-level precision and recall (validation GPUs)."""
    np = need("numpy")
    grid = np.unique(np.quantile(prob, np.linspace(0.5, 0.99999, 120)))
    best, best_t = -1.0, 0.5
    for t in grid:
        alarms = first_alarms(prob, life, t_end, float(t), len(failure_s))
        score = f1(alarm_table(alarms, failure_s, kinds, observed_s, horizon_s))
        if score > best:
            best, best_t = score, float(t)
    return best_t


def window_scores(y: Any, prob: Any) -> dict[str, float | None]:
    """Per-step figures: average precision, ROC AUC, Brier score and the expected calibration
    error (10 equal-width bins) of calibrated probabilities against the labels."""
    np = need("numpy")
    metrics = need("sklearn.metrics")
    if y.min() == y.max():
        return {
            "average_precision": None,
            "roc_auc": None,
            "brier": None,
            "ece": None,
            "positives": int(y.sum()),
        }
    bins = np.minimum((prob * 10).astype(int), 9)
    ece = sum(
        abs(float(y[bins == b].mean()) - float(prob[bins == b].mean())) * float((bins == b).mean())
        for b in range(10)
        if (bins == b).any()
    )
    return {
        "average_precision": round(float(metrics.average_precision_score(y, prob)), 4),
        "roc_auc": round(float(metrics.roc_auc_score(y, prob)), 4),
        "brier": round(float(metrics.brier_score_loss(y, prob)), 5),
        "ece": round(ece, 5),
        "positives": int(y.sum()),
        "base_rate": round(float(y.mean()), 5),
    }

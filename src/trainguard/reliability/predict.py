"""Which GPUs fail next? Cox proportional hazards and a learned discrete-time hazard model on
location covariates, scored by concordance on held-out GPUs (`trainguard reliability predict`).

On Titan the position in the cabinet carries the signal (Ostrouchov et al., SC '20, tie it to
airflow and temperature: cages are stacked, air flows bottom to top). Both models train on a
seeded 70% of the old batch and are scored on the other 30% with Harrell's concordance index:
the probability that of two GPUs the one that failed first had the higher predicted risk (0.5 is
a model without covariates, 1.0 a perfect ranking).

The learned model is gradient boosting (scikit-learn) on person-period rows: one row per GPU
and half-year at risk, labelled 1 in the half-year it failed; its risk score is the cumulative
hazard it predicts over the batch's span.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from trainguard.reliability import need
from trainguard.reliability.titan import LOCATION_FIELDS, TitanGpu

PERIOD_YEARS = 0.5


@dataclass(frozen=True, slots=True)
class Design:
    """Which columns of a frame the models see: categorical codes (one-hot for Cox, categories
    for boosting), numeric covariates, the duration column and the boosting's period length."""

    categorical: tuple[str, ...]
    numeric: tuple[str, ...] = ()
    duration: str = "years"
    period: float = PERIOD_YEARS


TITAN = Design(LOCATION_FIELDS)


def split(n: int, seed: int, train_share: float = 0.7) -> tuple[Any, Any]:
    np = need("numpy")
    order = np.random.default_rng(seed).permutation(n)
    cut = round(train_share * n)
    return order[:cut], order[cut:]


def _frame(gpus: Sequence[TitanGpu]) -> Any:
    pd = need("pandas")
    return pd.DataFrame(
        {
            "years": [g.years for g in gpus],
            "dead": [int(g.dead) for g in gpus],
            **{k: [getattr(g, k) for g in gpus] for k in LOCATION_FIELDS},
        }
    )


def design_matrix(df: Any, design: Design = TITAN) -> Any:
    pd = need("pandas")
    x = pd.get_dummies(df[list(design.categorical)].astype(str), drop_first=True, dtype=float)
    return x.join(df[list(design.numeric)].astype(float))


def fit_cox(train: Any, penalizer: float = 0.01, design: Design = TITAN) -> Any:
    lifelines = need("lifelines")
    x = design_matrix(train, design)
    x = x.loc[:, x.std() > 0]  # a column constant in training carries no information
    data = x.assign(_t=train[design.duration].to_numpy(), _dead=train["dead"].to_numpy())
    return lifelines.CoxPHFitter(penalizer=penalizer).fit(data, duration_col="_t", event_col="_dead")


def cox_risk(model: Any, df: Any, design: Design = TITAN) -> Any:
    x = design_matrix(df, design).reindex(columns=model.params_.index, fill_value=0.0)
    return model.predict_partial_hazard(x).to_numpy()


def _person_periods(df: Any, periods: int, design: Design = TITAN) -> tuple[Any, Any]:
    np = need("numpy")
    loc = df[[*design.categorical, *design.numeric]].to_numpy(dtype=float)
    years, dead = df[design.duration].to_numpy(), df["dead"].to_numpy()
    at_risk = np.ceil(np.maximum(years, 1e-9) / design.period).astype(int).clip(1, periods)
    rows = np.repeat(np.arange(len(df)), at_risk)
    k = np.concatenate([np.arange(n) for n in at_risk])
    y = ((k == at_risk[rows] - 1) & (dead[rows] == 1)).astype(int)
    return np.column_stack([loc[rows], k]), y


def fit_boosting(train: Any, periods: int, seed: int, design: Design = TITAN) -> Any:
    ensemble = need("sklearn.ensemble")
    x, y = _person_periods(train, periods, design)
    # Location columns and the period are categorical codes, not magnitudes; counts are numbers.
    n_cat = len(design.categorical)
    categorical = [i < n_cat or i == x.shape[1] - 1 for i in range(x.shape[1])]
    model = ensemble.HistGradientBoostingClassifier(
        max_iter=200,
        learning_rate=0.05,
        max_leaf_nodes=15,
        categorical_features=categorical,
        random_state=seed,
    )
    return model.fit(x, y)


def boosting_risk(model: Any, df: Any, periods: int, design: Design = TITAN) -> Any:
    """Cumulative hazard over all periods: -sum log(1 - h_k)."""
    np = need("numpy")
    loc = df[[*design.categorical, *design.numeric]].to_numpy(dtype=float)
    total = np.zeros(len(df))
    for k in range(periods):
        h = model.predict_proba(np.column_stack([loc, np.full(len(df), k)]))[:, 1]
        total -= np.log1p(-np.clip(h, 0.0, 1.0 - 1e-12))
    return total


def concordance(df: Any, risk: Any, duration: str = "years") -> float:
    utils = need("lifelines.utils")
    return float(utils.concordance_index(df[duration], -risk, df["dead"]))


def predict_titan(gpus: Sequence[TitanGpu], seed: int = 0, top: int = 10) -> dict[str, Any]:
    np = need("numpy")
    old = [g for g in gpus if g.batch == "old"]
    df = _frame(old)
    tr, te = split(len(df), seed)
    train, test = df.iloc[tr].reset_index(drop=True), df.iloc[te].reset_index(drop=True)
    periods = math.ceil(df["years"].max() / PERIOD_YEARS)

    cox = fit_cox(train)
    c_cox = concordance(test, cox_risk(cox, test))
    boost = fit_boosting(train, periods, seed)
    risk = boosting_risk(boost, test, periods)
    c_boost = concordance(test, risk)
    models = {"cox_ph": round(c_cox, 4), "gradient_boosting_discrete_time": round(c_boost, 4)}
    best = max(models, key=lambda k: models[k])
    best_risk = cox_risk(cox, test) if best == "cox_ph" else risk

    summary = cox.summary
    hr = {}
    for cage in ("1", "2"):
        row = summary.loc[f"cage_{cage}"]
        hr[cage] = {
            "hazard_ratio": round(float(row["exp(coef)"]), 3),
            "ci95": [
                round(float(row["exp(coef) lower 95%"]), 3),
                round(float(row["exp(coef) upper 95%"]), 3),
            ],
        }
    order = np.argsort(-best_risk)
    test_old = [old[i] for i in te]
    top_rows = [
        {
            "sn": test_old[i].sn,
            "location": _cname(test_old[i]),
            "risk": round(float(best_risk[i] / np.median(best_risk)), 3),
            "failed": bool(test_old[i].dead),
            "years": round(test_old[i].years, 2),
        }
        for i in order[:top]
    ]
    decile = order[: max(1, len(order) // 10)]
    return {
        "source": "titan",
        "batch": "old",
        "seed": seed,
        "n_train": len(train),
        "n_test": len(test),
        "covariates": list(LOCATION_FIELDS),
        "concordance_holdout": models[best],
        "best_model": best,
        "concordance_baseline": 0.5,
        "models": models,
        "hazard_ratio_by_cage": {"reference": "cage 0 (bottom)", **hr},
        "failed_share_holdout": round(float(test["dead"].mean()), 4),
        "failed_share_top_decile": round(float(test["dead"].to_numpy()[decile].mean()), 4),
        "highest_risk": top_rows,
    }


def _cname(g: TitanGpu) -> str:
    return f"c{g.col}-{g.row}c{g.cage}s{g.slot}n{g.node}"

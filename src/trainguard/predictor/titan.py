"""A neural survival model against Cox on Titan's real GPU lifetimes, on the same held-out GPUs.

`reliability.predict` fits Cox proportional hazards to the old batch's location covariates
(cabinet column and row, cage, slot, node) on a seeded 70% of the GPUs and scores the other
30% by concordance. Here DeepSurv (an MLP trained on Cox's partial likelihood, so it may learn
interactions Cox cannot, e.g. a hot cage in one column) reads the same one-hot design on the
same 70%, stopping early on a fifth of it, and both are scored on the same 30%. Each C-index
comes with a 95% bootstrap interval (the held-out GPUs resampled), and so does their
difference (paired: both models on each resample).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from trainguard.reliability import need
from trainguard.reliability.predict import _frame, concordance, cox_risk, design_matrix, fit_cox, split
from trainguard.reliability.titan import LOCATION_FIELDS, TitanGpu

__all__ = ["compare_titan"]


def _ci(np: Any, values: Any) -> list[float]:
    return [round(float(np.percentile(values, 2.5)), 4), round(float(np.percentile(values, 97.5)), 4)]


def compare_titan(gpus: Sequence[TitanGpu], seed: int = 0, boots: int = 200) -> dict[str, Any]:
    np = need("numpy", "predictor")
    from trainguard.predictor import torch as nets

    old = [g for g in gpus if g.batch == "old"]
    df = _frame(old)
    tr, te = split(len(df), seed)
    train, test = df.iloc[tr].reset_index(drop=True), df.iloc[te].reset_index(drop=True)
    cox = fit_cox(train)
    r_cox = cox_risk(cox, test)
    x = design_matrix(df)
    x = x.loc[:, x.iloc[tr].std() > 0].to_numpy(dtype="float32")
    fit_i, val_i = split(len(tr), seed + 1, 0.8)
    t_all, e_all = df["years"].to_numpy(), df["dead"].to_numpy()
    fit_rows, val_rows = tr[fit_i], tr[val_i]
    t0 = time.perf_counter()
    net, curve = nets.fit_deepsurv(
        x[fit_rows],
        t_all[fit_rows],
        e_all[fit_rows],
        val=(x[val_rows], t_all[val_rows], e_all[val_rows]),
        seed=seed,
    )
    train_s = time.perf_counter() - t0
    r_ds = np.exp(nets.risk_of(net, x[te]))
    c = {"cox_ph": concordance(test, r_cox), "deepsurv": concordance(test, r_ds)}
    rng = np.random.default_rng(seed)
    samples: dict[str, list[float]] = {"cox_ph": [], "deepsurv": [], "difference": []}
    for _ in range(boots):
        idx = rng.integers(0, len(test), len(test))
        sub = test.iloc[idx].reset_index(drop=True)
        a, b = concordance(sub, r_cox[idx]), concordance(sub, r_ds[idx])
        samples["cox_ph"].append(a)
        samples["deepsurv"].append(b)
        samples["difference"].append(b - a)
    return {
        "source": "titan",
        "batch": "old",
        "seed": seed,
        "n_train": len(tr),
        "n_test": len(te),
        "failures_test": int(test["dead"].sum()),
        "covariates": list(LOCATION_FIELDS),
        "design_columns": int(x.shape[1]),
        "bootstrap_resamples": boots,
        "models": {m: {"concordance": round(v, 4), "ci95": _ci(np, samples[m])} for m, v in c.items()},
        "difference_deepsurv_minus_cox": {
            "concordance": round(c["deepsurv"] - c["cox_ph"], 4),
            "ci95": _ci(np, samples["difference"]),
        },
        "deepsurv": {
            "parameters": sum(p.numel() for p in net.parameters()),
            "train_s": round(train_s, 1),
            **curve,
        },
    }

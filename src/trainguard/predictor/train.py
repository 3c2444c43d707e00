"""`trainguard reliability train-predictor`: fit, pick, calibrate and score a failure predictor.

    lives -> arrays (every step a scoring point)
          -> GPUs split 70/30 (seeded; by GPU): training | held out (scored once, at the end)
             training split again 80/20: fit | validation
          -> on fit: logistic regression (the baseline), an MLP over the window features, a
             1D-CNN over the window itself
          -> on validation: the net with the better average precision (both horizons) is kept;
             Platt scaling per horizon; the alarm threshold per horizon with the best GPU-level F1
          -> on held out: per-step scores (average precision, AUC, Brier, calibration error)
             and per-kind alarms (precision, recall, lead time) of the net, the logistic
             baseline and the fixed rules

The model never reads a life's kind or failure time, only its points; the labels are the
failure times.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from trainguard.errors import InputError
from trainguard.predictor import evaluate as ev
from trainguard.predictor import features as ft
from trainguard.predictor.data import HORIZONS_S, Arrays, LifeLike, arrays, split_lives
from trainguard.predictor.modelfile import Header
from trainguard.reliability import need

__all__ = ["Trained", "train"]

WIDTH = 72  # steps in a window: 12 h at the simulated fleet's 10-minute step
BATCH = 512
CNN_ROWS = 60_000  # training windows per CNN epoch


@dataclass
class Trained:
    header: Header
    net: Any  # the torch module
    report: dict[str, Any]


class _Inputs:
    """Normalised inputs of rows, for one architecture (the CNN's windows are gathered per chunk)."""

    def __init__(self, arch: str, data: Arrays, mean: Any, std: Any) -> None:
        self.arch, self.data, self.mean, self.std = arch, data, mean, std

    def __call__(self, rows: Any) -> Any:
        if self.arch == "mlp":
            return ((self.data.feats[rows] - self.mean) / self.std).astype("float32")
        x = ft.net_input(self.data.windows(rows))
        return ((x - self.mean[None, :, None]) / self.std[None, :, None]).astype("float32")

    def logits(self, net: Any, rows: Any, chunk: int = 4096) -> Any:
        np = need("numpy")
        from trainguard.predictor import torch as nets

        parts = [nets.logits(net, self(rows[i : i + chunk])) for i in range(0, len(rows), chunk)]
        return np.concatenate(parts) if parts else np.zeros((0, 2), dtype="float32")


def _norm(np: Any, x: Any, axis: Any) -> tuple[Any, Any]:
    mean, std = x.mean(axis=axis), x.std(axis=axis)
    return mean.astype("float32"), np.where(std > 1e-6, std, 1.0).astype("float32")


def _fit_arch(
    arch: str, data: Arrays, fit: Any, val: Any, epochs: int, seed: int
) -> tuple[Any, _Inputs, dict[str, Any]]:
    np = need("numpy")
    from trainguard.predictor import torch as nets

    rng = np.random.default_rng(seed)
    if arch == "mlp":
        mean, std = _norm(np, data.feats[fit], 0)
        rows = fit
    else:
        sample = rng.choice(fit, min(len(fit), 20_000), replace=False)
        mean, std = _norm(np, ft.net_input(data.windows(sample)), (0, 2))
        # Steps near a failure and twice as many others, at most CNN_ROWS: its epochs stay short
        # on a CPU (the MLP reads every step).
        pos = fit[data.y[fit, -1] > 0]
        pos = rng.choice(pos, min(len(pos), CNN_ROWS // 3), replace=False)
        neg = fit[data.y[fit, -1] == 0]
        rows = np.concatenate([pos, rng.choice(neg, min(len(neg), 2 * len(pos)), replace=False)])
    inputs = _Inputs(arch, data, mean, std)
    net = nets.build(arch, len(mean), seed=seed)  # a seed is one model: its first weights too
    vsub = rng.choice(val, min(len(val), 20_000), replace=False)
    vx, vy = inputs(vsub), data.y[vsub]

    def batches(r: Any) -> Any:
        order = r.permutation(rows)
        for i in range(0, len(order), BATCH):
            b = order[i : i + BATCH]
            yield inputs(b), data.y[b]

    pos = data.y[rows].mean(0)
    weight = np.clip((1 - pos) / np.maximum(pos, 1e-6), 1.0, 50.0)  # the 1 h failures are rare
    t0 = time.perf_counter()
    curve = nets.fit_net(net, batches, vx, vy, epochs=epochs, seed=seed, pos_weight=weight)
    curve["train_s"] = round(time.perf_counter() - t0, 1)
    curve["train_rows"] = len(rows)
    curve["parameters"] = sum(p.numel() for p in net.parameters())
    return net, inputs, curve


def sigmoid(x: Any) -> Any:
    np = need("numpy")
    return 0.5 * (1.0 + np.tanh(0.5 * x))  # no overflow at large |x|


def _platt(np: Any, logit: Any, y: Any) -> tuple[float, float]:
    """p = sigmoid(a logit + b) fitted to the validation labels. A slope that comes out at zero
    or below (too few validation failures to tell) would turn the ranking around: then the
    slope stays 1 and only the offset is fitted (mean probability = failure rate)."""
    lm = need("sklearn.linear_model")
    if y.min() == y.max():
        return 1.0, 0.0
    m = lm.LogisticRegression(C=1e4, max_iter=1000).fit(logit[:, None], y)
    a, b = float(m.coef_[0, 0]), float(m.intercept_[0])
    if a > 0:
        return a, b
    lo, hi = -50.0, 50.0
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if sigmoid(logit + mid).mean() < y.mean() else (lo, mid)
    return 1.0, (lo + hi) / 2


def _calibrated(np: Any, logits: Any, platt: Sequence[tuple[float, float]]) -> Any:
    p = np.stack([sigmoid(a * logits[:, h] + b) for h, (a, b) in enumerate(platt)], axis=1)
    p[:, 0] = np.minimum(p[:, 0], p[:, 1])  # failing within 1 h is failing within 24 h
    return p


def train(
    lives: Sequence[LifeLike],
    seed: int = 0,
    arch: str = "auto",
    epochs: int = 8,
    width: int = WIDTH,
    source: str = "",
) -> Trained:
    np = need("numpy", "predictor")
    lm = need("sklearn.linear_model", "predictor")
    data = arrays(lives, width)
    n = len(lives)
    train_l, test_l = split_lives(n, seed)
    fit_i, val_i = split_lives(len(train_l), seed + 1, 0.8)
    fit_l, val_l = train_l[fit_i], train_l[val_i]
    fit, val, test = data.rows_of(fit_l), data.rows_of(val_l), data.rows_of(test_l)
    for name, rows in (("training", fit), ("validation", val), ("held-out", test)):
        if not (data.y[rows, -1] > 0).any():
            raise InputError(
                f"the {name} GPUs hold no step within {HORIZONS_S[-1] / 3600:g} h of a failure: too few "
                f"failures to train on ({int((~np.isnan(data.failure_s)).sum())} among {n} GPUs)"
            )
    # The logistic baseline: the same features, one model per horizon.
    mean, std = _norm(np, data.feats[fit], 0)
    z = (data.feats - mean) / std
    baseline = [lm.LogisticRegression(C=1.0, max_iter=2000).fit(z[fit], data.y[fit, h]) for h in range(2)]
    base_logit = np.stack([m.decision_function(z) for m in baseline], axis=1)
    candidates = {}
    for a in ("mlp", "cnn") if arch == "auto" else (arch,):
        net, inputs, curve = _fit_arch(a, data, fit, val, epochs, seed)
        val_logit = inputs.logits(net, val)
        ap = [ev.window_scores(data.y[val, h], sigmoid(val_logit[:, h]))["average_precision"] or 0.0
              for h in range(2)]  # fmt: skip
        candidates[a] = (net, inputs, curve, val_logit, float(np.mean(ap)))
    best = max(candidates, key=lambda a: candidates[a][4])
    net, inputs, curve, val_logit, _ = candidates[best]
    platt = tuple(_platt(np, val_logit[:, h], data.y[val, h]) for h in range(2))
    base_platt = tuple(_platt(np, base_logit[val, h], data.y[val, h]) for h in range(2))
    p_val = _calibrated(np, val_logit, platt)
    b_val = _calibrated(np, base_logit[val], base_platt)
    thr, base_thr = [], []
    for h, hs in enumerate(HORIZONS_S):
        args = (data.life[val], data.t_end[val], data.failure_s, data.kinds, data.observed_s, hs)
        thr.append(ev.best_threshold(p_val[:, h], *args))
        base_thr.append(ev.best_threshold(b_val[:, h], *args))
    # Scored once, on GPUs nothing above has seen.
    t0 = time.perf_counter()
    test_logit = inputs.logits(net, test)
    predict_s = (time.perf_counter() - t0) / max(1, len(test))
    p_test = _calibrated(np, test_logit, platt)
    b_test = _calibrated(np, base_logit[test], base_platt)
    held = _held_out(np, data, test, test_l, p_test, b_test, thr, base_thr)
    report = {
        "source": source,
        "seed": seed,
        "gpus": n,
        "failed": int((~np.isnan(data.failure_s)).sum()),
        "kinds": {k: data.kinds.count(k) for k in sorted(set(data.kinds))},
        "step_s": data.step_s,
        "window_steps": width,
        "split_gpus": {"fit": len(fit_l), "validation": len(val_l), "held_out": len(test_l)},
        "steps": {"fit": len(fit), "validation": len(val), "held_out": len(test)},
        "candidates": {a: {"validation_ap": round(c[4], 4), **c[2]} for a, c in candidates.items()},
        "model": best,
        "thresholds": [round(t, 5) for t in thr],
        "baseline_thresholds": [round(t, 5) for t in base_thr],
        "predict_us_per_window_batched": round(predict_s * 1e6, 2),
        **held,
    }
    header = Header(
        arch=best,
        size=len(inputs.mean),
        step_s=data.step_s,
        width=width,
        horizons_s=HORIZONS_S,
        channels=ft.CHANNELS,
        features=ft.FEATURES,
        mean=tuple(float(x) for x in inputs.mean),
        std=tuple(float(x) for x in inputs.std),
        platt=platt,
        thresholds=tuple(thr),
        training={k: report[k] for k in ("source", "seed", "gpus", "failed", "kinds", "split_gpus", "model")}
        | {"held_out": report["held_out"]},
    )
    return Trained(header, net, report)


def _held_out(
    np: Any,
    data: Arrays,
    test: Any,
    test_l: Any,
    p: Any,
    b: Any,
    thr: Sequence[float],
    base_thr: Sequence[float],
) -> dict[str, Any]:
    life = data.life[test]
    # Renumber the held-out lives 0..k-1 so the per-life arrays hold only them.
    index = {int(v): i for i, v in enumerate(test_l)}
    local = np.array([index[int(v)] for v in life])
    fail, obs = data.failure_s[test_l], data.observed_s[test_l]
    kinds = [data.kinds[i] for i in test_l]
    out: dict[str, Any] = {"held_out": {}, "alarms": {}}
    for h, hs in enumerate(HORIZONS_S):
        name = f"{hs / 3600:g}h"
        y = data.y[test, h]
        out["held_out"][name] = {
            "net": ev.window_scores(y, p[:, h]),
            "logistic": ev.window_scores(y, b[:, h]),
        }
        out["alarms"][name] = {
            "net": ev.alarm_table(
                ev.first_alarms(p[:, h], local, data.t_end[test], thr[h], len(test_l)), fail, kinds, obs, hs
            ),
            "logistic": ev.alarm_table(
                ev.first_alarms(b[:, h], local, data.t_end[test], base_thr[h], len(test_l)),
                fail,
                kinds,
                obs,
                hs,
            ),
            "rules": ev.alarm_table(data.rule_alarm_s[test_l], fail, kinds, obs, hs),
        }
    return out

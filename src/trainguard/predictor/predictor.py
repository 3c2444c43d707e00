"""Serving a trained failure predictor: a GPU's recent series in, a `Prediction` out.

    Predictor.load("model.safetensors")
    predictor.predict_many([GpuSeries, ...])  ->  [Prediction | None]   (None: too little series)
    predictor.findings([GpuSeries, ...], now) ->  [Finding("predicted_failure", ...)]  (never raises)

A prediction holds P(failure within each horizon), whether it reaches the model's alarm
threshold, the expected lead time, and the readings that drove it (gradient x input over the
normalised input, summed per reading, with what each reading did in words). `findings` is what
a detector wraps: one finding per alarmed GPU, DEGRADED with the action DRAIN, its category
taken from the reading that drove it most. Runs on the CPU; one batched forward pass per call,
the attribution (one backward pass) only for alarmed GPUs.

    >>> p = Predictor.load("model.safetensors")                       # doctest: +SKIP
    >>> [f.reason for f in p.findings(series_of_a_node, now=time.time())]  # doctest: +SKIP
    ['P(failure within 24 h) 0.91, within 1 h 0.07; expected in about 6.2 h; driven by ...']
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trainguard.actions import Advice
from trainguard.detect.detector import PREDICTED_FAILURE
from trainguard.predictor import features as ft
from trainguard.predictor import modelfile
from trainguard.predictor.modelfile import Header
from trainguard.predictor.series import GpuSeries
from trainguard.records import Category, Finding, Health
from trainguard.reliability import need

log = logging.getLogger(__name__)

__all__ = ["RULE", "Prediction", "Predictor", "lead_time_s"]

RULE = PREDICTED_FAILURE
MIN_HISTORY_S = 3600.0  # a GPU with less series than this gets no prediction
_CATEGORY = {
    "ecc_sbe": Category.GPU_MEMORY_ECC,
    "remapped_rows": Category.GPU_MEMORY_ECC,
    "uncorrectable": Category.GPU_MEMORY_ECC,
    "temperature": Category.THERMAL_POWER,
    "pcie_replay": Category.INTERCONNECT,
    "nvlink_crc": Category.INTERCONNECT,
}


@dataclass(frozen=True, slots=True)
class Prediction:
    host: str
    gpu: int
    time: float  # the end of the series' last step
    horizons_s: tuple[float, ...]
    probabilities: tuple[float, ...]  # P(failure within each horizon), calibrated
    alarm: bool  # a probability reached its horizon's threshold
    horizon_s: float | None  # the shortest horizon that alarmed
    lead_s: float  # median time to the failure, if it comes within the longest horizon
    drivers: tuple[tuple[str, float, str], ...] = ()  # (reading, share of the push, what it did)


def lead_time_s(p: Sequence[float], horizons_s: Sequence[float]) -> float:
    """The median time to failure given a failure within the last horizon, under a hazard that
    is constant within each horizon's stretch (P(within 1 h) = 0.5 and P(within 24 h) = 0.6 give
    a median of about 50 minutes)."""
    target = p[-1] / 2
    if target <= 0:
        return float(horizons_s[-1])  # no failure expected: nothing to time
    survive, start = 1.0, 0.0
    for prob, end in zip(p, horizons_s, strict=True):
        s_end = max(1e-12, 1.0 - prob)
        if 1.0 - s_end >= target:  # the median falls in this stretch
            rate = -math.log(s_end / survive) / (end - start) if s_end < survive else 0.0
            return start + (math.log(survive / (1.0 - target)) / rate if rate > 0 else end - start)
        survive, start = s_end, end
    return float(horizons_s[-1])


class Predictor:
    """A trained model and what it needs to read a series (see the module docstring)."""

    name = "failure_predictor"

    def __init__(self, header: Header, net: Any) -> None:
        self.header, self.net = header, net
        self.skipped = 0  # series that could not be scored (a wrong step, a bad value)
        np = need("numpy", "predictor")
        self._mean = np.asarray(header.mean, dtype=np.float32)
        self._std = np.asarray(header.std, dtype=np.float32)

    @classmethod
    def load(cls, path: str | Path) -> Predictor:
        from trainguard.predictor import torch as nets

        header, state = modelfile.load(path)
        net = nets.build(header.arch, header.size)
        net.load_state_dict(state)
        net.eval()
        return cls(header, net)

    def _window(self, series: GpuSeries) -> Any | None:
        h = self.header
        pts = series.points[-(h.width + 1) :]  # one more: the first step's counter deltas need it
        if not pts or any(abs(p.step_s - h.step_s) > 1e-6 for p in pts):
            self.skipped += 1
            return None
        if len(pts) * h.step_s < MIN_HISTORY_S - 1e-6:
            return None
        ch = ft.channels(pts)
        if len(pts) > h.width:  # a series that began before the window: its first point gave the deltas
            ch = ch[1:]
        return ft.windows(ch, h.width)[-1]  # else, as in training, its first step counts nothing

    def _inputs(self, wins: Any) -> Any:
        np = need("numpy")
        if self.header.arch == "mlp":
            return ((ft.features(wins, self.header.step_s) - self._mean) / self._std).astype(np.float32)
        x = ft.net_input(wins)
        return ((x - self._mean[None, :, None]) / self._std[None, :, None]).astype(np.float32)

    def predict_many(self, series: Sequence[GpuSeries], explain: bool = True) -> list[Prediction | None]:
        """Predictions for many GPUs in one forward pass (None where a series is too short or
        does not fit the model); ``explain``: name the drivers of alarmed GPUs."""
        from trainguard.predictor import torch as nets

        np = need("numpy")
        h = self.header
        wins = [self._window(s) for s in series]
        ok = [i for i, w in enumerate(wins) if w is not None]
        out: list[Prediction | None] = [None] * len(series)
        if not ok:
            return out
        batch = np.stack([wins[i] for i in ok])
        x = self._inputs(batch)
        probs = self._calibrated(nets.logits(self.net, x))
        alarmed = probs >= np.asarray(h.thresholds)[None, :]
        grads = nets.input_gradients(self.net, x[alarmed.any(1)]) if explain and alarmed.any() else None
        g = 0
        for j, i in enumerate(ok):
            p = tuple(float(v) for v in probs[j])
            hit = [k for k in range(len(p)) if alarmed[j, k]]
            drivers: tuple[tuple[str, float, str], ...] = ()
            if hit and grads is not None:
                drivers = self._drivers(grads[hit[0], g] * x[j], batch[j])
                g += 1
            last = series[i].points[-1]
            out[i] = Prediction(
                host=series[i].host,
                gpu=series[i].gpu,
                time=last.t + last.step_s,
                horizons_s=tuple(h.horizons_s),
                probabilities=p,
                alarm=bool(hit),
                horizon_s=h.horizons_s[hit[0]] if hit else None,
                lead_s=lead_time_s(p, h.horizons_s),
                drivers=drivers,
            )
        return out

    def _calibrated(self, logit: Any) -> Any:
        from trainguard.predictor.train import sigmoid

        np = need("numpy")
        probs = np.stack([sigmoid(a * logit[:, k] + b) for k, (a, b) in enumerate(self.header.platt)], 1)
        probs[:, 0] = np.minimum(probs[:, 0], probs[:, -1])  # failing within 1 h is failing within 24 h
        return probs

    def probabilities(self, windows: Any) -> Any:
        """[B, horizons]: the calibrated probabilities of a batch of windows ([B, width,
        channels], as `features.windows` cuts them): what `predict_many` computes, for scoring
        many steps at once."""
        from trainguard.predictor import torch as nets

        return self._calibrated(nets.logits(self.net, self._inputs(windows)))

    def _drivers(self, attribution: Any, window: Any, top: int = 3) -> tuple[tuple[str, float, str], ...]:
        """The readings whose inputs pushed the logit up most, with their share of the push."""
        groups: dict[str, float] = {}
        if self.header.arch == "mlp":
            for name, a in zip(self.header.features, attribution, strict=True):
                groups[ft.GROUPS[name]] = groups.get(ft.GROUPS[name], 0.0) + float(a)
        else:
            for name, a in zip(self.header.channels, attribution.sum(1), strict=True):
                groups[ft.CHANNEL_GROUPS[name]] = groups.get(ft.CHANNEL_GROUPS[name], 0.0) + float(a)
        push = {k: v for k, v in groups.items() if v > 0}
        total = sum(push.values()) or 1.0
        ranked = sorted(push.items(), key=lambda kv: -kv[1])[:top]
        return tuple((k, round(v / total, 3), ft.evidence(k, window, self.header.step_s)) for k, v in ranked)

    def findings(self, series: Sequence[GpuSeries], now: float | None = None) -> list[Finding]:
        """One ``predicted_failure`` finding per alarmed GPU. Never raises: a series that
        cannot be scored is skipped and counted."""
        try:
            predictions = self.predict_many(series)
        except Exception as exc:  # a model that cannot score is the predictor's problem, not the node's
            log.warning("failure predictor could not score %d series: %s", len(series), exc)
            self.skipped += len(series)
            return []
        return [finding(p, now) for p in predictions if p is not None and p.alarm]


def finding(p: Prediction, now: float | None = None) -> Finding:
    probs = ", ".join(
        f"within {h / 3600:g} h {v:.2f}" for h, v in sorted(zip(p.horizons_s, p.probabilities, strict=True))
    )
    drivers = "; ".join(text for _, _, text in p.drivers)
    reason = f"P(failure) {probs}; expected in about {p.lead_s / 3600:.1f} h" + (
        f"; driven by {drivers}" if drivers else ""
    )
    top = p.drivers[0][0] if p.drivers else ""
    return Finding(
        RULE,
        Health.DEGRADED,
        Advice.DRAIN,
        reason,
        gpu=p.gpu,
        time=p.time if now is None else now,
        category=_CATEGORY.get(top, Category.GPU_HARDWARE),
        evidence=tuple(f"{name}: {share:.0%} of the push: {text}" for name, share, text in p.drivers),
    )

"""The neural failure predictor: P(a GPU fails within 1 h / 24 h) from its recent telemetry series.

    agent series (per GPU, one point per step)  ->  features (window levels, slopes, sums)
        -> a small torch model (an MLP over the features or a 1D-CNN over the window, picked on
           held-out GPUs), calibrated (Platt)  ->  Prediction (probabilities, lead time, the
           readings that drove it)  ->  a ``predicted_failure`` finding

Modules: ``series`` (the points it reads, stdlib), ``features`` (numpy), ``torch`` (the nets, the
only importer of torch here), ``modelfile`` (the versioned model file: safetensors + a JSON
header), ``train`` (fit, pick, calibrate, score), ``predictor`` (serving: a window in, a
prediction out, never raises), ``simfleet`` (simulated GPU lives with failure precursors, from
``telemetry/sim/wearout.py``), ``evaluate`` (per-kind precision, recall and lead time against the
fixed rules and a logistic baseline), ``titan`` (a DeepSurv model against Cox on Titan).
Everything but ``series`` and ``simfleet`` needs ``pip install 'trainguard[predictor]'``.
"""

from __future__ import annotations

from trainguard.predictor.series import GpuSeries, Point

__all__ = ["GpuSeries", "Point"]

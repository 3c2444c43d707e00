"""NVML GPM (GPU Performance Monitoring): the activity ratios dcgm-exporter exports as
``DCGM_FI_PROF_*``, read without DCGM. Hopper and newer only; elsewhere every field is None.

GPM reports over an interval: each ``read()`` takes a sample and returns the metrics between it
and the previous one (the first read returns nothing). The pynvml module is handed in by
``telemetry/nvml.py``, which stays the only importer of pynvml.

    DCGM_FI_PROF_GR_ENGINE_ACTIVE    GPM GRAPHICS_UTIL (%)     -> gr_engine_active (ratio)
    DCGM_FI_PROF_PIPE_TENSOR_ACTIVE  GPM ANY_TENSOR_UTIL (%)   -> tensor_active (ratio)
    DCGM_FI_PROF_DRAM_ACTIVE         GPM DRAM_BW_UTIL (%)      -> dram_active (ratio)
    DCGM_FI_PROF_PCIE_TX/RX_BYTES    GPM PCIE_TX/RX_PER_SEC (MiB/s) -> bytes per second
"""

from __future__ import annotations

import logging
from typing import Any

log = logging.getLogger(__name__)

# Sample field -> (GPM metric constant name, scale to the DCGM unit)
METRICS: dict[str, tuple[str, float]] = {
    "gr_engine_active": ("NVML_GPM_METRIC_GRAPHICS_UTIL", 0.01),
    "tensor_active": ("NVML_GPM_METRIC_ANY_TENSOR_UTIL", 0.01),
    "dram_active": ("NVML_GPM_METRIC_DRAM_BW_UTIL", 0.01),
    "pcie_tx_bytes_s": ("NVML_GPM_METRIC_PCIE_TX_PER_SEC", float(2**20)),
    "pcie_rx_bytes_s": ("NVML_GPM_METRIC_PCIE_RX_PER_SEC", float(2**20)),
}
NONE: dict[str, float | None] = dict.fromkeys(METRICS)


class GpmReader:
    """One GPU's GPM samples. ``supported`` is False before Hopper (or with an older library)."""

    def __init__(self, nv: Any, handle: Any) -> None:
        self._nv, self._handle = nv, handle
        self._previous: Any = None
        self.supported = False
        ids = [getattr(nv, name, None) for name, _ in METRICS.values()]
        if handle is None or None in ids or getattr(nv, "nvmlGpmQueryDeviceSupport", None) is None:
            return
        try:
            self.supported = bool(nv.nvmlGpmQueryDeviceSupport(handle).isSupportedDevice)
        except nv.NVMLError as exc:  # NotSupported before Hopper, or a driver before R520
            log.debug("GPM not available: %s", exc)

    def read(self) -> dict[str, float | None]:
        if not self.supported:
            return dict(NONE)
        nv = self._nv
        sample = None
        try:
            sample = nv.nvmlGpmSampleAlloc()
            nv.nvmlGpmSampleGet(self._handle, sample)
        except nv.NVMLError as exc:
            log.debug("GPM sample failed: %s", exc)
            if sample is not None:
                nv.nvmlGpmSampleFree(sample)
            return dict(NONE)
        previous, self._previous = self._previous, sample
        if previous is None:
            return dict(NONE)
        try:
            return self._metrics(previous, sample)
        finally:
            nv.nvmlGpmSampleFree(previous)

    def _metrics(self, first: Any, second: Any) -> dict[str, float | None]:
        nv = self._nv
        get = nv.c_nvmlGpmMetricsGet_t()
        get.version = nv.NVML_GPM_METRICS_GET_VERSION
        get.numMetrics = len(METRICS)
        get.sample1, get.sample2 = first, second
        for i, (name, _) in enumerate(METRICS.values()):
            get.metrics[i].metricId = getattr(nv, name)
        try:
            nv.nvmlGpmMetricsGet(get)
        except nv.NVMLError as exc:
            log.debug("GPM metrics failed: %s", exc)
            return dict(NONE)
        out: dict[str, float | None] = {}
        for i, (field, (_, scale)) in enumerate(METRICS.items()):
            m = get.metrics[i]
            ok = int(m.nvmlReturn) == int(getattr(nv, "NVML_SUCCESS", 0))
            out[field] = float(m.value) * scale if ok else None
        return out

    def close(self) -> None:
        if self._previous is not None:
            try:
                self._nv.nvmlGpmSampleFree(self._previous)
            except Exception:  # freeing at shutdown must not fail the caller
                log.debug("GPM sample free failed", exc_info=True)
            self._previous = None

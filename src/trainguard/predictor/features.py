"""What the failure models read: a GPU's points as channels, and a window of them as features.

    GpuSeries.points -> channels(points)  [T, C]  (one row per step: levels, per-step counter
                                                  deltas, the share of empty readings)
                     -> windows(ch, W)    [T, W, C] (the last W steps before each step)
                     -> features(win)     [T, F]  (levels, slopes, sums over 1 h / 6 h / the
                                                   window, acceleration: the MLP's and the
                                                   logistic baseline's input; the CNN reads win)

Every feature belongs to a reading (`GROUPS`), so a prediction can name the readings that drove
it, and `evidence` says what a reading did over the window in words. Needs numpy.
"""

from __future__ import annotations

from collections.abc import Sequence
from operator import attrgetter
from typing import Any

from trainguard.predictor.series import Point
from trainguard.reliability import need

__all__ = ["CHANNELS", "FEATURES", "GROUPS", "channels", "evidence", "features", "net_input", "windows"]

CHANNELS = ("temperature_c", "headroom_c", "util", "power_frac", "clock_frac", "throttled", "d_sbe",
            "sbe_level", "d_remap", "d_replay", "d_crc", "d_uncorrectable", "missed", "xids")  # fmt: skip
_C = {name: i for i, name in enumerate(CHANNELS)}
_DELTAS = {"d_sbe": "ecc_sbe_aggregate", "d_remap": "remap_correctable", "d_replay": "pcie_replay",
           "d_crc": "nvlink_crc_errors"}  # fmt: skip
_COUNTED = ("d_sbe", "d_remap", "d_replay", "d_crc", "d_uncorrectable", "xids", "sbe_level")  # log1p for nets
_SUMMED = {"sbe": "d_sbe", "remap": "d_remap", "replay": "d_replay", "crc": "d_crc", "unc": "d_uncorrectable"}

FEATURES: tuple[str, ...] = (
    "temp_last", "headroom_last", "temp_busy_slope_per_h", "temp_busy_rise", "temp_max",
    "util_1h", "power_1h", "clock_1h", "throttled",
    *(f"{k}_{span}" for k in _SUMMED for span in ("1h", "6h", "window", "accel")),
    "sbe_level", "missed_1h", "missed_6h", "missed_window", "missed_trend", "xids_window",
)  # fmt: skip

# The reading each feature (and channel) speaks of: a prediction names these.
GROUPS: dict[str, str] = {
    **{f: "temperature" for f in FEATURES if f.startswith(("temp", "headroom"))},
    **{f: "load" for f in ("util_1h", "power_1h", "clock_1h", "throttled")},
    **{f: "ecc_sbe" for f in FEATURES if f.startswith("sbe")},
    **{f: "remapped_rows" for f in FEATURES if f.startswith("remap")},
    **{f: "pcie_replay" for f in FEATURES if f.startswith("replay")},
    **{f: "nvlink_crc" for f in FEATURES if f.startswith("crc")},
    **{f: "uncorrectable" for f in FEATURES if f.startswith("unc")},
    **{f: "missed_readings" for f in FEATURES if f.startswith("missed")},
    "xids_window": "xids",
}
CHANNEL_GROUPS: dict[str, str] = {
    "temperature_c": "temperature", "headroom_c": "temperature", "util": "load", "power_frac": "load",
    "clock_frac": "load", "throttled": "load", "d_sbe": "ecc_sbe", "sbe_level": "ecc_sbe",
    "d_remap": "remapped_rows", "d_replay": "pcie_replay", "d_crc": "nvlink_crc",
    "d_uncorrectable": "uncorrectable", "missed": "missed_readings", "xids": "xids",
}  # fmt: skip


def _np() -> Any:
    return need("numpy", "predictor")


_RAW = ("temperature_c", "temp_slowdown_c", "util_gpu_pct", "power_w", "power_limit_w", "sm_clock_mhz",
        "sm_clock_max_mhz", "throttled", *_DELTAS.values(), "ecc_dbe_aggregate", "remap_uncorrectable")  # fmt: skip
_NAN = float("nan")
_COUNTER_COLUMNS = [_RAW.index(k) for k in (*_DELTAS.values(), "ecc_dbe_aggregate", "remap_uncorrectable")]


def channels(points: Sequence[Point]) -> Any:
    """[T, C] float32: levels carried forward over steps that read nothing, counter deltas."""
    np = _np()
    n = len(points)
    read = attrgetter(*_RAW)
    table = np.array([[_NAN if v is None else v for v in read(p)] for p in points], dtype=np.float64).reshape(
        n, len(_RAW)
    )  # one pass over the points: this runs for every GPU at every step
    filled = _ffill(np, table)
    raw = {k: filled[:, i] for i, k in enumerate(_RAW)}
    out = np.zeros((n, len(CHANNELS)), dtype=np.float32)
    out[:, _C["temperature_c"]] = raw["temperature_c"]
    out[:, _C["headroom_c"]] = raw["temp_slowdown_c"] - raw["temperature_c"]
    out[:, _C["util"]] = raw["util_gpu_pct"] / 100.0
    with np.errstate(invalid="ignore", divide="ignore"):
        out[:, _C["power_frac"]] = raw["power_w"] / np.where(
            raw["power_limit_w"] > 0, raw["power_limit_w"], np.nan
        )
        out[:, _C["clock_frac"]] = raw["sm_clock_mhz"] / np.where(
            raw["sm_clock_max_mhz"] > 0, raw["sm_clock_max_mhz"], np.nan
        )
    out[:, _C["throttled"]] = raw["throttled"]
    d = _delta(np, filled[:, _COUNTER_COLUMNS])
    for k, ch in enumerate(_DELTAS):
        out[:, _C[ch]] = d[:, k]
    out[:, _C["d_uncorrectable"]] = d[:, -2] + d[:, -1]
    out[:, _C["sbe_level"]] = raw["ecc_sbe_aggregate"]
    out[:, _C["missed"]] = [p.missed / p.n if p.n else 1.0 for p in points]
    out[:, _C["xids"]] = [p.xids for p in points]
    return np.nan_to_num(out, nan=0.0)


def _ffill(np: Any, v: Any) -> Any:
    """Carry the last reading forward, per column; before a column's first, its first."""
    if not len(v):
        return v
    ok = ~np.isnan(v)
    idx = np.where(ok, np.arange(len(v))[:, None], 0)
    np.maximum.accumulate(idx, axis=0, out=idx)
    out = np.take_along_axis(v, idx, axis=0)
    first = np.argmax(ok, axis=0)  # 0 for a column never read: it stays nan
    before = np.arange(len(v))[:, None] < first[None, :]
    return np.where(before, v[first, np.arange(v.shape[1])][None, :], out)


def _delta(np: Any, v: Any) -> Any:
    """Per-step increments of counters (columns of ``v``); a counter never read counts nothing."""
    v = np.where(np.isnan(v), 0.0, v)
    d = np.diff(v, axis=0, prepend=v[:1])
    return np.maximum(d, 0.0)  # a counter that went back was reset: no new errors


def windows(ch: Any, width: int) -> Any:
    """[T, W, C]: for each step, the ``width`` steps up to it; before the series began, its
    first step repeated with nothing counted (a view: no copy of the series per window)."""
    np = _np()
    pad = np.repeat(ch[:1], width - 1, axis=0)
    for name in ("d_sbe", "d_remap", "d_replay", "d_crc", "d_uncorrectable", "missed", "xids"):
        pad[:, _C[name]] = 0.0
    full = np.concatenate([pad, ch], axis=0)
    return np.lib.stride_tricks.sliding_window_view(full, width, axis=0).transpose(0, 2, 1)


def features(win: Any, step_s: float) -> Any:
    """[B, F] float32 from windows [B, W, C] (`FEATURES` order)."""
    np = _np()
    w = win.shape[1]
    per_h = max(1, round(3600.0 / step_s))
    third = max(1, w // 3)
    temp, util = win[:, :, _C["temperature_c"]], win[:, :, _C["util"]]
    busy = (util > 0.5).astype(np.float64)
    out: list[Any] = [
        temp[:, -3:].mean(1),
        win[:, -3:, _C["headroom_c"]].mean(1),
        _slope(np, temp, busy) * per_h,
        _mean_where(np, temp[:, -per_h:], busy[:, -per_h:])
        - _mean_where(np, temp[:, :third], busy[:, :third]),
        temp.max(1),
        util[:, -per_h:].mean(1),
        win[:, -per_h:, _C["power_frac"]].mean(1),
        win[:, -per_h:, _C["clock_frac"]].mean(1),
        win[:, :, _C["throttled"]].mean(1),
    ]
    for ch in _SUMMED.values():
        x = win[:, :, _C[ch]]
        first, last = np.log1p(x[:, :third].sum(1)), np.log1p(x[:, -third:].sum(1))
        out += [np.log1p(x[:, -per_h:].sum(1)), np.log1p(x[:, -6 * per_h :].sum(1)), np.log1p(x.sum(1))]
        out.append(last - first)
    missed = win[:, :, _C["missed"]]
    out += [
        np.log1p(win[:, -1, _C["sbe_level"]]),
        missed[:, -per_h:].mean(1),
        missed[:, -6 * per_h :].mean(1),
        missed.mean(1),
        missed[:, -third:].mean(1) - missed[:, :third].mean(1),
        np.log1p(win[:, :, _C["xids"]].sum(1)),
    ]
    return np.stack(out, axis=1).astype(np.float32)


def _mean_where(np: Any, x: Any, m: Any) -> Any:
    n = m.sum(1)
    return np.where(n > 0, (x * m).sum(1) / np.maximum(n, 1), 0.0)


def _slope(np: Any, y: Any, m: Any) -> Any:
    """Least-squares slope of y over the step index, counting only the steps where m is 1."""
    x = np.arange(y.shape[1], dtype=np.float64)[None, :]
    n = m.sum(1)
    mx = _mean_where(np, np.broadcast_to(x, y.shape), m)
    my = _mean_where(np, y, m)
    cov = ((x - mx[:, None]) * (y - my[:, None]) * m).sum(1)
    var = (((x - mx[:, None]) ** 2) * m).sum(1)
    return np.where((n >= 3) & (var > 0), cov / np.maximum(var, 1e-9), 0.0)


def net_input(win: Any) -> Any:
    """The CNN's input [B, C, W]: counts as log1p, the rest as read (normalised by the model)."""
    np = _np()
    x = np.array(win, dtype=np.float32, copy=True)
    for name in _COUNTED:
        x[:, :, _C[name]] = np.log1p(x[:, :, _C[name]])
    return x.transpose(0, 2, 1)


def evidence(group: str, win: Any, step_s: float) -> str:
    """What one reading did over one window [W, C], in words."""
    np = _np()
    hours = win.shape[0] * step_s / 3600.0
    per_h = max(1, round(3600.0 / step_s))

    def total(ch: str) -> int:
        return int(win[:, _C[ch]].sum())

    if group == "temperature":
        slope = float(
            _slope(np, win[None, :, _C["temperature_c"]], (win[None, :, _C["util"]] > 0.5) * 1.0)[0]
        )
        return (
            f"temperature {win[-1, _C['temperature_c']]:.0f} C ({win[-1, _C['headroom_c']]:.0f} C under "
            f"slowdown), {slope * per_h:+.1f} C/h under load over {hours:.0f} h"
        )
    if group == "ecc_sbe":
        return f"correctable ECC errors +{total('d_sbe')} in {hours:.0f} h ({win[-1, _C['sbe_level']]:.0f} in all)"
    if group == "remapped_rows":
        return f"rows remapped for correctable errors +{total('d_remap')} in {hours:.0f} h"
    if group == "pcie_replay":
        last = int(win[-per_h:, _C["d_replay"]].sum())
        return f"PCIe replays +{total('d_replay')} in {hours:.0f} h ({last} in the last hour)"
    if group == "nvlink_crc":
        return f"NVLink CRC errors +{total('d_crc')} in {hours:.0f} h"
    if group == "uncorrectable":
        return f"uncorrectable errors +{total('d_uncorrectable')} in {hours:.0f} h"
    if group == "missed_readings":
        return (
            f"{win[-per_h:, _C['missed']].mean():.0%} of readings empty in the last hour "
            f"({win[:, _C['missed']].mean():.0%} over {hours:.0f} h)"
        )
    if group == "xids":
        return f"{total('xids')} Xid events in {hours:.0f} h"
    return (
        f"load {win[-per_h:, _C['util']].mean():.0%}, clocks {win[-per_h:, _C['clock_frac']].mean():.0%} "
        f"of max, throttled {win[:, _C['throttled']].mean():.0%} of the time"
    )

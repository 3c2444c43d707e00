"""GPU lives as arrays a model trains on: every step of every life a scoring point, with its
window, its features and its labels.

A life is any value with ``points`` (a GPU's series, oldest first), ``failure_s`` (when it failed,
on the points' clock; None: it did not), ``kind`` (a name for the per-kind report) and
``rule_alarm_s`` (the fixed rules' first alarm, None where unknown): `simfleet.Life`, or a GPU's
series from a store with its failure from the incidents. A step is scored at its end, with the
steps up to it; only steps that end before the failure, after ``min_history_s`` of series::

    label_h = 1 if 0 < failure_s - step_end <= h else 0      for h in HORIZONS_S

Splits are by GPU (a GPU's steps never straddle training and scoring), seeded.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from trainguard.errors import InputError
from trainguard.predictor import features as ft
from trainguard.predictor.series import Point
from trainguard.reliability import need

__all__ = ["HORIZONS_S", "Arrays", "LifeLike", "arrays", "split_lives"]

HORIZONS_S = (3600.0, 86_400.0)


class LifeLike(Protocol):
    @property
    def points(self) -> tuple[Point, ...]: ...

    @property
    def failure_s(self) -> float | None: ...

    @property
    def kind(self) -> str: ...

    @property
    def rule_alarm_s(self) -> float | None: ...


@dataclass
class Arrays:
    """Scoring points of many lives (row j: one step of one life)."""

    step_s: float
    width: int
    padded: Any  # [rows, C]: each life's channels after width - 1 rows of padding
    start: Any  # [N]: the window of row j is padded[start[j] : start[j] + width]
    feats: Any  # [N, F]
    life: Any  # [N]: which life
    t_end: Any  # [N]: when the step ended (the prediction's time)
    y: Any  # [N, len(HORIZONS_S)]
    failure_s: Any  # [L] (nan: none)
    rule_alarm_s: Any  # [L] (nan: none)
    observed_s: Any  # [L]: how long each life was watched (to its failure or its last step)
    kinds: list[str]

    def windows(self, rows: Any) -> Any:
        """[len(rows), width, C] windows of the given rows."""
        np = need("numpy")
        idx = self.start[rows][:, None] + np.arange(self.width)[None, :]
        return self.padded[idx]

    def rows_of(self, lives: Any) -> Any:
        np = need("numpy")
        return np.flatnonzero(np.isin(self.life, lives))


def arrays(
    lives: Sequence[LifeLike], width: int, step_s: float | None = None, min_history_s: float = 3600.0
) -> Arrays:
    np = need("numpy", "predictor")
    if not lives:
        raise InputError("no GPU series to learn from")
    step = step_s or next((p.step_s for life in lives for p in life.points), 0.0)
    if step <= 0:
        raise InputError("the GPU series hold no points: nothing to learn from")
    pads, starts, feats, owner, ends, ys = [], [], [], [], [], []
    offset = 0
    for i, life in enumerate(lives):
        pts = life.points
        ch = ft.channels(pts) if pts else np.zeros((0, len(ft.CHANNELS)), dtype=np.float32)
        t_end = np.array([p.t + p.step_s for p in pts], dtype=np.float64)
        fail = math.inf if life.failure_s is None else life.failure_s
        keep = (t_end < fail) & (t_end >= (t_end[0] if len(t_end) else 0) - step + min_history_s)
        win = ft.windows(ch, width) if len(ch) else np.zeros((0, width, len(ft.CHANNELS)), dtype=np.float32)
        rows = np.flatnonzero(keep)
        pads.append(np.concatenate([np.repeat(ch[:1], width - 1, axis=0), ch]) if len(ch) else ch)
        starts.append(offset + rows)
        offset += len(pads[-1])
        feats.append(
            ft.features(win[rows], step) if len(rows) else np.zeros((0, len(ft.FEATURES)), np.float32)
        )
        owner.append(np.full(len(rows), i))
        ends.append(t_end[rows])
        left = fail - t_end[rows]
        ys.append(np.stack([(left > 0) & (left <= h) for h in HORIZONS_S], axis=1).astype(np.float32))
    # The padding repeats a life's first step with nothing counted, as `features.windows` does.
    padded = _zero_counts(np, np.concatenate(pads), pads, width)
    return Arrays(
        step_s=step,
        width=width,
        padded=padded,
        start=np.concatenate(starts),
        feats=np.concatenate(feats),
        life=np.concatenate(owner),
        t_end=np.concatenate(ends),
        y=np.concatenate(ys),
        failure_s=np.array([np.nan if x.failure_s is None else x.failure_s for x in lives]),
        rule_alarm_s=np.array([np.nan if x.rule_alarm_s is None else x.rule_alarm_s for x in lives]),
        observed_s=np.array(
            [
                (x.failure_s if x.failure_s is not None else x.points[-1].t + x.points[-1].step_s)
                - x.points[0].t
                if x.points
                else 0.0
                for x in lives
            ]
        ),
        kinds=[x.kind for x in lives],
    )


def _zero_counts(np: Any, out: Any, pads: list[Any], width: int) -> Any:
    counted = [ft.CHANNELS.index(c) for c in ("d_sbe", "d_remap", "d_replay", "d_crc", "d_uncorrectable",
                                              "missed", "xids")]  # fmt: skip
    offset = 0
    for p in pads:
        if len(p):
            out[offset : offset + width - 1, counted] = 0.0
        offset += len(p)
    return out


def split_lives(n: int, seed: int, share: float = 0.7) -> tuple[Any, Any]:
    """Seeded (train, held-out) life indices, as reliability.predict.split."""
    from trainguard.reliability.predict import split

    return split(n, seed, share)

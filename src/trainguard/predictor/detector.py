"""The failure predictor behind the agent's detector seam (detect/detector.py): every GPU's
series scored once per closed step, a ``predicted_failure`` finding held while it stays alarmed.

    agent tick -> Window.series (telemetry/series.py, one point per GPU and step)
        GPUs whose newest point closed since they were last scored
            -> their last width + 1 points -> point_of_values -> GpuSeries
            -> Predictor.predict_many (one batched forward pass on the CPU)
        -> an alarmed GPU: Finding("predicted_failure", DEGRADED, DRAIN, probabilities, lead
           time, the readings that drove it), stated every tick until its probabilities all fall
           below ``clear`` x their thresholds (a GPU near its threshold does not flicker)

What it costs is bounded by the model, not by the agent's rate: on a tick where no step closed it
looks at each GPU's newest point and returns what it holds; when a step closes it converts one
point per GPU and runs one forward pass over the node's GPUs (and one backward pass for the
alarmed ones, to name their readings). ``scored`` and ``seconds`` count that work.

The agent loads it when its config names a model file (``[agent] predictor``, ``--predictor``),
checked at start against the agent's series (`load`)::

    >>> detector = FailurePredictor.load("fleet.safetensors", series_step_s=600, series_points=360)  # doctest: +SKIP
    >>> daemon = assemble(config, detectors=[*fixed_rules(), detector])  # doctest: +SKIP
"""

from __future__ import annotations

import logging
import math
import time
from collections import deque
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from trainguard.errors import ConfigError, InputError, MissingDependency
from trainguard.predictor import modelfile
from trainguard.predictor.series import GpuSeries, Point, point_of_values

if TYPE_CHECKING:
    from trainguard.detect.detector import Window
    from trainguard.predictor.predictor import Prediction, Predictor
    from trainguard.records import Finding
    from trainguard.telemetry.series import SeriesPoint

log = logging.getLogger(__name__)

__all__ = ["FailurePredictor"]


class FailurePredictor:
    """A `Detector` (detect/detector.py) over a trained `Predictor` (see the module docstring)."""

    name = "failure_predictor"

    def __init__(self, predictor: Predictor, clear: float = 0.5) -> None:
        self.predictor, self.clear = predictor, clear
        self._need = predictor.header.width + 1  # points a window reads (one more for counter deltas)
        self._scored: dict[int, float] = {}  # gpu -> start of the newest point scored
        self._points: dict[int, deque[Point]] = {}  # gpu -> its last points, converted once each
        self._alarms: dict[int, Finding] = {}  # gpu -> the finding it is held with
        self._drivers: dict[int, tuple[tuple[str, float, str], ...]] = {}  # gpu -> readings of its alarm
        self.scored = 0  # GPU steps scored
        self.seconds = 0.0  # wall time spent scoring them
        self.failed = 0  # scorings that raised (the GPUs' steps counted in skipped)

    @classmethod
    def load(cls, path: str | Path, series_step_s: float, series_points: int) -> FailurePredictor:
        """The model file at ``path``, checked against the agent's series: the same step, and
        enough points kept to fill a window. A ConfigError says what to change."""
        try:
            header = modelfile.read_header(path)
        except InputError as exc:
            raise ConfigError(f"agent predictor: {exc}") from None
        if abs(header.step_s - series_step_s) > 1e-6:
            raise ConfigError(
                f"agent predictor: {path} reads a series of {header.step_s:g} s steps and the agent "
                f"keeps {series_step_s:g} s steps: set series_step_s = {header.step_s:g} in [agent] "
                "(or train a model on the agent's step)"
            )
        if series_points < header.width + 1:
            raise ConfigError(
                f"agent predictor: {path} reads the last {header.width + 1} points of a GPU and the "
                f"agent keeps {series_points}: set series_points >= {header.width + 1} in [agent]"
            )
        try:
            from trainguard.predictor.predictor import Predictor
        except ImportError:
            raise MissingDependency(
                "agent predictor: serving a failure predictor needs torch and numpy: "
                "pip install 'trainguard[predictor]'"
            ) from None
        try:
            predictor = Predictor.load(path)
        except ImportError as exc:
            raise MissingDependency(f"agent predictor: {exc}") from None
        except InputError as exc:
            raise ConfigError(f"agent predictor: {exc}") from None
        log.info("failure predictor %s loaded (%s, %g s steps)", path, header.arch, header.step_s)
        return cls(predictor)

    @property
    def skipped(self) -> int:
        """GPU steps that could not be scored (another step length, bad values, a model error)."""
        return self.predictor.skipped

    @skipped.setter
    def skipped(self, value: int) -> None:
        self.predictor.skipped = value

    def detect(self, window: Window) -> list[Finding]:
        series = window.series
        if series is None:  # the agent keeps no series: nothing to read (assemble refuses that)
            return []
        due = []
        for gpu in series.gpus():
            newest = series.newest(gpu)
            if gpu >= 0 and newest is not None and newest.t != self._scored.get(gpu):
                due.append((gpu, newest.t))
        if due:
            self._score(
                [(gpu, series.points(gpu)[-self._need :]) for gpu, _ in due], window.time, series.host
            )
            self._scored.update(due)
        return list(self._alarms.values())

    def _score(self, due: list[tuple[int, tuple[SeriesPoint, ...]]], now: float, host: str) -> None:
        batch = [GpuSeries(host, gpu, self._window(gpu, points)) for gpu, points in due]
        t0 = time.perf_counter()
        try:
            predictions = self.predictor.predict_many(batch)
        except Exception as exc:  # a model that cannot score is the predictor's problem, not the node's
            log.warning("failure predictor could not score %d GPU(s): %s", len(batch), exc)
            self.failed += 1
            self.predictor.skipped += len(batch)
            return
        finally:
            self.seconds += time.perf_counter() - t0
        self.scored += len(batch)
        for (gpu, _), p in zip(due, predictions, strict=True):
            self._judge(gpu, p, now)

    def _window(self, gpu: int, points: tuple[SeriesPoint, ...]) -> tuple[Point, ...]:
        kept = self._points.get(gpu)
        if kept is None:
            kept = self._points[gpu] = deque(maxlen=self._need)
        last = kept[-1].t if kept else -math.inf
        for sp in points:
            if sp.t > last:
                kept.append(point_of_values(sp.t, sp.step_s, sp.n, sp.as_dict()))
        return tuple(kept)

    def _judge(self, gpu: int, p: Prediction | None, now: float) -> None:
        from trainguard.predictor.predictor import finding

        held = self._alarms.get(gpu)
        thresholds = self.predictor.header.thresholds
        still = p is not None and any(
            v >= self.clear * t for v, t in zip(p.probabilities, thresholds, strict=True)
        )
        if p is None or not (p.alarm or (held is not None and still)):
            self._alarms.pop(gpu, None)
            self._drivers.pop(gpu, None)
            return
        if p.drivers:
            self._drivers[gpu] = p.drivers
        f = finding(replace(p, drivers=self._drivers.get(gpu, ())), now)
        # The category is part of what makes a finding the same one (agent/judge.py): it stays
        # that of the alarm's onset while the GPU is held, or each change would be a new incident.
        self._alarms[gpu] = f if held is None else replace(f, category=held.category)

    def forget(self, gpu: int) -> None:
        """A GPU was reset: its alarm is dropped; its next closed step is scored afresh (the
        points before the reset stay in the window: a wearing part is not repaired by a reset)."""
        self._alarms.pop(gpu, None)
        self._drivers.pop(gpu, None)

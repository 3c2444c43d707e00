"""GPU lives from an incident store: the telemetry series the node agents wrote, labelled with
the GPU failures the incidents name. What `train-predictor --store` learns from.

    store.series_hosts(), store.series(host) -> per (host, gpu), the points oldest first (the
                         agent's series, by name: telemetry/series.py), one host at a time
    store.incidents() -> per (host, gpu), the first unresolved incident whose root cause is GPU
                         hardware: the failure time; its root cause names the kind
    -> one life per GPU: its points up to that failure (all of them when it did not fail)

A ``predicted_failure`` incident (the agent's failure predictor) has no root cause of its own
(incidents/taxonomy.py): a forecast is never a label. The series of one store may come from
agents with different steps; the lives of the commonest step are kept (a model reads one step)
and the others left out, logged. The fixed rules' first alarm is not in a store's series (the
agent recorded its findings as incidents, not per step), so the rules' row is left out of a
store's report.
"""

from __future__ import annotations

import logging
from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from trainguard.errors import InputError
from trainguard.predictor.series import Point, point_of_values

log = logging.getLogger(__name__)

__all__ = ["StoreLife", "lives_from_points", "lives_from_store"]

_NO_SERIES = (
    "the store holds no telemetry series: the node agent writes one per GPU "
    "(trainguard agent); train on the simulated fleet with --sim meanwhile"
)


@dataclass(frozen=True, slots=True)
class StoreLife:
    host: str
    gpu: int
    points: tuple[Point, ...]
    failure_s: float | None
    kind: str  # the failure's root cause, or "healthy"
    rule_alarm_s: float | None = None


def failures_of(incidents: Iterable[Any]) -> dict[tuple[str, int], tuple[float, str]]:
    """(host, gpu) -> (time, root cause) of its first unresolved GPU-hardware incident
    (incidents with ``node``, ``gpu``, ``time``, ``resolved`` and ``root_cause``)."""
    from trainguard.reliability.store_predict import GPU_FAILURES

    failures: dict[tuple[str, int], tuple[float, str]] = {}
    for i in incidents:
        if i.gpu is None or i.time is None or i.resolved or i.root_cause not in GPU_FAILURES:
            continue
        key = (i.node or "", i.gpu)
        if key not in failures or i.time < failures[key][0]:
            failures[key] = (i.time, i.root_cause.value)
    return failures


def _lives(series: Iterable[Any], failures: dict[tuple[str, int], tuple[float, str]]) -> list[StoreLife]:
    by_gpu: dict[tuple[str, int], list[Point]] = defaultdict(list)
    for p in series:
        if p.gpu < 0:
            continue  # kernel-log events no GPU owns
        by_gpu[(p.host, p.gpu)].append(point_of_values(p.t, p.step_s, p.n, p.as_dict()))
    lives = []
    for (host, gpu), pts in sorted(by_gpu.items()):
        pts.sort(key=lambda p: p.t)
        fail, kind = failures.get((host, gpu), (None, "healthy"))
        kept = tuple(p for p in pts if fail is None or p.t + p.step_s <= fail)
        if kept:
            lives.append(StoreLife(host, gpu, kept, fail, kind))
    return lives


def _one_step(lives: list[StoreLife]) -> list[StoreLife]:
    steps = Counter(life.points[-1].step_s for life in lives)
    if len(steps) <= 1:
        return lives
    step = steps.most_common(1)[0][0]
    kept = [life for life in lives if all(p.step_s == step for p in life.points)]
    log.warning(
        "the store's series have steps of %s s: training on the %d GPU(s) of %g s steps, %d left out",
        ", ".join(f"{s:g}" for s in sorted(steps)), len(kept), step, len(lives) - len(kept),
    )  # fmt: skip
    return kept


def lives_from_points(series: Iterable[Any], incidents: Iterable[Any]) -> list[StoreLife]:
    """Lives from the agent's series points (``host``, ``gpu``, ``t``, ``step_s``, ``n`` and
    ``as_dict()``) and incidents (``node``, ``gpu``, ``time``, ``resolved``, ``root_cause``)."""
    lives = _lives(series, failures_of(incidents))
    if not lives:
        raise InputError(_NO_SERIES)
    return _one_step(lives)


def lives_from_store(store: Any) -> list[StoreLife]:
    """Every GPU's life in an `IncidentStore`, its series read one host at a time."""
    try:
        hosts = store.series_hosts()
    except AttributeError:
        raise InputError(
            f"the store {store.path} keeps no telemetry series in this version of trainguard; "
            "train on the simulated fleet with --sim"
        ) from None
    failures = failures_of(store.incidents())
    lives = [life for host in hosts for life in _lives(store.series(host), failures)]
    if not lives:
        raise InputError(_NO_SERIES)
    return _one_step(lives)

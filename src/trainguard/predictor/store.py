"""GPU lives from an incident store: the telemetry series the node agents wrote, labelled with
the GPU failures the incidents name. What `train-predictor --store` learns from.

    store.series()    -> per (host, gpu), the points oldest first (the agent's series, by name)
    store.incidents() -> per (host, gpu), the first interrupting incident with a GPU hardware
                         root cause: the failure time; its root cause names the kind
    -> one life per GPU: its points up to that failure (all of them when it did not fail)

The fixed rules' first alarm is not in a store's series (the agent recorded its findings as
incidents, not per step), so the rules' row is left out of a store's report.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from trainguard.errors import InputError
from trainguard.predictor.series import Point, point_of_values

__all__ = ["StoreLife", "lives_from_points"]


@dataclass(frozen=True, slots=True)
class StoreLife:
    host: str
    gpu: int
    points: tuple[Point, ...]
    failure_s: float | None
    kind: str  # the failure's root cause, or "healthy"
    rule_alarm_s: float | None = None


def lives_from_points(series: Iterable[Any], incidents: Iterable[Any]) -> list[StoreLife]:
    """Lives from the agent's series points (``host``, ``gpu``, ``t``, ``step_s``, ``n`` and
    ``as_dict()``) and incidents (``node``, ``gpu``, ``time``, ``resolved``, ``root_cause``)."""
    from trainguard.reliability.store_predict import GPU_FAILURES

    by_gpu: dict[tuple[str, int], list[Point]] = defaultdict(list)
    for p in series:
        if p.gpu < 0:
            continue  # kernel-log events no GPU owns
        by_gpu[(p.host, p.gpu)].append(point_of_values(p.t, p.step_s, p.n, p.as_dict()))
    failures: dict[tuple[str, int], tuple[float, str]] = {}
    for i in incidents:
        if i.gpu is None or i.time is None or i.resolved or i.root_cause not in GPU_FAILURES:
            continue
        key = (i.node or "", i.gpu)
        if key not in failures or i.time < failures[key][0]:
            failures[key] = (i.time, i.root_cause.value)
    lives = []
    for (host, gpu), pts in sorted(by_gpu.items()):
        pts.sort(key=lambda p: p.t)
        fail, kind = failures.get((host, gpu), (None, "healthy"))
        kept = tuple(p for p in pts if fail is None or p.t + p.step_s <= fail)
        if kept:
            lives.append(StoreLife(host, gpu, kept, fail, kind))
    if not lives:
        raise InputError(
            "the store holds no telemetry series: the node agent writes one per GPU "
            "(trainguard agent); train on the simulated fleet with --sim meanwhile"
        )
    return lives


def lives_from_store(store: Any) -> list[StoreLife]:
    try:
        read = store.series
    except AttributeError:
        raise InputError(
            f"the store {store.path} keeps no telemetry series in this version of trainguard; "
            "train on the simulated fleet with --sim"
        ) from None
    return lives_from_points(read(), store.incidents())

"""The telemetry series in the store: the points node agents write, for models to train on.

    agent (each closed step):  IncidentStore.add_series(points)   -> series (host, gpu, t)
    a trainer:                 IncidentStore.series(host, gpu, since, until) -> [SeriesPoint]
                               IncidentStore.series_hosts() -> the hosts that wrote any
    retention (the agent):     IncidentStore.prune_series(before)

One row per GPU and step (``gpu`` -1: kernel-log events of no GPU), keyed by (host, gpu, t): a
retried or replayed write lands once. ``data`` holds the point's values by name as JSON
(telemetry/series.py lists them), so a newer agent's extra values do not change the table::

    >>> import tempfile, os
    >>> from trainguard.incidents import IncidentStore
    >>> from trainguard.records import Gpu, Sample
    >>> from trainguard.telemetry.series import Series
    >>> s = Series(step_s=60.0, host="gpu-001")
    >>> for t in (0.0, 30.0, 60.0):
    ...     s.add(t, [Sample(Gpu(2, uuid="GPU-c"), t, temperature_c=70.0)], [])
    >>> store = IncidentStore(os.path.join(tempfile.mkdtemp(), "tg.db"))
    >>> store.add_series(s.take_closed())
    >>> [(p.gpu, p.uuid, p.t, p.n, p["temperature_c"]) for p in store.series("gpu-001", since=0.0)]
    [(2, 'GPU-c', 0.0, 2, 70.0)]
    >>> store.close()
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from trainguard.telemetry.series import SeriesPoint

if TYPE_CHECKING:
    from trainguard.incidents.backend import Backend, Row

__all__ = ["insert", "point_of", "query", "rows_of"]

COLUMNS = ("host", "gpu", "t", "step_s", "n", "gpu_uuid", "rack", "node_group", "data")


def rows_of(points: Iterable[SeriesPoint], node: dict[str, Any]) -> list[dict[str, Any]]:
    """The rows of ``points``; ``node``: the writer's host, rack and group (the host names the
    points whose own host is empty)."""
    return [
        {"host": p.host or node["host"], "gpu": p.gpu, "t": p.t, "step_s": p.step_s, "n": p.n,
         "gpu_uuid": p.uuid, "rack": node.get("rack"), "node_group": node.get("node_group"),
         "data": json.dumps(p.as_dict(), separators=(",", ":"))}
        for p in points
    ]  # fmt: skip


def insert(backend: Backend, rows: list[dict[str, Any]]) -> None:
    if not rows:
        return
    sql = (
        f"INSERT INTO series ({', '.join(COLUMNS)}) VALUES ({', '.join('?' * len(COLUMNS))}) "
        "ON CONFLICT (host, gpu, t) DO NOTHING"
    )
    with backend.transaction(durable=False) as tx:  # a point lost to a crash costs one step of one GPU
        tx.many(sql, [tuple(r[c] for c in COLUMNS) for r in rows])


def query(
    host: str | None, gpu: int | None, since: float | None, until: float | None
) -> tuple[str, list[Any]]:
    """The SELECT for `IncidentStore.series` (``until`` exclusive), oldest first per GPU."""
    clauses, params = [], []
    for clause, value in (("host = ?", host), ("gpu = ?", gpu), ("t >= ?", since), ("t < ?", until)):
        if value is not None:
            clauses.append(clause)
            params.append(value)
    where = " WHERE " + " AND ".join(clauses) if clauses else ""
    return f"SELECT {', '.join(COLUMNS)} FROM series{where} ORDER BY host, gpu, t", params


def point_of(row: Row) -> SeriesPoint:
    try:
        data = json.loads(row["data"])
    except ValueError:  # written by something else: the row's keys stay readable
        data = {}
    values = (
        {k: float(v) for k, v in data.items() if isinstance(v, int | float)} if isinstance(data, dict) else {}
    )
    return SeriesPoint.from_dict(
        row["host"],
        int(row["gpu"]),
        float(row["t"]),
        float(row["step_s"]),
        int(row["n"]),
        values,
        row["gpu_uuid"],
    )

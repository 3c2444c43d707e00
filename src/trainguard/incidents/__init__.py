"""Incidents: what interrupted a job, why (root cause), what was done, and what it cost.

    telemetry -> detect -> diagnose -> [incidents] -> recover

- `RootCause` and `root_cause_for(evidence)`: the interruption taxonomy and the pure rule
  "the earliest causal failure is the root cause, not the loudest" (`incidents.correlate`, which
  also explains a failed job's logs rank by rank: `explain_job`).
- `Incident` and `IncidentStore(path or URL)`: a SQLite (WAL) file, or a fleet's PostgreSQL
  (`incidents.postgres`, psycopg), that the supervisors and node agents write at once, and that
  `trainguard incidents` / `report` / `fleet` read (`incidents.fleet`, `incidents.fleet_read`).
- `Interval`, `goodput()`: the per-job goodput ledger and ETTR (productive time / wall time).

Stdlib only, and each name loads its submodule on first use; the report's plot imports matplotlib inside `trainguard.incidents.plot`.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

# The ledger's nouns are stdlib-only and loaded now: ``goodput`` is also a submodule's name, which
# importing that submodule would bind here in place of the function.
from trainguard.incidents.goodput import (
    PRECEDENCE,
    GoodputSummary,
    Interval,
    IntervalKind,
    JobInfo,
    ProgressPoint,
    goodput,
)

# The rest is loaded on first use (PEP 562): `trainguard run` reads which database to use
# (`incidents.backend`) before its workers start, and the store, the taxonomy and the ledger after.
if TYPE_CHECKING:
    from trainguard.incidents.correlate import (
        Consequence,
        Explanation,
        JobFinding,
        explain_job,
        first_failure,
        first_failure_index,
        root_cause_for,
    )
    from trainguard.incidents.incident import Incident
    from trainguard.incidents.stats import IncidentStats, incident_stats
    from trainguard.incidents.store import DB_ENV, IncidentStore, default_db_path
    from trainguard.incidents.taxonomy import (
        Evidence,
        RootCause,
        as_evidence,
        numerics_root_cause,
        suspects,
        xid_root_cause,
    )

_WHERE = {  # name -> the submodule that defines it
    "Consequence": "correlate",
    "DB_ENV": "store",
    "Evidence": "taxonomy",
    "Explanation": "correlate",
    "Incident": "incident",
    "IncidentStats": "stats",
    "IncidentStore": "store",
    "JobFinding": "correlate",
    "RootCause": "taxonomy",
    "as_evidence": "taxonomy",
    "default_db_path": "store",
    "explain_job": "correlate",
    "first_failure": "correlate",
    "first_failure_index": "correlate",
    "incident_stats": "stats",
    "numerics_root_cause": "taxonomy",
    "root_cause_for": "correlate",
    "suspects": "taxonomy",
    "xid_root_cause": "taxonomy",
}

__all__ = [
    "DB_ENV",
    "PRECEDENCE",
    "Consequence",
    "Evidence",
    "Explanation",
    "GoodputSummary",
    "Incident",
    "IncidentStats",
    "IncidentStore",
    "Interval",
    "IntervalKind",
    "JobFinding",
    "JobInfo",
    "ProgressPoint",
    "RootCause",
    "as_evidence",
    "default_db_path",
    "explain_job",
    "first_failure",
    "first_failure_index",
    "goodput",
    "incident_stats",
    "numerics_root_cause",
    "root_cause_for",
    "suspects",
    "xid_root_cause",
]


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{_WHERE[name]}"), name)
    globals()[name] = value  # once
    return value

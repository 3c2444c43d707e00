"""Counting incidents: by root cause, category and action; time lost; mean time between failures.

Pure: `IncidentStore.stats()` reads the rows and the jobs' wall time and calls `incident_stats`.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from trainguard.incidents.incident import Incident


@dataclass(frozen=True, slots=True)
class IncidentStats:
    count: int
    by_root_cause: dict[str, int] = field(default_factory=dict)  # most frequent first
    by_category: dict[str, int] = field(default_factory=dict)
    by_action: dict[str, int] = field(default_factory=dict)
    time_lost_s: float = 0.0  # sum of the incidents' time_lost_s (unknown counts as 0)
    mtbf_s: float | None = None  # observed wall time / incidents; None when it cannot be told
    unresolved: int = 0
    first: float | None = None
    last: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def incident_stats(incidents: Sequence[Incident], observed_s: float | None = None) -> IncidentStats:
    """Summarise incidents. MTBF is ``observed_s / count`` when the observed wall time is known
    (the jobs' durations), else the mean gap between the first and the last incident."""
    times = sorted(i.time for i in incidents)
    n = len(incidents)
    if observed_s is not None and n:
        mtbf: float | None = observed_s / n
    elif n >= 2:
        mtbf = (times[-1] - times[0]) / (n - 1)
    else:
        mtbf = None
    return IncidentStats(
        count=n,
        by_root_cause=dict(Counter(i.root_cause.value for i in incidents).most_common()),
        by_category=dict(Counter(i.category or "-" for i in incidents).most_common()),
        by_action=dict(Counter(i.action for i in incidents).most_common()),
        time_lost_s=sum(i.time_lost_s or 0.0 for i in incidents),
        mtbf_s=mtbf,
        unresolved=sum(1 for i in incidents if not i.resolved),
        first=times[0] if times else None,
        last=times[-1] if times else None,
    )

"""Which ranks came late to a group's last collective, from the flight recorder's entry times.

Where it sits: ``incidents.flight.judge`` calls `late_ranks` with every rank's entries in issue
order; a rank it returns is named as a culprit of kind ``late`` beside the ranks the stall waits on.

A late rank leaves one trace a rank waiting on someone else does not: time of its *own* before it
entered a collective. A rank cannot leave a collective before the last member entered it (an
all-reduce needs every contribution), so no earlier entry of the rank held it past
``ready = the latest creation among the members of any of its earlier entries`` (or the recorded
completion, where NCCL records one). ``own = created - ready`` is then at most the time the rank
spent outside communication (computing, loading data, stalled) plus the transfer itself, which
its peers pay alike. A victim that waited in a collective on a late peer enters its next one
right after that peer's entry: its own time stays small, so waiting is never mistaken for
lateness.

A rank is late in a group's last collective (where a stall shows; earlier steps are history) when
its own time there is at least `LATE_S` and `LATE_FACTOR` times the median own time of its peers in
the same step: the members of every group with the same description (``dp``, ``tp``) at the same
sequence id, which do the same work between the same collectives. Where a bound is unknown (a
member of the previous collective left no dump, or its entry fell out of the ring buffer) the
rank is not named: it may have waited on that member; when it entered `LATE_S` after its peers it
is returned with ``own_s=None``, a suspect, as evidence cannot decide.

>>> def job(late_s):  # 4 ranks: tp groups (0, 1) and (2, 3), then dp groups (0, 2) and (1, 3)
...     tp, dp = {0: "1", 1: "1", 2: "2", 3: "2"}, {0: "3", 2: "3", 1: "4", 3: "4"}
...     members = {"1": (0, 1), "2": (2, 3), "3": (0, 2), "4": (1, 3)}
...     at = lambda r: int((0.1 + (late_s if r == 3 else 0)) * 1e9)
...     return {r: [Timed((tp[r], members[tp[r]]), "tp", 1, 1),
...                 Timed((dp[r], members[dp[r]]), "dp", 1, at(r))] for r in range(4)}
>>> [(late.rank, round(late.own_s, 1)) for late in late_ranks(job(4.0))]
[(3, 4.1)]
>>> late_ranks(job(0.0))
[]
"""

from __future__ import annotations

import itertools
import statistics
from collections.abc import Iterable
from dataclasses import dataclass

__all__ = ["LATE_FACTOR", "LATE_S", "Late", "Timed", "describe", "late_ranks"]

LATE_S = 1.0  # own time before a collective that counts as late, at the least
LATE_FACTOR = 4.0  # ... and this many times the median own time of the rank's peers in that step

Key = tuple[str, tuple[int, ...]]  # a group: (pg name, global member ranks)


@dataclass(frozen=True, slots=True)
class Timed:
    """One rank's flight-recorder entry, as far as timing goes."""

    key: Key
    desc: str  # the group's description ("dp", "tp"); "" when unknown
    seq: int  # collective_seq_id; 0 for send/recv (never matched by sequence)
    created_ns: int  # time_created_ns: when the rank issued it
    completed_ns: int = 0  # time_discovered_completed_ns where recorded (NCCL), else 0


@dataclass(frozen=True, slots=True)
class Late:
    rank: int
    key: Key
    seq: int
    own_s: float | None  # the rank's own time before it entered; None when it cannot be bounded
    peers_own_s: float  # the median own time of its peers in the same step
    after_s: float  # how long after the median peer's entry it entered (0 when no peer's is known)
    peers: tuple[int, ...]  # the peers compared with
    unknown: tuple[int, ...] = ()  # where own_s is None: the members whose entry would bound it


def late_ranks(timelines: dict[int, list[Timed]]) -> list[Late]:
    """The ranks that entered their group's last collective late (see the module docstring), and,
    with ``own_s=None``, those that entered it `LATE_S` after their peers while their own time
    cannot be bounded (late, or held by a member whose entry is missing: evidence cannot decide)."""
    entered: dict[tuple[Key, int], dict[int, int]] = {}  # (group, seq) -> rank -> creation time
    top: dict[Key, int] = {}
    for rank, entries in timelines.items():
        for e in entries:
            if e.seq > 0 and e.created_ns > 0:
                entered.setdefault((e.key, e.seq), {})[rank] = e.created_ns
                top[e.key] = max(top.get(e.key, 0), e.seq)
    released = {  # (group, seq) -> the earliest any member could leave it; absent when unknown
        k: max(times.values()) for k, times in entered.items() if len(times) == len(k[0][1])
    }
    # (step, seq) -> rank -> (own time or None, the entry, the members that would bound it)
    own: dict[tuple[str, int], dict[int, tuple[float | None, Timed, tuple[int, ...]]]] = {}
    for rank, entries in timelines.items():
        free: int | None = None  # the latest any earlier entry could have held the rank
        for before, e in itertools.pairwise(entries):
            bound = _released(before, released)
            free = None if bound is None else max(bound, free or 0)  # the previous entry must be known
            if e.seq == 0 or e.seq != top.get(e.key) or e.created_ns <= 0:
                continue
            step = e.desc if e.desc not in ("", "undefined") else repr(e.key)
            mine = None if free is None else (e.created_ns - free) / 1e9
            missing = tuple(m for m in before.key[1] if m not in entered.get((before.key, before.seq), {}))
            own.setdefault((step, e.seq), {})[rank] = (mine, e, missing)
    out = []
    for step_ranks in own.values():
        for rank, (mine, e, missing) in sorted(step_ranks.items()):
            others = {r: v for r, v in step_ranks.items() if r != rank}
            known = [v[0] for v in others.values() if v[0] is not None]
            if not others or (mine is not None and (mine < LATE_S or not known)):
                continue
            typical = statistics.median(known) if known else 0.0
            after = (e.created_ns - statistics.median(v[1].created_ns for v in others.values())) / 1e9
            if mine is None and after < LATE_S:
                continue
            if mine is not None and mine < LATE_FACTOR * max(typical, 0.0):
                continue
            peers = tuple(sorted(others))
            out.append(
                Late(
                    rank, e.key, e.seq, mine, typical, max(after, 0.0), peers, missing if mine is None else ()
                )
            )
    return sorted(out, key=lambda late: late.rank)


def _released(before: Timed, released: dict[tuple[Key, int], int]) -> int | None:
    """The earliest a rank was free of its previous entry; None when the entry's peers are unknown."""
    if before.completed_ns > 0:
        return max(before.completed_ns, before.created_ns)
    if before.seq == 0:  # a send/recv without a completion time: its peer's timing is unknown
        return None
    peers = released.get((before.key, before.seq))
    return None if peers is None else max(peers, before.created_ns)


def describe(late: Late, op: str) -> str:
    """The evidence sentence for one late rank."""
    after = f" {late.after_s:.1f} s after its peers in that step" if late.after_s > 0 else ""
    if late.own_s is None:
        return (
            f"entered {op}{after} (ranks {_span(late.peers)}), but whether on its own time or held in "
            f"its previous collective cannot be told: rank(s) {_span(late.unknown)} left no entry of it"
        )
    return (
        f"entered {op}{after} (ranks {_span(late.peers)}): {late.own_s:.1f} s passed between the end "
        f"of its previous collective at the latest and this entry, where its peers took "
        f"{late.peers_own_s * 1000:.0f} ms; that time was its own, outside communication (compute, "
        f"data loading, I/O, a stall), and it did enter in the end: late"
    )


def _span(ranks: Iterable[int]) -> str:
    rs = list(ranks)
    return ", ".join(map(str, rs[:8])) + (f" and {len(rs) - 8} more" if len(rs) > 8 else "")

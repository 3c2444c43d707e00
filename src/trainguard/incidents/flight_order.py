"""Which ranks left the order of collectives the other ranks followed: `incidents.flight`'s
evidence inside a cycle of waits.

A rank that skips a collective, issues one more, or swaps two ends up waiting in a collective its
peers never reach while they wait for the one it left out: every rank involved waits on another,
and the waits alone cannot tell who started it. The order can. Every rank of an SPMD job issues its
collectives in the same order, group by group (a group named by its description, ``tp``, ``dp``,
``default_pg``, and its sequence number), so after any collective the next one is the same on
every rank. A rank whose next collective differs from the one a strict majority (two or more) of
the ranks issued next is the one that left the order. Where no majority exists (two ranks, each
one way) nothing is decided.

The same order finds a rank that stopped where no group shows it: one that completed a collective
and issued nothing since, while most ranks that completed it went on to the next (its next group's
peers may all be held elsewhere, so that group never stalls on it).

    >>> seq = [("tp", 1), ("dp", 1), ("tp", 2)]
    >>> deviants({0: seq, 1: seq, 2: [("tp", 1), ("tp", 2)]})[2]
    'issued tp #2 after tp #1, where 2 of 3 ranks issued dp #1 next'
    >>> deviants({0: [("a", 1), ("b", 1)], 1: [("b", 1), ("a", 1)]})
    {}
"""

from __future__ import annotations

import itertools
from collections import Counter

__all__ = ["Key", "deviants", "stopped"]

Key = tuple[str, int]  # (group description, collective sequence number)


def deviants(sequences: dict[int, list[Key]]) -> dict[int, str]:
    """rank -> why, for each rank whose collective after some collective differs from the one a
    strict majority of the ranks that went on from there issued (at least two of them); the first
    such point of each rank is given."""
    after: dict[Key, Counter[Key]] = {}
    for seq in sequences.values():
        for a, b in itertools.pairwise(seq):
            after.setdefault(a, Counter())[b] += 1
    out: dict[int, str] = {}
    for rank, seq in sorted(sequences.items()):
        for a, b in itertools.pairwise(seq):
            (common, n), total = after[a].most_common(1)[0], sum(after[a].values())
            if b != common and n >= 2 and 2 * n > total:
                out[rank] = (
                    f"issued {_name(b)} after {_name(a)}, where {n} of {total} ranks issued {_name(common)} next"
                )
                break
    return out


def _name(key: Key) -> str:
    return f"{key[0] or 'group'} #{key[1]}"


def stopped(sequences: dict[int, list[tuple[Key, bool]]]) -> dict[int, str]:
    """rank -> why, for each rank whose last collective completed and was its last, where a strict
    majority (at least two) of the ranks that completed that collective issued another after it:
    the rank stopped outside communication. ``sequences``: rank -> [(key, completed)], oldest
    first.

    >>> step = [(("tp", 3), True), (("dp", 3), False)]
    >>> stopped({4: step, 5: step, 6: [(("tp", 3), True)]})[6]
    'completed tp #3 and issued nothing since, where 2 of 3 ranks that completed it went on (to dp #3)'
    """
    went: dict[Key, Counter[Key]] = {}
    finished: Counter[Key] = Counter()
    for seq in sequences.values():
        for i, (key, done) in enumerate(seq):
            if done:
                finished[key] += 1
                if i + 1 < len(seq):
                    went.setdefault(key, Counter())[seq[i + 1][0]] += 1
    out: dict[int, str] = {}
    for rank, seq in sorted(sequences.items()):
        if not seq or not seq[-1][1]:
            continue
        last = seq[-1][0]
        n = sum(went.get(last, Counter()).values())
        if n >= 2 and 2 * n > finished[last]:
            to = went[last].most_common(1)[0][0]
            out[rank] = (
                f"completed {_name(last)} and issued nothing since, where {n} of {finished[last]} ranks "
                f"that completed it went on (to {_name(to)})"
            )
    return out

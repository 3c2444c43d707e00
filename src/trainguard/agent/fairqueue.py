"""Who the agent's API serves next when requests wait: a reserved lane, then turns per client.

agent/api.py takes a turn for every request it has let through (token checked, rate limit
passed), around the route; ``/healthz`` takes none. At most ``slots`` ordinary requests run at
once, and one more slot is the **reserved lane**'s alone: a request of that lane (Prometheus's
scrape token) runs in its own slot or any free ordinary one, and goes before everyone waiting. The others
wait in one queue per key (a token and an address: ``read:10.0.0.7``) and take turns round robin,
so one holder of the read token with a hundred requests waiting gets one turn per round, like
the dashboard with one::

    >>> import asyncio
    >>> async def demo():
    ...     q, order = FairQueue(slots=1), []
    ...     async def ask(key, name):
    ...         async with q.turn(key):
    ...             order.append(name)
    ...     async with q.turn("read:a"):  # the one slot is taken: everyone below waits
    ...         tasks = [asyncio.create_task(ask(k, n)) for k, n in
    ...                  [("read:a", "a1"), ("read:a", "a2"), ("read:b", "b1"), (LANE, "scrape")]]
    ...         await asyncio.sleep(0)
    ...     await asyncio.gather(*tasks)
    ...     return order
    >>> asyncio.run(demo())
    ['scrape', 'a1', 'b1', 'a2']

Nothing here waits on a clock: a waiting request is let in when another finishes, or dropped when
its connection goes (its task is cancelled). What waits is bounded by the connections the server
admits (each has at most one request being handled).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import AsyncIterator

__all__ = ["LANE", "FairQueue"]

LANE = "scrape"  # the reserved lane's key


class FairQueue:
    def __init__(self, slots: int = 8, lane: str = LANE) -> None:
        self.slots, self.lane = slots, lane
        self.running = 0  # requests running, the lane's included
        self.lane_running = 0  # of which the lane's (its first sits in its own slot)
        self._waiting: dict[str, deque[asyncio.Future[None]]] = {}  # key -> waiters; key order = turn order

    def waiting(self) -> int:
        return sum(len(q) for q in self._waiting.values())

    @contextlib.asynccontextmanager
    async def turn(self, key: str) -> AsyncIterator[None]:
        """Run the block when it is ``key``'s turn."""
        if self._may_run(key, queued=False):
            self._count(key, +1)
        else:
            granted: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self._waiting.setdefault(key, deque()).append(granted)
            try:
                await granted  # the releaser counted us in
            except asyncio.CancelledError:
                if granted.done() and not granted.cancelled():  # let in and cancelled at once
                    self._release(key)
                else:
                    self._forget(key, granted)
                raise
        try:
            yield
        finally:
            self._release(key)

    def _may_run(self, key: str, queued: bool) -> bool:
        """Whether a request of ``key`` finds a free slot (and, unless ``queued``, no one it
        should wait behind)."""
        if key == self.lane:
            return (queued or self.lane not in self._waiting) and self.running < self.slots + 1
        ordinary = self.running - min(self.lane_running, 1)  # the lane's first is in its own slot
        return (queued or not self._waiting) and ordinary < self.slots

    def _count(self, key: str, n: int) -> None:
        self.running += n
        if key == self.lane:
            self.lane_running += n

    def _release(self, key: str) -> None:
        self._count(key, -1)
        while (nxt := self._next()) is not None:
            waiter_key, waiter = nxt
            if waiter.done():  # its request went away while it waited
                continue
            self._count(waiter_key, +1)
            waiter.set_result(None)

    def _next(self) -> tuple[str, asyncio.Future[None]] | None:
        """The next waiter with a free slot: the lane's first, else the next key's in turn."""
        if self.lane in self._waiting and self._may_run(self.lane, queued=True):
            return self.lane, self._pop(self.lane)
        for key in self._waiting:
            if key != self.lane:
                return (key, self._pop(key)) if self._may_run(key, queued=True) else None
        return None

    def _pop(self, key: str) -> asyncio.Future[None]:
        waiters = self._waiting.pop(key)
        first = waiters.popleft()
        if waiters:
            self._waiting[key] = waiters  # to the back: the other keys go first
        return first

    def _forget(self, key: str, granted: asyncio.Future[None]) -> None:
        waiters = self._waiting.get(key)
        if waiters is not None and granted in waiters:
            waiters.remove(granted)
            if not waiters:
                del self._waiting[key]

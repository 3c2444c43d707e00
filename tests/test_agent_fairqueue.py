"""The agent's fair queue (agent/fairqueue.py): the scrape lane's reserved slot and its place at
the head of the queue, turns per key, and waiters that go away."""

from __future__ import annotations

import asyncio

from trainguard.agent.fairqueue import LANE, FairQueue


async def _ask(
    q: FairQueue, key: str, name: str, order: list[str], hold: asyncio.Event | None = None
) -> None:
    async with q.turn(key):
        order.append(name)
        if hold is not None:
            await hold.wait()


def test_one_key_with_many_waiting_gets_one_turn_a_round() -> None:
    async def scenario() -> list[str]:
        q, order, hold = FairQueue(slots=1), [], asyncio.Event()
        first = asyncio.create_task(_ask(q, "read:a", "a0", order, hold))
        await asyncio.sleep(0)
        names = [("read:a", "a1"), ("read:a", "a2"), ("read:a", "a3"), ("read:b", "b1"), ("read:c", "c1")]
        rest = [asyncio.create_task(_ask(q, k, n, order)) for k, n in names]
        await asyncio.sleep(0)
        assert order == ["a0"] and q.waiting() == 5
        hold.set()
        await asyncio.gather(first, *rest)
        assert q.running == 0 and q.waiting() == 0
        return order

    assert asyncio.run(scenario()) == ["a0", "a1", "b1", "c1", "a2", "a3"]


def test_the_scrape_lane_has_a_slot_of_its_own_and_goes_first() -> None:
    async def scenario() -> list[str]:
        q, order = FairQueue(slots=1), []
        reader, scraper = asyncio.Event(), asyncio.Event()
        busy = asyncio.create_task(_ask(q, "read:a", "a0", order, reader))  # every ordinary slot
        await asyncio.sleep(0)
        first = asyncio.create_task(_ask(q, LANE, "s1", order, scraper))  # runs at once: its own slot
        await asyncio.sleep(0)
        assert order == ["a0", "s1"]
        queued = [asyncio.create_task(_ask(q, k, n, order)) for k, n in [("read:a", "a1"), ("read:b", "b1")]]
        second = asyncio.create_task(_ask(q, LANE, "s2", order))  # behind s1, before a1 and b1
        await asyncio.sleep(0)
        reader.set()  # a slot frees: the lane's waiter takes it before the queue's
        await asyncio.gather(busy, second, *queued)
        scraper.set()
        await first
        return order

    assert asyncio.run(scenario()) == ["a0", "s1", "s2", "a1", "b1"]


def test_a_waiter_whose_request_goes_away_leaves_no_slot_taken() -> None:
    async def scenario() -> list[str]:
        q, order, hold = FairQueue(slots=1), [], asyncio.Event()
        first = asyncio.create_task(_ask(q, "read:a", "a0", order, hold))
        await asyncio.sleep(0)
        gone = asyncio.create_task(_ask(q, "read:b", "b1", order))
        kept = asyncio.create_task(_ask(q, "read:c", "c1", order))
        await asyncio.sleep(0)
        gone.cancel()  # its connection was evicted while it waited
        hold.set()
        await asyncio.gather(first, kept)
        assert gone.cancelled() and q.running == 0 and q.waiting() == 0
        return order

    assert asyncio.run(scenario()) == ["a0", "c1"]

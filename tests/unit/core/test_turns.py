"""Turns (no Ray): one at a time, in the order asked, and how many wait."""

from __future__ import annotations

import asyncio

from choreography_ray.core.turns import Turns


def test_turns__one_at_a_time_in_order_and_the_waiting_counted() -> None:
    async def scenario() -> None:
        turns = Turns()
        order: list[str] = []
        release = asyncio.Event()

        async def take(name: str) -> None:
            async with turns.turn(name):
                order.append(name)
                if name == "first":
                    await release.wait()

        first = asyncio.create_task(take("first"))
        await asyncio.sleep(0)
        later = [asyncio.create_task(take(n)) for n in ("second", "third")]
        await asyncio.sleep(0)

        assert (turns.current, turns.waiting.total()) == ("first", 2)
        release.set()
        await asyncio.gather(first, *later)
        assert order == ["first", "second", "third"]
        assert (turns.current, turns.waiting.total()) == (None, 0)

    asyncio.run(scenario())


def test_turns__a_turn_cancelled_while_it_waits_is_no_longer_counted() -> None:
    async def scenario() -> None:
        turns = Turns()
        async with turns.turn("holding"):
            waiter = asyncio.create_task(turns.turn("never").__aenter__())
            await asyncio.sleep(0)
            assert turns.waiting == {"never": 1}
            waiter.cancel()
            await asyncio.gather(waiter, return_exceptions=True)
            assert turns.waiting.total() == 0

    asyncio.run(scenario())

"""Turns (no Ray): one at a time, in the order asked, and how many wait."""

from __future__ import annotations

import asyncio

from choreography_ray.core.turns import Turns
from tests.unit.core.conftest import Activations
from tests.unit.core.harness import eventually
from tests.unit.core.jobs import Plan, StagedJob


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


def test_caller_waiting__counts_an_operation_a_caller_waits_on_not_a_report_a_tick_or_a_save(
    activations: Activations,
) -> None:
    """What a job actor's exit gives way to (runtime/job_actor.py): an operation whose caller
    waits for its answer (one that can reopen the job, and a stop or removal, which would
    otherwise die with the actor: issue 35); reports, ticks and saves keep coming and never do."""

    async def scenario() -> None:
        h = await activations.new(StagedJob, Plan(sizes=[1]))
        core = h.c
        async with core.turns.turn("held by the test"):
            others = [
                asyncio.create_task(core.report_outcomes([])),
                asyncio.create_task(core.watchdog_tick()),
                asyncio.create_task(core._save_progress()),
            ]
            await eventually(lambda: core.turns.waiting.total() == 3, what="three turns waiting")
            assert not core.caller_waiting
            for called in (core.resume(), core.retry_failed_steps(), core.stop(), core.remove()):
                task = asyncio.create_task(called)
                await eventually(lambda: core.caller_waiting, what="the called turn waiting")
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
                assert not core.caller_waiting
        await asyncio.gather(*others, return_exceptions=True)

    activations.run(scenario)

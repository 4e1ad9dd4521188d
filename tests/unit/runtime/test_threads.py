"""A host's thread pool shared fairly (`runtime.threads.FairThreads`): no more calls in the
pool than it has threads; the others wait in `core.sharing`'s order."""

from __future__ import annotations

import asyncio
import threading

import pytest

from choreography_ray.core.sharing import Share
from choreography_ray.runtime.threads import FairThreads


def test_a_late_key_runs_before_the_backlog_of_another() -> None:
    async def main() -> list[str]:
        threads = FairThreads(1)
        gate = threading.Event()
        order: list[str] = []

        def call(name: str) -> str:
            gate.wait(5)
            order.append(name)
            return name

        try:
            futures = [threads.run(Share(key="big"), call, f"big{n}") for n in range(5)]
            futures.append(threads.run(Share(key="small"), call, "small"))
            assert threads.busy == 1 and len(threads.waiting) == 5
            gate.set()
            assert await asyncio.gather(*futures) == [f"big{n}" for n in range(5)] + ["small"]
        finally:
            threads.shutdown()
        return order

    assert asyncio.run(main()) == ["big0", "small", "big1", "big2", "big3", "big4"]


def test_an_error_comes_back_and_a_cancelled_call_never_runs() -> None:
    async def main() -> None:
        threads = FairThreads(1)
        gate = threading.Event()
        ran: list[str] = []

        def fail() -> None:
            gate.wait(5)
            raise KeyError("boom")

        try:
            failing = threads.run(Share(), fail)
            dropped = threads.run(Share(), ran.append, "dropped")
            kept = threads.run(Share(), ran.append, "kept")
            dropped.cancel()
            gate.set()
            with pytest.raises(KeyError, match="boom"):
                await failing
            await kept
            assert ran == ["kept"] and threads.busy == 0
        finally:
            threads.shutdown()

    asyncio.run(main())

"""Fixtures of the core's unit tests. pytest-asyncio is not used: a test is a sync function that
hands its scenario (a coroutine function) to `activations.run`, which runs it on an event loop of
its own with a timeout and closes every activation it built before the loop ends."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Callable, Coroutine, Iterator
from typing import Any

import pytest
from pydantic import BaseModel

from choreography_ray.core.retries import Backoff
from choreography_ray.job import Job
from tests.unit.core import jobs
from tests.unit.core.harness import Harness, create

#: Seconds a scenario may take before it fails.
SCENARIO_TIMEOUT = 20.0


class Activations:
    """Builds job activations for one test and tears them down with `core.close()`."""

    def __init__(self) -> None:
        self.made: list[Harness] = []

    async def new(self, job_type: type[Job[Any]], request: BaseModel, **kwargs: Any) -> Harness:
        """A job created PREPARING_JOB in storage and a `JobCore` activated over it."""
        harness = await create(job_type, request, **kwargs)
        self.made.append(harness)
        return harness

    def run(
        self,
        scenario: Callable[[], Coroutine[Any, Any, None]],
        timeout: float = SCENARIO_TIMEOUT,
    ) -> None:
        async def main() -> None:
            try:
                await asyncio.wait_for(scenario(), timeout)
            finally:
                self.close()
                await asyncio.sleep(0)

        asyncio.run(main())

    def close(self) -> None:
        for harness in self.made:
            harness.close()
            jobs.forget(harness.job_id)


@pytest.fixture
def activations() -> Iterator[Activations]:
    made = Activations()
    yield made
    made.close()


#: The core's standard backoff (start retries, admission, finish, failed background tasks)
#: shrunk for tests that wait for it: 50 ms doubling to 200 ms instead of 1 s doubling to 60 s.
FAST = Backoff(0.05, 0.2)


@pytest.fixture
def fast_backoff(monkeypatch: pytest.MonkeyPatch) -> Backoff:
    """Every core module that reads the standard backoff reads `FAST` instead."""
    for name, module in list(sys.modules.items()):
        if name.startswith("choreography_ray.core.") and hasattr(module, "STANDARD"):
            monkeypatch.setattr(module, "STANDARD", FAST)
    return FAST

"""Job and step types the runtime tests run (importable by path in Ray workers)."""

from __future__ import annotations

import asyncio
import contextlib
import time

from pydantic import BaseModel

import choreography_ray as cr


class Item(BaseModel):
    n: int
    fail: bool = False
    sleep: float = 0.0
    #: The sleep ends early when the step is told to stop.
    stoppable: bool = False


class Noop(cr.JobStep[Item]):
    async def perform(self, request: Item, context: cr.StepContext) -> cr.StepResult:
        if request.sleep and request.stoppable:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(context.cancelled(), request.sleep)
        elif request.sleep:
            await asyncio.sleep(request.sleep)
        if request.fail:
            return cr.StepResult.failed(f"item {request.n} failed")
        return cr.StepResult.succeeded()


class SyncNoop(cr.JobStep[Item]):
    def perform(self, request: Item, context: cr.StepContext) -> cr.StepResult:
        time.sleep(request.sleep)
        return cr.StepResult.succeeded()


class FanOutRequest(BaseModel):
    count: int
    fail_every: int = 0
    stages: int = 1
    sleep: float = 0.0
    stoppable: bool = False


class FanOut(cr.Job[FanOutRequest]):
    def prepare_steps(self, request: FanOutRequest) -> list[cr.StepSpec]:
        return [
            self.create_step(
                Noop,
                Item(
                    n=i,
                    fail=bool(request.fail_every) and i % request.fail_every == 0,
                    sleep=request.sleep,
                    stoppable=request.stoppable,
                ),
                stage=(i % request.stages) * 10,
            )
            for i in range(request.count)
        ]

"""The job type the CLI's acting commands are tried on (tests/runtime/test_cli_jobs.py):
steps that hold until they are told to stop (or `seconds` pass), and may fail their first
attempt, in a job whose failed steps may be retried."""

from __future__ import annotations

import asyncio

from pydantic import BaseModel

import choreography_ray as cr


class Hold(BaseModel):
    n: int
    seconds: float
    fail_first: bool = False


class HoldStep(cr.JobStep[Hold]):
    async def perform(self, request: Hold, context: cr.StepContext) -> cr.StepResult:
        if request.fail_first and context.attempt == 1:
            return cr.StepResult.failed(f"step {request.n}: the first attempt fails on purpose")
        try:
            await asyncio.wait_for(context.cancelled(), timeout=request.seconds)
        except TimeoutError:
            return cr.StepResult.succeeded()
        raise asyncio.CancelledError  # honour the stop


class HoldRequest(BaseModel):
    count: int = 2
    seconds: float = 120.0
    fail_first: bool = False


class Held(cr.Job[HoldRequest]):
    can_retry_failed_steps = True

    def prepare_steps(self, request: HoldRequest) -> list[cr.StepSpec]:
        return [
            self.create_step(HoldStep, Hold(n=n, seconds=request.seconds,
                                            fail_first=request.fail_first))
            for n in range(request.count)
        ]  # fmt: skip

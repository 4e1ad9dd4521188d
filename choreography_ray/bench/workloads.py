"""The job the benchmarks run: N steps, optional stages, simulated work and failures."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator

from pydantic import BaseModel

import choreography_ray as cr


class BenchItem(BaseModel):
    fail: bool = False
    ms: float = 0.0
    #: Return when perform began and ended (wall clock) as the step's output.
    timed: bool = False


class Timing(BaseModel):
    began: float
    ended: float


class BenchStep(cr.JobStep[BenchItem]):
    async def perform(self, request: BenchItem, context: cr.StepContext) -> cr.StepResult:
        began = time.time()
        if request.ms:
            await asyncio.sleep(request.ms / 1000)
        if request.fail:
            return cr.StepResult.failed("simulated failure")
        if request.timed:
            return cr.StepResult.succeeded(output=Timing(began=began, ended=time.time()))
        return cr.StepResult.succeeded()


class BenchRequest(BaseModel):
    steps: int
    stages: int = 1
    fail_rate: float = 0.0
    step_ms: float = 0.0
    timed: bool = False


class BenchJob(cr.Job[BenchRequest]):
    def get_failure_behavior_for(self, stage: int) -> cr.JobStageFailureBehavior:
        return cr.JobStageFailureBehavior.CONTINUE_WITH_NEXT_STAGE

    def prepare_steps(self, request: BenchRequest) -> Iterator[cr.StepSpec]:
        """The steps one at a time (a generator): the job reads and stores them in chunks, so
        a plan of 10,000,000 steps is never held whole. Steps share their two requests."""
        every = round(1 / request.fail_rate) if request.fail_rate else 0
        per_stage = -(-request.steps // request.stages)
        succeeds = BenchItem(ms=request.step_ms, timed=request.timed)
        fails = BenchItem(fail=True, ms=request.step_ms)
        for i in range(request.steps):
            failing = bool(every) and i % every == every - 1
            yield self.create_step(BenchStep, fails if failing else succeeds, stage=i // per_stage)

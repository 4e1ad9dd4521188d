"""Job types of the streamed-plan tests (issue 13): plans `prepare_steps` yields lazily, with
steps that trace every run. Ray workers import them by path, so they live at module level; they
trace through `tests.runtime.lifecycle_jobs` (one directory per job id), and a plan names its
job id under its request's token, since `start` has not returned it yet."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from pydantic import BaseModel

import choreography_ray as cr
from tests.runtime.lifecycle_jobs import TRACES, flag_set, record


class Counted(BaseModel):
    n: int


class CountedStep(cr.JobStep[Counted]):
    """Traces each run, with its step id and attempt."""

    async def perform(self, request: Counted, context: cr.StepContext) -> cr.StepResult:
        record(context.job_id, "runs", step=context.step_id, attempt=context.attempt)
        return cr.StepResult.succeeded()


class StreamedPlan(BaseModel):
    token: str
    steps: int
    stages: int = 1
    #: The plan waits for the job's flag "go on" once it has yielded this many steps.
    pause_after: int | None = None


class StreamedJob(cr.Job[StreamedPlan]):
    """An async generator plan; step i is in stage `i % stages` (the stages interleave)."""

    def get_failure_behavior_for(self, stage: int) -> cr.JobStageFailureBehavior:
        return cr.JobStageFailureBehavior.CONTINUE_WITH_NEXT_STAGE

    async def prepare_steps(self, request: StreamedPlan) -> AsyncIterator[cr.StepSpec]:  # type: ignore[override]
        TRACES.mkdir(parents=True, exist_ok=True)
        (TRACES / f"token-{request.token}").write_text(self.job_id)
        for i in range(request.steps):
            if i == request.pause_after:
                record(self.job_id, "paused", at_step=i)
                await flag_set(self.job_id, "go on")
            if i % 100 == 0:
                await asyncio.sleep(0)
            yield self.create_step(CountedStep, Counted(n=i), stage=i % request.stages)

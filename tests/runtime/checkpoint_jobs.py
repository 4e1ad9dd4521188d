"""A job type with `checkpoint_stages`: stage 0's steps log their runs, stage 1's step fails
until it has run `fail_runs` times. Each run of a step appends a line to `{directory}/stage-N`,
so the test counts across processes."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel

import choreography_ray as cr


class CheckpointRequest(BaseModel):
    directory: str
    fail_runs: int = 1


class Logged(BaseModel):
    directory: str
    stage: int
    fail_runs: int = 0


class LoggedStep(cr.JobStep[Logged]):
    async def perform(self, request: Logged, context: cr.StepContext) -> cr.StepResult:
        log = Path(request.directory) / f"stage-{request.stage}"
        with log.open("a") as lines:
            lines.write(f"{context.job_id}\n")
        if len(log.read_text().splitlines()) <= request.fail_runs:
            return cr.StepResult.failed(f"stage {request.stage} fails this time")
        return cr.StepResult.succeeded()


class TwoStages(cr.Job[CheckpointRequest]):
    """Two steps in stage 0, one in stage 1 that fails on its first `fail_runs` runs."""

    checkpoint_stages = True

    def prepare_steps(self, request: CheckpointRequest) -> list[cr.StepSpec]:
        first = Logged(directory=request.directory, stage=0)
        second = Logged(directory=request.directory, stage=1, fail_runs=request.fail_runs)
        return [
            self.create_step(LoggedStep, first, 0),
            self.create_step(LoggedStep, first, 0),
            self.create_step(LoggedStep, second, 1),
        ]

    def should_retry_step(self, step_id: str, result: cr.StepResult, attempt: int) -> bool:
        return False

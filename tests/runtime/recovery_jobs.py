"""Job types for the recovery tests: steps log each run to a file named in the request.

The log is one step id a line (`tests.support.append_line`), not a JSON trace:
`test_recovery.py` counts its whitespace-separated words, the step ids.
"""

from __future__ import annotations

import asyncio

from pydantic import BaseModel

import choreography_ray as cr
from tests.support import append_line


class LoggedItem(BaseModel):
    log: str
    sleep: float


class LoggedStep(cr.JobStep[LoggedItem]):
    async def perform(self, request: LoggedItem, context: cr.StepContext) -> cr.StepResult:
        await asyncio.sleep(request.sleep)
        append_line(request.log, context.step_id)
        return cr.StepResult.succeeded()


class LoggedRequest(BaseModel):
    log: str
    steps: int
    sleep: float = 0.3


class LoggedJob(cr.Job[LoggedRequest]):
    max_active_steps = 4

    def prepare_steps(self, request: LoggedRequest) -> list[cr.StepSpec]:
        return [
            self.create_step(LoggedStep, LoggedItem(log=request.log, sleep=request.sleep))
            for _ in range(request.steps)
        ]

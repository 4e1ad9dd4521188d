"""Job types the acceptance tests run through the CLI, imported by path in Ray workers
(`tests.acceptance.acceptance_jobs:Greet`): the CLI's subprocess runs with the repository root
as its working directory and on PYTHONPATH."""

from __future__ import annotations

from pydantic import BaseModel, Field

import choreography_ray as cr


class Greeting(BaseModel):
    name: str
    fail: bool = False


class SayHello(cr.JobStep[Greeting]):
    async def perform(self, request: Greeting, context: cr.StepContext) -> cr.StepResult:
        if request.fail:
            return cr.StepResult.failed(f"no greeting for {request.name}")
        return cr.StepResult.succeeded()


class GreetRequest(BaseModel):
    names: list[str] = Field(min_length=1)
    #: Names whose step fails.
    fail: list[str] = []


class Greet(cr.Job[GreetRequest]):
    def prepare_steps(self, request: GreetRequest) -> list[cr.StepSpec]:
        return [
            self.create_step(SayHello, Greeting(name=name, fail=name in request.fail))
            for name in request.names
        ]

"""Job types the sharing tests run (importable by path in Ray workers): a backlog of sync steps
that sleep, keyed by the request's tenant (none: the manager's namespace)."""

from __future__ import annotations

import time

from pydantic import BaseModel

import choreography_ray as cr


class Nap(BaseModel):
    seconds: float


class Sleep(cr.JobStep[Nap]):
    def perform(self, request: Nap, context: cr.StepContext) -> cr.StepResult:
        time.sleep(request.seconds)
        return cr.StepResult.succeeded()


class BacklogRequest(BaseModel):
    steps: int
    seconds: float
    tenant: str = ""


class Backlog(cr.Job[BacklogRequest]):
    def prepare_steps(self, request: BacklogRequest) -> list[cr.StepSpec]:
        nap = Nap(seconds=request.seconds)
        return [self.create_step(Sleep, nap) for _ in range(request.steps)]

    def fairness_key(self, request: BacklogRequest) -> str | None:
        return request.tenant or None

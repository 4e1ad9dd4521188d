"""Jobs for the failures-at-scale tests: steps that fail in one of three ways by their number
until a file says they are fixed, and a stage that goes on at a share of successes."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel

import choreography_ray as cr


class Item(BaseModel):
    n: int
    #: A file whose existence fixes every failing step (what a retry after a fix finds); each
    #: start appends the step's number to `{fixed}.starts`.
    fixed: str
    #: `Rejects`: the steps with n % 100 below it fail.
    fail_below: int = 0


class Flaky(cr.JobStep[Item]):
    """Steps n % 100 == 1 raise a KeyError, == 2 a TimeoutError, == 3 fail with a code; the
    others succeed."""

    def perform(self, request: Item, context: cr.StepContext) -> cr.StepResult:
        with open(f"{request.fixed}.starts", "a") as starts:
            starts.write(f"{request.n}\n")
        if Path(request.fixed).exists():
            return cr.StepResult.succeeded()
        kind = request.n % 100
        if kind == 1:
            raise KeyError(f"doc-{request.n}")
        if kind == 2:
            raise TimeoutError(f"GET https://api.example.com/items/{request.n} after 30.5 s")
        if kind == 3:
            return cr.StepResult.failed(f"quota exceeded for tenant {request.n}", code="QUOTA")
        return cr.StepResult.succeeded()


class Batch(BaseModel):
    steps: int
    fixed: str
    #: `GoesOnAt98`: of every 100 steps of stage 0, how many fail.
    fail_below: int = 0


class ThreeKinds(cr.Job[Batch]):
    """`steps` Flaky steps: 1 % fail of each of the three kinds."""

    can_retry_failed_steps = True

    def prepare_steps(self, request: Batch) -> list[cr.StepSpec]:
        item = Item(n=0, fixed=request.fixed)
        return [self.create_step(Flaky, item.model_copy(update={"n": n}))
                for n in range(request.steps)]  # fmt: skip


class Rejects(cr.JobStep[Item]):
    def perform(self, request: Item, context: cr.StepContext) -> cr.StepResult:
        if request.n % 100 < request.fail_below:
            return cr.StepResult.failed(f"item {request.n} rejected")
        return cr.StepResult.succeeded()


class GoesOnAt98(cr.Job[Batch]):
    """Stage 0: `steps` steps, `fail_below` of every 100 failing; stage 1: one step. Stage 0
    goes on when at least 98 % of its steps succeeded."""

    def prepare_steps(self, request: Batch) -> list[cr.StepSpec]:
        item = Item(n=0, fixed=request.fixed, fail_below=request.fail_below)
        first = [self.create_step(Rejects, item.model_copy(update={"n": n}), stage=0)
                 for n in range(request.steps)]  # fmt: skip
        return [*first, self.create_step(Rejects, Item(n=99, fixed=request.fixed), stage=1)]

    def get_min_success_ratio(self, stage: int) -> float | None:
        return 0.98

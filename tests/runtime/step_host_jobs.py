"""Job and step types of the step host tests (`test_step_host.py`), importable by path in Ray
workers. No tests here: the module holds types only."""

from __future__ import annotations

import asyncio
from typing import Literal

from pydantic import BaseModel

import choreography_ray as cr

#: What a step's perform does: succeed, return a failed result, or raise one of these.
Behaviour = Literal["ok", "fail", "cancelled", "keyboard_interrupt", "system_exit", "error"]
#: Where a raise happens: "now" in the first slice (before any await), "later" after an
#: await (under the step's task), "sync" in a worker thread, "stop" after the step is told to
#: stop (it waits for that first).
Where = Literal["now", "later", "sync", "stop"]

_ERRORS: dict[str, type[BaseException]] = {
    "cancelled": asyncio.CancelledError,
    "keyboard_interrupt": KeyboardInterrupt,
    "system_exit": SystemExit,
    "error": RuntimeError,
}


class Case(BaseModel):
    n: int
    behaviour: Behaviour = "ok"
    where: Where = "now"


def outcome(case: Case) -> cr.StepResult:
    if case.behaviour == "ok":
        return cr.StepResult.succeeded()
    if case.behaviour == "fail":
        return cr.StepResult.failed(f"case {case.n} failed")
    raise _ERRORS[case.behaviour](f"case {case.n}")


class AsyncCaseStep(cr.JobStep[Case]):
    async def perform(self, request: Case, context: cr.StepContext) -> cr.StepResult:
        if request.where == "later":
            await asyncio.sleep(0.01)
        elif request.where == "stop":
            await context.cancelled()
        return outcome(request)


class SyncCaseStep(cr.JobStep[Case]):
    def perform(self, request: Case, context: cr.StepContext) -> cr.StepResult:
        return outcome(request)


class CasesRequest(BaseModel):
    cases: list[Case]


class CasesJob(cr.Job[CasesRequest]):
    """One step per case, all in stage 0."""

    def prepare_steps(self, request: CasesRequest) -> list[cr.StepSpec]:
        return [
            self.create_step(SyncCaseStep if case.where == "sync" else AsyncCaseStep, case)
            for case in request.cases
        ]

"""A job whose steps ask `decide` and then fail: the scheduler's decision replay on real Ray.

Each `ask` appends a line to `{directory}/asked-{question}` and each answer the step acts on to
`{directory}/answers-{question}`, so the test counts across processes."""

from __future__ import annotations

import json
from pathlib import Path

from pydantic import BaseModel

import choreography_ray as cr


class DecideRequest(BaseModel):
    directory: str
    question: str = "async"


def _question(request: DecideRequest) -> str:
    """Each step its own question: one asked the same way about the same state in one run
    is answered once, by the run's recorded answer."""
    return f"which lead? ({request.question})"


def _ask(request: DecideRequest) -> dict[str, str]:
    with (Path(request.directory) / f"asked-{request.question}").open("a") as counter:
        counter.write("asked\n")
    return {"pick": "a"}


def _acted_on(request: DecideRequest, answer: object) -> cr.StepResult:
    with (Path(request.directory) / f"answers-{request.question}").open("a") as answers:
        answers.write(json.dumps(answer) + "\n")
    return cr.StepResult.failed(f"{request.question}: fails after its decision")


class AsksThenFails(cr.JobStep[DecideRequest]):
    async def perform(self, request: DecideRequest, context: cr.StepContext) -> cr.StepResult:
        answer = await context.decide(_question(request), {"lead": "ada"}, lambda: _ask(request))
        return _acted_on(request, answer)


class SyncAsksThenFails(cr.JobStep[DecideRequest]):
    def perform(self, request: DecideRequest, context: cr.StepContext) -> cr.StepResult:
        answer = context.decide_sync(_question(request), {"lead": "ada"}, lambda: _ask(request))
        return _acted_on(request, answer)


class DecidesThenFails(cr.Job[DecideRequest]):
    """Two steps: one asks from an async perform, one from a sync perform."""

    def prepare_steps(self, request: DecideRequest) -> list[cr.StepSpec]:
        sync = request.model_copy(update={"question": "sync"})
        return [self.create_step(AsksThenFails, request), self.create_step(SyncAsksThenFails, sync)]

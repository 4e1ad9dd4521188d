"""The demo job: embed a corpus of documents, in three stages.

    stage 0    OpenIndex         1 step    set-up; a failure here still lets the fan-out run
    stage 10   EmbedDocument     N - 2     the fan-out; every `fail_every`-th document fails
    stage 20   PublishIndex      1 step    runs once stage 10 has an outcome for every step

Stages 0 and 10 are best-effort (`CONTINUE_WITH_NEXT_STAGE`), so the failed documents of stage
10 do not stop stage 20: the job ends `COMPLETED_WITH_FAILURES`, and the failed steps keep their
messages in storage. Every step does a little simulated asynchronous work (a sleep of a few
milliseconds); no step touches anything outside the process.
"""

from __future__ import annotations

import asyncio

from pydantic import BaseModel, Field

import choreography_ray as cr

#: The stages of the demo, in the order they run.
SETUP_STAGE = 0
FAN_OUT_STAGE = 10
FINAL_STAGE = 20

#: Steps outside the fan-out: one set-up step and one final step.
FIXED_STEPS = 2


class DemoRequest(BaseModel):
    """How big the demo is. `steps` counts every step, the set-up and final ones included."""

    steps: int = Field(default=3_000, ge=FIXED_STEPS + 1, le=1_000_000)
    #: Every `fail_every`-th document of the fan-out fails (1 %); 0 fails none.
    fail_every: int = Field(default=100, ge=0)
    #: Simulated work per step, in milliseconds (each step sleeps 0.5 to 1.5 times this).
    work_ms: float = Field(default=5.0, ge=0.0, le=60_000.0)


class IndexStep(BaseModel):
    """The request of the set-up and the final step."""

    index: str
    work_ms: float = 0.0


class Document(BaseModel):
    """The request of one fan-out step."""

    index: str
    #: 1 to N - 2.
    number: int
    fail: bool = False
    work_ms: float = 0.0


async def simulate_work(ms: float, seed: int) -> None:
    """Sleeps about `ms` milliseconds, spread deterministically by `seed` (0.5x to 1.5x)."""
    if ms > 0:
        await asyncio.sleep(ms * (0.5 + (seed * 7919 % 101) / 100) / 1000)


class OpenIndex(cr.JobStep[IndexStep]):
    async def perform(self, request: IndexStep, context: cr.StepContext) -> cr.StepResult:
        await simulate_work(request.work_ms, 0)
        return cr.StepResult.succeeded()


class EmbedDocument(cr.JobStep[Document]):
    async def perform(self, request: Document, context: cr.StepContext) -> cr.StepResult:
        await simulate_work(request.work_ms, request.number)
        if request.fail:
            return cr.StepResult.failed(
                f"document {request.number} of {request.index!r}: simulated parse error"
            )
        return cr.StepResult.succeeded()


class PublishIndex(cr.JobStep[IndexStep]):
    async def perform(self, request: IndexStep, context: cr.StepContext) -> cr.StepResult:
        await simulate_work(request.work_ms, 1)
        return cr.StepResult.succeeded()


class DemoJob(cr.Job[DemoRequest]):
    """Set up, fan out over the documents, publish: see the module docstring."""

    #: The name of the simulated index every step works on.
    INDEX = "demo-corpus"

    def prepare_steps(self, request: DemoRequest) -> list[cr.StepSpec]:
        index = IndexStep(index=self.INDEX, work_ms=request.work_ms)
        every = request.fail_every
        documents = (
            Document(
                index=self.INDEX,
                number=n,
                fail=every > 0 and n % every == 0,
                work_ms=request.work_ms,
            )
            for n in range(1, request.steps - FIXED_STEPS + 1)
        )
        return [
            self.create_step(OpenIndex, index, stage=SETUP_STAGE),
            *(self.create_step(EmbedDocument, d, stage=FAN_OUT_STAGE) for d in documents),
            self.create_step(PublishIndex, index, stage=FINAL_STAGE),
        ]

    def get_failure_behavior_for(self, stage: int) -> cr.JobStageFailureBehavior:
        # The set-up and the fan-out are best-effort: failed documents are reported, and the
        # index is published with the documents that made it. The last stage has none after it.
        if stage in (SETUP_STAGE, FAN_OUT_STAGE):
            return cr.JobStageFailureBehavior.CONTINUE_WITH_NEXT_STAGE
        return cr.JobStageFailureBehavior.STOP_JOB

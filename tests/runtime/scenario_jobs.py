"""Job and step types of the job scenarios (`test_jobs.py`), importable by path in Ray workers.

Steps and hooks run in other processes than the test, so they record what they observe in the
trace files the request names (`tests.support.trace`): which step ran, in which stage and
attempt, when it started and ended, in which actor, and which hooks were called. The test reads
the files afterwards.
"""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path
from typing import Any, Literal

import ray
from pydantic import BaseModel

import choreography_ray as cr
from tests.support import trace

#: Seconds between two looks at a gate file.
GATE_POLL = 0.05


def is_open(gate: str) -> bool:
    return Path(gate).exists()


class Probe(BaseModel):
    """One step of a plan: what it does and where it records itself."""

    n: int
    log: str
    stage: int = 0
    #: Which step type runs it (see `STEP_TYPES`).
    kind: Literal["async", "sync", "dedicated"] = "async"
    #: ok: returns its result; raise: raises; garbage: returns something that is not a
    #: StepResult; block: holds the event loop with time.sleep for `sleep` seconds.
    behaviour: Literal["ok", "raise", "garbage", "block"] = "ok"
    #: Returns StepResult.failed while its attempt is at most this.
    fail_attempts: int = 0
    #: Seconds the step takes (awaited, or slept in a sync perform).
    sleep: float = 0.0
    #: When set, the step waits until this file exists before it goes on.
    gate: str = ""


async def _perform_async(request: Probe, context: cr.StepContext) -> Any:
    started = time.time()
    if request.gate:
        # Another process opens the gate: polling a file is the simplest cross-process signal.
        while not is_open(request.gate):  # noqa: ASYNC110
            await asyncio.sleep(GATE_POLL)
    if request.behaviour == "block":
        time.sleep(request.sleep)  # noqa: ASYNC251 (blocks the host's event loop on purpose)
    elif request.sleep:
        await asyncio.sleep(request.sleep)
    return _finish(request, context, started, on_loop=True)


def _finish(request: Probe, context: cr.StepContext, started: float, on_loop: bool) -> Any:
    trace(
        request.log,
        n=request.n,
        job_id=context.job_id,
        step_id=context.step_id,
        stage=context.stage,
        attempt=context.attempt,
        start=started,
        end=time.time(),
        pid=os.getpid(),
        on_loop=on_loop,
        actor=ray.get_runtime_context().get_actor_name(),
        namespace=ray.get_runtime_context().namespace,
    )
    if request.behaviour == "raise":
        raise ValueError(f"boom from step {request.n}")
    if request.behaviour == "garbage":
        return {"n": request.n}
    if context.attempt <= request.fail_attempts:
        return cr.StepResult.failed(f"step {request.n} failed at attempt {context.attempt}")
    return cr.StepResult.succeeded()


class AsyncProbeStep(cr.JobStep[Probe]):
    async def perform(self, request: Probe, context: cr.StepContext) -> Any:
        return await _perform_async(request, context)


class SyncProbeStep(cr.JobStep[Probe]):
    def perform(self, request: Probe, context: cr.StepContext) -> Any:
        started = time.time()
        try:
            asyncio.get_running_loop()
            on_loop = True
        except RuntimeError:
            on_loop = False
        time.sleep(request.sleep)
        return _finish(request, context, started, on_loop=on_loop)


class DedicatedProbeStep(cr.JobStep[Probe]):
    dedicated = True
    actor_options = {"num_cpus": 0}

    async def perform(self, request: Probe, context: cr.StepContext) -> Any:
        return await _perform_async(request, context)


STEP_TYPES: dict[str, type[cr.JobStep[Probe]]] = {
    "async": AsyncProbeStep,
    "sync": SyncProbeStep,
    "dedicated": DedicatedProbeStep,
}


class PlanRequest(BaseModel):
    steps: list[Probe]
    #: Where the job's hooks record their calls (on_completed, admit_stage).
    hooks: str
    #: A stage whose admission waits until the file `gate` exists.
    gated_stage: int | None = None
    gate: str = ""
    #: prepare_steps raises with this message when set.
    fail_prepare: str = ""
    #: on_completed waits this many seconds, then raises with `fail_completed` when set.
    completed_delay: float = 0.0
    fail_completed: str = ""


class PlanJob(cr.Job[PlanRequest]):
    """Runs the steps its request lists, each in the stage it names."""

    request: PlanRequest

    def prepare_steps(self, request: PlanRequest) -> list[cr.StepSpec]:
        self.request = request
        if request.fail_prepare:
            raise RuntimeError(request.fail_prepare)
        return [self.create_step(STEP_TYPES[p.kind], p, stage=p.stage) for p in request.steps]

    async def on_completed(self) -> None:
        trace(self.request.hooks, hook="on_completed", job_id=self.job_id, at=time.time())
        if self.request.completed_delay:
            await asyncio.sleep(self.request.completed_delay)
        if self.request.fail_completed:
            raise RuntimeError(self.request.fail_completed)

    async def admit_stage(self, stage: int) -> bool:
        admitted = stage != self.request.gated_stage or is_open(self.request.gate)
        trace(
            self.request.hooks, hook="admit_stage", stage=stage, admitted=admitted, at=time.time()
        )
        return admitted


class BestEffortPlanJob(PlanJob):
    """Every stage continues with the next one when a step fails."""

    def get_failure_behavior_for(self, stage: int) -> cr.JobStageFailureBehavior:
        return cr.JobStageFailureBehavior.CONTINUE_WITH_NEXT_STAGE


class RetryablePlanJob(PlanJob):
    can_retry_failed_steps = True


class WindowOfTwoJob(PlanJob):
    max_active_steps = 2


class WindowOfZeroJob(PlanJob):
    max_active_steps = 0

"""The chaos job and step types, importable by path in Ray workers.

Every attempt of a step appends a `start` and an `end` event (with a run id that pairs them,
its attempt, pid, Ray node and time) to the run's step log, a trace file the request names
(`tests.support.trace`). Hooks cannot see their job's request, so they append to the hooks log
of the run directory named by `CHAOS_RUN_DIR`, which every process of a run's cluster inherits.

A step's outcome is a function of (step, attempt) only, so a step run twice at one attempt ends
the same way and the harness can tell which outcome the job must have counted.
"""

from __future__ import annotations

import asyncio
import os
import time
import uuid
from pathlib import Path
from typing import Literal

import ray
from pydantic import BaseModel

import choreography_ray as cr
from tests.support import trace

#: The environment variable naming the run directory (set by the harness for its cluster).
RUN_DIR_ENV = "CHAOS_RUN_DIR"

#: Seconds between two looks of a sync step at its cancellation flag.
SYNC_POLL = 0.01


class ChaosItem(BaseModel):
    """One step: how long it works and how it ends."""

    log: str
    n: int
    work_ms: float
    #: ok: succeeds; fail: returns StepResult.failed; raise: raises (stored FAILED).
    ending: Literal["ok", "fail", "raise"] = "ok"
    #: Returns StepResult.failed while its attempt is at most this, then ends as `ending`.
    flaky_attempts: int = 0


def planned_ending(item: ChaosItem, attempt: int) -> str:
    """What attempt `attempt` of the step ends with: `ok`, `fail` or `raise`."""
    if attempt <= item.flaky_attempts:
        return "fail"
    return item.ending


def _node() -> str:
    try:
        return ray.get_runtime_context().get_node_id()
    except Exception:  # outside Ray (a unit check of this module)
        return ""


def _event(item: ChaosItem, context: cr.StepContext, event: str, run: str, **more: object) -> None:
    trace(
        item.log,
        event=event,
        run=run,
        job=context.job_id,
        step=context.step_id,
        n=item.n,
        attempt=context.attempt,
        pid=os.getpid(),
        node=_node(),
        at=time.time(),
        **more,
    )


def _result(item: ChaosItem, context: cr.StepContext, run: str) -> cr.StepResult:
    ending = planned_ending(item, context.attempt)
    _event(item, context, "end", run, result=ending)
    if ending == "raise":
        raise RuntimeError(f"chaos step {item.n} raises at attempt {context.attempt}")
    if ending == "fail":
        return cr.StepResult.failed(f"chaos step {item.n} fails at attempt {context.attempt}")
    return cr.StepResult.succeeded()


def _stopped(item: ChaosItem, context: cr.StepContext, run: str) -> RuntimeError:
    _event(item, context, "end", run, result="stopped")
    return RuntimeError(f"chaos step {item.n} stopped")


class ChaosStep(cr.JobStep[ChaosItem]):
    """Awaits its work on the host's event loop; a stop ends it at once (stored STOPPED)."""

    async def perform(self, request: ChaosItem, context: cr.StepContext) -> cr.StepResult:
        run = uuid.uuid4().hex[:12]
        _event(request, context, "start", run)
        try:
            await asyncio.wait_for(context.cancelled(), request.work_ms / 1000)
        except TimeoutError:
            return _result(request, context, run)
        raise _stopped(request, context, run)


class SyncChaosStep(cr.JobStep[ChaosItem]):
    """Works in the host's thread pool, looking at its cancellation flag."""

    def perform(self, request: ChaosItem, context: cr.StepContext) -> cr.StepResult:
        run = uuid.uuid4().hex[:12]
        _event(request, context, "start", run)
        deadline = time.monotonic() + request.work_ms / 1000
        while time.monotonic() < deadline:
            if context.is_cancelled:
                raise _stopped(request, context, run)
            time.sleep(SYNC_POLL)
        return _result(request, context, run)


class DedicatedChaosStep(ChaosStep):
    """The same step in an actor of its own (`step/{job_id}/{step_id}`)."""

    dedicated = True
    actor_options = {"num_cpus": 0}


#: Step types by the name a plan gives them.
STEP_TYPES: dict[str, type[cr.JobStep[ChaosItem]]] = {
    "async": ChaosStep,
    "sync": SyncChaosStep,
    "dedicated": DedicatedChaosStep,
}


class ChaosStepPlan(BaseModel):
    kind: Literal["async", "sync", "dedicated"]
    stage: int
    item: ChaosItem


class ChaosRequest(BaseModel):
    steps: list[ChaosStepPlan]


def continues_on_failure(stage: int) -> bool:
    """Stages 10, 30, 50, ... are best-effort; 0, 20, 40, ... are barriers."""
    return (stage // 10) % 2 == 1


def hooks_log() -> Path | None:
    run_dir = os.environ.get(RUN_DIR_ENV)
    return Path(run_dir) / "hooks.jsonl" if run_dir else None


def _hook(job: cr.Job[ChaosRequest], event: str) -> None:
    path = hooks_log()
    if path is not None:
        trace(path, event=event, job=job.job_id, pid=os.getpid(), at=time.time())


class ChaosJob(cr.Job[ChaosRequest]):
    def prepare_steps(self, request: ChaosRequest) -> list[cr.StepSpec]:
        return [self.create_step(STEP_TYPES[s.kind], s.item, stage=s.stage) for s in request.steps]

    def get_failure_behavior_for(self, stage: int) -> cr.JobStageFailureBehavior:
        if continues_on_failure(stage):
            return cr.JobStageFailureBehavior.CONTINUE_WITH_NEXT_STAGE
        return cr.JobStageFailureBehavior.STOP_JOB

    async def on_completed(self) -> None:
        _hook(self, "completed")

    async def on_stopped(self) -> None:
        _hook(self, "stopped")


class RetryableChaosJob(ChaosJob):
    """One stage (its plan is drawn so): `op_retry_failed` aims at it; a staged job answers
    `NotSupported`, its type not allowing retries."""

    can_retry_failed_steps = True


#: Job types by the name a plan gives them.
JOB_TYPES: dict[str, type[ChaosJob]] = {"staged": ChaosJob, "retryable": RetryableChaosJob}

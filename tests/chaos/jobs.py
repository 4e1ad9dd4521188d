"""The chaos job and step types, importable by path in Ray workers.

Every attempt of a step appends a `start` and an `end` event (with a run id that pairs them,
its attempt, pid, Ray node and time) to the run's step log, a trace file the request names
(`tests.support.trace`). Hooks cannot see their job's request, so they append to the hooks log
of the run directory named by `CHAOS_RUN_DIR`, which every process of a run's cluster inherits.

A step's outcome is a function of (step, attempt) only, so a step run twice at one attempt ends
the same way and the harness can tell which outcome the job must have counted.

A step that succeeds returns a `ChaosOutput` (its step id, number and attempt), stored by its
host with the outcome: the harness checks that the stored outputs are exactly one per succeeded
step, written by an attempt that ended `ok` (`invariants.check_outputs`).

Pool steps (`PoolChaosStep`, docs/pools.md) run in batches on hosts of one declared GPU each; every
step of a batch logs its own start and end (with the host's actor name and the batch's id). A
batch that raised would fail its neighbours too, making a step's outcome depend on its batch, so
pool steps are drawn without `raise` endings (`harness.plan_run`). `UnplaceableChaosStep` needs a
resource no node of a run has: it must never run.
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


class ChaosOutput(BaseModel):
    """A succeeded step's output: which step, and which attempt of it, wrote it."""

    step: str
    n: int
    attempt: int


def succeeded(item: ChaosItem, context: cr.StepContext) -> cr.StepResult:
    output = ChaosOutput(step=context.step_id, n=item.n, attempt=context.attempt)
    return cr.StepResult.succeeded(output=output)


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
    return succeeded(item, context)


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


#: The shape of the pool the chaos pool steps run on, as pool host names spell it.
POOL_SHAPE = "num_gpus=1"
#: Steps one batch of a chaos pool step gets at most.
POOL_BATCH_SIZE = 8


class PoolChaosStep(cr.JobStep[ChaosItem]):
    """Batches of up to 8 steps on a host of one declared GPU, one batch at a time a host. A
    batch works as long as its longest step (a GPU batch costs its largest item); a stop ends it
    at once, every step of it logged `stopped` (counted stopped)."""

    resources = {"num_gpus": 1}
    batch_size = POOL_BATCH_SIZE
    batch_wait = 0.02

    async def perform_batch(
        self, requests: list[ChaosItem], context: cr.BatchContext
    ) -> list[cr.StepResult]:
        steps = list(zip(requests, context.steps, strict=True))
        if any(planned_ending(r, c.attempt) == "raise" for r, c in steps):
            # A plan error: the step log then shows no end of these stored FAILED steps.
            raise ValueError("a chaos pool step drawn to raise: a batch cannot raise for one")
        batch = uuid.uuid4().hex[:12]
        actor = _actor()
        runs = [(r, c, uuid.uuid4().hex[:12]) for r, c in steps]
        for request, step, run in runs:
            _event(request, step, "start", run, batch=batch, actor=actor, size=len(requests))
        try:
            await asyncio.wait_for(context.cancelled(), max(r.work_ms for r in requests) / 1000)
        except TimeoutError:
            return [_batch_result(request, step, run) for request, step, run in runs]
        for request, step, run in runs:
            _event(request, step, "end", run, result="stopped")
        raise RuntimeError(f"chaos batch {batch} stopped")


class PoolChaosStep2(PoolChaosStep):
    """The same on the same pool, two batches at a time a host."""

    concurrency = 2


class UnplaceableChaosStep(PoolChaosStep):
    """Needs a resource no node of a chaos run has: Ray can place no host of its pool, so its
    steps wait in their job until it is stopped. Were one to run, the step log would say so."""

    resources = {"num_gpus": 1, "widget": 1}


#: The shape of `UnplaceableChaosStep`'s pool, as pool host names spell it.
UNPLACEABLE_SHAPE = "num_gpus=1,widget=1"


def _actor() -> str:
    try:
        return ray.get_runtime_context().get_actor_name() or ""
    except Exception:  # outside Ray
        return ""


def _batch_result(item: ChaosItem, context: cr.StepContext, run: str) -> cr.StepResult:
    ending = planned_ending(item, context.attempt)
    _event(item, context, "end", run, result=ending)
    if ending == "fail":
        return cr.StepResult.failed(f"chaos step {item.n} fails at attempt {context.attempt}")
    return succeeded(item, context)


#: Step types by the name a plan gives them.
STEP_TYPES: dict[str, type[cr.JobStep[ChaosItem]]] = {
    "async": ChaosStep,
    "sync": SyncChaosStep,
    "dedicated": DedicatedChaosStep,
    "pool": PoolChaosStep,
    "pool2": PoolChaosStep2,
    "unplaceable": UnplaceableChaosStep,
}
#: The kinds of step that run on a pool.
POOL_KINDS = ("pool", "pool2", "unplaceable")


class ChaosStepPlan(BaseModel):
    kind: Literal["async", "sync", "dedicated", "pool", "pool2", "unplaceable"]
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

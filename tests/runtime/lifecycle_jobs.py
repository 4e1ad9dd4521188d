"""Job and step types of the lifecycle tests (retries, stop, resume, remove, the watchdog).

Ray workers import them by path, so they live at module level. Steps and hooks run in other
processes of this machine; they leave traces (`tests.support.trace`, one file per kind of
event, each event with its time `at`) and read flags in a directory per job, `TRACES / job_id`,
which the tests read and write.
"""

from __future__ import annotations

import asyncio
import tempfile
import time
from pathlib import Path
from typing import Any

from pydantic import BaseModel

import choreography_ray as cr
from tests.support import read_trace, trace

#: Where jobs leave their traces and find their flags: one directory per job id.
TRACES = Path(tempfile.gettempdir()) / "choreography-lifecycle-tests"
#: How long a blocked step waits for its flag before it gives up, in seconds.
BLOCK_LIMIT = 60.0


def job_dir(job_id: str) -> Path:
    path = TRACES / job_id
    path.mkdir(parents=True, exist_ok=True)
    return path


def record(job_id: str, name: str, **fields: object) -> None:
    """Appends an event to the trace `name` of the job, with the time it happened as `at`."""
    trace(job_dir(job_id) / name, at=time.time(), **fields)


def read(job_id: str, name: str) -> list[dict[str, Any]]:
    """The events of the trace `name` of the job, in the order written."""
    return read_trace(TRACES / job_id / name)


def is_set(job_id: str, flag: str) -> bool:
    return (TRACES / job_id / f"flag-{flag}").exists()


def set_flag(job_id: str, flag: str) -> None:
    (job_dir(job_id) / f"flag-{flag}").touch()


def clear_flag(job_id: str, flag: str) -> None:
    (TRACES / job_id / f"flag-{flag}").unlink(missing_ok=True)


async def flag_set(job_id: str, flag: str) -> None:
    """Returns once the flag is set (a test sets it from another process), or after
    `BLOCK_LIMIT` seconds."""
    deadline = time.monotonic() + BLOCK_LIMIT
    while time.monotonic() < deadline:
        if is_set(job_id, flag):
            return
        await asyncio.sleep(0.05)


# -- steps ----------------------------------------------------------------------------------------


class Work(BaseModel):
    n: int
    stage: int = 0
    #: The first `fail_attempts` attempts fail with "attempt {attempt} failed".
    fail_attempts: int = 0
    #: Every attempt fails, with `message` (and the attempt number).
    always_fail: bool = False
    message: str = "failed"
    #: Every attempt raises `RuntimeError("raised at attempt {attempt}")`.
    raise_error: bool = False
    #: Fails until the job's flag "fixed" is set.
    fail_until_fixed: bool = False
    #: Waits for the job's flag "go"; a stop or removal ends the wait (the step then stops).
    block: bool = False
    #: Waits for the job's flag "go" and ignores the stop: it ends when the flag is set.
    ignore_stop: bool = False
    #: Runs in an actor of its own (`DedicatedTracedStep`).
    dedicated: bool = False


class TracedStep(cr.JobStep[Work]):
    """Traces "starts" (step_id, attempt, n) when it starts and "ends" (step_id, attempt, n,
    outcome) when it ends."""

    async def perform(self, request: Work, context: cr.StepContext) -> cr.StepResult:
        job_id, step_id, attempt = context.job_id, context.step_id, context.attempt
        record(job_id, "starts", step_id=step_id, attempt=attempt, n=request.n)
        await asyncio.sleep(0)
        if request.block:
            stop = asyncio.ensure_future(context.cancelled())
            try:
                deadline = time.monotonic() + BLOCK_LIMIT
                while not is_set(job_id, "go") and time.monotonic() < deadline:
                    await asyncio.wait([stop], timeout=0.05)
                    if stop.done():
                        record(
                            job_id,
                            "ends",
                            step_id=step_id,
                            attempt=attempt,
                            n=request.n,
                            outcome="stopped",
                        )
                        raise asyncio.CancelledError  # honour the stop
            finally:
                stop.cancel()
        if request.ignore_stop:
            await flag_set(job_id, "go")
        if request.raise_error:
            record(job_id, "ends", step_id=step_id, attempt=attempt, n=request.n, outcome="raised")
            raise RuntimeError(f"raised at attempt {attempt}")
        result = self.result(request, job_id, attempt)
        outcome = "succeeded" if result.success else "failed"
        record(job_id, "ends", step_id=step_id, attempt=attempt, n=request.n, outcome=outcome)
        return result

    @staticmethod
    def result(request: Work, job_id: str, attempt: int) -> cr.StepResult:
        if request.always_fail:
            return cr.StepResult.failed(f"{request.message} attempt {attempt}")
        if attempt <= request.fail_attempts:
            return cr.StepResult.failed(f"attempt {attempt} failed")
        if request.fail_until_fixed and not is_set(job_id, "fixed"):
            return cr.StepResult.failed(f"not fixed at attempt {attempt}")
        return cr.StepResult.succeeded()


class DedicatedTracedStep(TracedStep):
    dedicated = True


def step_type(work: Work) -> type[TracedStep]:
    return DedicatedTracedStep if work.dedicated else TracedStep


# -- jobs -----------------------------------------------------------------------------------------


class Plan(BaseModel):
    steps: list[Work]


class Traced(cr.Job[Plan]):
    """Runs `TracedStep`s, one per `Work`, and traces every hook it runs."""

    def prepare_steps(self, request: Plan) -> list[cr.StepSpec]:
        return [self.create_step(step_type(work), work, stage=work.stage) for work in request.steps]

    async def on_before_resuming_job_steps(self) -> None:
        record(self.job_id, "on_before_resuming_job_steps")

    async def on_stopped(self) -> None:
        record(self.job_id, "on_stopped")

    async def on_completed(self) -> None:
        record(self.job_id, "on_completed")


class Windowed(Traced):
    """Two steps at a time: the others stay prepared in storage."""

    max_active_steps = 2


class Retryable(Traced):
    can_retry_failed_steps = True


class Picky(Traced):
    """Retries a timeout, never a rejected input."""

    def should_retry_step(self, step_id: str, result: cr.StepResult, attempt: int) -> bool:
        record(
            self.job_id,
            "should_retry_step",
            step_id=step_id,
            attempt=attempt,
            message=result.message or "",
        )
        return "rejected" not in (result.message or "")


class StopHookFailsTwice(Traced):
    """`on_stopped` throws the first two times it runs."""

    async def on_stopped(self) -> None:
        record(self.job_id, "on_stopped")
        if len(read(self.job_id, "on_stopped")) <= 2:
            raise RuntimeError("on_stopped failed on purpose")


class StopHookFailsWhileFlagged(Traced):
    """`on_stopped` throws while the job's flag "hook-fails" is set."""

    async def on_stopped(self) -> None:
        record(self.job_id, "on_stopped")
        if is_set(self.job_id, "hook-fails"):
            raise RuntimeError("on_stopped failed on purpose")


class ResumeHookFails(Traced):
    """`on_before_resuming_job_steps` throws the first `FAILURES` times it runs."""

    FAILURES = 5

    async def on_before_resuming_job_steps(self) -> None:
        record(self.job_id, "on_before_resuming_job_steps")
        if len(read(self.job_id, "on_before_resuming_job_steps")) <= self.FAILURES:
            raise RuntimeError("on_before_resuming_job_steps failed on purpose")


class AdmittedOnFlag(Traced):
    """Admission is refused until the job's flag "admit" is set; each question is traced."""

    async def admit_stage(self, stage: int) -> bool:
        record(self.job_id, "admit_stage", stage=stage)
        return is_set(self.job_id, "admit")


class AdmittedOnFlagStopHookFailsTwice(AdmittedOnFlag, StopHookFailsTwice):
    pass


class AdmittedOnFlagStopHookFailsWhileFlagged(AdmittedOnFlag, StopHookFailsWhileFlagged):
    pass


class AdmissionWaits(Traced):
    """Admission answers once the job's flag "admit" is set: until then the job is still
    `STARTING_STEPS` with its plan saved."""

    async def admit_stage(self, stage: int) -> bool:
        record(self.job_id, "admit_stage", stage=stage)
        await flag_set(self.job_id, "admit")
        return True


class ResumeHookFailsOnce(ResumeHookFails):
    FAILURES = 1

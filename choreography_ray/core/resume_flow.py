"""Resume, recover and RetryFailedSteps: a resume recounts from storage under the fence, saves
RUNNING, adopts steps still running on live hosts, and starts the others once
`on_before_resuming_job_steps` succeeded; recovery (what rehydration does) resumes a job or
finishes its stop, never both; RetryFailedSteps runs a job's failed steps again.

A flow of an activation (`activation.Activation`): functions that never take a turn themselves.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Collection
from typing import TYPE_CHECKING

from choreography_ray.core import (
    host_watch,
    job_record,
    plan_writer,
    resuming,
    stage_flow,
    stop_flow,
)
from choreography_ray.core.messages import StepStart
from choreography_ray.core.mode import Act, Mode, Op, act
from choreography_ray.core.planning import Feed
from choreography_ray.core.resuming import Recover, Resume
from choreography_ray.core.stages import stored_among, stored_running
from choreography_ray.errors import (
    CannotResumeJobError,
    JobOperationError,
    ResumeJobError,
    RetryFailedStepsError,
)
from choreography_ray.logs import get_logger
from choreography_ray.model import StatusChange, StepState
from choreography_ray.status import FAILED_STEP, JobStatus, StepStatus
from choreography_ray.storage import PAGE, StepUpdate, step_pages

if TYPE_CHECKING:
    from choreography_ray.core.activation import Activation

log = get_logger(__name__)


async def recover(a: Activation) -> None:
    """What rehydration does to this job: resume it, or finish its stop; never both. A removed
    job has nothing left to recover; a stop whose `on_stopped` ran here owes only its save."""
    match act(Op.RECOVER, a.mode, a.job_id, a.job_state.status):
        case Act.FINISH_STOP:
            await stop_flow.finish_stop(a)
        case Act.RUN:
            action = resuming.recover_action(a.job_state)
            if action is Recover.FINISH_STOP:
                await stop_flow.tell_stop_again(a)
            elif action is Recover.RESUME:
                await _resume(a, explicit=False)


async def resume(a: Activation, explicit: bool) -> None:
    """ResumeJob (and the watchdog's resume of an interrupted startup): nothing for a job
    this activation drives already or whose outcome is decided (`mode.OPERATIONS`)."""
    if act(Op.RESUME, a.mode, a.job_id, a.job_state.status) is Act.RUN:
        await _resume(a, explicit)


async def _resume(a: Activation, explicit: bool) -> None:
    """The counts are rebuilt from storage under the fence, RUNNING is saved, steps still
    running on a live host are adopted, and the others start once
    `on_before_resuming_job_steps` succeeded."""
    state = a.job_state
    action = resuming.resume_action(state, explicit)
    if action is Resume.NOTHING:
        return
    if action is Resume.MISSING_PLAN:
        message = "the job was interrupted before its step plan was stored"
        # A plan cut short while it was written is no plan: its records go, never run.
        await plan_writer.clear_partial_plan(a)
        if state.status is not JobStatus.FAILED:
            await stage_flow.finish_with(
                a, JobStatus.FAILED, message, str(CannotResumeJobError.MISSING_STEP_PLAN)
            )
        raise JobOperationError(CannotResumeJobError.MISSING_STEP_PLAN, message)
    # R43: a stopped job whose explicit resume's hook throws is stopped again.
    stopped = explicit and state.status is JobStatus.STOPPED
    # Every read before the first change: a failed read leaves the activation as it was.
    async with host_watch.fenced(a) as host_of:
        counts = await a.storage.count_by_status(a.job_id)
        running = await stored_running(a.storage, a.job_id, state.stage, host_of)
        counted = a.counting.stopped
        stored = await stored_among(a.storage, a.job_id, state.stage, counted) if counted else set()
    # The counts the resume saves; the activation goes back to them when the save fails.
    stages, counting = copy.deepcopy(a.stages), copy.deepcopy(a.counting)
    a.stages.recount(counts)
    # A stop counted for a step that has since reached its outcome (a take-back lost with
    # an activation before it was saved) is taken back now.
    for step_id in [s for s in a.counting.stopped if s not in stored]:
        a.counting.take_back_stop(step_id)
    resuming.rebase_stops(a.stages, len(a.counting.stopped), state.stage)
    a.counting.records = True
    try:
        await job_record.set_status(
            a, JobStatus.RUNNING, records_counted_steps=True, stop_finalized=False
        )
    except Exception:
        # Nothing of the resume applies: steps still winding down stay active here.
        a.stages, a.counting = stages, counting
        raise
    a.window.clear()
    # Steps still running on a live host are this activation's again before the hook runs:
    # their reports count (the fence kept their outcomes out of the recount), and a stop
    # while the hook is owed reaches them.
    # The others start once the resume hook succeeded; until then they are the stage's
    # never-started steps (a stop counts them as stopped).
    a.window.hold(state.stage, stage_flow.adopt(a, running, host_of))
    a.feed = Feed(state.stage, skip={row.step_id for row in running})
    a.enter(Mode.RUNNING)
    await run_resume_hook(a, stop_on_failure=stopped)


async def run_resume_hook(a: Activation, stop_on_failure: bool = False) -> None:
    """`on_before_resuming_job_steps`, then the stage's steps start. When it throws, the job
    stays RUNNING and the watchdog asks again with backoff; an explicit resume of a stopped job
    (`stop_on_failure`) is stopped again instead, and the resume answers the hook's error."""
    try:
        await a.loaded_job.on_before_resuming_job_steps()
    except Exception as error:
        log.warning("job %s: on_before_resuming_job_steps failed: %s", a.job_id, error)
        a.enter(Mode.HOOK_OWED)
        a.hook_backoff.failed()
        if stop_on_failure:
            await stop_again(a, error)
        return
    a.enter(Mode.RUNNING)
    a.hook_backoff.succeeded()
    stage = a.job_state.stage
    if stage not in a.stages.counters:
        stage = a.stages.first()
    await stage_flow.begin_stage(a, stage)
    a.kick()


async def stop_again(a: Activation, error: Exception) -> None:
    """R43 (docs/decisions.md): "A job reverted to `Stopped` ... is never resumed by the
    watchdog." The job is stopped as a stop would (its adopted steps told, the others counted
    stopped), and the resume raises. When STOPPED cannot be saved, the job stays RUNNING with
    its hook owed (HOOK_OWED: the watchdog asks again), and the resume raises all the same."""
    message = f"on_before_resuming_job_steps of job {a.job_id} failed: {error}"
    try:
        await job_record.set_status(a, JobStatus.STOPPED, stop_finalized=False)
    except Exception as save_error:
        log.warning("job %s: saving it stopped again after its resume hook failed failed (the "
                    "watchdog asks the hook again): %s", a.job_id, save_error)  # fmt: skip
        raise JobOperationError(ResumeJobError.UNKNOWN, message) from error
    await stop_flow.halt_and_tell(a, removing=False)
    message += "; the job is stopped again"
    raise JobOperationError(ResumeJobError.UNKNOWN, message) from error


async def retry_failed(
    a: Activation, signature: str | None = None, step_ids: Collection[str] | None = None
) -> int:
    """RetryFailedSteps: a job completed with failures runs its failed steps again (those of
    `signature`, those among `step_ids`, or all), each as its next attempt; returns how many.
    In a job of stages the job goes back to the first stage a retried step is in and runs the
    stages from there as it would: each runs its retried steps (and the steps a barrier left
    UNREACHABLE, which are scheduled again), and a stage whose steps all reached an outcome
    before is not run again (docs/decisions.md)."""
    state = a.job_state
    resuming.check_retry_failed(a.loaded_job, state)
    act(Op.RETRY_FAILED, a.mode, a.job_id, state.status)
    failed = [
        StepStart(s.step_id, s.type, s.stage, s.attempt + 1, json.dumps(s.request))
        for s in await selected_failures(a, signature, step_ids)
    ]
    if not failed:
        return 0
    stage = min(start.stage for start in failed)
    unreachable = [
        s
        async for page in step_pages(a.storage, a.job_id, statuses=(StepStatus.UNREACHABLE,))
        for s in page
        if s.stage > stage
    ]
    # Retrying a counted failure removes its failed count, scheduling an unreachable step its
    # unreachable count: the counts change with the RUNNING save, and go back when it fails.
    stages = copy.deepcopy(a.stages)
    for start in failed:
        a.stages[start.stage].failed -= 1
    for step in unreachable:
        a.stages[step.stage].unreachable -= 1
    try:
        await job_record.set_status(a, JobStatus.RUNNING, records_counted_steps=True, stage=stage)
    except Exception as error:
        a.stages = stages
        raise JobOperationError(RetryFailedStepsError.COULD_NOT_PERSIST, str(error)) from error
    a.counting.records = True
    for start in failed:
        a.counting.uncount_outcome(start.step_id)
    scheduled = StatusChange(status=StepStatus.SCHEDULED)
    try:
        # Durable before they run: a lost activation resumes them as scheduled.
        await a.counting.flush(a.storage, a.job_id)
        await a.storage.update_steps(
            [
                *(StepUpdate(a.job_id, s.step_id, StepStatus.SCHEDULED, s.attempt, None, scheduled)
                  for s in failed),
                *(StepUpdate(a.job_id, s.step_id, StepStatus.SCHEDULED, s.attempt)
                  for s in unreachable),
            ]
        )  # fmt: skip
    except Exception as error:
        # The job is RUNNING with its failed steps stored as failed: the pump recounts
        # from storage and completes it again.
        a.enter(Mode.RUNNING)
        a.kick()
        raise JobOperationError(RetryFailedStepsError.COULD_NOT_PERSIST, str(error)) from error
    # Storage drives the stages from here, as after a resume: each reads its steps without an
    # outcome, which are the retried ones and those scheduled again.
    a.window.clear()
    a.feed = None
    a.enter(Mode.RUNNING)
    try:
        await stage_flow.begin_stage(a, stage)
    except Exception as error:  # they are stored SCHEDULED: the watchdog starts them
        log.warning("job %s: beginning stage %s of RetryFailedSteps failed: %s; the watchdog "
                    "starts its steps", a.job_id, stage, error)  # fmt: skip
    a.kick()
    return len(failed)


async def selected_failures(
    a: Activation, signature: str | None, step_ids: Collection[str] | None
) -> list[StepState]:
    """The job's failed steps RetryFailedSteps runs: among `step_ids`, of `signature`, or all."""
    if step_ids is not None:
        found = await a.storage.get_steps(a.job_id, set(step_ids))
        steps = sorted(found.values(), key=lambda s: s.step_id)
    elif signature is not None:
        steps, after = [], None
        while page := await a.storage.list_failed(a.job_id, signature, after=after, limit=PAGE):
            steps += page
            after = page[-1].step_id
    else:
        return [s async for page in step_pages(a.storage, a.job_id, statuses=FAILED_STEP)
                for s in page]  # fmt: skip
    return [
        s for s in steps
        if s.status in FAILED_STEP and signature in (None, s.failure_signature)
    ]  # fmt: skip

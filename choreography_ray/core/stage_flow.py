"""Stages: start's first stage and its answer, `admit_stage`, a stage's steps read (or adopted
from the hosts) and queued, the move to the next stage or to the job's outcome, and the save of
an outcome decided (`on_completed` ran) but not saved yet.

A flow of an activation (`activation.Activation`): functions that never take a turn themselves.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from choreography_ray.core import dispatch, job_record, stopping
from choreography_ray.core.cleanup import keeps_records
from choreography_ray.core.messages import StepStart, describe
from choreography_ray.core.mode import Mode
from choreography_ray.core.planning import FEED_STATUSES, Feed, to_start
from choreography_ray.core.stages import after_stage, mark_unreachable, stored_running
from choreography_ray.core.watchdog import stage_done_in_storage
from choreography_ray.core.window import RunState
from choreography_ray.errors import StartJobError
from choreography_ray.logs import get_logger
from choreography_ray.status import JobStatus
from choreography_ray.storage import StoredStart

if TYPE_CHECKING:
    from choreography_ray.core.activation import Activation

log = get_logger(__name__)


async def begin_first_stage(a: Activation) -> list[asyncio.Future[bool]] | None:
    """Start's second turn: the job runs, and its first stage begins. Returns the first wave
    of start operations, or None when a stop or removal came while it prepared."""
    if a.job_state.status is not JobStatus.PREPARING_STEPS or a.mode is not Mode.PREPARING:
        return None
    try:
        await job_record.set_status(a, JobStatus.STARTING_STEPS)
        a.enter(Mode.RUNNING)
        return await begin_stage(a, a.stages.first(), first_run=True)
    except Exception:
        # The plan is stored: the watchdog (or a rehydration) finishes startup.
        if a.live:
            a.enter(Mode.IDLE)
        raise


async def first_wave_answered(a: Activation, answers: list[bool]) -> StartJobError | None:
    """Start's last turn: RUNNING is saved, and the answer to start is what became of the first
    stage's starts."""
    if a.job_state.status is JobStatus.STARTING_STEPS:
        try:
            await job_record.set_status(a, JobStatus.RUNNING)
        except Exception:
            # Its steps run, driven here (a failure with attempts left is retried): the save
            # is owed, saved again by the pump on the "running" timer.
            a.timers.arm("running")
            raise
        await _first_stage_checked(a)
    a.kick()
    return start_error(a, answers)


async def save_running(a: Activation) -> None:
    """The RUNNING save that start's last turn owes (it failed), again; on a failure, again
    after the timer's backoff."""
    if a.job_state.status is not JobStatus.STARTING_STEPS:
        return
    try:
        await job_record.set_status(a, JobStatus.RUNNING)
    except Exception as error:
        log.warning("job %s: saving RUNNING failed again (%s); again soon", a.job_id, error)
        a.timers.arm("running")
        return
    a.timers.clear("running")
    await _first_stage_checked(a)


async def _first_stage_checked(a: Activation) -> None:
    try:
        # A first stage whose steps all failed to start is done: on to the next.
        await check_stage(a)
    except Exception:
        log.exception("job %s: moving past its first stage failed", a.job_id)


def start_error(a: Activation, answers: list[bool]) -> StartJobError | None:
    """The first stage's start error: no step of it started, or some did not."""
    if a.first_stage_failed == 0 and all(answers):
        return None
    if any(answers):
        return StartJobError.FAILED_STARTING_SOME_JOB_STEPS
    first = a.stages.first()
    moved_on = a.job_state.stage != first and not a.job_state.status.is_terminal
    # A first stage that continues on failure while a later stage starts: the job runs.
    return (
        StartJobError.FAILED_STARTING_SOME_JOB_STEPS
        if moved_on
        else StartJobError.FAILED_STARTING_ALL_JOB_STEPS
    )


async def begin_stage(
    a: Activation, stage: int, first_run: bool = False
) -> list[asyncio.Future[bool]]:
    """Asks admission, then starts the stage's steps. Returns the futures of the first
    wave of start operations when `first_run` (what `start` waits for)."""
    if not a.stages.counters:
        await complete(a)
        return []
    try:
        admitted = await a.loaded_job.admit_stage(stage)
    except Exception as error:
        log.warning("job %s: admit_stage(%s) failed: %s; asking again", a.job_id, stage, error)
        a.timers.arm("admission")
        admitted = False
    if not admitted:
        a.admission_stage = stage
        a.enter(Mode.AWAITING_ADMISSION)
        return []
    a.enter(Mode.RUNNING)
    a.timers.clear("admission")
    counter = a.stages[stage]
    # Stored now: an activation lost before the next periodic save must find the stage
    # the job had reached, or it would adopt (and stop) the steps of the one before. A
    # failed save leaves the stage unstarted, so the pump's retry begins it again.
    was_started, counter.is_started = counter.is_started, True
    try:
        await job_record.save(a, stage=stage)
    except Exception:
        counter.is_started = was_started
        raise
    starts = a.window.release(stage)
    feed = a.feed
    if starts is None and feed is not None and feed.stage == stage:
        # A first run's feed: nothing is stored running. Its steps in memory enter the window
        # a page at a time, unless a type of theirs does not load (they fail at once, below).
        bad = dispatch.unloadable(a, {record.type for record in feed.ahead})
        starts = feed.take_ahead(len(feed.ahead)) if bad else []
    elif starts is None:
        starts = await adopt_stage(a, stage)
    # Steps whose type cannot be loaded fail to start, the whole stage at once: what
    # `start` answers covers the first stage, not only its first wave.
    starts, cannot = dispatch.startable(a, starts)
    if cannot:
        await dispatch.cannot_start(a, cannot)
    a.window.queue(starts)
    if first_run:
        a.first_stage_failed = len(cannot)
        return await dispatch.fill(a)
    if not starts and not a.window.in_flight() and counter.is_completed:
        await stage_done(a, stage)
    return []


async def adopt_stage(
    a: Activation, stage: int, host_of: dict[str, str] | None = None
) -> list[StepStart]:
    """The stage's steps stored running: those still running on a live host (`host_of`,
    else asked now) become active here again instead of being started twice; returns the
    others, to start first. The rest of the stage's unfinished steps come from the feed,
    from the top."""
    # Hosts first, storage after: a step that finishes between the two reads is then either
    # adopted and stored as finished (so left alone), never read running and found idle.
    if host_of is None:
        host_of = await a.hosts.running(a.job_id, epoch=a.epoch)
    running = await stored_running(a.storage, a.job_id, stage, host_of)
    a.feed = Feed(stage, skip={row.step_id for row in running})
    return adopt(a, running, host_of)


def adopt(a: Activation, rows: list[StoredStart], host_of: dict[str, str]) -> list[StepStart]:
    """A stopped step runs again as its next attempt, so a stop report of the run it
    replaces, delivered again, cannot pass for the new run's outcome."""
    rest: list[StepStart] = []
    for row in rows:
        host = host_of.get(row.step_id)
        if host is not None:
            start = StepStart(row.step_id, row.type, row.stage, max(1, row.attempt),
                              row.request_json)  # fmt: skip
            a.window.adopt(start, host)
            a.watch(host, a.hosts.known_incarnation(host))
        else:
            rest.append(to_start(row))
    return rest


async def refill(a: Activation) -> None:
    """The running stage's next page of steps, once few wait to start; none before the stage
    begins (its admission is asked first)."""
    feed = a.feed
    if feed is None or feed.empty or a.window.count(RunState.QUEUED) >= a.page:
        return
    counter = a.stages.counters.get(feed.stage)
    if feed.stage != a.job_state.stage or counter is None or not counter.is_started:
        return
    starts, cannot = dispatch.startable(a, await next_page(a, feed))
    a.window.queue(starts)
    if cannot:
        await dispatch.cannot_start(a, cannot)


async def next_page(a: Activation, feed: Feed) -> list[StepStart]:
    """The feed's next page: its steps kept in memory first, then storage's."""
    if feed.ahead:
        return feed.take_ahead(a.page)
    page = await a.storage.list_starts(
        a.job_id, statuses=FEED_STATUSES, stage=feed.stage, after=feed.after,
        limit=a.page,
    )  # fmt: skip
    return feed.take(page, a.page)


async def stage_done(a: Activation, stage: int) -> None:
    if a.job_state.stage != stage or a.job_state.status is not JobStatus.RUNNING:
        return  # another turn moved on already
    after = after_stage(a.stages, stage, a.loaded_job)
    if after.unreachable:
        for later in after.unreachable:
            if skipped := a.window.release(later):
                a.window.forget(start.step_id for start in skipped)
        await mark_unreachable(a.storage, a.job_id, a.stages, after.unreachable)
    if after.next_stage is not None:
        await begin_stage(a, after.next_stage)
        a.kick()
        return
    await complete(a)


async def complete(a: Activation) -> None:
    if a.job_state.status.is_terminal or not a.live:
        return  # its outcome is decided (or saved) already
    status = (
        JobStatus.COMPLETED_WITH_FAILURES
        if a.stages.progress().has_failures
        else JobStatus.COMPLETED_SUCCESSFULLY
    )
    try:
        await a.loaded_job.on_completed()
    except Exception as error:
        await fail(a, error)
        return
    await finish_with(a, status)


async def fail(a: Activation, error: BaseException) -> None:
    """A job hook threw: the job is FAILED with the message, and its actor exits."""
    await finish_with(a, JobStatus.FAILED, describe(error))


async def finish_with(
    a: Activation, status: JobStatus, message: str | None = None, error: str | None = None
) -> None:
    """Saves a terminal status (`error`, else `message`, as the job's error); if the save
    fails, the pump saves it before anything else, and the hooks do not run again."""
    a.owed = (status, message, error or message)
    a.enter(Mode.OWES_STATUS)
    await save_owed(a)


async def save_owed(a: Activation) -> None:
    assert a.owed is not None
    status, message, error = a.owed
    messages = () if message is None else (message,)
    await job_record.set_status(a, status, *messages, error=error)
    a.owed = None
    job = a.job
    keeps = job is None or a.job_state.held or keeps_records(type(job), status)
    a.enter(Mode.AT_REST if keeps or not await drop_records(a) else Mode.REMOVED)


async def drop_records(a: Activation) -> bool:
    """A completed job whose type does not keep its records drops them, in the turn that
    saved its outcome (so nothing of this activation writes them again). A drop that fails
    leaves them to the cleanup pass's retention."""
    try:
        await stopping.remove_records(a.storage, a.job_id)
    except Exception as error:
        log.warning("job %s: dropping its records (its type does not keep them) failed: "
                    "%s; terminal_job_retention removes them", a.job_id, error)  # fmt: skip
        return False
    log.info("job %s: %s, its records dropped (not kept)", a.job_id, a.job_state.status)
    return True


async def check_stage(a: Activation) -> None:
    stage = a.job_state.stage
    if not idle(a):
        return
    if not a.stages[stage].is_completed:
        # Nothing runs, yet the counters miss outcomes (reports refused while the job was
        # reactivating, or lost): storage decides, now rather than at the next tick.
        if not await stage_done_in_storage(a.storage, a.job_id, stage):
            return
        a.stages.recount(await a.storage.count_by_status(a.job_id))
    await stage_done(a, stage)


def idle(a: Activation) -> bool:
    """No step of the running stage is active, waiting to start, or waiting to retry."""
    return (
        not a.window.runs and a.awaiting_admission is None
        and a.job_state.stage in a.stages.counters and fed(a)
    )  # fmt: skip


def fed(a: Activation) -> bool:
    """The feed has no more steps of the running stage to read."""
    feed = a.feed
    return feed is None or feed.empty or feed.stage != a.job_state.stage


async def restart_orphans(a: Activation, stage: int) -> None:
    """Nothing runs here, yet storage holds unfinished steps of the stage (an answer or a
    report was lost across a reactivation): those running nowhere start again."""
    a.window.queue(await adopt_stage(a, stage))
    await refill(a)
    if a.window.count(RunState.QUEUED):
        log.warning(
            "job %s: unfinished steps of stage %s run nowhere; starting them (%d read so far)",
            a.job_id,
            stage,
            a.window.count(RunState.QUEUED),
        )

"""StopJob and RemoveJob: the status is saved first, the steps are told, steps that will never
report (never started, a gone host's) are counted or stored STOPPED, and the stop is final
(`on_stopped`, then the final save or the records' removal) once every step has reported.
A stop an earlier activation left is finished from storage (`tell_stop_again`).

A flow of an activation (`activation.Activation`): functions that never take a turn themselves.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from choreography_ray.core import host_watch, job_record, settling, stage_flow, stopping
from choreography_ray.core.messages import StepStart
from choreography_ray.core.mode import STOPPING, Act, Mode, Op, act
from choreography_ray.core.stages import stored_running
from choreography_ray.core.watchdog import stored_outcome
from choreography_ray.core.window import RUNNING, WAITING, RunState
from choreography_ray.errors import JobOperationError, RemoveJobError, StopJobError
from choreography_ray.logs import get_logger
from choreography_ray.status import JobStatus, StepStatus

if TYPE_CHECKING:
    from choreography_ray.core.activation import Activation

log = get_logger(__name__)


async def stop(a: Activation) -> None:
    """StopJob: STOPPED is saved first; then the steps are told, and the stop is final once
    each has reported it."""
    action = act(Op.STOP, a.mode, a.job_id, a.job_state.status)
    stopping.refuse_stop(a.job_state)
    try:
        await job_record.set_status(a, JobStatus.STOPPED, stop_finalized=False)
    except Exception as error:
        raise JobOperationError(StopJobError.COULD_NOT_PERSIST_STOP, str(error)) from error
    await (carry_on(a) if action is Act.FROM_STORAGE else halt_and_tell(a, removing=False))


async def remove(a: Activation) -> None:
    """RemoveJob: as a stop, with REMOVING saved first; once every step has reported, the
    job's records are removed."""
    action = act(Op.REMOVE, a.mode, a.job_id, a.job_state.status)
    if action is Act.SAVE_OWED_FIRST:
        try:
            await stage_flow.save_owed(a)
        except Exception as error:
            raise JobOperationError(RemoveJobError.UNKNOWN, str(error)) from error
    if a.job_state.status is JobStatus.REMOVING:
        if a.window.in_flight():
            raise JobOperationError(RemoveJobError.JOB_IS_ALREADY_BEING_REMOVED)
        # A removal this activation began is finished now; one an earlier activation began
        # is carried on from storage first.
        finished = await (finish_stop(a) if a.mode in STOPPING else tell_stop_again(a))
        raise JobOperationError(
            RemoveJobError.JOB_IS_ALREADY_BEING_REMOVED if finished else RemoveJobError.UNKNOWN
        )
    try:
        await job_record.set_status(a, JobStatus.REMOVING, stop_finalized=False)
    except Exception as error:
        raise JobOperationError(RemoveJobError.UNKNOWN, str(error)) from error
    await (carry_on(a) if action is Act.FROM_STORAGE else halt_and_tell(a, removing=True))


async def carry_on(a: Activation) -> None:
    """A stop or removal (saved) of a job this activation does not drive: its window and
    counts are not the job's, so the stop is carried on from storage as one an earlier
    activation left. A failure is tried again on the finish timer (the stop is stored: the
    caller's answer stands)."""
    try:
        await tell_stop_again(a)
    except Exception as error:
        log.warning("job %s: carrying its stop on from storage failed (again soon): %s",
                    a.job_id, error)  # fmt: skip
        a.timers.arm("finish")


async def halt_and_tell(a: Activation, removing: bool) -> None:
    """The steps stop: those not started yet are counted stopped (a retry waiting, failed),
    the hosts are told, and the stop is final once every step has reported."""
    a.enter(Mode.STOPPING)
    count_never_started(a)
    try:
        a.tally.stopped += (await stop_unread(a))[0]
    except Exception as error:  # read again before the stop is final (`finish_stop`)
        log.warning("job %s: counting its unread steps as stopped failed (again before the "
                    "stop is final): %s", a.job_id, error)  # fmt: skip
    await a.hosts.cancel(a.window.hosts(), a.job_id, removing)
    try:
        await stop_lost_owners(a)
    except Exception as error:  # the next watchdog tick stores them
        log.warning("job %s: storing the stop of steps whose host is gone failed: %s",
                    a.job_id, error)  # fmt: skip
    await finish_stop_when_reported(a)


def count_never_started(a: Activation) -> None:
    """The steps that never started (held, queued, start failed, waiting for a retry) leave
    the table counted: stopped, or failed for a retry (`stopping.halt`)."""
    halted = stopping.halt(a.window, a.stages, a.counting)
    a.tally.failed += halted.failed
    a.tally.stopped += halted.stopped
    a.dirty = True


async def stop_lost_owners(a: Activation) -> None:
    """A stopping job's steps whose host the job saw go (leases on) never report: a step
    whose outcome that host stored counts it, the others are stored STOPPED."""
    lost = a.window.active(RunState.OWNER_LOST)
    if not lost:
        return
    await settling.settle_stored(a, lost)
    await settling.store_stops(
        a, [start for start, _host in a.window.active(RunState.OWNER_LOST).values()]
    )


async def tell_stop_again(a: Activation) -> bool:
    """Finishes a stop left by an earlier activation: steps that never recorded their stop
    are told again; steps of stages never started are left alone. False when finishing
    failed."""
    removing = a.job_state.status is JobStatus.REMOVING
    stage = a.job_state.stage
    # Every read before the stop's mode: a read that fails leaves an idle activation idle,
    # the stop owed (the watchdog tells it again from the top). Progress from storage; a step
    # of the stage with no outcome that runs nowhere has stopped, and one still running
    # counts when it reports.
    async with host_watch.fenced(a) as host_of:
        not_running = await stage_flow.adopt_stage(a, stage, host_of)
        a.stages.recount(await a.storage.count_by_status(a.job_id))
        # Entries this activation had before (a stop it made) may have stored outcomes.
        await settling.forget_stored_outcomes(a, stage)
    for start in not_running:
        if a.counting.count_stop(start.step_id):
            a.tally.stopped += 1
    counted, read = await stop_unread(a)
    a.tally.stopped += counted
    a.enter(Mode.STOPPING)
    if stage in a.stages.counters:
        # Running steps whose stop an earlier execution counted stay counted: their stop
        # report is then a duplicate. Every step read here is counted stopped now.
        active = sum(s in a.counting.stopped for s in a.window.active())
        a.stages[stage].stopped = len(not_running) + read + active
    a.dirty = True
    await a.hosts.cancel(a.window.hosts(), a.job_id, removing)
    return await finish_stop_when_reported(a)


async def finish_stop_when_reported(a: Activation) -> bool:
    """Finishes the stop once every step has reported; False when finishing failed."""
    if a.mode not in STOPPING or a.window.in_flight():
        return True
    return await finish_stop(a)


async def finish_stop(a: Activation) -> bool:
    """`on_stopped` once every step has reported; a removal then clears the job. A failed
    finish is retried on one timer, 1 s doubling to 60 s."""
    removing = a.job_state.status is JobStatus.REMOVING
    try:
        await sweep_stop(a)
        # Every step is counted before the stop is final: starts that threw and steps the feed
        # has not read, whose reading failed before, are read again (a failure: on the timer).
        if a.window.failed_starts():
            await settle_failed_starts(a)
        a.tally.stopped += (await stop_unread(a))[0]
        if a.window.in_flight():
            return True  # their reports finish it
        if left := a.window.count(*WAITING):
            # Every path counts the steps it leaves waiting before this: one left is counted
            # now, as a stop counts it, rather than a stop final with a step uncounted.
            log.warning("job %s: %d steps waited uncounted as its stop became final; counted "
                        "now", a.job_id, left)  # fmt: skip
            count_never_started(a)
        await job_record.save(a)
        if a.mode is Mode.STOPPING:
            # Once per stop: a finish retried after a later part failed skips it.
            await a.loaded_job.on_stopped()
            a.enter(Mode.FINISHING_STOP)
        if removing:
            await stopping.remove_records(a.storage, a.job_id)
        else:
            await job_record.save(a, stop_finalized=True)
    except Exception as error:
        what = "removal" if removing else "stop"
        log.warning("job %s: finishing the %s failed: %s", a.job_id, what, error)
        a.timers.arm("finish")
        return False
    a.timers.clear("finish")
    a.enter(Mode.REMOVED if removing else Mode.AT_REST)
    return True


async def sweep_stop(a: Activation) -> None:
    """What a stop still waits for, checked against the hosts and storage in one fenced
    read: an active step whose outcome storage holds counts it; one that runs on no live
    host (its host died, before or after the stop) is stored STOPPED, as its host would
    have, and counted; a step storage holds RUNNING that runs nowhere is stored STOPPED
    too; one a live host runs though this activation had not told it (a start whose
    answer was lost, a dedicated actor of an earlier activation) is active again and told
    to stop. Steps whose start is unanswered wait for their answer."""
    stage = a.job_state.stage
    async with host_watch.fenced(a) as host_of:
        rows = await stored_running(a.storage, a.job_id, stage, host_of)
        await settling.settle_stored(a, settling.settleable(a, stage))
    lost = [
        start
        for step_id, (start, _host) in a.window.active(*RUNNING).items()
        if step_id not in host_of
    ]
    lost += [
        StepStart(row.step_id, row.type, row.stage, row.attempt, row.request_json)
        for row in rows
        if row.step_id not in host_of and not a.window.is_in_flight(row.step_id)
    ]
    if lost:
        await settling.store_stops(a, lost)
    before = a.window.hosts()
    stage_flow.adopt(a, [row for row in rows if not a.window.is_in_flight(row.step_id)], host_of)
    if told := a.window.hosts() - before:
        await a.hosts.cancel(told, a.job_id, a.job_state.status is JobStatus.REMOVING)


async def stop_unread(a: Activation) -> tuple[int, int]:
    """A stop counts the running stage's steps the feed has not read yet as stopped (they
    never started): (how many it counted now, how many it read)."""
    feed = a.feed
    counter = None if feed is None else a.stages.counters.get(feed.stage)
    if feed is None or counter is None or feed.stage != a.job_state.stage:
        return 0, 0
    counted = read = 0
    while not feed.empty:
        for start in await stage_flow.next_page(a, feed):
            if start.step_id in a.window.runs:
                continue
            read += 1
            if a.counting.count_stop(start.step_id):
                counter.stopped += 1
                counted += 1
    return counted, read


async def stop_failed_starts(a: Activation) -> None:
    """A stopping job's starts that threw (the stop came first) are settled, and the stop
    finishes once every step has reported; when settling them fails, the finish tries again."""
    try:
        await settle_failed_starts(a)
    except Exception as error:
        log.warning("job %s: settling the starts that threw during its stop failed: %s",
                    a.job_id, error)  # fmt: skip
        a.timers.arm("finish")
        return
    await finish_stop_when_reported(a)


async def settle_failed_starts(a: Activation) -> None:
    """A stopping job's starts that threw: a step a host has all the same is active again and
    told to stop, a step whose outcome storage holds counts it, a step storage holds RUNNING
    at that attempt ran on a host that went before it answered (stored STOPPED and counted,
    as `sweep_stop` does), and the others never ran: they count as the stop counts a step
    that never started."""
    failed = {start.step_id: start for start in a.window.failed_starts()}
    on_hosts = await a.hosts.running(a.job_id, epoch=a.epoch)  # before storage: see _adopt_stage
    unsure = [step_id for step_id in failed if step_id not in on_hosts]
    records = await a.storage.get_steps(a.job_id, unsure) if unsure else {}
    outcomes = {
        step_id: outcome
        for step_id in unsure
        if (outcome := stored_outcome(failed[step_id], records.get(step_id))) is not None
    }
    ran = [
        failed[step_id]
        for step_id in unsure
        if (record := records.get(step_id)) is not None
        and record.status is StepStatus.RUNNING
        and record.attempt == failed[step_id].attempt
    ]
    for step_id, host in on_hosts.items():
        if step_id in failed:
            a.window.adopt(failed[step_id], host)
    for step_id, outcome in outcomes.items():
        a.window.adopt(failed[step_id], "")
        settling.accept(a, outcome)
    if ran:
        await settling.store_stops(a, ran)
    count_never_started(a)
    told = {on_hosts[step_id] for step_id in failed if step_id in on_hosts}
    if told:
        removing = a.job_state.status is JobStatus.REMOVING
        await a.hosts.cancel(told, a.job_id, removing)

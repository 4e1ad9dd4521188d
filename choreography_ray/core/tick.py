"""The activation's one reconciler: a pass by mode, run by the pump at each kick and by the
watchdog at each tick (which first reads what no report or answer will tell). As Ray Serve's
controller runs one `update()`, a pass reads what it needs, then acts by mode; the pump and the
watchdog never decide with conditions of their own.

A flow of an activation (`activation.Activation`): functions that never take a turn themselves.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from choreography_ray.core import (
    dispatch,
    job_record,
    leases,
    pool_dispatch,
    resume_flow,
    settling,
    stage_flow,
    stop_flow,
    stopping,
)
from choreography_ray.core.mode import STEPPING, Act, Mode, Op, act
from choreography_ray.core.watchdog import stage_done_in_storage
from choreography_ray.core.window import RunState
from choreography_ray.status import JobStatus

if TYPE_CHECKING:
    from choreography_ray.core.activation import Activation


async def reconcile(a: Activation, look: bool) -> None:
    """One pass over what the activation owes, by mode (`mode.OPERATIONS`): every pass (a
    kick, `look` False) saves an owed terminal status first, runs a stop's finish when its timer
    is due, starts what may start and moves past a stage that ended; a watchdog tick (`look`)
    first reads what no report or answer will tell (saves whose answer was lost, lost reports,
    failed starts, expired leases, a stage storage holds done, orphans, admission, an
    interrupted startup, stop or resume hook). Idempotent: a pass that owes nothing does
    nothing, so a tick and a kick never disagree about what is owed."""
    if look:
        a.ticks += 1
    if a.state is None:
        return
    if look and a.unanswered_saves:
        await job_record.reconcile(a)
    if act(Op.RECONCILE, a.mode, a.job_id, a.job_state.status) is Act.RUN:
        await _BY_MODE[a.mode](a, look)


async def _owes_status(a: Activation, look: bool) -> None:
    """A terminal status decided and not saved: saved before anything else."""
    await stage_flow.save_owed(a)


async def _idle(a: Activation, look: bool) -> None:
    """An activation that drives nothing yet: at a tick, a startup cut short after its plan
    was stored finishes through a resume; a stop or removal stored and not carried on here (an
    earlier activation's, or one whose reads failed: then also on the finish timer) is."""
    state = a.job_state
    if look and state.status.is_preparing and state.has_plan:
        await resume_flow.resume(a, explicit=False)
    elif (look or a.timers.due("finish")) and stopping.stop_owed(state):
        await stop_flow.tell_stop_again(a)


async def _stopping(a: Activation, look: bool) -> None:
    """A stop is final once every step reported it: at a tick lost reports are settled too;
    the finish runs when its timer is due, and at a tick when no failed finish waits for it."""
    if look and a.window.in_flight():
        await settling.settle_lost_reports(a, a.job_state.stage)
        await stop_flow.stop_lost_owners(a)
    if a.timers.due("finish") or (look and not a.timers.armed("finish")):
        await stop_flow.finish_stop_when_reported(a)


async def _hook_owed(a: Activation, look: bool) -> None:
    """The resume hook failed: asked again at a tick, with backoff."""
    if look and a.hook_backoff.should_try():
        await resume_flow.run_resume_hook(a)


async def _running(a: Activation, look: bool) -> None:
    """At a tick, what storage and the hosts say first (`_look`); then, while the job still
    runs here, the timers due, the window filled and the stage's end."""
    if look:
        await _look(a)
    if a.mode not in STEPPING:
        return
    if a.job_state.status not in (JobStatus.STARTING_STEPS, JobStatus.RUNNING):
        return
    if a.timers.due("running"):
        await stage_flow.save_running(a)
    if a.timers.due("starts"):
        await dispatch.retry_failed_starts(a)
    if a.timers.due("admission") and a.mode is Mode.AWAITING_ADMISSION:
        await stage_flow.begin_stage(a, a.admission_stage)
    if a.timers.due("pools"):
        await pool_dispatch.sync(a)
    a.timers.due("retries")  # re-armed below for the next one
    a.window.retry_due()
    if (due_in := a.window.next_due_in()) is not None:
        a.timers.arm("retries", due_in)
    await dispatch.fill(a)
    if a.job_state.status is JobStatus.RUNNING:
        await stage_flow.check_stage(a)


async def _look(a: Activation) -> None:
    """Lost reports are settled, failed starts retried, expired leases restarted, admission
    asked again, and a stage that storage holds done moves on. Start's RUNNING save, when
    owed, is saved first."""
    if a.timers.armed("running"):
        await stage_flow.save_running(a)
    if a.job_state.status is not JobStatus.RUNNING:
        return
    stage = a.job_state.stage
    if stage_flow.idle(a) and await stage_done_in_storage(a.storage, a.job_id, stage):
        # Every step of the stage is done in storage: recount from storage and move on (the
        # recount reads every record of the job, so only then).
        a.stages.recount(await a.storage.count_by_status(a.job_id))
        await stage_flow.stage_done(a, stage)
        return
    await settling.settle_lost_reports(a, stage)
    await dispatch.retry_failed_starts(a)
    lease = a.options.lease_seconds
    if lease is not None:
        # The spec's override point: the job type says which owners are alive.
        silos = await asyncio.to_thread(a.loaded_job.get_active_silos)
        # A step whose start is unanswered has, in storage, the record of its last run.
        stale = await leases.expired(
            a.storage,
            a.hosts,
            silos,
            a.job_id,
            stage,
            settling.settleable(a, stage),
            lease,
            a.window.active(RunState.OWNER_LOST).keys(),
        )
        a.tally.restarted_by_lease += len(stale)
        a.window.queue(stale, front=True)
    if a.mode is Mode.AWAITING_ADMISSION:
        await stage_flow.begin_stage(a, a.admission_stage)
    elif stage_flow.idle(a):
        await stage_flow.restart_orphans(a, stage)
    await a.hosts.refresh()


#: What a pass does in each mode it runs in.
_BY_MODE = {
    Mode.IDLE: _idle,
    Mode.RUNNING: _running,
    Mode.AWAITING_ADMISSION: _running,
    Mode.HOOK_OWED: _hook_owed,
    Mode.STOPPING: _stopping,
    Mode.FINISHING_STOP: _stopping,
    Mode.OWES_STATUS: _owes_status,
}

"""Start operations: queued steps are handed to hosts in batches while the window and the
throttle allow; a step whose type cannot be loaded fails to start; a start's answer comes back
as a turn (`JobCore.send`) and is applied here; a start that threw is sent back to the host that
has it, counted from its stored outcome, or started again.

A flow of an activation (`activation.Activation`): functions that never take a turn themselves.
"""

from __future__ import annotations

import asyncio
from collections import defaultdict
from collections.abc import Iterable
from typing import TYPE_CHECKING

from choreography_ray.core import (
    host_watch,
    job_record,
    pool_dispatch,
    settling,
    stage_flow,
    stop_flow,
)
from choreography_ray.core.messages import StepStart, describe, failed
from choreography_ray.core.mode import STOPPING
from choreography_ray.core.placement import Placement, placement_of
from choreography_ray.core.watchdog import stored_outcome
from choreography_ray.core.window import RunState
from choreography_ray.logs import get_logger, ids
from choreography_ray.status import JobStatus, StepStatus
from choreography_ray.types import import_type

if TYPE_CHECKING:
    from choreography_ray.core.activation import Activation

log = get_logger(__name__)


def startable(
    a: Activation, starts: list[StepStart]
) -> tuple[list[StepStart], list[tuple[StepStart, str]]]:
    """The steps whose type loads, and the others with the reason."""
    reasons = unloadable(a, {start.type for start in starts})
    if not reasons:
        return starts, []
    good = [start for start in starts if start.type not in reasons]
    return good, [(start, reasons[start.type]) for start in starts if start.type in reasons]


def unloadable(a: Activation, step_types: Iterable[str]) -> dict[str, str]:
    """The step types that do not load, each with the reason."""
    reasons: dict[str, str] = {}
    for step_type in step_types:
        try:
            placement(a, step_type)
        except Exception as error:
            reasons[step_type] = describe(error)
    return reasons


async def fill(a: Activation) -> list[asyncio.Future[bool]]:
    """Hands pending steps to hosts while the window and the throttle allow. A step whose
    type cannot be loaded fails to start: it is recorded FAILED and counted."""
    answers: list[asyncio.Future[bool]] = []
    if a.live:
        await job_record.take_epoch(a)  # a job reopened at rest: before its first start
    while a.live:
        await stage_flow.refill(a)
        room = pool_dispatch.room_for(a, lambda step_type: placement(a, step_type))
        if not (batch := a.window.next_batch(room)):
            break
        #: Per placement (the shared hosts, a pool, an actor each), the batch's steps.
        grouped: dict[Placement, list[StepStart]] = {}
        cannot: list[tuple[StepStart, str]] = []
        for start in batch:
            try:
                where = placement(a, start.type)
            except Exception as error:
                cannot.append((start, describe(error)))
                continue
            grouped.setdefault(where, []).append(start)
        for where, starts in grouped.items():
            if where.shape is None:
                shares = a.hosts.place(a.job_id, starts, where)
            else:
                shares, left = pool_dispatch.share_out(a, where, starts)
                a.window.queue(left, front=True)  # a host left the pool meanwhile
            for host, share in shares:
                answers.append(a.send(host, share))
        if cannot:
            await cannot_start(a, cannot)
    if any(d.steps for d in pool_dispatch.demands(a)):
        a.timers.arm("pools", pool_dispatch.SYNC_SECONDS)  # the owner learns what the job holds
    return answers


async def cannot_start(a: Activation, failures: list[tuple[StepStart, str]]) -> None:
    outcomes = [failed(s.step_id, s.attempt, StepStatus.FAILED, why) for s, why in failures]
    try:
        await settling.store_outcomes(a, outcomes)
    except Exception:
        a.window.queue((start for start, _why in failures), front=True)
        raise
    # Its attempt ended here: out of the table (a retry's too, else a stop after a
    # RetryFailedSteps would count it failed once more).
    a.window.forget(start.step_id for start, _why in failures)
    for (start, why), outcome in zip(failures, outcomes, strict=True):
        log.warning("job %s: step %s cannot start: %s", a.job_id, start.step_id, why,
                    extra=ids(a.job_id, start.step_id))  # fmt: skip
        settling.settle(a, start, outcome)


def placement(a: Activation, type_path: str) -> Placement:
    """Where the type's steps run (`core.placement`), read once per type and activation."""
    where = a.placements.get(type_path)
    if where is None:
        step_type = import_type(type_path, a.options.allowed_type_prefixes)
        where = a.placements[type_path] = placement_of(step_type)
    return where


def is_dedicated(a: Activation, type_path: str) -> bool:
    """Whether the type's steps run in an actor each (False for a type that does not load)."""
    try:
        return placement(a, type_path).dedicated
    except Exception:
        return False


async def answered(
    a: Activation,
    host: str,
    batch: list[StepStart],
    error: Exception | None,
    incarnation: str | None = None,
) -> None:
    known = a.incarnations.get(host)
    if error is None and known is not None and known != incarnation:
        # The host restarted since it last answered: the steps it ran then are gone (this
        # batch's are still being started, so not among them). A loss that fails to be
        # handled here is handled again later: the batch is answered all the same, ACTIVE
        # and watched, not left STARTING.
        earlier = host_watch.answered_on(a, host)
        try:
            await host_watch.host_lost(a, host, earlier)
        except Exception as failure:
            log.warning("job %s: handling the steps host %s lost as it restarted failed (%s);"
                        " again soon", a.job_id, host, failure)  # fmt: skip
            a.lose_later(host, earlier)
    a.window.answered(batch, error is None)
    a.kick()
    if error is not None:
        # One retry round for every start that failed meanwhile: the backoff grows by
        # round, not by the number of batches that failed in it.
        log.warning(
            "job %s: starting %d steps on %s failed (started again soon): %s",
            a.job_id,
            len(batch),
            host,
            error,
        )
        if a.mode not in STOPPING:
            a.timers.arm("starts")
        else:
            await stop_flow.stop_failed_starts(a)
        return
    if not a.window.count(RunState.START_FAILED):
        a.timers.clear("starts")
    a.tally.started += len(batch)
    a.watch(host, incarnation)
    if a.mode in STOPPING:
        # The stop reached this host before these steps did: tell them again.
        await a.hosts.cancel([host], a.job_id, a.job_state.status is JobStatus.REMOVING)


async def retry_failed_starts(a: Activation) -> None:
    """Start operations that threw may have run on their host all the same (Ray: "the task
    may or may not have been executed"): a step whose outcome storage holds counts it; a
    step a host still has goes back to that host, which skips it when it runs that attempt
    and refuses it while it lets an earlier one go; the others start again anywhere."""
    failed = {start.step_id: start for start in a.window.failed_starts()}
    if not failed:
        return
    on_hosts = await a.hosts.running(a.job_id, epoch=a.epoch)  # before storage: see _adopt_stage
    unsure = [step_id for step_id in failed if step_id not in on_hosts]
    records = await a.storage.get_steps(a.job_id, unsure) if unsure else {}
    back: dict[str, list[StepStart]] = defaultdict(list)
    again: list[StepStart] = []
    for step_id, start in failed.items():
        if step_id in on_hosts:
            back[on_hosts[step_id]].append(start)
        elif (outcome := stored_outcome(start, records.get(step_id))) is not None:
            a.window.adopt(start, "")
            settling.accept(a, outcome)
        else:
            again.append(start)
    for host, batch in back.items():
        a.send(host, batch)
    a.window.queue(again, front=True)

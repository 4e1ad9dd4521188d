"""The hosts: the fence (one picture of the hosts' steps and storage), what becomes of the steps
of a host whose incarnation is gone, and the watch that learns it.

A flow of an activation (`activation.Activation`): functions that never take a turn themselves.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Collection
from typing import TYPE_CHECKING

from choreography_ray.core import job_record, settling, stop_flow
from choreography_ray.core.mode import STOPPING
from choreography_ray.core.retries import STANDARD
from choreography_ray.core.window import RUNNING
from choreography_ray.logs import get_logger

if TYPE_CHECKING:
    from choreography_ray.core.activation import Activation

log = get_logger(__name__)


@contextlib.asynccontextmanager
async def fenced(a: Activation) -> AsyncIterator[dict[str, str]]:
    """The job's steps on live hosts (step id -> host), the hosts fenced while the block
    reads storage: none of the job's outcomes is written meanwhile, and no start sent
    before lands after. A recount and the steps adopted are then one picture: a step
    listed has no outcome stored (it counts when it reports), and an outcome stored is of
    a step not listed (the recount counts it)."""
    await job_record.take_epoch(a)  # a job reopened at rest: before its first fence
    try:  # a host that does not answer fails the read: those that did are lifted too
        yield await a.hosts.running(a.job_id, fence=True, epoch=a.epoch)
    finally:
        await a.hosts.lift_fence(a.job_id)


def answered_on(a: Activation, host: str) -> set[str]:
    """The steps on `host` whose start it answered (those still starting are not among them)."""
    return {s.step_id for s in a.window.on_host(host) if a.window.state_of(s.step_id) in RUNNING}


async def host_lost(a: Activation, host: str, only: Collection[str] | None = None) -> None:
    """The incarnation of `host` that ran this activation's answered steps (`only` those of
    them, when a later incarnation runs the others) is gone: a step whose outcome it stored
    counts that; the others never report. A stopping job stores them STOPPED (and finishes
    its stop when they were the last); a running one starts them again (leases off) or
    leaves them to the lease (on); an activation that drives nothing yet leaves them to its
    resume. Steps whose start is unanswered wait for their answer."""
    stage = a.job_state.stage
    lost_ids = answered_on(a, host)
    if only is not None:
        lost_ids &= set(only)
    stored = {k: v for k, v in settling.settleable(a, stage).items() if k in lost_ids}
    await settling.settle_stored(a, stored)
    lost = [s for s in a.window.on_host(host) if s.step_id in lost_ids]
    if a.mode in STOPPING:
        # (Also when the settle above counted the last of them.)
        if lost:
            await settling.store_stops(a, lost)
        await stop_flow.finish_stop_when_reported(a)
    elif not lost:
        return
    elif not a.live:
        return  # driven by nobody here yet: the resume that takes the job on finds them gone
    elif a.options.lease_seconds is None:
        log.warning("job %s: host %s died with %d steps; starting them again", a.job_id,
                    host, len(lost))  # fmt: skip
        a.window.queue(lost, front=True)
    else:
        # With leases the lease decides; that this host's process is gone is known now,
        # whatever Ray's state API can tell later.
        a.window.lose_owner(start.step_id for start in lost)


async def until_gone(a: Activation, host: str, incarnation: str | None) -> None:
    """Returns once this incarnation of `host` is gone (its watch call ended); a watch that
    fails without telling is asked again, 1 s doubling to 60 s."""
    failures = 0
    while True:
        try:
            await a.hosts.watch(host, incarnation)
            break
        except Exception as error:
            failures += 1
            delay = STANDARD.delay(failures)
            log.warning("job %s: watching host %s failed (%s); again in %.0f s",
                        a.job_id, host, error, delay)  # fmt: skip
            await asyncio.sleep(delay)
    log.info("job %s: host %s (%s) is gone", a.job_id, host, incarnation)

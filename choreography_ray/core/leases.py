"""Leases: which running steps the watchdog may start again.

A running step records a lease (silo = Ray node id, activation = hosting actor id + process id,
heartbeat); its step host renews it by a timer every third of the timeout, only while the step
is still RUNNING at that attempt. A step is restarted only when its owner is gone (its node is
not alive, or its hosting actor is dead or a new incarnation) and its lease has expired. A
running step without a lease (written by an older release) is left alone for one lease period
after its last change. A step stored at an earlier attempt whose host the job saw go never had
its RUNNING write stored (a host runs a step while that write waits for its round): it starts
again at once.
"""

from __future__ import annotations

from collections.abc import Collection
from datetime import timedelta

from choreography_ray.core.hosts import Hosts
from choreography_ray.core.messages import StepStart
from choreography_ray.model import Lease, utcnow
from choreography_ray.status import StepStatus
from choreography_ray.storage import Storage


async def expired(
    storage: Storage,
    hosts: Hosts,
    silos: set[str],
    job_id: str,
    stage: int,
    active: dict[str, tuple[StepStart, str]],
    lease_seconds: float,
    owner_lost: Collection[str] = (),
) -> list[StepStart]:
    """The active steps of `stage` whose owner is gone and whose lease expired. Steps in
    `owner_lost` ran on a host whose process the job saw go."""
    if not active:
        return []
    timeout = timedelta(seconds=lease_seconds)
    now = utcnow()
    gone: dict[str, bool] = {}
    stale: list[StepStart] = []
    # The active steps' records, read by id: the cost follows what runs, not the job's size.
    records = await storage.get_steps(job_id, list(active))
    for step_id in sorted(records):
        step, entry = records[step_id], active[step_id]
        if step.stage != stage:
            continue
        if step_id in owner_lost and step.attempt < entry[0].attempt:
            # Its host went before its RUNNING write of this attempt was stored: no lease of
            # this attempt will ever expire.
            stale.append(entry[0])
            continue
        if step.status is not StepStatus.RUNNING:
            continue
        if step.lease is None:
            if now - step.updated > timeout:
                stale.append(entry[0])
        elif now - step.lease.heartbeat > timeout and (
            step.step_id in owner_lost or await _owner_gone(step.lease, silos, hosts, gone)
        ):
            stale.append(entry[0])
    return stale


async def _owner_gone(lease: Lease, silos: set[str], hosts: Hosts, cache: dict[str, bool]) -> bool:
    if lease.silo not in silos:
        return True
    if lease.activation not in cache:
        cache[lease.activation] = await hosts.activation_gone(lease.activation)
    return cache[lease.activation]

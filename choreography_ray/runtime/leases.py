"""Leases: which running steps the watchdog may start again.

A running step records a lease (silo = Ray node id, activation = hosting actor id + process id,
heartbeat); its step host renews it on state writes and by a timer every third of the timeout.
A step is restarted only when its owner is gone (its node is not alive, or its hosting actor is
dead or is a new incarnation) and its lease has expired. A running step without a lease (written
by an older release) is left alone for one lease period after its last change.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from choreography_ray.job import Job
from choreography_ray.model import Lease, utcnow
from choreography_ray.options import JobsOptions
from choreography_ray.runtime.messages import StepStart
from choreography_ray.status import StepStatus
from choreography_ray.storage import Storage, step_pages


async def expired(
    storage: Storage,
    job: Job[Any] | None,
    job_id: str,
    stage: int,
    active: dict[str, tuple[StepStart, str]],
    options: JobsOptions,
) -> list[StepStart]:
    """The active steps of `stage` whose owner is gone and whose lease expired."""
    if job is None or options.lease_seconds is None or not active:
        return []
    timeout = timedelta(seconds=options.lease_seconds)
    now = utcnow()
    silos = job.get_active_silos()
    gone: dict[str, bool] = {}
    stale: list[StepStart] = []
    async for page in step_pages(storage, job_id, statuses=(StepStatus.RUNNING,), stage=stage):
        for step in page:
            entry = active.get(step.step_id)
            if entry is None:
                continue
            if step.lease is None:
                if now - step.updated > timeout:
                    stale.append(entry[0])
            elif now - step.lease.heartbeat > timeout and owner_gone(step.lease, silos, gone):
                stale.append(entry[0])
    return stale


def owner_gone(lease: Lease, silos: set[str], cache: dict[str, bool]) -> bool:
    if lease.silo not in silos:
        return True
    if lease.activation not in cache:
        cache[lease.activation] = activation_gone(lease.activation)
    return cache[lease.activation]


def activation_gone(activation: str) -> bool:
    """The hosting actor is dead, or alive in another process (a restart lost its steps)."""
    from ray.util.state import get_actor

    actor_id, _, pid = activation.partition(":")
    try:
        info = get_actor(actor_id)
    except Exception:  # the state API is unavailable: do not declare anybody gone
        return False
    return info is None or info.state == "DEAD" or (bool(pid) and str(info.pid) != pid)

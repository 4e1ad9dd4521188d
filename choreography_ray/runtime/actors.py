"""Creating the package's named actors: a jobs manager, the recovery actor, the pools' owner,
a job actor, a scheduler.

Each function returns a handle to the named detached actor and creates the actor first if it
does not exist yet (get-if-exists, `names.actor_options`), so the name, the options and the
constructor arguments of each actor are written once, here. The actor classes are imported
inside the functions, because the modules that define them call these functions.

Getting a handle by name asks Ray's GCS and blocks until it answers. Async actors must call
these functions through `asyncio.to_thread`, never on their event loop; `LazyHandle` does so
for the async clients, on their first call.

Handles are `Any`: Ray types a handle's methods as `Never` (`ActorHandle.__getattr__`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from choreography_ray.runtime.names import (
    POOLS,
    RECOVERY,
    actor_options,
    job_name,
    manager_name,
    scheduler_name,
)


def manager_actor(
    scope: str, namespace: str, storage_url: str, options_json: str, ray_namespace: str
) -> Any:
    """`jobs-manager/{scope}/{namespace}`. An existing manager keeps the storage and options it
    was created with; `config()` tells them."""
    from choreography_ray.runtime.manager import JobsManagerActor

    return JobsManagerActor.options(  # type: ignore[attr-defined]
        **actor_options(manager_name(scope, namespace), ray_namespace)
    ).remote(scope, namespace, storage_url, options_json, ray_namespace)


def recovery_actor(ray_namespace: str) -> Any:
    """`recovery`, one per Ray namespace."""
    from choreography_ray.runtime.recovery import RecoveryActor

    return RecoveryActor.options(  # type: ignore[attr-defined]
        **actor_options(RECOVERY, ray_namespace)
    ).remote(ray_namespace)


def pool_owner_actor(ray_namespace: str, capacity: int) -> Any:
    """`pools`, one per Ray namespace: it makes every pool's hosts (`runtime/pool_owner.py`).
    `capacity` is what each of its hosts runs at once, as the first job to use a pool said."""
    from choreography_ray.runtime.pool_owner import PoolOwner

    return PoolOwner.options(  # type: ignore[attr-defined]
        **actor_options(POOLS, ray_namespace)
    ).remote(ray_namespace, capacity)


def job_actor(
    job_id: str, storage_url: str, options_json: str, ray_namespace: str, spare: bool = False
) -> Any:
    """`job/{job_id}`: the job's activation, loaded from storage when the actor is created, or
    at its first call when it is a `spare` created ahead of its job."""
    from choreography_ray.runtime.job_actor import JobActor

    return JobActor.options(  # type: ignore[attr-defined]
        **actor_options(job_name(job_id), ray_namespace)
    ).remote(job_id, storage_url, options_json, ray_namespace, spare)


def scheduler_actor(scope: str, storage_url: str, options_json: str, ray_namespace: str) -> Any:
    """`scheduler/{scope}`: runs the scope's manifests while it holds the scope's lock. An
    existing scheduler keeps the storage and options it was created with; `config()` tells."""
    from choreography_ray.runtime.scheduler_actor import SchedulerActor

    return SchedulerActor.options(  # type: ignore[attr-defined]
        **actor_options(scheduler_name(scope), ray_namespace)
    ).remote(scope, storage_url, options_json, ray_namespace)


class LazyHandle:
    """An actor handle got on first use: `await get()` runs `make` (one of the functions above,
    which block on the GCS) in a worker thread, so an async client can be made on an event loop
    without blocking it. Two first calls at once may both run `make`; get-if-exists gives them
    the same actor."""

    def __init__(self, make: Callable[[], Any]) -> None:
        self._make = make
        self._handle: Any = None

    @classmethod
    def of(cls, handle: Any) -> LazyHandle:
        """A handle already got."""
        lazy = cls(lambda: handle)
        lazy._handle = handle
        return lazy

    async def get(self) -> Any:
        if self._handle is None:
            self._handle = await asyncio.to_thread(self._make)
        return self._handle

    def get_sync(self) -> Any:
        """For the sync clients, which may block."""
        if self._handle is None:
            self._handle = self._make()
        return self._handle

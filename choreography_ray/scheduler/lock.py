"""The durable lock of a scheduler scope: one scheduler at a time runs its manifests.

The lock is a lease in storage (`SchedulerStorage.acquire_lease`): taken when free or expired,
renewed by its holder every third of `lock_ttl`, released when the scheduler closes. A holder is
one activation of the scheduler actor, so a second cluster's scheduler on the same storage waits
until the lease is free; a restarted actor (a later incarnation of the same actor) takes its
predecessor's lease over at once (`storage.scheduler.lease_for`).

The lease's expiry is on the database's clock; this process believes it holds the lock only
until its own monotonic clock says `lock_ttl` has passed since the last renewal *started*, so a
renewal that fails (storage unreachable) stops this scheduler before the lease can expire and
another take it. Every write of the scheduler's loops and operations goes through
`guarded(storage, lock)`, which checks the lock before it writes: a lease that lapses in the
middle of a cycle stops that cycle at its next write. That check is this process's belief;
the storage's fence (`SchedulerStorage.fenced`, issue 36) checks the lease itself in the same
write, so a holder whose lease a successor took over at once, or that expired on the
database's clock while its own clock says otherwise, writes nothing: its refused write marks
the lock `lost`, and its loops stop until `keep` takes the lease again.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any, cast

from choreography_ray.errors import SchedulerError, SchedulerOperationError
from choreography_ray.logs import get_logger
from choreography_ray.storage.scheduler import FENCED_WRITES, SchedulerStorage

log = get_logger(__name__)


def lock_name(scope: str) -> str:
    return f"scheduler/{scope}"


class SchedulerLock:
    def __init__(
        self,
        storage: SchedulerStorage,
        scope: str,
        holder: str,
        ttl: timedelta,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.storage = storage
        self.name = lock_name(scope)
        self.holder = holder
        self.ttl = ttl
        self._monotonic = monotonic
        #: This process's monotonic time until which it holds the lock.
        self._until = 0.0
        #: The lease's current holder as last read (for the error of a refused operation).
        self.other: str | None = None

    @property
    def renew_every(self) -> float:
        """Seconds between two renewals (or two attempts of a scheduler that waits)."""
        return self.ttl.total_seconds() / 3

    @property
    def held(self) -> bool:
        return self._monotonic() < self._until

    async def keep(self) -> bool:
        """Acquires or renews the lease; whether this scheduler holds the lock now. A storage
        error leaves the lock held until it runs out here, and is raised."""
        started = self._monotonic()
        was_held = self.held
        lease = await self.storage.acquire_lease(self.name, self.holder, self.ttl)
        if lease is None:
            self._until = 0.0
            current = await self.storage.get_lease(self.name)
            self.other = current.holder if current is not None else None
            if was_held:
                log.error("%s: lost the lock to %s; its loops stop", self.name, self.other)
            return False
        self._until = started + self.ttl.total_seconds()
        self.other = None
        if not was_held:
            log.info("%s: %s holds the lock", self.name, self.holder)
        return True

    def lost(self, why: str) -> None:
        """A fenced write found the lease gone (a successor or another cluster holds it, or
        it expired on the database's clock): the loops stop until `keep` takes it again."""
        if self.held:
            log.error("%s: the lease is lost (%s); its loops stop", self.name, why)
        self._until = 0.0

    async def release(self) -> None:
        if self._until:
            self._until = 0.0
            await self.storage.release_lease(self.name, self.holder)


#: The writes of the scheduler's storage the lock guards (the ones the lease fences).
GUARDED_WRITES = FENCED_WRITES


class _Guarded:
    def __init__(self, storage: SchedulerStorage, lock: SchedulerLock) -> None:
        self._storage = storage
        self._lock = lock

    def __getattr__(self, method: str) -> Any:
        found = getattr(self._storage, method)
        if method not in GUARDED_WRITES:
            return found

        async def write(*args: Any, **kwargs: Any) -> Any:
            if not self._lock.held:
                raise SchedulerOperationError(
                    SchedulerError.NOT_LOCK_HOLDER,
                    f"{self._lock.name}: the lock lapsed; {method} is not written",
                )
            return await found(*args, **kwargs)

        return write


def guarded(storage: SchedulerStorage, lock: SchedulerLock) -> SchedulerStorage:
    """`storage` whose writes are refused (`NOT_LOCK_HOLDER`) while `lock` is not held."""
    return cast(SchedulerStorage, _Guarded(storage, lock))


def lapsed(error: Exception) -> bool:
    """`error` is a write refused because the lock lapsed: the loop stops until it is back."""
    return isinstance(error, SchedulerOperationError) and error.error is (
        SchedulerError.NOT_LOCK_HOLDER
    )

"""Issue 36, item 5: every write of the scheduler is fenced by the scope's lease, checked in
the same write. A scheduler whose lease a restarted successor took at once (or another
cluster took after a forward step of the database's clock) still believes, by its own
monotonic clock, that it holds the lock until its next renewal: before the fence it went on
writing beside the new holder."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from choreography_ray.errors import SchedulerError, SchedulerOperationError
from choreography_ray.scheduler.schedules import Every
from choreography_ray.storage.scheduler import fenced, lease_for
from choreography_ray.storage.scheduler.memory import MemorySchedulerStorage
from tests.storage.test_scheduler_contract import queued
from tests.unit.scheduler.harness import JOB, Clock, Harness, run


def test_a_predecessor_whose_lease_was_taken_over_writes_nothing() -> None:
    async def scenario() -> None:
        h = Harness()
        h.core = before = h.new_core("actor-1/0001")
        await before.start(loops=False)
        await before.schedule("m", JOB, {}, Every.hours(1))
        successor = h.new_core("actor-1/0002")  # the actor's next incarnation
        await successor.start(loops=False)
        assert successor.lock.held
        assert before.lock.held, "by its own clock, until its next renewal"

        with pytest.raises(SchedulerOperationError) as refused:
            await before.schedule("n", JOB, {}, Every.hours(1))
        assert refused.value.error is SchedulerError.NOT_LOCK_HOLDER
        await before.run_cycle()  # its cycle stops at its first write
        await before.dispatch_due()

        assert [m.name for m in await h.storage.list_manifests("s")] == ["m"]
        assert await h.storage.queued_entries("s") == []
        assert h.jobs.started == []
        await successor.run_cycle()
        assert len(await h.storage.queued_entries("s")) == 1

    run(scenario)


def test_a_holder_whose_lease_expired_on_the_databases_clock_writes_nothing() -> None:
    """The database's clock stepped forward past the lease (another cluster may take it):
    the holder's monotonic clock has not moved, its writes are refused all the same."""

    async def scenario() -> None:
        h = Harness()
        core = await h.start()
        await core.schedule("m", JOB, {}, Every.hours(1))
        h.clock.advance(h.options.lock_ttl.total_seconds() + 1)
        assert core.lock.held
        with pytest.raises(SchedulerOperationError) as refused:
            await core.trigger("m")
        assert refused.value.error is SchedulerError.NOT_LOCK_HOLDER
        assert await h.storage.queued_entries("s") == []
        await core.lock.keep()  # renewed: it writes again
        assert (await core.trigger("m")).run_id is not None

    run(scenario)


class Proxy:
    """A storage forwarded through something that has no fence of its own (as the memory
    storage shared through an actor on Ray)."""

    def __init__(self, storage: object) -> None:
        self._storage = storage

    def __getattr__(self, method: str) -> object:
        return getattr(self._storage, method)


def test_a_proxied_storage_is_fenced_by_reading_the_lease_before_each_write() -> None:
    async def scenario() -> None:
        storage = MemorySchedulerStorage(Clock())
        proxy = fenced(Proxy(storage), "scheduler/s", "actor/0001")  # type: ignore[arg-type]
        await storage.acquire_lease("scheduler/s", "actor/0001", timedelta(seconds=30))
        assert (await proxy.enqueue(*queued("a"))).entry is not None
        await storage.acquire_lease("scheduler/s", "actor/0002", timedelta(seconds=30))
        with pytest.raises(SchedulerOperationError):
            await proxy.enqueue(*queued("b"))
        assert [e.manifest for e in await proxy.queued_entries("s")] == ["a"]

    run(scenario)


def test_the_leases_token_goes_up_on_a_takeover_and_stays_on_a_renewal() -> None:
    """The fencing token MongoDB's writes carry: one more for each new holder, the same for
    the holder's renewals; a lease inserted after none goes on from `floor` (a released one's)."""
    now, ttl = datetime(2026, 1, 1, tzinfo=UTC), timedelta(seconds=30)
    first = lease_for(None, "scheduler/s", "actor/0001", ttl, now)
    assert first is not None and first.token == 1
    renewed = lease_for(first, "scheduler/s", "actor/0001", ttl, now + timedelta(seconds=10))
    assert renewed is not None and renewed.token == 1
    successor = lease_for(renewed, "scheduler/s", "actor/0002", ttl, now + timedelta(seconds=11))
    assert successor is not None and successor.token == 2
    expired = lease_for(successor, "scheduler/s", "other/0001", ttl, now + timedelta(minutes=5))
    assert expired is not None and expired.token == 3
    assert lease_for(expired, "scheduler/s", "actor/0003", ttl, now + timedelta(minutes=5)) is None
    after_release = lease_for(None, "scheduler/s", "b", ttl, now, floor=7)
    assert after_release is not None and after_release.token == 8

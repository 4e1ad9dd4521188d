"""The scheduler's MongoDB storage under a lost acknowledgement of each kind of write it makes,
and a partition, through `tests.mongo_proxy` (as `test_mongodb_faults.py` does for the jobs).

The server applies the write and its reply is dropped with the connection; nx-27017 and a
standalone `mongod` do not retry writes, so the caller sees `StorageUnavailableError` and writes
again: the same call (an operator's retry, the dispatcher's next claim), or a new entry or dead
letter for the same manifest (the manifest manager's next cycle plans afresh). Either way
nothing is applied twice.
"""

from __future__ import annotations

import asyncio
import time
from datetime import timedelta
from typing import Any

import pytest

from choreography_ray.errors import StorageUnavailableError
from choreography_ray.model import StageShape
from choreography_ray.scheduler.records import (
    Checkpoint,
    DeadLetter,
    Decision,
    Manifest,
    ManifestRun,
    WorkEntry,
)
from choreography_ray.scheduler.schedules import Every
from choreography_ray.scheduler.status import DeadLetterStatus, RunStatus, WorkStatus
from choreography_ray.storage.mongodb import MongoStorage
from choreography_ray.storage.scheduler import Refusal
from choreography_ray.storage.scheduler import mongodb as provider
from choreography_ray.storage.scheduler import mongodb_docs as docs
from choreography_ray.storage.scheduler.mongodb import MongoSchedulerStorage
from tests.mongo_proxy import SHORT_DEADLINES, FaultProxy

pytestmark = [pytest.mark.mongodb, pytest.mark.timeout(60)]

FAST = SHORT_DEADLINES
SCOPE = "s"


@pytest.fixture
def store(proxied_storage: MongoStorage) -> MongoSchedulerStorage:
    return MongoSchedulerStorage(proxied_storage)


def queued(name: str = "m") -> tuple[WorkEntry, ManifestRun]:
    run = ManifestRun(scope=SCOPE, manifest=name, job_type="pkg.jobs:J")
    return WorkEntry(scope=SCOPE, manifest=name, run_id=run.id), run


def letter(name: str = "m") -> DeadLetter:
    return DeadLetter(scope=SCOPE, manifest=name, retry_count_at_dead_letter=4, reason="boom")


async def lost(proxy: FaultProxy, command: str, write: Any) -> None:
    """`write()` with the reply of its first `command` lost: applied, and unavailable."""
    proxy.drop_reply(command)
    with pytest.raises(StorageUnavailableError):
        await write()
    assert proxy.hits == [("drop_reply", command)]
    proxy.hits.clear()


async def test_lost_ack__a_manifest_upserted_again_is_stored_once(
    proxy: FaultProxy, store: MongoSchedulerStorage
) -> None:
    new = Manifest(scope=SCOPE, name="m", job_type="pkg.jobs:J", schedule=Every.hours(1),
                   max_retries=5)  # fmt: skip
    await lost(proxy, "update", lambda: store.upsert_manifest(new, {"max_retries"}))

    assert await store.upsert_manifest(new, {"max_retries"}) == new
    assert await store.list_manifests(SCOPE) == [new]


async def test_lost_ack__an_enqueue_whose_key_was_taken_queues_the_same_entry_once(
    proxy: FaultProxy, store: MongoSchedulerStorage
) -> None:
    """The key's marker was inserted for the entry: written again, the key is its own, not
    another queued entry's."""
    entry, run = queued()
    await lost(proxy, "insert", lambda: store.enqueue(entry, run))

    done = await store.enqueue(entry, run)

    assert done.refused is None and done.entry is not None
    assert [e.id for e in await store.queued_entries(SCOPE, "m")] == [entry.id]


async def test_lost_ack__an_enqueued_entry_keeps_its_manifest_key_for_the_next_cycle(
    proxy: FaultProxy, store: MongoSchedulerStorage, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The entry was written but its reply lost (its run was not): it still holds the manifest
    key, so the next cycle's new entry is refused rather than queued beside it (the cycle
    then cancels the entry that names no run, `ManifestManager._cancel_orphans`)."""
    take_keys = docs._take_keys

    def then_lose_the_entry(*args: Any) -> Any:
        taken = take_keys(*args)
        proxy.drop_reply("insert")  # the next insert is the entry's
        return taken

    monkeypatch.setattr(provider, "_take_keys", then_lose_the_entry)
    first, run = queued()
    with pytest.raises(StorageUnavailableError):
        await store.enqueue(first, run)
    monkeypatch.undo()
    assert proxy.hits == [("drop_reply", "insert")]

    again = await store.enqueue(*queued())

    assert again.refused is Refusal.MANIFEST_ALREADY_QUEUED
    assert [e.id for e in await store.queued_entries(SCOPE, "m")] == [first.id]


async def test_lost_ack__an_enqueued_run_is_not_queued_again_by_the_next_cycle(
    proxy: FaultProxy, store: MongoSchedulerStorage
) -> None:
    entry, run = queued()
    await lost(proxy, "update", lambda: store.enqueue(entry, run))  # the run's replace

    again = await store.enqueue(*queued())

    assert again.refused is Refusal.MANIFEST_ALREADY_QUEUED
    assert [e.id for e in await store.queued_entries(SCOPE, "m")] == [entry.id]
    assert [r.id for r in await store.list_runs(SCOPE, "m")] == [run.id]


async def test_lost_ack__a_claim_claimed_again_dispatches_each_entry_once(
    proxy: FaultProxy, store: MongoSchedulerStorage
) -> None:
    entry, run = queued()
    await store.enqueue(entry, run)
    await lost(proxy, "findAndModify", lambda: store.claim_due(SCOPE))

    assert await store.claim_due(SCOPE) == []
    claimed = await store.get_entry(entry.id)
    assert claimed is not None
    assert (claimed.status, claimed.dispatch_attempts) == (WorkStatus.DISPATCHED, 1)


async def test_lost_ack__a_requeued_dispatch_requeued_again_is_refused_and_queued_once(
    proxy: FaultProxy, store: MongoSchedulerStorage
) -> None:
    entry, run = queued()
    await store.enqueue(entry, run)
    await store.claim_due(SCOPE)
    requeue = lambda: store.requeue_dispatch(entry.id, timedelta(0))  # noqa: E731
    await lost(proxy, "update", requeue)

    assert await requeue() is None, "conditional on DISPATCHED"
    stored = await store.get_entry(entry.id)
    assert stored is not None
    assert (stored.status, stored.dispatch_attempts) == (WorkStatus.QUEUED, 1)
    assert (await store.enqueue(*queued())).refused is Refusal.MANIFEST_ALREADY_QUEUED


async def test_lost_ack__a_release_released_again_clears_its_runs_link_and_key(
    proxy: FaultProxy, store: MongoSchedulerStorage
) -> None:
    def replaying(name: str) -> tuple[WorkEntry, ManifestRun]:
        entry, run = queued(name)
        link = {"replays": "r0"}
        return entry.model_copy(update=link), run.model_copy(update=link)

    entry, run = replaying("m")
    await store.enqueue(entry, run)
    release = lambda: store.release(entry.id, clear_link=True)  # noqa: E731
    await lost(proxy, "findAndModify", release)

    released = await release()

    assert released is not None and released.replays is None
    assert await store.runs_replaying("r0") == [], "its run asks afresh too"
    assert not (await store.enqueue(*replaying("n"))).replay_dropped, "its key is given up"


@pytest.mark.parametrize("lost_write", ["flag", "link"])
async def test_lost_ack__an_opt_out_written_again_clears_each_link(
    proxy: FaultProxy,
    store: MongoSchedulerStorage,
    monkeypatch: pytest.MonkeyPatch,
    lost_write: str,
) -> None:
    new = Manifest(scope=SCOPE, name="m", job_type="pkg.jobs:J", schedule=Every.hours(1))
    await store.upsert_manifest(new, ())
    entry, run = queued()
    link = {"replays": "r0"}
    await store.enqueue(entry.model_copy(update=link), run.model_copy(update=link))
    if lost_write == "flag":
        proxy.drop_reply("update")
    else:  # the entry's update: armed once the entries are read, after the manifests' update

        def then_lose_the_link(found: Any) -> list[Any]:
            if not isinstance(found, list):  # the entries' cursor, not the names
                proxy.drop_reply("update")
            return [*found]

        monkeypatch.setattr(provider, "list", then_lose_the_link, raising=False)
    opt_out = lambda: store.set_replay_decisions_on_retry(SCOPE, ["m"], False)  # noqa: E731
    with pytest.raises(StorageUnavailableError):
        await opt_out()
    monkeypatch.undo()
    assert proxy.hits == [("drop_reply", "update")]

    assert await opt_out() == (1 if lost_write == "flag" else 0)
    stored = await store.get_manifest(SCOPE, "m")
    assert stored is not None and stored.replay_decisions_on_retry is False
    assert await store.runs_replaying("r0") == []


async def test_lost_ack__a_cancelled_entry_cancelled_again_is_refused_and_frees_its_key(
    proxy: FaultProxy, store: MongoSchedulerStorage
) -> None:
    entry, run = queued()
    await store.enqueue(entry, run)
    cancel = lambda: store.cancel_entry(entry.id)  # noqa: E731
    await lost(proxy, "update", cancel)

    assert await cancel() is False, "conditional on QUEUED"
    assert await store.queued_entries(SCOPE, "m") == []
    assert (await store.enqueue(*queued())).entry is not None, "its key is taken over"


async def test_lost_ack__runs_checkpoints_and_decisions_written_again_are_stored_once(
    proxy: FaultProxy, store: MongoSchedulerStorage
) -> None:
    run = ManifestRun(scope=SCOPE, manifest="m", job_type="pkg.jobs:J", status=RunStatus.FAILED)
    checkpoint = Checkpoint(run_id=run.id, scope=SCOPE, manifest="m", stage=1,
                            layout=(StageShape(stage=1, steps=2),))  # fmt: skip
    decision = Decision(run_id=run.id, scope=SCOPE, manifest="m", question="q",
                        state_hash="h", answer=1)  # fmt: skip
    other = decision.model_copy(update={"answer": 2})

    for command, write in [("update", lambda: store.save_run(run)),
                           ("update", lambda: store.save_checkpoint(checkpoint)),
                           ("insert", lambda: store.record_decision(decision))]:  # fmt: skip
        await lost(proxy, command, write)
        await write()

    assert await store.list_runs(SCOPE, "m") == [run]
    assert await store.list_checkpoints(run.id) == [checkpoint]
    assert await store.record_decision(other) == decision, "the first answer stays"
    assert await store.count_decisions(run.id) == 1


async def test_lost_ack__a_dead_letter_added_again_awaits_once(
    proxy: FaultProxy, store: MongoSchedulerStorage
) -> None:
    first = letter()
    await lost(proxy, "insert", lambda: store.add_dead_letter(first))  # its key's marker

    assert await store.add_dead_letter(first) is True
    assert await store.add_dead_letter(letter()) is False, "the next cycle's is refused"
    awaiting = DeadLetterStatus.AWAITING_INTERVENTION
    assert [d.id for d in await store.list_dead_letters(SCOPE, "m", awaiting)] == [first.id]


async def test_lost_ack__a_resolved_dead_letter_resolved_again_is_refused_once(
    proxy: FaultProxy, store: MongoSchedulerStorage
) -> None:
    first = letter()
    await store.add_dead_letter(first)
    resolve = lambda: store.resolve_dead_letter(first.id, DeadLetterStatus.ACKNOWLEDGED)  # noqa: E731
    await lost(proxy, "findAndModify", resolve)

    assert await resolve() is None, "conditional on AWAITING_INTERVENTION"
    stored = await store.get_dead_letter(first.id)
    assert stored is not None and stored.status is DeadLetterStatus.ACKNOWLEDGED
    assert await store.add_dead_letter(letter()) is True, "its key is taken over"


async def test_lost_ack__a_lease_acquired_or_renewed_again_is_the_holders(
    proxy: FaultProxy, store: MongoSchedulerStorage
) -> None:
    acquire = lambda: store.acquire_lease("scheduler/s", "a/1", timedelta(seconds=30))  # noqa: E731
    await lost(proxy, "insert", acquire)
    taken = await acquire()
    await lost(proxy, "update", acquire)
    renewed = await acquire()

    assert taken is not None and renewed is not None
    assert (renewed.holder, renewed.acquired_at) == ("a/1", taken.acquired_at)
    assert await store.acquire_lease("scheduler/s", "b/1", timedelta(seconds=30)) is None


@pytest.mark.parametrize("refuse", [True, False], ids=["refused", "black-holed"])
async def test_partition__is_unavailable_within_the_deadline_and_ends_with_it(
    proxy: FaultProxy, store: MongoSchedulerStorage, refuse: bool
) -> None:
    entry, run = queued()
    await store.enqueue(entry, run)
    proxy.partition(4.0, refuse=refuse)

    began = time.monotonic()
    with pytest.raises(StorageUnavailableError):
        await store.claim_due(SCOPE)
    assert time.monotonic() - began < 4.0 + 2 * FAST["socketTimeoutMS"] / 1000

    proxy.heal()
    assert [e.id for e in await eventually_claimed(store)] == [entry.id]


async def eventually_claimed(store: MongoSchedulerStorage, seconds: float = 15.0) -> list[Any]:
    """The driver finds the server again within its next heartbeat checks."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            return await store.claim_due(SCOPE)
        except StorageUnavailableError:
            await asyncio.sleep(0.2)
    return []


async def test_reset__a_half_written_requeue_written_again_starts_its_run_once(
    proxy: FaultProxy, store: MongoSchedulerStorage
) -> None:
    """Issue 36, item 7: a dead letter's requeue whose entry was written and whose run was
    not (the connection reset before the run's write), requeued again, leaves two entries
    naming one run; the dispatcher starts it once and cancels the other entry."""
    from choreography_ray.scheduler.core import SchedulerCore
    from choreography_ray.scheduler.options import SchedulerOptions
    from tests.unit.scheduler.harness import Clock, FakeJobs

    jobs = FakeJobs(Clock())
    core = SchedulerCore(SCOPE, store, jobs, SchedulerOptions(), holder="actor/0001")
    await core.start(loops=False)
    new = Manifest(scope=SCOPE, name="m", job_type="pkg.jobs:J", schedule=Every.hours(1),
                   enabled=False)  # fmt: skip
    await store.upsert_manifest(new, ())
    dead = letter()
    assert await store.add_dead_letter(dead)

    proxy.reset("update")  # the run's write, after its entry's insert
    with pytest.raises(StorageUnavailableError):
        await core.requeue(dead.id)
    assert proxy.hits == [("reset", "update")]
    assert await store.get_run(dead.id) is None
    assert await core.requeue(dead.id) == dead.id  # written again: a second entry, the run
    assert len(await store.queued_entries(SCOPE, "m")) == 2

    await core.dispatch_due()

    assert len(jobs.attempts) == 1
    statuses = sorted(e.status.value for e in [await store.get_entry(e) for e in
                      await _entry_ids(store)] if e is not None)  # fmt: skip
    assert statuses == [WorkStatus.CANCELLED.value, WorkStatus.DISPATCHED.value]
    started = await store.get_run(dead.id)
    assert started is not None and started.status is RunStatus.RUNNING


async def _entry_ids(store: MongoSchedulerStorage) -> list[str]:
    docs = await store._run(lambda db: list(db.work_queue.find({}, {"_id": 1})))
    return [str(d["_id"]) for d in docs]

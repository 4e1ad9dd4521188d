"""The scheduler storage contract, issue 36's part, on memory, SQLite and MongoDB: writes fenced
by the scope's lease, a dead letter's resolution kept through its cleanup, runs deleted with
their decisions, checkpoints and entries, a claimed entry cancelled or given back its
attempt, claims in due order, and SQLite's clock read without the write lock."""

from __future__ import annotations

import asyncio
import sqlite3
from datetime import timedelta

import pytest

from choreography_ray.errors import SchedulerError, SchedulerOperationError
from choreography_ray.model import StageShape
from choreography_ray.scheduler.records import Checkpoint, DeadLetter, Decision
from choreography_ray.scheduler.status import DeadLetterStatus, RunStatus, WorkStatus
from choreography_ray.storage import Storage
from choreography_ray.storage.scheduler import SchedulerStorage, scheduler_storage
from tests.storage.test_scheduler_contract import SCOPE, manifest, queued

LEASE = "scheduler/s"


@pytest.fixture
def sched(storage: Storage) -> SchedulerStorage:
    return scheduler_storage(storage)


# --- item 5: the lease fences every write ----------------------------------------------------


async def test_fenced__a_holder_writes_until_a_successor_takes_its_lease(
    sched: SchedulerStorage,
) -> None:
    ttl = timedelta(seconds=30)
    assert await sched.acquire_lease(LEASE, "actor/0001", ttl) is not None
    before = sched.fenced(LEASE, "actor/0001")
    assert (await before.enqueue(*queued("a"))).entry is not None

    assert await sched.acquire_lease(LEASE, "actor/0002", ttl) is not None  # a restart
    entry, run = queued("b")
    writes = [
        lambda: before.enqueue(entry, run),
        lambda: before.save_run(run),
        lambda: before.upsert_manifest(manifest("b"), ()),
        lambda: before.claim_due(SCOPE),
        lambda: before.add_dead_letter(
            DeadLetter(scope=SCOPE, manifest="b", retry_count_at_dead_letter=1, reason="r")
        ),
        lambda: before.delete_runs([run.id]),
    ]
    for write in writes:
        with pytest.raises(SchedulerOperationError) as refused:
            await write()
        assert refused.value.error is SchedulerError.NOT_LOCK_HOLDER
    assert await sched.get_run(run.id) is None
    assert [e.manifest for e in await sched.queued_entries(SCOPE)] == ["a"]
    assert await sched.list_dead_letters(SCOPE) == []
    assert await before.get_run(run.id) is None  # reads are not fenced

    after = sched.fenced(LEASE, "actor/0002")
    assert (await after.enqueue(entry, run)).entry is not None


async def test_fenced__an_expired_lease_fences_its_holder(sched: SchedulerStorage) -> None:
    assert await sched.acquire_lease(LEASE, "h", timedelta(milliseconds=50)) is not None
    fenced = sched.fenced(LEASE, "h")
    await asyncio.sleep(0.2)
    with pytest.raises(SchedulerOperationError):
        await fenced.enqueue(*queued())
    assert await sched.queued_entries(SCOPE) == []
    with pytest.raises(SchedulerOperationError):  # no lease at all
        await sched.fenced("scheduler/other", "h").save_run(queued()[1])


# --- item 1: the cleanup keeps each manifest's latest resolution -----------------------------


async def test_cleanup__keeps_each_manifests_latest_resolution_of_each_kind(
    sched: SchedulerStorage,
) -> None:
    def letter(name: str = "m") -> DeadLetter:
        return DeadLetter(scope=SCOPE, manifest=name, retry_count_at_dead_letter=4, reason="r")

    resolved = []
    for name, status in [
        ("m", DeadLetterStatus.RETRIED),
        ("m", DeadLetterStatus.ACKNOWLEDGED),
        ("m", DeadLetterStatus.RETRIED),
        ("m", DeadLetterStatus.ACKNOWLEDGED),
        ("n", DeadLetterStatus.ACKNOWLEDGED),
    ]:
        new = letter(name)
        assert await sched.add_dead_letter(new)
        done = await sched.resolve_dead_letter(new.id, status, "seen")
        assert done is not None and done.resolved_at is not None
        resolved.append(done)
        await asyncio.sleep(0.002)  # resolved at distinct instants
    last = max(d.resolved_at for d in resolved if d.resolved_at is not None)

    assert await sched.remove_resolved_dead_letters(last + timedelta(days=1)) == 2

    left = {d.id for d in await sched.list_dead_letters(SCOPE)}
    assert left == {resolved[2].id, resolved[3].id, resolved[4].id}
    assert await sched.remove_resolved_dead_letters(last + timedelta(days=1)) == 0


# --- item 11: runs deleted with what is theirs ------------------------------------------------


async def test_delete_runs__with_their_decisions_checkpoints_and_entries(
    sched: SchedulerStorage,
) -> None:
    runs = {}
    for name in ("doomed", "kept", "waiting"):
        entry, run = queued(name)
        runs[name] = (entry, run.model_copy(update={"entry_id": entry.id}))
        await sched.enqueue(*runs[name])
        decision = Decision(run_id=run.id, scope=SCOPE, manifest=name, question="q",
                            state_hash="h", answer=1)  # fmt: skip
        await sched.record_decision(decision)
        await sched.save_checkpoint(Checkpoint(
            run_id=run.id, scope=SCOPE, manifest=name, stage=0,
            layout=(StageShape(stage=0, steps=1),),
        ))  # fmt: skip
        if name != "waiting":
            assert [e.id for e in await sched.claim_due(SCOPE)] == [entry.id]

    doomed, waiting = runs["doomed"][1].id, runs["waiting"][1].id
    assert await sched.delete_runs([doomed, waiting, "no-such-run"]) == 2

    for name in ("doomed", "waiting"):
        assert await sched.get_run(runs[name][1].id) is None
        assert await sched.list_decisions(runs[name][1].id) == []
        assert await sched.list_checkpoints(runs[name][1].id) == []
    assert await sched.get_entry(runs["doomed"][0].id) is None
    assert await sched.get_entry(runs["waiting"][0].id) is not None, "a queued entry stays"
    kept_entry, kept = runs["kept"]
    assert await sched.get_run(kept.id) == kept
    assert len(await sched.list_decisions(kept.id)) == 1
    assert len(await sched.list_checkpoints(kept.id)) == 1
    assert await sched.get_entry(kept_entry.id) is not None
    assert await sched.delete_runs([]) == 0


# --- items 4, 7, 9: a claimed entry cancelled, or given its attempt back ---------------------


async def test_cancel_entry__a_claimed_entry_with_claimed(sched: SchedulerStorage) -> None:
    entry, run = queued()
    await sched.enqueue(entry, run)
    await sched.claim_due(SCOPE)
    assert not await sched.cancel_entry(entry.id)  # not queued
    cancelled = run.model_copy(update={"status": RunStatus.CANCELLED})
    assert await sched.cancel_entry(entry.id, cancelled, claimed=True)
    stored = await sched.get_entry(entry.id)
    assert stored is not None and stored.status is WorkStatus.CANCELLED
    assert (await sched.get_run(run.id)) == cancelled
    assert not await sched.cancel_entry(entry.id, claimed=True)


async def test_requeue_dispatch__without_counting_the_attempt(sched: SchedulerStorage) -> None:
    entry, run = queued()
    await sched.enqueue(entry, run)
    (claimed,) = await sched.claim_due(SCOPE)
    assert claimed.dispatch_attempts == 1
    back = await sched.requeue_dispatch(entry.id, timedelta(0), count_attempt=False)
    assert back is not None and back.status is WorkStatus.QUEUED
    assert back.dispatch_attempts == 0 and back.scheduled_at is None
    (again,) = await sched.claim_due(SCOPE)
    assert again.dispatch_attempts == 1


# --- also: claims in due order; SQLite's clock --------------------------------------------------


async def test_claim__in_due_order_not_creation_order(sched: SchedulerStorage) -> None:
    """A retry queued first with a delay is due after an entry queued later at once."""
    delayed, delayed_run = queued("a")
    await sched.enqueue(delayed, delayed_run, timedelta(milliseconds=300))
    await asyncio.sleep(0.01)
    at_once, at_once_run = queued("b")
    await sched.enqueue(at_once, at_once_run)
    await asyncio.sleep(0.4)  # both due now

    (first,) = await sched.claim_due(SCOPE, limit=1)
    (second,) = await sched.claim_due(SCOPE, limit=1)

    assert [first.id, second.id] == [at_once.id, delayed.id]


async def test_now__sqlite_reads_its_clock_without_the_write_lock(
    sched: SchedulerStorage, provider: str, storage_url: str
) -> None:
    if provider != "sqlite":
        pytest.skip("SQLite's write lock")
    await sched.now()  # the tables laid out
    other = sqlite3.connect(storage_url.removeprefix("sqlite:///"), isolation_level=None)
    other.execute("BEGIN IMMEDIATE")  # another process's write transaction holds the lock
    try:
        assert await asyncio.wait_for(sched.now(), 2)
    finally:
        other.execute("ROLLBACK")
        other.close()

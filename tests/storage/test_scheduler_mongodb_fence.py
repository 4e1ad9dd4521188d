"""Issue 36, item 5 on MongoDB: a fenced write carries the lease's token, checked in the same
write, so a holder that lost the lease cannot overwrite what its successor wrote.

MongoDB's fence reads the lease just before each write (no transaction holds the two together):
a takeover in the round trip between the read and the write is a race no test can cause for
real. Each test here makes it by hand: the predecessor's lease read, from the takeover on,
returns the lease as the predecessor read it just before the takeover (its read passed), and
its write is then sent after the successor's. The stored document's fence (the successor's
higher token) refuses it, with NOT_LOCK_HOLDER.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from datetime import timedelta
from typing import Any

import pytest

from choreography_ray.errors import (
    SchedulerError,
    SchedulerOperationError,
    StorageUnavailableError,
)
from choreography_ray.model import StageShape
from choreography_ray.scheduler.records import (
    Checkpoint,
    Manifest,
    ManifestRun,
    SchedulerLease,
    WorkEntry,
)
from choreography_ray.scheduler.schedules import Every
from choreography_ray.scheduler.status import RunStatus, WorkStatus
from choreography_ray.storage.mongodb import MongoStorage
from choreography_ray.storage.scheduler import SchedulerStorage
from choreography_ray.storage.scheduler import mongodb as provider
from choreography_ray.storage.scheduler import mongodb_docs as docs
from choreography_ray.storage.scheduler.mongodb import MongoSchedulerStorage
from tests.mongo_proxy import FaultProxy

pytestmark = [pytest.mark.mongodb, pytest.mark.timeout(60)]

SCOPE = "s"
NAME = f"scheduler/{SCOPE}"
BEFORE, AFTER = "actor-1/0001", "actor-1/0002"  # an incarnation and its successor
TTL = timedelta(seconds=30)


@pytest.fixture
def store(proxied_storage: MongoStorage) -> MongoSchedulerStorage:
    return MongoSchedulerStorage(proxied_storage)


class TakenOver:
    """The predecessor's and the successor's fenced storages, the lease taken over between."""

    def __init__(self, store: MongoSchedulerStorage, read_before: SchedulerLease) -> None:
        self.before = store.fenced(NAME, BEFORE)
        self.after = store.fenced(NAME, AFTER)
        self._read_before = read_before

    @contextmanager
    def read_passed(self, monkeypatch: pytest.MonkeyPatch) -> Iterator[SchedulerStorage]:
        """The predecessor, whose lease read returns what it read before the takeover."""
        parse = docs._parse

        def as_read_before(model: type[Any], collection: str, doc: Any) -> Any:
            if collection == "scheduler_locks":
                return self._read_before
            return parse(model, collection, doc)

        with monkeypatch.context() as patch:
            patch.setattr(provider, "_parse", as_read_before)
            yield self.before


async def take_over(store: MongoSchedulerStorage) -> TakenOver:
    assert await store.acquire_lease(NAME, BEFORE, TTL) is not None
    read_before = await store.get_lease(NAME)
    assert read_before is not None
    assert await store.acquire_lease(NAME, AFTER, TTL) is not None
    return TakenOver(store, read_before)


@pytest.fixture
def taken(store: MongoSchedulerStorage, runner: asyncio.Runner) -> TakenOver:
    return runner.run(take_over(store))


def queued(name: str = "m") -> tuple[WorkEntry, ManifestRun]:
    run = ManifestRun(scope=SCOPE, manifest=name, job_type="pkg.jobs:J")
    return WorkEntry(scope=SCOPE, manifest=name, run_id=run.id), run


async def refused(write: Callable[[], Awaitable[object]]) -> None:
    with pytest.raises(SchedulerOperationError) as raised:
        await write()
    assert raised.value.error is SchedulerError.NOT_LOCK_HOLDER


async def test_fence__a_predecessor_whose_read_passed_cannot_overwrite_the_successors_run(
    taken: TakenOver, monkeypatch: pytest.MonkeyPatch
) -> None:
    run = ManifestRun(scope=SCOPE, manifest="m", job_type="pkg.jobs:J")
    ended = run.model_copy(update={"status": RunStatus.SUCCEEDED})
    await taken.after.save_run(ended)

    with taken.read_passed(monkeypatch) as before:
        await refused(lambda: before.save_run(run.model_copy(update={"status": RunStatus.FAILED})))

    assert await taken.after.get_run(run.id) == ended


async def test_fence__a_predecessor_whose_read_passed_cannot_overwrite_the_successors_manifest(
    taken: TakenOver, monkeypatch: pytest.MonkeyPatch
) -> None:
    new = Manifest(scope=SCOPE, name="m", job_type="pkg.jobs:J", schedule=Every.hours(1),
                   max_retries=5)  # fmt: skip
    stored = await taken.after.upsert_manifest(new, {"max_retries"})
    old = new.model_copy(update={"job_type": "pkg.jobs:Old", "max_retries": 1})

    with taken.read_passed(monkeypatch) as before:
        await refused(lambda: before.upsert_manifest(old, {"max_retries"}))

    assert await taken.after.get_manifest(SCOPE, "m") == stored


@pytest.mark.parametrize(
    "write",
    [
        pytest.param(lambda s, e: s.cancel_entry(e.id), id="cancel"),
        pytest.param(lambda s, e: s.release(e.id, clear_link=True), id="release"),
    ],
)
async def test_fence__a_predecessor_whose_read_passed_cannot_change_the_successors_entry(
    taken: TakenOver, monkeypatch: pytest.MonkeyPatch, write: Any
) -> None:
    entry, run = queued()
    done = await taken.after.enqueue(entry, run, delay=timedelta(hours=1))
    assert done.entry is not None

    with taken.read_passed(monkeypatch) as before:
        await refused(lambda: write(before, entry))

    assert await taken.after.get_entry(entry.id) == done.entry


async def test_fence__a_predecessor_whose_read_passed_cannot_claim_the_successors_entry(
    taken: TakenOver, monkeypatch: pytest.MonkeyPatch
) -> None:
    entry, run = queued()
    assert (await taken.after.enqueue(entry, run)).entry is not None

    with taken.read_passed(monkeypatch) as before:
        await refused(lambda: before.claim_due(SCOPE))

    stored = await taken.after.get_entry(entry.id)
    assert stored is not None and stored.status is WorkStatus.QUEUED
    assert [e.id for e in await taken.after.claim_due(SCOPE)] == [entry.id]


async def test_fence__a_predecessor_whose_read_passed_cannot_overwrite_the_successors_checkpoint(
    taken: TakenOver, monkeypatch: pytest.MonkeyPatch
) -> None:
    checkpoint = Checkpoint(run_id="r", scope=SCOPE, manifest="m", stage=1,
                            layout=(StageShape(stage=1, steps=2),))  # fmt: skip
    await taken.after.save_checkpoint(checkpoint)
    other = checkpoint.model_copy(update={"layout": (StageShape(stage=1, steps=3),)})

    with taken.read_passed(monkeypatch) as before:
        await refused(lambda: before.save_checkpoint(other))

    assert await taken.after.list_checkpoints("r") == [checkpoint]


async def test_fence__the_window_left_a_document_the_successor_has_not_written(
    taken: TakenOver, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What the token does not cover (docs/decisions.md): a document the successor has not
    written yet carries no higher fence, so the predecessor's write in its one round trip
    lands. The successor's next write of it wins."""
    run = ManifestRun(scope=SCOPE, manifest="m", job_type="pkg.jobs:J")

    with taken.read_passed(monkeypatch) as before:
        await before.save_run(run)

    assert await taken.after.get_run(run.id) == run
    ended = run.model_copy(update={"status": RunStatus.SUCCEEDED})
    await taken.after.save_run(ended)
    assert await taken.after.get_run(run.id) == ended


async def test_fence__the_token_goes_on_from_a_released_lease(
    store: MongoSchedulerStorage,
) -> None:
    """A lease released is deleted: the next one inserted goes on from its token, not from 1,
    or a predecessor's token could equal its successor's."""
    first = await store.acquire_lease(NAME, "a", TTL)
    assert first is not None and first.token == 1
    taken = await store.acquire_lease(NAME, "b/0002", TTL)
    assert taken is None  # "a" holds it, and "b" is not its successor
    assert await store.release_lease(NAME, "a")
    again = await store.acquire_lease(NAME, "b/0002", TTL)
    assert again is not None and again.token == 2


async def test_fence__a_fenced_write_whose_reply_was_lost_is_written_again(
    proxy: FaultProxy, store: MongoSchedulerStorage
) -> None:
    """The holder's own stamp is no higher than its token: written again, it matches."""
    assert await store.acquire_lease(NAME, BEFORE, TTL) is not None
    holder = store.fenced(NAME, BEFORE)
    run = ManifestRun(scope=SCOPE, manifest="m", job_type="pkg.jobs:J")
    new = Manifest(scope=SCOPE, name="m", job_type="pkg.jobs:J", schedule=Every.hours(1))
    for write in (lambda: holder.save_run(run), lambda: holder.upsert_manifest(new, ())):
        proxy.drop_reply("update")
        with pytest.raises(StorageUnavailableError):
            await write()
        await write()

    assert await store.get_run(run.id) == run
    assert await store.list_manifests(SCOPE) == [new]

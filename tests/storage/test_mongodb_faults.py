"""The MongoDB provider under the faults of a real socket, through `tests.mongo_proxy`: a lost
acknowledgement of each kind of write the runtime makes, a reset, a partition, a half-open
connection and latency. What each test shows is in docs/storage.md, "MongoDB under faults".

A lost acknowledgement here is for real: the proxy forwards the request, the server applies it,
and the reply is dropped with the connection. nx-27017 and a standalone `mongod` do not retry
writes (pymongo's retryable writes need a replica set), so the error reaches the provider's
caller, which writes again; with a replica set pymongo retries once itself. Either way the
second write must change nothing the first did.
"""

from __future__ import annotations

import asyncio
import time

import pytest

from choreography_ray.errors import ConcurrencyError, DuplicateRecordError, StorageUnavailableError
from choreography_ray.model import JobState, Lease, StatusChange, StepState, utcnow
from choreography_ray.status import JobStatus, StepStatus
from choreography_ray.storage import CountedKind, LeaseRenewal, StepUpdate, StoredOutput
from choreography_ray.storage.mongodb import MongoStorage, _client_options
from tests.mongo_proxy import SHORT_DEADLINES, FaultProxy

pytestmark = [pytest.mark.mongodb, pytest.mark.timeout(60)]

FAST = SHORT_DEADLINES


@pytest.fixture
def store(proxied_storage: MongoStorage) -> MongoStorage:
    return proxied_storage


def job(version: int = 0) -> JobState:
    return JobState(id="j1", scope="s", namespace="n", type="pkg:Job", version=version)


def steps(*ids: str) -> list[StepState]:
    return [StepState(job_id="j1", step_id=i, type="pkg:Step") for i in ids]


async def lost_then_again(proxy: FaultProxy, command: str, write: object) -> Exception | None:
    """`write()` with its reply lost (an unavailable error), then again: the second's error."""
    proxy.drop_reply(command)
    with pytest.raises(StorageUnavailableError):
        await write()  # type: ignore[operator]
    assert proxy.hits == [("drop_reply", command)]
    try:
        await write()  # type: ignore[operator]
    except Exception as error:
        return error
    return None


async def test_lost_ack__an_outcome_written_again_is_stored_once(
    proxy: FaultProxy, store: MongoStorage
) -> None:
    await store.insert_steps(steps("a", "b"))
    change = StatusChange(status=StepStatus.FAILED, exception_messages=("boom",))
    update = [StepUpdate("j1", s, StepStatus.FAILED, 1, None, change, "boom") for s in "ab"]

    assert await lost_then_again(proxy, "update", lambda: store.update_steps(update)) is None

    for step in (await store.get_steps("j1", ["a", "b"])).values():
        assert (step.status, step.attempt, step.failure_signature) == (StepStatus.FAILED, 1, "boom")
        assert step.status_changes == (change,), "the change is recorded once"


async def test_lost_ack__a_created_job_created_again_is_a_duplicate_of_the_same_record(
    proxy: FaultProxy, store: MongoStorage
) -> None:
    error = await lost_then_again(proxy, "insert", lambda: store.create_job(job()))

    assert isinstance(error, DuplicateRecordError)
    stored = await store.get_job("j1")
    assert stored is not None and stored.version == 1


async def test_lost_ack__a_save_written_again_is_refused_and_the_first_is_stored(
    proxy: FaultProxy, store: MongoStorage
) -> None:
    """A save is conditional on the version: the second finds its own first save, which is
    what the job activation's read-back adopts (`job_record.save`)."""
    created = await store.create_job(job())
    running = created.with_status(JobStatus.RUNNING)

    error = await lost_then_again(proxy, "update", lambda: store.save_job(running))

    assert isinstance(error, ConcurrencyError)
    stored = await store.get_job("j1")
    assert stored is not None
    assert (stored.version, stored.status) == (created.version + 1, JobStatus.RUNNING)


async def test_lost_ack__counted_records_and_deletes_written_again_change_nothing(
    proxy: FaultProxy, store: MongoStorage
) -> None:
    await store.insert_steps(steps("a", "b", "c"))
    add = lambda: store.add_counted("j1", CountedKind.COMPLETED, ["a", "b"])  # noqa: E731
    delete = lambda: store.delete_steps("j1", ["a"])  # noqa: E731

    assert await lost_then_again(proxy, "insert", add) is None
    proxy.hits.clear()
    assert await lost_then_again(proxy, "delete", delete) is None

    assert await store.list_counted("j1", CountedKind.COMPLETED) == ["a", "b"]
    assert sorted(await store.get_steps("j1", ["a", "b", "c"])) == ["b", "c"]


async def test_lost_ack__outputs_written_again_are_one_record_per_step(
    proxy: FaultProxy, store: MongoStorage
) -> None:
    outputs = [StoredOutput("j1", s, 0, 1, f'{{"step": "{s}"}}') for s in "ab"]

    assert await lost_then_again(proxy, "update", lambda: store.put_outputs(outputs)) is None

    assert await store.list_outputs("j1") == outputs
    assert await store.count_outputs("j1") == 2


async def test_lost_ack__a_lease_renewal_written_again_renews_the_same_steps(
    proxy: FaultProxy, store: MongoStorage
) -> None:
    await store.insert_steps(steps("a"))
    await store.update_steps([StepUpdate("j1", "a", StepStatus.RUNNING, 1)])
    lease = Lease(silo="node", activation="host#1", heartbeat=utcnow())
    renew = lambda: store.renew_leases([LeaseRenewal("j1", "a", 1, lease)])  # noqa: E731

    proxy.drop_reply("update")
    with pytest.raises(StorageUnavailableError):
        await renew()
    assert await renew() == 1

    stored = await store.get_step("j1", "a")
    assert stored is not None and stored.lease == lease


async def test_reset__a_write_never_forwarded_is_unavailable_and_goes_through_again(
    proxy: FaultProxy, store: MongoStorage
) -> None:
    await store.insert_steps(steps("a"))
    proxy.reset("update")
    with pytest.raises(StorageUnavailableError):
        await store.update_steps([StepUpdate("j1", "a", StepStatus.RUNNING, 1)])
    assert (await store.get_step("j1", "a")).status is StepStatus.SCHEDULED  # type: ignore[union-attr]

    await store.update_steps([StepUpdate("j1", "a", StepStatus.RUNNING, 1)])
    assert (await store.get_step("j1", "a")).status is StepStatus.RUNNING  # type: ignore[union-attr]


@pytest.mark.parametrize("refuse", [True, False], ids=["refused", "black-holed"])
async def test_partition__is_unavailable_within_the_deadline_and_ends_with_it(
    proxy: FaultProxy, store: MongoStorage, refuse: bool
) -> None:
    await store.create_job(job())
    proxy.partition(4.0, refuse=refuse)

    began = time.monotonic()
    with pytest.raises(StorageUnavailableError):
        await store.get_job("j1")
    assert time.monotonic() - began < 4.0 + 2 * FAST["socketTimeoutMS"] / 1000

    proxy.heal()
    assert await eventually_read(store), "the job is read again once the partition ends"


async def eventually_read(store: MongoStorage, seconds: float = 15.0) -> bool:
    """The driver finds the server again within its next heartbeat checks."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            return await store.get_job("j1") is not None
        except StorageUnavailableError:
            await asyncio.sleep(0.2)
    return False


async def test_half_open__a_connection_that_never_answers_fails_at_its_deadline(
    proxy: FaultProxy, store: MongoStorage
) -> None:
    await store.create_job(job())
    proxy.hang("find", times=2)  # a read is retried once (retryReads)

    began = time.monotonic()
    with pytest.raises(StorageUnavailableError):
        await store.get_job("j1")
    assert time.monotonic() - began < 3 * FAST["socketTimeoutMS"] / 1000 + 1

    assert (await store.get_job("j1")) is not None


async def test_latency__every_operation_still_answers(
    proxy: FaultProxy, store: MongoStorage
) -> None:
    proxy.latency = 0.05
    await store.create_job(job())
    await store.insert_steps(steps("a"))
    await store.update_steps([StepUpdate("j1", "a", StepStatus.RUNNING, 1)])
    assert (await store.get_step("j1", "a")).status is StepStatus.RUNNING  # type: ignore[union-attr]


def test_client_options__a_socket_deadline_unless_the_url_sets_one() -> None:
    assert _client_options("mongodb://h/db")["socketTimeoutMS"] > 0
    assert "socketTimeoutMS" not in _client_options("mongodb://h/db?sockettimeoutms=5")

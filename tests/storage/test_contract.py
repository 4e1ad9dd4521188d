"""The storage contract: the same suite on every provider (memory, SQLite, MongoDB).

`storage` is parametrized in conftest.py; tests that need one provider say so in their name.
"""

from __future__ import annotations

import asyncio
import json
import os
import pickle
import random
import sqlite3
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from choreography_ray.errors import (
    ConcurrencyError,
    CorruptRecordError,
    DuplicateRecordError,
    StorageUnavailableError,
)
from choreography_ray.failures import failure_signature
from choreography_ray.model import (
    JobProgress,
    JobsManagerKey,
    JobState,
    Lease,
    ResumeAfter,
    StageProgress,
    StageShape,
    StatusChange,
    StepState,
)
from choreography_ray.status import JobStatus, StepStatus
from choreography_ray.storage import (
    CountedKind,
    JobCounts,
    JobCursor,
    JobFilter,
    LeaseRenewal,
    PlannedStep,
    StepUpdate,
    Storage,
    StoredOutput,
    StoredStart,
    open_storage,
    redact_url,
)
from choreography_ray.storage.memory import MemoryStorage
from choreography_ray.storage.sqlite import PAGE_SIZE, WAL_AUTOCHECKPOINT_BYTES, SqliteStorage
from tests.fixtures import build_oldest_sqlite

T0 = datetime(2020, 1, 2, 3, 4, 5, 678901, tzinfo=UTC)
COMPLETED, STOPPED = CountedKind.COMPLETED, CountedKind.STOPPED
SCHEDULED, RUNNING, FAILED = StepStatus.SCHEDULED, StepStatus.RUNNING, StepStatus.FAILED
UNREACHABLE = StepStatus.UNREACHABLE


def job(job_id: str, *, scope: str = "s", namespace: str = "n", **fields: object) -> JobState:
    return JobState.model_validate(
        {"id": job_id, "scope": scope, "namespace": namespace, "type": "pkg.Job", **fields}
    )


def step(job_id: str, step_id: str, **fields: object) -> StepState:
    return StepState.model_validate(
        {"job_id": job_id, "step_id": step_id, "type": "pkg.Step", **fields}
    )


def lease(activation: str = "host-1#1") -> Lease:
    return Lease(silo="node-1", activation=activation, heartbeat=T0)


# --- jobs ------------------------------------------------------------------------------------


async def test_create_job__stored_at_version_1_and_read_back_equal(storage: Storage) -> None:
    progress = JobProgress(total_steps=3, failed_steps=1, stages=(StageProgress(stage=0),))
    new = job("j1", status=JobStatus.RUNNING, created=T0, progress=progress, stage=1,
              request={"n": 3, "nested": {"a": [1, "x"]}}, has_plan=True, error=None)  # fmt: skip
    new = new.with_status(JobStatus.RUNNING, "why")

    stored = await storage.create_job(new.model_copy(update={"stopped_steps_counted": ("a",)}))

    assert stored.version == 1
    assert stored.stopped_steps_counted == ()
    assert await storage.get_job("j1") == stored
    assert await storage.get_job("missing") is None


async def test_resume_after__stored_and_read_back_then_cleared(storage: Storage) -> None:
    """A start after a checkpoint keeps its `resume_after` through create and save."""
    resume = ResumeAfter(stage=1, layout=(StageShape(stage=0, steps=2),), source="run-1")
    stored = await storage.create_job(job("j1", resume_after=resume))
    assert (await storage.get_job("j1")).resume_after == resume  # type: ignore[union-attr]
    saved = await storage.save_job(stored.model_copy(update={"resume_after": None}))
    assert saved.resume_after is None
    assert (await storage.get_job("j1")).resume_after is None  # type: ignore[union-attr]


async def test_create_job__existing_id_refused(storage: Storage) -> None:
    await storage.create_job(job("j1", type="first"))
    with pytest.raises(DuplicateRecordError):
        await storage.create_job(job("j1", type="second"))
    assert (await storage.get_job("j1")).type == "first"  # type: ignore[union-attr]


async def test_save_job__bumps_version_and_stores_without_counted_lists(storage: Storage) -> None:
    stored = await storage.create_job(job("j1"))
    changed = stored.with_status(JobStatus.STOPPED).model_copy(
        update={"stop_finalized": True, "completed_steps_counted": ("a",)}
    )

    saved = await storage.save_job(changed)

    assert saved.version == 2
    assert saved.completed_steps_counted == ()
    assert await storage.get_job("j1") == saved


async def test_save_job__stale_version_refused_and_record_unchanged(storage: Storage) -> None:
    stored = await storage.create_job(job("j1"))
    winner = await storage.save_job(stored.with_status(JobStatus.RUNNING))

    with pytest.raises(ConcurrencyError):
        await storage.save_job(stored.with_status(JobStatus.FAILED))

    assert await storage.get_job("j1") == winner
    with pytest.raises(ConcurrencyError):
        await storage.save_job(job("never-created", version=1))


async def test_list_jobs__by_key_and_status(storage: Storage) -> None:
    await storage.create_job(job("a", status=JobStatus.RUNNING))
    await storage.create_job(job("b", status=JobStatus.FAILED))
    await storage.create_job(job("c", namespace="other", status=JobStatus.RUNNING))

    assert {j.id for j in await storage.list_jobs("s", "n")} == {"a", "b"}
    assert [j.id for j in await storage.list_jobs("s", "n", JobStatus.RUNNING)] == ["a"]
    assert await storage.list_jobs("s", "nobody") == []


async def test_count_jobs__of_one_key_in_the_statuses_asked_for(storage: Storage) -> None:
    """The jobs gauge's query: one key, some statuses (`count_jobs_by_type_and_status`)."""
    running, stopped, failed = JobStatus.RUNNING, JobStatus.STOPPED, JobStatus.FAILED
    await storage.create_job(job("a1", type="pkg.mod:A", status=running))
    await storage.create_job(job("a2", type="pkg.mod:A", status=running))
    await storage.create_job(job("a3", type="pkg.mod:A", status=stopped, stop_finalized=True))
    await storage.create_job(job("b1", type="pkg.mod:B", status=running))
    await storage.create_job(job("b2", type="pkg.mod:B", status=failed))
    await storage.create_job(job("c1", type="pkg.mod:A", namespace="other", status=running))

    async def count(namespace: str, *statuses: JobStatus) -> JobCounts:
        where = JobFilter(scope="s", namespace=namespace, statuses=frozenset(statuses))
        return await storage.count_jobs_by_type_and_status(where)

    assert await count("n", running, stopped) == {
        ("pkg.mod:A", running): 2,
        ("pkg.mod:A", stopped): 1,
        ("pkg.mod:B", running): 1,
    }
    assert await count("n", failed) == {("pkg.mod:B", failed): 1}
    assert await count("n") == {}
    assert await count("nobody", running) == {}


async def test_jobs_excluding_finalized_stops__leaves_out_only_finalized_stops_oldest_first(
    storage: Storage,
) -> None:
    def at(minutes: int) -> datetime:
        return T0 + timedelta(minutes=minutes)

    await storage.create_job(job("finalized", status=JobStatus.STOPPED, stop_finalized=True))
    await storage.create_job(job("removing", status=JobStatus.REMOVING, created=at(3)))
    await storage.create_job(job("stopping", status=JobStatus.STOPPED, created=at(1)))
    await storage.create_job(job("running", status=JobStatus.RUNNING, created=at(2)))
    await storage.create_job(job("elsewhere", scope="t", status=JobStatus.RUNNING))
    # A stop finalized on a REMOVING job does not hide it: only STOPPED + finalized is left out.
    await storage.create_job(
        job("removing-final", status=JobStatus.REMOVING, stop_finalized=True, created=at(4))
    )

    found = await storage.get_jobs_excluding_finalized_stops("s", "n")

    assert [j.id for j in found] == ["stopping", "running", "removing", "removing-final"]


async def test_unsettled_jobs__live_and_unfinished_stops_oldest_first(storage: Storage) -> None:
    def at(minutes: int) -> datetime:
        return T0 + timedelta(minutes=minutes)

    await storage.create_job(job("finalized", status=JobStatus.STOPPED, stop_finalized=True))
    await storage.create_job(job("succeeded", status=JobStatus.COMPLETED_SUCCESSFULLY))
    await storage.create_job(job("with-failures", status=JobStatus.COMPLETED_WITH_FAILURES))
    await storage.create_job(job("failed", status=JobStatus.FAILED))
    await storage.create_job(job("never-started", status=JobStatus.NONE))
    await storage.create_job(job("elsewhere", scope="t", status=JobStatus.RUNNING))
    await storage.create_job(job("removing", status=JobStatus.REMOVING, stop_finalized=True,
                                 created=at(6)))  # fmt: skip
    await storage.create_job(job("stopping", status=JobStatus.STOPPED, created=at(5)))
    await storage.create_job(job("running", status=JobStatus.RUNNING, created=at(4)))
    await storage.create_job(job("starting", status=JobStatus.STARTING_STEPS, created=at(3)))
    await storage.create_job(job("steps", status=JobStatus.PREPARING_STEPS, created=at(2)))
    await storage.create_job(job("preparing", status=JobStatus.PREPARING_JOB, created=at(1)))

    found = await storage.list_unsettled_jobs("s", "n")

    assert [j.id for j in found] == [
        "preparing", "steps", "starting", "running", "stopping", "removing",
    ]  # fmt: skip
    assert found[3] == await storage.get_job("running")
    assert [j.id for j in await storage.list_unsettled_jobs("t", "n")] == ["elsewhere"]
    assert await storage.list_unsettled_jobs("s", "other") == []


async def _seed_listing(storage: Storage) -> None:
    """Eight jobs a minute apart (j0 oldest); two share j4's created instant, so the id breaks
    the tie; two types, two scopes, three statuses."""
    for n in range(8):
        created = T0 + timedelta(minutes=min(n, 4) if n in (4, 5) else n)
        await storage.create_job(job(
            f"j{n}", scope="t" if n % 4 == 3 else "s",
            type="pkg:Other" if n % 3 == 0 else "pkg:Job",
            status=(JobStatus.RUNNING, JobStatus.FAILED, JobStatus.STOPPED)[n % 3],
            created=created,
        ))  # fmt: skip


async def test_find_jobs__newest_first_with_the_id_breaking_ties(storage: Storage) -> None:
    await _seed_listing(storage)

    found = await storage.find_jobs(JobFilter(), limit=100)

    assert [j.id for j in found] == ["j7", "j6", "j5", "j4", "j3", "j2", "j1", "j0"]
    assert found[0] == await storage.get_job("j7")


async def test_find_jobs__pages_older_and_newer_by_cursor(storage: Storage) -> None:
    await _seed_listing(storage)
    everything = JobFilter()

    first = await storage.find_jobs(everything, limit=3)
    second = await storage.find_jobs(everything, before=JobCursor.of(first[-1]), limit=3)
    last = await storage.find_jobs(everything, before=JobCursor.of(second[-1]), limit=3)
    back = await storage.find_jobs(everything, after=JobCursor.of(last[0]), limit=3)

    assert [[j.id for j in page] for page in (first, second, last, back)] == [
        ["j7", "j6", "j5"], ["j4", "j3", "j2"], ["j1", "j0"], ["j4", "j3", "j2"],
    ]  # fmt: skip
    assert await storage.find_jobs(everything, after=JobCursor.of(first[0])) == []


async def test_find_jobs__filters_by_scope_namespace_status_type_and_creation(
    storage: Storage,
) -> None:
    await _seed_listing(storage)

    async def ids(**fields: object) -> list[str]:
        return [j.id for j in await storage.find_jobs(JobFilter(**fields))]  # type: ignore[arg-type]

    assert await ids(scope="t") == ["j7", "j3"]
    assert await ids(scope="s", namespace="n", type="pkg:Other") == ["j6", "j0"]
    assert await ids(statuses=frozenset({JobStatus.FAILED, JobStatus.STOPPED})) == [
        "j7", "j5", "j4", "j2", "j1",
    ]  # fmt: skip
    assert await ids(created_since=T0 + timedelta(minutes=4)) == ["j7", "j6", "j5", "j4"]
    assert await ids(statuses=frozenset()) == []
    assert await ids(namespace="nobody") == []


async def test_count_jobs_by_type_and_status__counts_what_the_filter_matches(
    storage: Storage,
) -> None:
    await _seed_listing(storage)
    running, failed, stopped = JobStatus.RUNNING, JobStatus.FAILED, JobStatus.STOPPED

    assert await storage.count_jobs_by_type_and_status(JobFilter()) == {
        ("pkg:Other", running): 3, ("pkg:Job", failed): 3, ("pkg:Job", stopped): 2,
    }  # fmt: skip
    assert await storage.count_jobs_by_type_and_status(JobFilter(scope="t")) == {
        ("pkg:Other", running): 1, ("pkg:Job", failed): 1,
    }  # fmt: skip
    since = JobFilter(created_since=T0 + timedelta(minutes=6), statuses=frozenset({running}))
    assert await storage.count_jobs_by_type_and_status(since) == {("pkg:Other", running): 1}
    assert await storage.count_jobs_by_type_and_status(JobFilter(scope="nobody")) == {}


async def test_remove_job(storage: Storage) -> None:
    await storage.create_job(job("j1"))
    await storage.remove_job("j1")
    await storage.remove_job("j1")
    assert await storage.get_job("j1") is None


# --- the cleanup query ---------------------------------------------------------------------


def reached(job_id: str, status: JobStatus, at: datetime, namespace: str = "n") -> JobState:
    """A job that reached `status` at `at` (its last status change), created a day before."""
    history = (StatusChange(status=JobStatus.PREPARING_JOB, occurred=at - timedelta(days=1)),
               StatusChange(status=status, occurred=at))  # fmt: skip
    return job(job_id, namespace=namespace, status=status, created=at - timedelta(days=1),
               status_changes=history)  # fmt: skip


TERMINAL = (JobStatus.COMPLETED_SUCCESSFULLY, JobStatus.COMPLETED_WITH_FAILURES, JobStatus.FAILED)


async def test_list_jobs_for_cleanup__the_keys_jobs_in_the_statuses_reached_before_oldest_first(
    storage: Storage,
) -> None:
    def at(minutes: int) -> datetime:
        return T0 + timedelta(minutes=minutes)

    await storage.create_job(reached("failed-3", JobStatus.FAILED, at(3)))
    await storage.create_job(reached("done-1", JobStatus.COMPLETED_SUCCESSFULLY, at(1)))
    await storage.create_job(reached("failures-2", JobStatus.COMPLETED_WITH_FAILURES, at(2)))
    await storage.create_job(reached("done-2", JobStatus.COMPLETED_SUCCESSFULLY, at(2)))
    await storage.create_job(reached("done-at-cutoff", JobStatus.COMPLETED_SUCCESSFULLY, at(10)))
    await storage.create_job(reached("running", JobStatus.RUNNING, at(0)))
    await storage.create_job(reached("stopped", JobStatus.STOPPED, at(0)))
    await storage.create_job(reached("removing", JobStatus.REMOVING, at(0)))
    await storage.create_job(reached("elsewhere", JobStatus.FAILED, at(0), namespace="other"))

    async def ids(statuses: tuple[JobStatus, ...], limit: int = 100) -> list[str]:
        found = await storage.list_jobs_for_cleanup("s", "n", statuses, at(10), limit)
        return [j.id for j in found]

    # Ties (done-2, failures-2) in id order; the cutoff itself is not before it.
    assert await ids(TERMINAL) == ["done-1", "done-2", "failures-2", "failed-3"]
    assert await ids(TERMINAL, limit=2) == ["done-1", "done-2"]
    assert await ids((JobStatus.FAILED,)) == ["failed-3"]
    assert await ids((JobStatus.RUNNING, JobStatus.STOPPED)) == ["running", "stopped"]
    assert await ids(()) == []
    found = await storage.list_jobs_for_cleanup("s", "n", TERMINAL, at(10), 1)
    assert found == [await storage.get_job("done-1")]


async def test_list_jobs_for_cleanup__measures_from_the_last_status_change_else_created(
    storage: Storage,
) -> None:
    # Created long ago, completed just now: not old. Never changed status: its creation counts.
    await storage.create_job(reached("completed-late", JobStatus.COMPLETED_SUCCESSFULLY,
                                     T0 + timedelta(days=30)))  # fmt: skip
    await storage.create_job(job("unchanged", status=JobStatus.PREPARING_JOB, created=T0))
    cutoff = T0 + timedelta(days=1)
    preparing = (JobStatus.PREPARING_JOB, JobStatus.PREPARING_STEPS)

    assert await storage.list_jobs_for_cleanup("s", "n", TERMINAL, cutoff, 10) == []
    found = await storage.list_jobs_for_cleanup("s", "n", preparing, cutoff, 10)
    assert [j.id for j in found] == ["unchanged"]


async def test_list_jobs_for_cleanup__a_save_moves_the_job_to_its_new_status_and_time(
    storage: Storage,
) -> None:
    stored = await storage.create_job(reached("j1", JobStatus.PREPARING_JOB, T0))
    cutoff = T0 + timedelta(hours=1)
    preparing = (JobStatus.PREPARING_JOB,)
    assert [j.id for j in await storage.list_jobs_for_cleanup("s", "n", preparing, cutoff, 10)] == [
        "j1"
    ]

    await storage.save_job(stored.with_status(JobStatus.FAILED))  # now: not before the cutoff

    assert await storage.list_jobs_for_cleanup("s", "n", preparing, cutoff, 10) == []
    assert await storage.list_jobs_for_cleanup("s", "n", (JobStatus.FAILED,), cutoff, 10) == []
    later = datetime.now(UTC) + timedelta(minutes=1)
    found = await storage.list_jobs_for_cleanup("s", "n", (JobStatus.FAILED,), later, 10)
    assert [j.id for j in found] == ["j1"]


async def test_held__stored_and_read_back(storage: Storage) -> None:
    stored = await storage.create_job(job("j1", held=True))
    assert (await storage.get_job("j1")).held is True  # type: ignore[union-attr]
    await storage.save_job(stored.model_copy(update={"held": False}))
    assert (await storage.get_job("j1")).held is False  # type: ignore[union-attr]


def share(state: JobState | None) -> tuple[int, str, str]:
    assert state is not None
    return state.priority, state.fairness_key, state.share_key


async def test_priority_and_fairness_key__stored_and_read_back(storage: Storage) -> None:
    stored = await storage.create_job(job("j1", priority=1, fairness_key="tenant-a"))
    assert share(await storage.get_job("j1")) == (1, "tenant-a", "tenant-a")
    await storage.save_job(stored.model_copy(update={"priority": 5, "fairness_key": "b"}))
    assert share(await storage.get_job("j1")) == (5, "b", "b")
    (listed,) = await storage.list_jobs("s", "n")
    assert share(listed) == (5, "b", "b")


async def test_priority_and_fairness_key__a_record_stored_without_them_reads_3_and_the_namespace(
    storage: Storage, provider: str, storage_url: str
) -> None:
    """As a record of the release before them: written, then the fields taken out around the
    API (an SQLite file loses the columns, and gains them again when it is opened)."""
    await storage.create_job(job("old", priority=1, fairness_key="tenant-a"))
    if provider == "memory":
        assert isinstance(storage, MemoryStorage)
        record = storage.jobs["old"].model_dump(exclude={"priority", "fairness_key"})
        storage.jobs["old"] = JobState.model_validate(record)
    elif provider == "sqlite":
        await storage.close()
        with sqlite3.connect(storage_url.removeprefix("sqlite:///")) as connection:
            connection.execute("ALTER TABLE jobs DROP COLUMN priority")
            connection.execute("ALTER TABLE jobs DROP COLUMN fairness_key")
        reader = open_storage(storage_url, read_only=True)  # reads it as the upgrade would
        try:
            assert share(await reader.get_job("old")) == (3, "", "n")
        finally:
            await reader.close()
        storage = open_storage(storage_url)
    else:
        import pymongo

        client: pymongo.MongoClient[dict[str, object]]
        with pymongo.MongoClient(storage_url) as client:
            database: pymongo.database.Database[dict[str, object]] = client.get_default_database()
            unset = {"$unset": {"priority": "", "fairness_key": ""}}
            database.jobs.update_one({"_id": "old"}, unset)
            assert "priority" not in (database.jobs.find_one("old") or {})
    try:
        assert share(await storage.get_job("old")) == (3, "", "n")
    finally:
        if provider == "sqlite":
            await storage.close()


async def test_mongodb__a_job_stored_without_status_since_is_found_by_the_cleanup_query(
    storage: Storage, provider: str, storage_url: str
) -> None:
    """A document an older release wrote has no `status_since`: the query fills it in."""
    if provider != "mongodb":
        pytest.skip("MongoDB's documents of an older release")
    await storage.create_job(reached("old", JobStatus.COMPLETED_SUCCESSFULLY, T0))
    await storage.create_job(reached("new", JobStatus.COMPLETED_SUCCESSFULLY, T0))
    import pymongo

    client: pymongo.MongoClient[dict[str, object]]
    with pymongo.MongoClient(storage_url) as client:
        client.get_default_database().jobs.update_one({"_id": "old"},
                                                      {"$unset": {"status_since": ""}})  # fmt: skip
        assert "status_since" not in (client.get_default_database().jobs.find_one("old") or {})

    found = await storage.list_jobs_for_cleanup("s", "n", TERMINAL, T0 + timedelta(days=1), 10)

    assert [j.id for j in found] == ["new", "old"]


# --- steps -----------------------------------------------------------------------------------


async def test_insert_steps__read_back_equal(storage: Storage) -> None:
    full = step("j1", "s1", stage=2, status=RUNNING, attempt=3, lease=lease(),
                request={"x": [1, 2], "y": {"z": None}}, updated=T0,
                status_changes=(StatusChange(status="Running", occurred=T0,
                                             exception_messages=("boom",)),))  # fmt: skip
    plain = step("j1", "s2")

    await storage.insert_steps([full, plain])
    await storage.insert_steps([])

    assert await storage.get_step("j1", "s1") == full
    assert await storage.get_step("j1", "s2") == plain
    assert await storage.get_step("j1", "s3") is None
    assert await storage.get_step("j2", "s1") is None


async def test_insert_steps__one_duplicate_writes_nothing(storage: Storage) -> None:
    await storage.insert_steps([step("j1", "s5")])
    batch = [step("j1", f"s{i}") for i in range(10)]

    with pytest.raises(DuplicateRecordError, match="s5"):
        await storage.insert_steps(batch)

    assert [s.step_id for s in await storage.list_steps("j1")] == ["s5"]
    with pytest.raises(DuplicateRecordError, match="s7"):
        await storage.insert_steps([step("j1", "s6"), step("j1", "s7"), step("j1", "s7")])
    assert [s.step_id for s in await storage.list_steps("j1")] == ["s5"]


async def test_insert_plan__scheduled_records_and_one_duplicate_writes_nothing(
    storage: Storage,
) -> None:
    plan = [
        PlannedStep(f"s{i}", "pkg.mod:Step", stage=i % 2 * 10, request_json=f'{{"n": {i}}}')
        for i in range(4)
    ]
    await storage.insert_plan("j1", plan)

    stored = await storage.list_steps("j1")
    assert [(s.step_id, s.type, s.stage, s.request) for s in stored] == [
        (p.step_id, p.type, p.stage, json.loads(p.request_json)) for p in plan
    ]
    assert {(s.status, s.attempt, s.lease, s.status_changes) for s in stored} == {
        (StepStatus.SCHEDULED, 0, None, ())
    }
    with pytest.raises(DuplicateRecordError, match="s3"):
        await storage.insert_plan("j1", [PlannedStep("s9", "pkg.mod:Step", 0, "{}"), plan[3]])
    assert len(await storage.list_steps("j1")) == 4


async def test_insert_plan__a_request_comes_back_as_it_was_written(storage: Storage) -> None:
    """Quotes, escapes, a newline and non-ASCII text: SQLite reads a plan chunk as one JSON
    array, and each request inside it must come back as it was."""
    text = r'{"name": "caf\u00e9 \"q\" \\ \n", "emoji": "😀", "n": -1.5}'
    await storage.insert_plan("j1", [PlannedStep("s1", "pkg.mod:Step", 3, text)])
    (back,) = await storage.list_starts("j1")
    expected = {"name": 'caf\u00e9 "q" \\ \n', "emoji": "\U0001f600", "n": -1.5}
    assert json.loads(back.request_json) == json.loads(text) == expected
    if isinstance(storage, SqliteStorage):  # the text itself, as the step host will parse it
        assert back.request_json == text


async def test_list_steps__pages_by_after_and_limit(storage: Storage) -> None:
    await storage.insert_steps([step("j1", f"s{i:03d}") for i in reversed(range(25))])
    await storage.insert_steps([step("j2", "s000")])

    pages, after = [], None
    while page := await storage.list_steps("j1", after=after, limit=10):
        pages.append([s.step_id for s in page])
        after = page[-1].step_id

    assert [len(p) for p in pages] == [10, 10, 5]
    assert [step_id for page in pages for step_id in page] == [f"s{i:03d}" for i in range(25)]
    assert len(await storage.list_steps("j1")) == 25
    assert await storage.list_steps("missing") == []


async def test_list_steps__filters_by_status_and_stage_while_paging(storage: Storage) -> None:
    statuses = [SCHEDULED, RUNNING, FAILED]
    await storage.insert_steps(
        [step("j1", f"s{i:03d}", stage=i % 2, status=statuses[i % 3]) for i in range(60)]
    )

    async def ids(**filters: object) -> list[str]:
        found, after = [], None
        while page := await storage.list_steps("j1", after=after, limit=7, **filters):  # type: ignore[arg-type]
            found += [s.step_id for s in page]
            after = page[-1].step_id
        return found

    def expected(keep: object) -> list[str]:
        return [f"s{i:03d}" for i in range(60) if keep(i)]  # type: ignore[operator]

    assert await ids(statuses=[RUNNING]) == expected(lambda i: i % 3 == 1)
    assert await ids(statuses={FAILED, SCHEDULED}) == expected(lambda i: i % 3 != 1)
    assert await ids(stage=1) == expected(lambda i: i % 2 == 1)
    assert await ids(stage=0, statuses=[RUNNING, FAILED]) == expected(
        lambda i: i % 2 == 0 and i % 3 != 0
    )
    assert await ids(statuses=[]) == []
    assert await ids(statuses=[StepStatus.STOPPED]) == []


async def test_list_starts__the_page_list_steps_reads_as_what_starting_needs(
    storage: Storage,
) -> None:
    statuses = [SCHEDULED, RUNNING, FAILED]
    await storage.insert_steps(
        [
            step("j1", f"s{i:03d}", stage=i % 2, status=statuses[i % 3], attempt=i % 4,
                 request={"n": i, "nested": {"a": [1, "x"]}})
            for i in range(30)
        ]
    )  # fmt: skip

    for filters in ({}, {"statuses": [RUNNING]}, {"stage": 1, "statuses": {FAILED, SCHEDULED}}):
        found, after = [], None
        while page := await storage.list_starts("j1", after=after, limit=4, **filters):  # type: ignore[arg-type]
            found += page
            after = page[-1].step_id
        records = await storage.list_steps("j1", limit=100, **filters)  # type: ignore[arg-type]
        assert all(isinstance(f, StoredStart) for f in found)
        assert [(*f[:5], json.loads(f.request_json)) for f in found] == [
            (s.step_id, s.type, s.stage, s.status, s.attempt, s.request) for s in records
        ]
    assert await storage.list_starts("j1", statuses=[]) == []
    assert await storage.list_starts("missing") == []


async def test_update_steps__sets_status_appends_changes_and_sets_or_clears_lease(
    storage: Storage,
) -> None:
    original = step("j1", "s1", updated=T0 - timedelta(days=1))
    await storage.insert_steps([original, step("j1", "s2")])
    first = StatusChange(status="Running", occurred=T0)
    second = StatusChange(status="Failed", occurred=T0, exception_messages=("boom", "again"))

    await storage.update_steps(
        [
            StepUpdate("j1", "s1", RUNNING, 1, lease=lease(), change=first),
            StepUpdate("j1", "gone", RUNNING, 1),
        ]
    )
    running = await storage.get_step("j1", "s1")
    await storage.update_steps([StepUpdate("j1", "s1", FAILED, 2, lease=None, change=second)])
    failed = await storage.get_step("j1", "s1")
    await storage.update_steps([StepUpdate("j1", "s1", SCHEDULED, 3, lease=lease("host-2#1"))])
    rescheduled = await storage.get_step("j1", "s1")

    assert running is not None and failed is not None and rescheduled is not None
    assert (running.status, running.attempt, running.lease) == (RUNNING, 1, lease())
    assert running.status_changes == (first,)
    assert running.updated > original.updated
    assert (failed.status, failed.attempt, failed.lease) == (FAILED, 2, None)
    assert failed.status_changes == (first, second)
    assert rescheduled.lease == lease("host-2#1")
    assert rescheduled.status_changes == (first, second)
    assert rescheduled.request == original.request and rescheduled.stage == original.stage
    assert await storage.get_step("j1", "gone") is None
    untouched = await storage.get_step("j1", "s2")
    assert untouched is not None and (untouched.status, untouched.status_changes) == (SCHEDULED, ())


async def test_update_steps__written_again_records_its_change_once(storage: Storage) -> None:
    await storage.insert_steps([step("j1", "s1")])
    change = StatusChange(status="Failed", occurred=T0, exception_messages=("boom",))
    update = StepUpdate("j1", "s1", FAILED, 1, change=change, failure_signature="boom")

    await storage.update_steps([update])
    await storage.update_steps([update])  # its acknowledgement was lost

    stored = await storage.get_step("j1", "s1")
    assert stored is not None and stored.status_changes == (change,)


async def test_update_steps__an_earlier_attempts_outcome_never_overwrites_a_later_one(
    storage: Storage,
) -> None:
    await storage.insert_steps([step("j1", "s1")])
    await storage.update_steps([StepUpdate("j1", "s1", FAILED, 2)])
    # Attempt 1's outcome, written again after its acknowledgement was lost.
    await storage.update_steps([StepUpdate("j1", "s1", StepStatus.COMPLETED_WITH_FAILURE, 1)])
    await storage.update_steps([StepUpdate("j1", "s1", FAILED, 2, change=None)])

    stored = await storage.get_step("j1", "s1")
    assert stored is not None and (stored.status, stored.attempt) == (FAILED, 2)


def failure(job_id: str, step_id: str, message: str, attempt: int = 1) -> StepUpdate:
    change = StatusChange(status=FAILED, exception_messages=(message,))
    return StepUpdate(job_id, step_id, FAILED, attempt, None, change, failure_signature(message))


async def test_failure_clusters__group_a_jobs_failed_steps_by_signature_most_frequent_first(
    storage: Storage,
) -> None:
    await storage.insert_steps([step("j1", f"s{i}") for i in range(7)] + [step("j2", "s0")])
    await storage.update_steps(
        [
            failure("j1", "s4", "KeyError: 'doc-4'"),
            failure("j1", "s1", "KeyError: 'doc-1'"),
            failure("j1", "s2", "TimeoutError: after 30 s"),
            failure("j1", "s5", "KeyError: 'doc-5'"),
            failure("j1", "s3", "TimeoutError: after 31 s"),
            failure("j1", "s6", "ValueError: bad row 6"),
            failure("j2", "s0", "KeyError: 'doc-0'"),
        ]
    )
    # A failed step that runs again leaves its cluster.
    await storage.update_steps([StepUpdate("j1", "s6", RUNNING, 2, lease=lease())])

    clusters = await storage.failure_clusters("j1")

    assert [(c.signature, c.count, c.example_step_id) for c in clusters] == [
        ("KeyError: '<v>'", 3, "s1"),
        ("TimeoutError: after <n> s", 2, "s2"),
    ]
    assert [c.example_message for c in clusters] == [
        "KeyError: 'doc-1'",
        "TimeoutError: after 30 s",
    ]
    stored = [await storage.get_step("j1", f"s{i}") for i in range(1, 6)]
    times = [s.updated for s in stored if s is not None]
    assert clusters[0].first_seen >= min(times) and clusters[0].last_seen <= max(times)
    assert clusters[0].first_seen <= clusters[0].last_seen
    assert (await storage.get_step("j1", "s6")).failure_signature is None  # type: ignore[union-attr]
    assert await storage.failure_clusters("missing") == []


async def test_list_failed__pages_one_signature_in_step_id_order(storage: Storage) -> None:
    await storage.insert_steps([step("j1", f"s{i}") for i in range(6)])
    await storage.update_steps(
        [failure("j1", f"s{i}", f"KeyError: 'doc-{i}'" if i % 2 else "boom") for i in range(6)]
    )

    first = await storage.list_failed("j1", "KeyError: '<v>'", limit=2)
    rest = await storage.list_failed("j1", "KeyError: '<v>'", after=first[-1].step_id)

    assert [s.step_id for s in first] == ["s1", "s3"]
    assert [s.step_id for s in rest] == ["s5"]
    assert {s.failure_signature for s in first + rest} == {"KeyError: '<v>'"}
    assert await storage.list_failed("j1", "nothing like it") == []


async def test_renew_leases__renews_only_steps_still_running_at_the_attempt(
    storage: Storage,
) -> None:
    before = T0 - timedelta(days=1)
    old = lease("host-1#0")
    change = StatusChange(status="Running", occurred=T0)
    at = {"attempt": 2, "lease": old, "updated": before, "status_changes": (change,)}
    await storage.insert_steps(
        [
            step("j1", "running", status=RUNNING, **at),
            step("j1", "running-too", status=RUNNING, **at),
            step("j1", "failed", status=FAILED, **at),
            step("j1", "completed", status=StepStatus.COMPLETED_WITH_FAILURE, **at),
            step("j1", "stopped", status=StepStatus.STOPPED, **at),
            step("j1", "scheduled", status=SCHEDULED, **at),
            step("j1", "next-attempt", status=RUNNING, **{**at, "attempt": 3}),
            step("j2", "running", status=RUNNING, **at),
        ]
    )
    stored = {s.step_id: s for s in await storage.list_steps("j1")}
    new, other = lease("host-1#1"), lease("host-2#1")
    renewals = [
        LeaseRenewal("j1", step_id, 2, other if step_id == "running-too" else new)
        for step_id in stored
    ]

    renewed = await storage.renew_leases([*renewals, LeaseRenewal("j1", "gone", 2, new)])

    assert renewed == 2
    after = {s.step_id: s for s in await storage.list_steps("j1")}
    for step_id, renewed_lease in (("running", new), ("running-too", other)):
        was, now = stored[step_id], after[step_id]
        assert now.lease == renewed_lease and now.updated > was.updated
        assert now.model_copy(update={"lease": old, "updated": was.updated}) == was
    assert {k: v for k, v in after.items() if not k.startswith("running")} == {
        k: v for k, v in stored.items() if not k.startswith("running")
    }
    untouched = await storage.get_step("j2", "running")
    assert untouched is not None and untouched.lease == old
    assert await storage.get_step("j1", "gone") is None
    assert await storage.renew_leases([]) == 0


async def test_renew_leases__after_an_outcome_write_leaves_the_outcome(storage: Storage) -> None:
    await storage.insert_steps([step("j1", f"s{i}", status=RUNNING, attempt=1) for i in range(3)])
    failed = StatusChange(status="Failed", occurred=T0, exception_messages=("boom",))
    await storage.update_steps(
        [
            StepUpdate("j1", "s0", FAILED, 1, change=failed),
            StepUpdate("j1", "s1", StepStatus.STOPPED, 1),
            StepUpdate("j1", "s2", SCHEDULED, 2),
        ]
    )

    renewals = [LeaseRenewal("j1", f"s{i}", 1, lease()) for i in range(3)]

    assert await storage.renew_leases(renewals) == 0

    stored = [(s.status, s.attempt, s.lease) for s in await storage.list_steps("j1")]
    assert stored == [(FAILED, 1, None), (StepStatus.STOPPED, 1, None), (SCHEDULED, 2, None)]
    assert await storage.count_by_status("j1") == {
        (0, FAILED): 1,
        (0, StepStatus.STOPPED): 1,
        (0, SCHEDULED): 1,
    }


async def test_delete_steps_and_remove_job_steps(storage: Storage) -> None:
    await storage.insert_steps([step("j1", f"s{i}") for i in range(5)] + [step("j2", "s0")])

    await storage.delete_steps("j1", ["s1", "s3", "missing"])
    await storage.delete_steps("j1", [])
    assert [s.step_id for s in await storage.list_steps("j1")] == ["s0", "s2", "s4"]
    # Ids are text to the letter (SQLite reads a batch's ids as one JSON array).
    odd = ['q"uote', "back\\slash", "été ✓", "s0 "]
    await storage.insert_steps([step("j1", i) for i in odd])
    await storage.delete_steps("j1", odd[:3])
    assert [s.step_id for s in await storage.list_steps("j1")] == ["s0", "s0 ", "s2", "s4"]

    await storage.remove_job_steps("j1")
    assert await storage.list_steps("j1") == []
    assert [s.step_id for s in await storage.list_steps("j2")] == ["s0"]


async def test_count_by_status__by_stage_and_status(storage: Storage) -> None:
    await storage.insert_steps(
        [step("j1", f"a{i}", stage=0, status=RUNNING) for i in range(3)]
        + [step("j1", f"b{i}", stage=0, status=FAILED) for i in range(2)]
        + [step("j1", f"c{i}", stage=1, status=SCHEDULED) for i in range(4)]
        + [step("j2", "x", stage=0, status=RUNNING)]
    )
    await storage.update_steps([StepUpdate("j1", "c0", RUNNING, 1)])

    assert await storage.count_by_status("j1") == {
        (0, RUNNING): 3,
        (0, FAILED): 2,
        (1, SCHEDULED): 3,
        (1, RUNNING): 1,
    }
    assert await storage.count_by_status("missing") == {}


async def test_count_by_status__counts_every_stage_of_many(storage: Storage) -> None:
    await storage.insert_steps(
        [
            step("j1", f"{stage}-{i}", stage=stage, status=RUNNING)
            for stage in (0, 2, 7)
            for i in range(stage + 1)
        ]
        + [step("j1", "7-f", stage=7, status=FAILED), step("j2", "x", stage=5)]
    )

    assert await storage.count_by_status("j1") == {
        (0, RUNNING): 1,
        (2, RUNNING): 3,
        (7, RUNNING): 8,
        (7, FAILED): 1,
    }


async def test_count_by_status__a_record_of_an_unknown_status_is_corrupt(
    storage: Storage, provider: str, storage_url: str
) -> None:
    await storage.create_job(job("bad"))
    await storage.insert_steps([step("j1", "bad"), step("j1", "good")])
    _corrupt(provider, storage, storage_url)

    with pytest.raises(CorruptRecordError) as error:
        await storage.count_by_status("j1")

    assert error.value.collection == "job_steps"


async def test_has_steps__of_the_stage_in_the_statuses_asked_for(storage: Storage) -> None:
    await storage.insert_steps(
        [
            step("j1", "a", stage=0, status=FAILED),
            step("j1", "b", stage=1, status=RUNNING),
            step("j2", "a", stage=0, status=SCHEDULED),
        ]
    )

    assert await storage.has_steps("j1", 0, [FAILED])
    assert await storage.has_steps("j1", 1, {SCHEDULED, RUNNING, StepStatus.STOPPED})
    assert not await storage.has_steps("j1", 0, [SCHEDULED, RUNNING])
    assert not await storage.has_steps("j1", 2, list(StepStatus))
    assert not await storage.has_steps("j1", 1, [])
    assert not await storage.has_steps("missing", 0, list(StepStatus))

    await storage.update_steps([StepUpdate("j1", "a", SCHEDULED, 1)])
    await storage.delete_steps("j1", ["b"])

    assert await storage.has_steps("j1", 0, [SCHEDULED])
    assert not await storage.has_steps("j1", 1, list(StepStatus))


async def test_get_steps__the_records_of_the_ids_asked_for_whatever_their_stage(
    storage: Storage,
) -> None:
    records = [step("j1", f"s{i:04d}", stage=i % 3, status=RUNNING, attempt=1) for i in range(1200)]
    await storage.insert_steps([*records, step("j2", "s0001")])
    await storage.update_steps([StepUpdate("j1", "s0005", FAILED, 1, lease=lease())])
    # More ids than one query takes, in no order, with ids of no record and duplicates.
    wanted = [f"s{i:04d}" for i in range(1199, 0, -2)] + ["missing", "s0005", "s0003"]

    found = await storage.get_steps("j1", wanted)

    assert sorted(found) == sorted(set(wanted) - {"missing"})
    assert found["s0003"] == (await storage.get_step("j1", "s0003"))
    assert (found["s0005"].status, found["s0005"].lease) == (FAILED, lease())
    assert found["s1199"].stage == 1199 % 3
    assert await storage.get_steps("j1", []) == {}
    assert await storage.get_steps("missing", ["s0001"]) == {}


async def test_mongodb__the_status_indexes_of_an_earlier_release_are_replaced(
    provider: str, storage_url: str
) -> None:
    """An earlier release made (job_id, status) and (job_id, stage, status): a new storage adds
    the indexes that end in step_id and drops those two, so writes keep three up to date."""
    if provider != "mongodb":
        pytest.skip("MongoDB's indexes")
    import pymongo

    client: pymongo.MongoClient[dict[str, object]]
    with pymongo.MongoClient(storage_url) as client:
        steps: pymongo.collection.Collection[dict[str, object]]
        steps = client.get_default_database().job_steps
        for old in (["job_id", "status"], ["job_id", "stage", "status"]):
            steps.create_index([(field, 1) for field in old])
        storage = open_storage(storage_url)
        try:
            await storage.insert_steps([step("j1", "a", status=RUNNING)])
            assert await storage.has_steps("j1", 0, [RUNNING])
        finally:
            await storage.close()
        keys = sorted(list(index["key"]) for index in steps.list_indexes())

    assert keys == [
        ["_id"],
        ["job_id", "failure_signature", "step_id"],
        ["job_id", "stage", "status", "step_id"],
        ["job_id", "status", "step_id"],
        ["job_id", "step_id"],
    ]


# --- step outputs ----------------------------------------------------------------------------


def output(
    job_id: str, step_id: str, *, stage: int = 0, attempt: int = 1, text: str | None = None
) -> StoredOutput:
    if text is None:
        text = json.dumps({"step": step_id, "attempt": attempt})
    return StoredOutput(job_id, step_id, stage, attempt, text)


async def test_put_outputs__read_back_equal(storage: Storage) -> None:
    written = [output("j1", "b", stage=2, attempt=3, text='{"x": [1, 2.5, null]}'),
               output("j1", "a", text="7"), output("j1", "c", text='"text"')]  # fmt: skip

    await storage.put_outputs(written)
    await storage.put_outputs([])

    assert await storage.list_outputs("j1") == sorted(written, key=lambda o: o.step_id)
    assert (await storage.list_outputs("j1"))[1].parsed().output == {"x": [1, 2.5, None]}
    assert await storage.list_outputs("missing") == []


async def test_list_outputs__pages_by_after_and_limit_in_step_id_order(storage: Storage) -> None:
    await storage.put_outputs([output("j1", f"s{i:03d}") for i in reversed(range(25))])

    pages, after = [], None
    while page := await storage.list_outputs("j1", after=after, limit=10):
        pages.append([o.step_id for o in page])
        after = page[-1].step_id

    assert [len(p) for p in pages] == [10, 10, 5]
    assert [step_id for page in pages for step_id in page] == [f"s{i:03d}" for i in range(25)]
    assert await storage.list_outputs("j1", after="s024") == []


async def test_list_outputs__filters_by_stage_and_a_range_of_step_ids_while_paging(
    storage: Storage,
) -> None:
    ids = [f"s{i:03d}" for i in range(30)]
    await storage.put_outputs([output("j1", s, stage=i % 2) for i, s in enumerate(ids)])

    async def found(**filters: Any) -> list[str]:
        step_ids, after = [], filters.pop("after", None)
        while page := await storage.list_outputs("j1", after=after, limit=3, **filters):
            step_ids += [o.step_id for o in page]
            after = page[-1].step_id
        return step_ids

    assert await found(stage=1) == ids[1::2]
    assert await found(after="s009", until="s019") == ids[10:20]
    assert await found(until="s004", stage=0) == ["s000", "s002", "s004"]
    assert await found(stage=2) == []


async def test_output_span__the_first_and_last_step_ids_with_an_output(storage: Storage) -> None:
    await storage.put_outputs([output("j1", f"s{i:03d}", stage=i % 3) for i in range(3, 30)])
    await storage.put_outputs([output("j2", "s000")])

    assert await storage.output_span("j1") == ("s003", "s029")
    assert await storage.output_span("j1", stage=1) == ("s004", "s028")
    assert await storage.output_span("j1", stage=5) is None
    assert await storage.output_span("missing") is None


async def test_put_outputs__the_same_output_written_twice_is_one_record(storage: Storage) -> None:
    written = output("j1", "a", attempt=2)

    await storage.put_outputs([written])
    await storage.put_outputs([written])

    assert await storage.list_outputs("j1") == [written]
    assert await storage.count_outputs("j1") == 1


async def test_put_outputs__a_later_attempt_overwrites_an_earlier(storage: Storage) -> None:
    await storage.put_outputs([output("j1", "a", attempt=1)])

    later = output("j1", "a", stage=1, attempt=2, text='{"later": true}')
    await storage.put_outputs([later])

    assert await storage.list_outputs("j1") == [later]


async def test_put_outputs__an_earlier_attempt_written_after_a_later_leaves_the_later(
    storage: Storage,
) -> None:
    later = output("j1", "a", attempt=3)
    await storage.put_outputs([later, output("j1", "b", attempt=1)])

    newer_b = output("j1", "b", attempt=2)
    await storage.put_outputs([output("j1", "a", attempt=2), newer_b])

    assert await storage.list_outputs("j1") == [later, newer_b]


async def test_delete_outputs__only_where_the_stored_attempt_is_that_one_or_earlier(
    storage: Storage,
) -> None:
    await storage.put_outputs([output("j1", s, attempt=2) for s in "abcd"])
    await storage.put_outputs([output("j2", "a", attempt=1)])

    await storage.delete_outputs("j1", [("a", 2), ("b", 3), ("c", 1), ("missing", 5)])
    await storage.delete_outputs("j1", [])

    assert [o.step_id for o in await storage.list_outputs("j1")] == ["c", "d"]
    assert [o.step_id for o in await storage.list_outputs("j2")] == ["a"]


async def test_update_steps__failed_or_stopped_deletes_an_earlier_attempts_output(
    storage: Storage,
) -> None:
    # A host stored attempt 1's output and died before the step's record was deleted; the
    # step then failed (or was stopped) at a later attempt: it has no output.
    await storage.insert_steps([step("j1", s) for s in ("failed", "stopped", "retried", "later")])
    await storage.put_outputs([output("j1", s, attempt=1) for s in ("failed", "stopped")])
    await storage.put_outputs(
        [output("j1", "retried", attempt=1), output("j1", "later", attempt=3)]
    )

    await storage.update_steps(
        [
            StepUpdate("j1", "failed", FAILED, 2),
            StepUpdate("j1", "stopped", StepStatus.STOPPED, 2),
            StepUpdate("j1", "retried", RUNNING, 2),
            StepUpdate("j1", "later", FAILED, 2),  # an earlier attempt's: attempt 3's stays
        ]
    )

    assert [o.step_id for o in await storage.list_outputs("j1")] == ["later", "retried"]


async def test_update_steps__a_stop_of_a_step_that_succeeded_leaves_its_output(
    storage: Storage,
) -> None:
    # Its record is deleted (it succeeded) when a stop of the same attempt is written.
    await storage.put_outputs([output("j1", "done", attempt=1)])

    await storage.update_steps([StepUpdate("j1", "done", StepStatus.STOPPED, 1)])

    assert [o.step_id for o in await storage.list_outputs("j1")] == ["done"]


async def test_delete_steps__stores_the_outputs_it_is_given_and_deletes_the_steps(
    storage: Storage,
) -> None:
    await storage.insert_steps([step("j1", s) for s in ("a", "b", "c")])

    await storage.delete_steps("j1", ["a", "b"], [output("j1", "a"), output("j1", "b")])
    await storage.delete_steps("j1", [], [])

    assert [s.step_id for s in await storage.list_steps("j1")] == ["c"]
    assert [o.step_id for o in await storage.list_outputs("j1")] == ["a", "b"]


async def test_count_outputs__of_the_job_and_of_a_stage_not_of_other_jobs(
    storage: Storage,
) -> None:
    await storage.put_outputs(
        [output("j1", f"s{i}", stage=i % 3) for i in range(10)] + [output("j2", "s0", stage=0)]
    )

    assert await storage.count_outputs("j1") == 10
    assert await storage.count_outputs("j1", stage=0) == 4
    assert await storage.count_outputs("j1", stage=2) == 3
    assert await storage.count_outputs("j1", stage=5) == 0
    assert await storage.count_outputs("j2") == 1
    assert await storage.count_outputs("missing") == 0
    assert [o.job_id for o in await storage.list_outputs("j2")] == ["j2"]


async def test_remove_job_outputs__removes_the_jobs_and_leaves_another_jobs(
    storage: Storage,
) -> None:
    await storage.put_outputs([output("j1", "a"), output("j1", "b"), output("j2", "a")])

    await storage.remove_job_outputs("j1")
    await storage.remove_job_outputs("missing")

    assert await storage.list_outputs("j1") == []
    assert await storage.count_outputs("j1") == 0
    assert await storage.list_outputs("j2") == [output("j2", "a")]


async def test_put_outputs__a_long_unicode_json_comes_back_as_written(storage: Storage) -> None:
    """The output is the step host's JSON text: it is stored and read back to the letter."""
    unit = r"caf\u00e9 é ✓ 😀 \"q\" \\ \n 中文 / "  # JSON escapes, as text, and the characters
    body = unit * ((1000 - 9) // len(unit))
    text = '{"s": "' + body + "x" * (1000 - 9 - len(body)) + '"}'
    assert len(text) == 1000 and json.loads(text)["s"].startswith('café é ✓ 😀 "q" \\ \n')

    await storage.put_outputs([output("j1", "a", text=text)])

    (back,) = await storage.list_outputs("j1")
    assert back.output.encode() == text.encode()


def test_sqlite__a_file_of_an_older_release_gets_the_outputs_table_on_open(
    tmp_path: Path,
) -> None:
    url = build_oldest_sqlite(tmp_path / "old.db", scope="s", namespace="n", log="",
                              job_type="pkg.jobs:Job", step_type="pkg.jobs:Step")  # fmt: skip

    async def run() -> list[StoredOutput]:
        storage = open_storage(url)
        try:
            await storage.put_outputs([output("j1", "a")])
            return await storage.list_outputs("j1")
        finally:
            await storage.close()

    assert asyncio.run(run()) == [output("j1", "a")]


@pytest.mark.parametrize("outputs_first", [True, False])
def test_sqlite__a_jobs_number_goes_with_the_last_of_its_counted_steps_and_outputs(
    tmp_path: Path, outputs_first: bool
) -> None:
    url = f"sqlite:///{tmp_path / 'jobs.db'}"

    async def run() -> tuple[list[StoredOutput], list[str]]:
        storage = SqliteStorage(url)
        try:
            await storage.add_counted("j1", CountedKind.COMPLETED, ["a"])
            await storage.put_outputs([output("j1", "b")])
            first, second = storage.remove_job_counted, storage.remove_job_outputs
            if outputs_first:
                first, second = second, first
            await first("j1")
            assert await storage.list_outputs("j1") == (
                [] if outputs_first else [output("j1", "b")]
            )
            await second("j1")
            return await storage.list_outputs("j1"), await storage.list_counted(
                "j1", CountedKind.COMPLETED
            )
        finally:
            await storage.close()

    assert asyncio.run(run()) == ([], [])
    with sqlite3.connect(tmp_path / "jobs.db") as connection:
        assert connection.execute("SELECT COUNT(*) FROM job_numbers").fetchone() == (0,)


def test_sqlite__a_range_of_step_ids_searches_the_primary_key(tmp_path: Path) -> None:
    from choreography_ray.storage.sqlite_outputs import page

    url = f"sqlite:///{tmp_path / 'jobs.db'}"

    async def lay_out() -> None:
        storage = SqliteStorage(url)
        await storage.put_outputs([output("j1", f"s-{n:05d}") for n in range(100)])
        await storage.close()

    asyncio.run(lay_out())
    sql, args = page("j1", None, "s-00050", "s-00075", 25)
    with sqlite3.connect(tmp_path / "jobs.db") as connection:
        plan = [row[3] for row in connection.execute(f"EXPLAIN QUERY PLAN {sql}", args)]

    assert plan[0] == "SEARCH job_outputs USING PRIMARY KEY (job_no=? AND step_id>? AND step_id<?)"


# --- counted steps and manager keys ----------------------------------------------------------


async def test_counted_steps__add_idempotent_remove_list_count_remove_all(
    storage: Storage,
) -> None:
    await storage.add_counted("j1", COMPLETED, ["c", "a", "b"])
    await storage.add_counted("j1", COMPLETED, ["b", "d"])
    await storage.add_counted("j1", COMPLETED, [])
    await storage.add_counted("j1", STOPPED, ["a"])
    await storage.add_counted("j2", COMPLETED, ["z"])

    assert await storage.list_counted("j1", COMPLETED) == ["a", "b", "c", "d"]
    assert await storage.count_counted("j1", COMPLETED) == 4
    assert await storage.list_counted("j1", STOPPED) == ["a"]

    await storage.remove_counted("j1", COMPLETED, "b")
    await storage.remove_counted("j1", COMPLETED, "missing")
    assert await storage.list_counted("j1", COMPLETED) == ["a", "c", "d"]
    assert await storage.list_counted("j1", STOPPED) == ["a"]

    await storage.remove_job_counted("j1")
    assert await storage.count_counted("j1", COMPLETED) == 0
    assert await storage.list_counted("j1", STOPPED) == []
    assert await storage.list_counted("j2", COMPLETED) == ["z"]
    await storage.add_counted("j1", STOPPED, ["again"])
    assert await storage.list_counted("j1", STOPPED) == ["again"]


@pytest.mark.timeout(150)
async def test_counted_steps__a_million_each_a_small_record_of_its_own(
    storage: Storage, provider: str, storage_url: str
) -> None:
    """What keeps the write cost flat as a job grows: each counted step is a record of its own
    (on SQLite at most 40 bytes), never a list in the job's document. The cost itself is a
    timing: `benchmarks/storage.py` prints the last batches' against the first's."""
    total, batch = (20_000, 5_000) if provider == "mongodb" else (1_000_000, 10_000)
    # Outcomes arrive roughly in step-id order (steps start in that order), scattered within a
    # batch. Fully scattered ids dirty up to one B-tree page per record.
    ids = [f"step-{i:07d}" for i in range(total)]
    for start in range(0, total, batch):
        ids[start : start + batch] = random.Random(start).sample(ids[start : start + batch], batch)
    await storage.add_counted("other", COMPLETED, ["x"])
    size_before = _sqlite_size(storage_url) if provider == "sqlite" else 0

    for start in range(0, total, batch):
        await storage.add_counted("big", COMPLETED, ids[start : start + batch])

    assert await storage.count_counted("big", COMPLETED) == total
    assert await storage.count_counted("other", COMPLETED) == 1
    if provider == "sqlite":
        per_record = (_sqlite_size(storage_url) - size_before) / total
        assert per_record <= 40, f"{per_record:.1f} bytes per counted record"


def _sqlite_size(url: str) -> int:
    path = url.removeprefix("sqlite:///")
    with sqlite3.connect(path) as connection:
        connection.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    return os.path.getsize(path)


async def test_manager_keys__add_idempotent_and_list(storage: Storage) -> None:
    keys = [JobsManagerKey(scope="a", namespace="x"), JobsManagerKey(scope="b", namespace="y")]
    for key in [*keys, keys[0]]:
        await storage.add_manager_key(key)
    assert sorted(await storage.list_manager_keys(), key=str) == keys


# --- faults ----------------------------------------------------------------------------------


async def test_corrupt_record__raises_naming_collection_and_id(
    storage: Storage, provider: str, storage_url: str
) -> None:
    await storage.create_job(job("bad"))
    await storage.insert_steps([step("j1", "bad")])
    _corrupt(provider, storage, storage_url)

    with pytest.raises(CorruptRecordError) as job_error:
        await storage.get_job("bad")
    with pytest.raises(CorruptRecordError) as step_error:
        await storage.get_step("j1", "bad")

    assert (job_error.value.collection, job_error.value.record_id) == ("jobs", "bad")
    assert (step_error.value.collection, step_error.value.record_id) == ("job_steps", "j1/bad")
    assert "'bad'" in str(job_error.value) and "'jobs'" in str(job_error.value)


def _corrupt(provider: str, storage: Storage, url: str) -> None:
    """Writes around the API: bad JSON where the provider keeps JSON, else an unknown status."""
    if provider == "memory":
        assert isinstance(storage, MemoryStorage)
        storage.jobs["bad"] = "{not json"  # type: ignore[assignment]
        storage.steps["j1"]["bad"] = "{not json"  # type: ignore[assignment]
    elif provider == "sqlite":
        with sqlite3.connect(url.removeprefix("sqlite:///")) as connection:
            connection.execute("UPDATE jobs SET progress = '{not json' WHERE id = 'bad'")
            connection.execute("UPDATE job_steps SET status = 'NoSuchStatus'")
    else:
        import pymongo

        client: pymongo.MongoClient[dict[str, object]]
        with pymongo.MongoClient(url) as client:
            database: pymongo.database.Database[dict[str, object]] = client.get_default_database()
            database.jobs.update_one({"_id": "bad"}, {"$set": {"status": "NoSuchStatus"}})
            database.job_steps.update_one({"_id": "j1/bad"}, {"$set": {"status": "NoSuch"}})


_WRITER = """
import asyncio, sys, time
from choreography_ray.model import StepState
from choreography_ray.status import StepStatus
from choreography_ray.storage import CountedKind, StepUpdate
from choreography_ray.storage.sqlite import SqliteStorage

async def main(url, job_id, total):
    storage = SqliteStorage(url)
    await storage.count_counted(job_id, CountedKind.COMPLETED)  # opens the file
    print("ready", flush=True)
    sys.stdin.readline()
    began = time.time()
    ids = [f"s{i:06d}" for i in range(total)]
    for start in range(0, total, 1000):
        await storage.insert_steps(
            [StepState(job_id=job_id, step_id=i, type="t") for i in ids[start:start + 1000]])
    for start in range(0, total, 512):
        await storage.update_steps(
            [StepUpdate(job_id, i, StepStatus.RUNNING, 1) for i in ids[start:start + 512]])
    await storage.add_counted(job_id, CountedKind.COMPLETED, ids)
    print(began, time.time(), flush=True)
    await storage.close()

asyncio.run(main(sys.argv[1], sys.argv[2], int(sys.argv[3])))
"""


@pytest.mark.timeout(120)
def test_sqlite__two_processes_write_one_file_at_once(tmp_path: Path) -> None:
    url, total = f"sqlite:///{tmp_path / 'shared' / 'jobs.db'}", 20_000
    writers = [
        subprocess.Popen(
            [sys.executable, "-c", _WRITER, url, job_id, str(total)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        for job_id in ("job-a", "job-b")
    ]
    try:
        for writer in writers:  # both have opened the file (and raced to make the schema)
            assert writer.stdout is not None and writer.stdout.readline() == "ready\n"
        for writer in writers:
            writer.stdin.write("go\n")  # type: ignore[union-attr]
            writer.stdin.flush()  # type: ignore[union-attr]
        spans = [
            [float(t) for t in writer.communicate(timeout=100)[0].split()] for writer in writers
        ]
        assert [writer.returncode for writer in writers] == [0, 0]
        assert max(began for began, _ in spans) < min(ended for _, ended in spans), "no overlap"

    finally:
        for writer in writers:
            if writer.poll() is None:
                writer.kill()

    async def check() -> None:
        storage = SqliteStorage(url)
        try:
            for job_id in ("job-a", "job-b"):
                assert await storage.count_by_status(job_id) == {(0, RUNNING): total}
                assert await storage.count_counted(job_id, COMPLETED) == total
        finally:
            await storage.close()

    asyncio.run(check())


# --- URLs ------------------------------------------------------------------------------------


async def test_sqlite__relative_and_absolute_urls_create_parent_directories(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    for url, path in [
        ("sqlite:///rel/dir/jobs.db", tmp_path / "rel" / "dir" / "jobs.db"),
        (f"sqlite:///{tmp_path}/abs/jobs.db", tmp_path / "abs" / "jobs.db"),
    ]:
        storage = SqliteStorage(url)
        await storage.create_job(job("j1"))
        await storage.close()
        await storage.close()
        assert path.is_file()


@pytest.mark.parametrize("existing_page", [None, 4_096])
async def test_sqlite__a_connection_is_wal_and_checkpoints_every_40_mib(
    tmp_path: Path, existing_page: int | None
) -> None:
    """A new file has 16 KiB pages; a file made before (SQLite's 4 KiB) keeps its own. Either
    checkpoints after about 40 MiB of WAL."""
    path = tmp_path / "jobs.db"
    if existing_page is not None:
        with sqlite3.connect(path) as made:
            made.execute(f"PRAGMA page_size = {existing_page}")
            made.execute("CREATE TABLE earlier (x)")
    storage = SqliteStorage(f"sqlite:///{path}")
    pragmas = await storage._run(
        lambda c: [
            c.execute(f"PRAGMA {name}").fetchone()[0]
            for name in ("journal_mode", "synchronous", "page_size", "wal_autocheckpoint")
        ]
    )
    await storage.close()
    page = existing_page or PAGE_SIZE
    assert pragmas == ["wal", 1, page, WAL_AUTOCHECKPOINT_BYTES // page]
    assert PAGE_SIZE == 16_384 and WAL_AUTOCHECKPOINT_BYTES // 4_096 == 10_000


async def test_sqlite__unopenable_file_is_unavailable(tmp_path: Path) -> None:
    (tmp_path / "garbage.db").write_bytes(b"this is not a database file" * 100)
    (tmp_path / "a-file").write_text("")
    for path in (tmp_path / "garbage.db", tmp_path / "a-file" / "jobs.db"):
        storage = SqliteStorage(f"sqlite:///{path}")
        with pytest.raises(StorageUnavailableError, match="cannot open SQLite database"):
            await storage.get_job("j1")
        await storage.close()


async def test_mongodb__unreachable_server_fails_fast_without_the_password() -> None:
    # Port 1 on loopback refuses connections: no server is needed for this case.
    url = "mongodb://admin:s3cret@127.0.0.1:1/jobs?serverSelectionTimeoutMS=1000"
    storage = open_storage(url)
    started = time.monotonic()
    with pytest.raises(StorageUnavailableError) as raised:
        await storage.get_job("j1")
    assert time.monotonic() - started < 15, "bounded by the server selection timeout"
    assert "127.0.0.1:1" in str(raised.value)
    assert "s3cret" not in str(raised.value)
    await storage.close()


@pytest.mark.parametrize("after", [None, "s-00050"])
@pytest.mark.parametrize("stage", [None, 1])
def test_sqlite__a_page_by_status_searches_the_status_index_never_the_whole_job(
    tmp_path: Path, stage: int | None, after: str | None
) -> None:
    """Across stages too: the job's stages are read a seek each, then one range per stage and
    status (there is no (job_id, status) index for every write to keep)."""
    from choreography_ray.storage.sqlite_pages import STAGES, PageRead

    url = f"sqlite:///{tmp_path / 'jobs.db'}"

    async def lay_out() -> None:
        storage = SqliteStorage(url)
        await storage.insert_steps([step("j1", f"s-{n:05d}", stage=n % 2) for n in range(100)])
        await storage.close()

    asyncio.run(lay_out())
    read = PageRead("j1", {FAILED, StepStatus.UNREACHABLE}, stage, after, 25)
    stages = [0, 1] if stage is None else [stage]
    with sqlite3.connect(tmp_path / "jobs.db") as connection:
        sql, args = read.merged([(s, status) for s in stages for status in (FAILED, UNREACHABLE)])
        plan = [row[3] for row in connection.execute(f"EXPLAIN QUERY PLAN {sql}", args)]
        stage_plan = [row[3] for row in connection.execute(f"EXPLAIN QUERY PLAN {STAGES}", ["j1"])]

    searches = [line for line in plan if line.startswith("SEARCH job_steps")]
    assert len(searches) == 2 * len(stages), plan
    assert all("INDEX job_steps_job_stage_status (job_id=? AND stage=? AND status=?" in line
               for line in searches), plan  # fmt: skip
    assert not any(line.startswith("SCAN job_steps") for line in stage_plan), stage_plan
    assert {line for line in stage_plan if line.startswith("SEARCH job_steps")} == {
        "SEARCH job_steps USING COVERING INDEX job_steps_job_stage_status (job_id=?)",
        "SEARCH job_steps USING COVERING INDEX job_steps_job_stage_status (job_id=? AND stage>?)",
    }, stage_plan


def test_sqlite__a_page_across_many_stages_merges_its_ranges_in_step_id_order(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """More ranges than one statement merges: the statements' pages merged again, in order."""
    from choreography_ray.storage import sqlite_pages

    monkeypatch.setattr(sqlite_pages, "RANGES_PER_READ", 3)
    statuses = [FAILED, UNREACHABLE, SCHEDULED]

    async def scenario() -> None:
        storage = SqliteStorage(f"sqlite:///{tmp_path / 'jobs.db'}")
        await storage.insert_steps([
            step("j1", f"s-{n:05d}", stage=n % 7 * 10, status=statuses[n % 3]) for n in range(300)
        ])  # fmt: skip
        wanted = {FAILED, UNREACHABLE}
        expected = [f"s-{n:05d}" for n in range(300) if statuses[n % 3] in wanted]
        pages, after = [], None
        while page := await storage.list_steps("j1", statuses=wanted, after=after, limit=17):
            pages.append([s.step_id for s in page])
            after = page[-1].step_id
        assert [i for p in pages for i in p] == expected
        assert all(len(p) == 17 for p in pages[:-1])
        starts = await storage.list_starts("j1", statuses=wanted, limit=5)
        assert [s.step_id for s in starts] == expected[:5]
        await storage.close()

    asyncio.run(scenario())


def test_sqlite__has_steps_and_get_steps_search_indexes_never_the_whole_job(
    tmp_path: Path,
) -> None:
    from choreography_ray.storage.sqlite_pages import any_step, steps_by_id

    url = f"sqlite:///{tmp_path / 'jobs.db'}"

    async def lay_out() -> None:
        storage = SqliteStorage(url)
        await storage.insert_steps([step("j1", f"s-{n:05d}", stage=n % 2) for n in range(100)])
        await storage.close()

    asyncio.run(lay_out())
    query = any_step("j1", 1, {SCHEDULED, RUNNING, StepStatus.STOPPED})
    assert query is not None
    by_id = (steps_by_id(2), "j1", "s-00001", "s-00002")
    with sqlite3.connect(tmp_path / "jobs.db") as connection:
        plans = [
            [row[3] for row in connection.execute(f"EXPLAIN QUERY PLAN {sql}", args)]
            for sql, *args in (query, by_id)
        ]

    assert plans[0] == [
        "SEARCH job_steps USING COVERING INDEX job_steps_job_stage_status "
        "(job_id=? AND stage=? AND status=?)"
    ]
    assert plans[1] == ["SEARCH job_steps USING PRIMARY KEY (job_id=? AND step_id=?)"]


def test_sqlite__pickles_as_its_url(tmp_path: Path) -> None:
    """Ray may ship a storage to an actor: the copy opens its own connection and thread."""
    storage = SqliteStorage(f"sqlite:///{tmp_path / 'jobs.db'}")
    copy = pickle.loads(pickle.dumps(storage))
    assert type(copy) is SqliteStorage and copy.url == storage.url and copy is not storage


@pytest.mark.parametrize("url", ["sqlite://", "sqlite:///", "sqlite:///:memory:", "sqlite:x.db"])
def test_sqlite__not_a_file_url_refused(url: str) -> None:
    with pytest.raises(ValueError, match="not a SQLite file URL"):
        SqliteStorage(url)


def test_open_storage__picks_the_provider_by_scheme(tmp_path: Path) -> None:
    assert type(open_storage("memory://")) is MemoryStorage
    sqlite = open_storage(f"sqlite:///{tmp_path / 'jobs.db'}")
    assert type(sqlite) is SqliteStorage
    asyncio.run(sqlite.close())
    pytest.importorskip("choreography_ray.storage.mongodb", reason="MongoStorage not written")
    from choreography_ray.storage.mongodb import MongoStorage

    assert type(open_storage("mongodb://127.0.0.1:1/db")) is MongoStorage
    assert type(open_storage("mongodb+srv://user:pw@cluster.example/db")) is MongoStorage


@pytest.mark.parametrize("url", ["postgres://u:secret@h/db", "jobs.db", ""])
def test_open_storage__unknown_scheme_is_a_clear_value_error(url: str) -> None:
    with pytest.raises(ValueError, match="unknown storage URL") as error:
        open_storage(url)
    assert "memory://" in str(error.value) and "sqlite:///" in str(error.value)
    assert "secret" not in str(error.value)


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("mongodb://user:secret@host:27017/db", "mongodb://user:***@host:27017/db"),
        ("mongodb+srv://user:s3cr3t@cluster.example/db?x=1", "mongodb+srv://user:***@cluster.example/db?x=1"),
        ("mongodb://host/db", "mongodb://host/db"),
        ("sqlite:///path/with@sign.db", "sqlite:///path/with@sign.db"),
        ("memory://", "memory://"),
    ],
)  # fmt: skip
def test_redact_url__hides_the_password(url: str, shown: str) -> None:
    assert redact_url(url) == shown

"""Upgrade safety in every provider: a record of a newer `schema_version` than this release reads
is refused with `UnsupportedSchemaError` wherever records are parsed, never misread, and left as
it is; a record without the field is of version 1 and reads missing fields as their defaults.

The newer record is written around the API (a model in memory, a hand-edited SQLite row, a
pymongo update), as a newer release would leave it.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta

import pytest

from choreography_ray.errors import StorageError, UnsupportedSchemaError
from choreography_ray.model import SCHEMA_VERSION, JobState, StepState
from choreography_ray.status import JobStatus
from choreography_ray.storage import Storage
from choreography_ray.storage.memory import MemoryStorage

NEWER = SCHEMA_VERSION + 1


def job(job_id: str) -> JobState:
    return JobState(id=job_id, scope="s", namespace="n", type="pkg.mod:Job").with_status(
        JobStatus.RUNNING
    )


def _mongo_database(url: str):  # type: ignore[no-untyped-def]
    import pymongo

    client: pymongo.MongoClient[dict[str, object]] = pymongo.MongoClient(url)
    return client, client.get_default_database()


def _set_schema_version(provider: str, storage: Storage, url: str, version: object) -> None:
    """Stamps job `new` and step `j1/new` with `version`, around the API."""
    if provider == "memory":
        assert isinstance(storage, MemoryStorage)
        storage.jobs["new"] = storage.jobs["new"].model_copy(update={"schema_version": version})
        steps = storage.steps["j1"]
        steps["new"] = steps["new"].model_copy(update={"schema_version": version})
    elif provider == "sqlite":
        with sqlite3.connect(url.removeprefix("sqlite:///")) as connection:
            connection.execute("UPDATE jobs SET schema_version = ? WHERE id = 'new'", (version,))
            connection.execute(
                "UPDATE job_steps SET schema_version = ? WHERE step_id = 'new'", (version,)
            )
    else:
        client, database = _mongo_database(url)
        with client:
            database.jobs.update_one({"_id": "new"}, {"$set": {"schema_version": version}})
            database.job_steps.update_one({"_id": "j1/new"}, {"$set": {"schema_version": version}})


def _stored_versions(provider: str, storage: Storage, url: str) -> tuple[object, object]:
    if provider == "memory":
        assert isinstance(storage, MemoryStorage)
        return storage.jobs["new"].schema_version, storage.steps["j1"]["new"].schema_version
    if provider == "sqlite":
        with sqlite3.connect(url.removeprefix("sqlite:///")) as connection:
            (j,) = connection.execute("SELECT schema_version FROM jobs WHERE id = 'new'").fetchone()
            (s,) = connection.execute(
                "SELECT schema_version FROM job_steps WHERE step_id = 'new'"
            ).fetchone()
            return j, s
    client, database = _mongo_database(url)
    with client:
        found = database.jobs.find_one({"_id": "new"}) or {}
        step_found = database.job_steps.find_one({"_id": "j1/new"}) or {}
        return found.get("schema_version"), step_found.get("schema_version")


async def test_records_are_written_at_this_releases_schema_version(
    storage: Storage, provider: str, storage_url: str
) -> None:
    await storage.create_job(job("new"))
    await storage.insert_steps([StepState(job_id="j1", step_id="new", type="pkg.mod:Step")])

    assert _stored_versions(provider, storage, storage_url) == (SCHEMA_VERSION, SCHEMA_VERSION)


async def test_newer_schema_version__refused_by_every_read_naming_the_record(
    storage: Storage, provider: str, storage_url: str
) -> None:
    await storage.create_job(job("new"))
    await storage.create_job(job("current"))
    await storage.insert_steps([StepState(job_id="j1", step_id="new", type="pkg.mod:Step")])
    _set_schema_version(provider, storage, storage_url, NEWER)

    reads: dict[str, Callable[[], Awaitable[object]]] = {
        "get_job": lambda: storage.get_job("new"),
        "list_jobs": lambda: storage.list_jobs("s", "n"),
        "get_jobs_excluding_finalized_stops": lambda: storage.get_jobs_excluding_finalized_stops(
            "s", "n"
        ),
        "list_unsettled_jobs": lambda: storage.list_unsettled_jobs("s", "n"),
        "list_jobs_for_cleanup": lambda: storage.list_jobs_for_cleanup(
            "s", "n", [JobStatus.RUNNING], datetime.now(UTC) + timedelta(days=1), 10
        ),
        "get_step": lambda: storage.get_step("j1", "new"),
        "list_steps": lambda: storage.list_steps("j1"),
        "list_steps by status": lambda: storage.list_steps("j1", statuses=["Scheduled"]),  # type: ignore[list-item]
    }
    for name, read in reads.items():
        with pytest.raises(UnsupportedSchemaError) as refused:
            await read()
        error = refused.value
        assert isinstance(error, StorageError), name
        expected = ("jobs", "new") if "job" in name else ("job_steps", "j1/new")
        assert (error.collection, error.record_id) == expected, name
        assert (error.version, error.supported) == (NEWER, SCHEMA_VERSION), name
        message = str(error)
        assert f"'{expected[1]}'" in message and f"'{expected[0]}'" in message, name
        assert f"schema_version {NEWER}" in message, name
        assert f"reads schema_version {SCHEMA_VERSION}" in message, name

    # The other job still reads; the refused records are as they were.
    assert (await storage.get_job("current")) is not None
    assert _stored_versions(provider, storage, storage_url) == (NEWER, NEWER)


async def test_a_version_that_is_not_a_number__is_a_corrupt_record(
    storage: Storage, provider: str, storage_url: str
) -> None:
    if provider == "memory":
        pytest.skip("a memory record is a model: its schema_version is always an int")
    await storage.create_job(job("new"))
    await storage.insert_steps([StepState(job_id="j1", step_id="new", type="pkg.mod:Step")])
    _set_schema_version(provider, storage, storage_url, "two")

    from choreography_ray.errors import CorruptRecordError

    with pytest.raises(CorruptRecordError, match="schema_version"):
        await storage.get_job("new")

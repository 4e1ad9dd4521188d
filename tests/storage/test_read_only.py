"""Storage opened read-only (`open_storage(url, read_only=True)`, what the CLI's read-only
commands use) creates nothing: no file, no directory, no table, no column, no index; it reads a
file of an older release as the upgrade would, and refuses writes."""

from __future__ import annotations

import asyncio
import hashlib
import sqlite3
import uuid
from pathlib import Path

import pytest

from choreography_ray.errors import StorageError, StorageUnavailableError
from choreography_ray.model import JobsManagerKey, JobState
from choreography_ray.status import JobStatus, StepStatus
from choreography_ray.storage import CountedKind, StoredOutput, open_storage
from choreography_ray.storage.mongodb import MongoStorage
from choreography_ray.storage.scheduler import scheduler_storage
from tests.fixtures import OLDEST_JOBS, build_oldest_sqlite


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def schema(path: Path) -> list[tuple[str, str]]:
    with sqlite3.connect(path) as connection:
        return connection.execute("SELECT type, sql FROM sqlite_master ORDER BY name").fetchall()


def test_missing_sqlite_file__unavailable_and_nothing_created(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'no' / 'such' / 'jobs.db'}"

    async def read() -> None:
        storage = open_storage(url, read_only=True)
        try:
            with pytest.raises(StorageUnavailableError, match="no SQLite database at"):
                await storage.get_job("x")
            with pytest.raises(StorageUnavailableError):
                await scheduler_storage(storage).list_manifests("default")
        finally:
            await storage.close()

    asyncio.run(read())
    assert list(tmp_path.iterdir()) == []


def test_oldest_sqlite_file__read_with_the_upgrades_defaults_and_left_unchanged(
    tmp_path: Path,
) -> None:
    path = tmp_path / "oldest.db"
    build_oldest_sqlite(path, scope="old", namespace="n", log="steps.jsonl",
                        job_type="pkg.jobs:Job", step_type="pkg.jobs:Step")  # fmt: skip
    before, layout = digest(path), schema(path)

    async def read() -> None:
        storage = open_storage(f"sqlite:///{path}", read_only=True)
        try:
            jobs = await storage.list_jobs("old", "n")
            assert [j.id for j in jobs] == list(OLDEST_JOBS)
            assert all(j.has_plan and j.version == 0 and j.resume_after is None for j in jobs)
            assert jobs[0].status is JobStatus.RUNNING
            steps = await storage.list_steps("old-running", statuses=[StepStatus.SCHEDULED])
            assert [s.attempt for s in steps] == [0, 0, 0]
            assert (await storage.count_by_status("old-running"))[0, StepStatus.RUNNING] == 1
            assert await storage.list_counted("old-running", CountedKind.COMPLETED) == []
            # The outputs' table is missing: it reads as empty, and stays missing.
            assert await storage.list_outputs("old-running") == []
            assert await storage.count_outputs("old-running", stage=0) == 0
            assert await storage.list_manager_keys() == [JobsManagerKey(scope="old", namespace="n")]
            # The scheduler's tables are missing: they read as empty, and stay missing.
            sched = scheduler_storage(storage)
            assert await sched.list_manifests("old") == []
            assert await sched.list_runs("old", None, 10) == []
            with pytest.raises(StorageError, match="read-only"):
                await storage.save_job(jobs[0])
        finally:
            await storage.close()

    asyncio.run(read())
    assert digest(path) == before
    assert schema(path) == layout


def test_current_sqlite_file__reads_what_was_written_and_refuses_writes(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'jobs.db'}"
    job = JobState(id="j1", scope="s", namespace="n", type="pkg.jobs:Job")
    output = StoredOutput("j1", "a", 0, 1, '{"n": 1}')

    async def run() -> None:
        writer = open_storage(url)
        await writer.add_manager_key(job.key)
        await writer.create_job(job.with_status(JobStatus.RUNNING))
        await writer.put_outputs([output])
        await writer.close()
        reader = open_storage(url, read_only=True)
        try:
            stored = await reader.get_job("j1")
            assert stored is not None and stored.status is JobStatus.RUNNING
            assert await reader.list_outputs("j1", stage=0) == [output]
            assert await reader.count_outputs("j1") == 1
            with pytest.raises(StorageError, match="read-only"):
                await reader.remove_job("j1")
            with pytest.raises(StorageError, match="read-only"):
                await reader.put_outputs([output])
        finally:
            await reader.close()

    asyncio.run(run())


def test_not_an_sqlite_file__unavailable_and_left_as_it_is(tmp_path: Path) -> None:
    path = tmp_path / "notes.txt"
    path.write_text("not a database\n" * 100, encoding="utf-8")

    async def read() -> None:
        storage = open_storage(f"sqlite:///{path}", read_only=True)
        try:
            with pytest.raises(StorageUnavailableError, match="cannot open SQLite database"):
                await storage.list_manager_keys()
        finally:
            await storage.close()

    asyncio.run(read())
    assert path.read_text(encoding="utf-8") == "not a database\n" * 100


def test_mongodb_read_only__flag_kept_and_no_io_on_open() -> None:
    storage = open_storage("mongodb://127.0.0.1:1/db", read_only=True)
    assert isinstance(storage, MongoStorage) and storage.read_only
    assert open_storage("mongodb://127.0.0.1:1/db").read_only is False  # type: ignore[attr-defined]


@pytest.mark.mongodb
def test_mongodb_read_only__reads_what_was_written_and_creates_no_index(
    mongodb_server: str,
) -> None:
    written = f"{mongodb_server}ro_written_{uuid.uuid4().hex[:8]}"
    fresh = f"{mongodb_server}ro_fresh_{uuid.uuid4().hex[:8]}"
    job = JobState(id="j1", scope="s", namespace="n", type="pkg.jobs:Job")

    async def run() -> list[str]:
        writer = open_storage(written)
        await writer.create_job(job)
        await writer.close()
        reader = open_storage(written, read_only=True)
        untouched = open_storage(fresh, read_only=True)
        try:
            stored = await reader.get_job("j1")
            assert stored is not None and stored.id == "j1"
            assert await untouched.get_job("j1") is None
            assert await untouched.list_manager_keys() == []
            assert await untouched.list_outputs("j1") == []
            assert await untouched.count_outputs("j1") == 0
            assert await scheduler_storage(untouched).list_manifests("s") == []
            assert isinstance(untouched, MongoStorage)
            return untouched._database().list_collection_names()
        finally:
            await reader.close()
            await untouched.close()

    assert asyncio.run(run()) == []  # no collection, so no index either

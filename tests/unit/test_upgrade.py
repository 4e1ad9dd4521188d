"""Upgrade safety without Ray: an SQLite file in the oldest form (tests/fixtures/oldest_sqlite.sql:
no counted-steps records, leases, attempts, `stop_finalized` or `schema_version`) opens, gains
the columns added since, and its records load with the spec's defaults; a record a newer release
wrote is refused and left as it is.
"""

from __future__ import annotations

import asyncio
import sqlite3
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from choreography_ray.errors import UnsupportedSchemaError
from choreography_ray.model import SCHEMA_VERSION
from choreography_ray.status import JobStatus, StepStatus
from choreography_ray.storage import CountedKind
from choreography_ray.storage.sqlite import SqliteStorage
from tests.fixtures import OLDEST_JOBS, build_oldest_sqlite, set_column

JOB_TYPE = "tests.runtime.rehydration_jobs:RecordedJob"
STEP_TYPE = "tests.runtime.rehydration_jobs:RecordedStep"


@pytest.fixture
def oldest(tmp_path: Path) -> Path:
    path = tmp_path / "oldest.db"
    build_oldest_sqlite(
        path, scope="old", namespace="n", log="steps.jsonl", job_type=JOB_TYPE, step_type=STEP_TYPE
    )
    return path


def columns(path: Path, table: str) -> set[str]:
    with sqlite3.connect(path) as connection:
        return {row[1] for row in connection.execute(f"PRAGMA table_info({table})")}


def test_oldest_sqlite_file__loads_with_the_specs_defaults(oldest: Path) -> None:
    assert "schema_version" not in columns(oldest, "jobs")
    assert "attempt" not in columns(oldest, "job_steps")

    async def read() -> None:
        storage = SqliteStorage(f"sqlite:///{oldest}")
        try:
            jobs = await storage.list_jobs("old", "n")
            assert [j.id for j in jobs] == list(OLDEST_JOBS)
            running, stopped, done = jobs
            for job in jobs:
                assert job.schema_version == 1
                assert job.stop_finalized is False
                assert job.records_counted_steps is False
                assert job.error is None
                assert job.version == 0
                assert job.has_plan is True
                assert job.progress.stopped_steps == 0 and job.progress.unreachable_steps == 0
                assert all(c.exception_messages == () for c in job.status_changes)
                for kind in CountedKind:
                    assert await storage.list_counted(job.id, kind) == []
            assert running.status is JobStatus.RUNNING
            assert [s.stage for s in running.progress.stages] == [0, 10]
            assert stopped.status is JobStatus.STOPPED and done.progress.is_completed

            steps = await storage.list_steps("old-running")
            assert [s.step_id for s in steps] == ["000001", "000002", "000003", "000004"]
            assert all(s.attempt == 0 and s.lease is None for s in steps)
            assert all(s.schema_version == 1 and s.is_prepared for s in steps)
            assert steps[0].status is StepStatus.RUNNING
            counts = await storage.count_by_status("old-running")
            assert counts == {(0, StepStatus.RUNNING): 1, (0, StepStatus.SCHEDULED): 2,
                              (10, StepStatus.SCHEDULED): 1}  # fmt: skip
            assert [j.id for j in await storage.get_jobs_excluding_finalized_stops("old", "n")] == [
                "old-done",
                "old-running",
                "old-stopped",
            ]
            unsettled = await storage.list_unsettled_jobs("old", "n")
            assert [j.id for j in unsettled] == ["old-running", "old-stopped"]

            # status_since is filled in from each row's history: the cleanup query finds the
            # terminal job by when it completed, the running one by when it started running.
            terminal = (JobStatus.COMPLETED_SUCCESSFULLY, JobStatus.FAILED)
            cutoff = datetime(2024, 12, 31, 0, 0, 5, tzinfo=UTC)
            assert await storage.list_jobs_for_cleanup("old", "n", terminal, cutoff, 10) == []
            later = cutoff + timedelta(microseconds=1)
            found = await storage.list_jobs_for_cleanup("old", "n", terminal, later, 10)
            assert [j.id for j in found] == ["old-done"]
            runs = (JobStatus.RUNNING,)
            assert await storage.list_jobs_for_cleanup("old", "n", runs, later, 10) == []
            found = await storage.list_jobs_for_cleanup("old", "n", runs, datetime.now(UTC), 1)
            assert [j.id for j in found] == ["old-running"]
            assert all(not j.held for j in jobs)

            # The job saves at the next version with this release's schema version, and the
            # counted-steps records now have a place.
            saved = await storage.save_job(running.model_copy(update={"stop_finalized": True}))
            assert saved.version == 1
            await storage.add_counted("old-running", CountedKind.COMPLETED, ["000001"])
            assert await storage.list_counted("old-running", CountedKind.COMPLETED) == ["000001"]
        finally:
            await storage.close()

    asyncio.run(read())

    assert {"schema_version", "stop_finalized", "records_counted_steps", "version", "held",
            "status_since"} <= columns(oldest, "jobs")  # fmt: skip
    assert {"attempt", "lease", "schema_version"} <= columns(oldest, "job_steps")
    assert {"job_numbers", "job_counted_steps"} <= tables(oldest)
    with sqlite3.connect(oldest) as connection:
        assert connection.execute(
            "SELECT schema_version, version FROM jobs WHERE id = 'old-running'"
        ).fetchone() == (SCHEMA_VERSION, 1)


def tables(path: Path) -> set[str]:
    with sqlite3.connect(path) as connection:
        rows = connection.execute("SELECT name FROM sqlite_master WHERE type = 'table'")
        return {name for (name,) in rows}


def test_oldest_sqlite_file_without_has_plan__a_job_with_totals_has_its_plan(
    tmp_path: Path,
) -> None:
    # An even older file, without has_plan: the plan's totals are written with the plan.
    path = tmp_path / "older.db"
    with sqlite3.connect(path) as connection:
        connection.executescript(
            """CREATE TABLE jobs (id TEXT PRIMARY KEY, scope TEXT NOT NULL,
                   namespace TEXT NOT NULL, type TEXT NOT NULL, status TEXT NOT NULL,
                   stage INTEGER NOT NULL, progress TEXT NOT NULL, request TEXT NOT NULL,
                   status_changes TEXT NOT NULL, created TEXT NOT NULL);
               INSERT INTO jobs VALUES ('planned', 's', 'n', 'p:J', 'Running', 0,
                   '{"total_steps": 3}', '{}', '[]', '2025-01-01T00:00:00.000000+00:00');
               INSERT INTO jobs VALUES ('unplanned', 's', 'n', 'p:J', 'PreparingJob', 0,
                   '{}', '{}', '[]', '2025-01-01T00:00:01.000000+00:00');"""
        )
    connection.close()

    async def read() -> dict[str, bool]:
        storage = SqliteStorage(f"sqlite:///{path}")
        try:
            return {j.id: j.has_plan for j in await storage.list_jobs("s", "n")}
        finally:
            await storage.close()

    assert asyncio.run(read()) == {"planned": True, "unplanned": False}


def test_newer_schema_version_in_an_sqlite_file__refused_and_left_as_it_is(oldest: Path) -> None:
    url = f"sqlite:///{oldest}"

    async def migrate() -> None:
        storage = SqliteStorage(url)
        await storage.count_counted("old-running", CountedKind.COMPLETED)  # opens the file
        await storage.close()

    asyncio.run(migrate())
    set_column(oldest, "UPDATE jobs SET schema_version = 7, status = 'Paused' WHERE id = ?",
               "old-running")  # fmt: skip

    async def read() -> UnsupportedSchemaError:
        storage = SqliteStorage(url)
        try:
            with pytest.raises(UnsupportedSchemaError) as refused:
                await storage.get_job("old-running")
            # The status a newer release may have added is never parsed (it would be corrupt).
            assert (await storage.get_job("old-done")) is not None
            return refused.value
        finally:
            await storage.close()

    error = asyncio.run(read())
    assert str(error) == (
        "record 'old-running' in 'jobs' has schema_version 7; this release reads "
        f"schema_version {SCHEMA_VERSION} and older: upgrade choreography-ray to read it"
    )
    with sqlite3.connect(oldest) as connection:
        row = connection.execute(
            "SELECT schema_version, status FROM jobs WHERE id = 'old-running'"
        ).fetchone()
    assert row == (7, "Paused")

"""The jobs manager's cleanup wiring without a cluster (issue 12, item 3): `ManagerCore` runs
the pass as its named periodic task, asks Ray's GCS (faked here) whether a job's actor lives,
and releases held jobs in the background. No Ray is started: the manager is built on SQLite and
its one Ray lookup is replaced."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from choreography_ray.model import JobState, StatusChange, utcnow
from choreography_ray.options import JobsOptions
from choreography_ray.runtime import manager as manager_module
from choreography_ray.status import JobStatus
from choreography_ray.storage import Storage
from choreography_ray.types import type_path
from tests.unit.core.jobs import NotKeptJob, StagedJob

pytestmark = pytest.mark.timeout(30)


def aged(job_id: str, status: JobStatus, age: timedelta, job_type: type) -> JobState:
    reached = utcnow() - age
    return JobState(id=job_id, scope="s", namespace="n", type=type_path(job_type), status=status,
                    status_changes=(StatusChange(status=status, occurred=reached),),
                    created=reached, held=True)  # fmt: skip


async def gone(storage: Storage, *job_ids: str) -> None:
    """Waits until none of the jobs is stored (the test's timeout bounds it)."""
    for job_id in job_ids:
        await eventually_gone(storage, job_id)


async def eventually_gone(storage: Storage, job_id: str) -> None:
    for _ in range(1_000):
        if await storage.get_job(job_id) is None:
            return
        await asyncio.sleep(0.02)
    raise AssertionError(f"job {job_id} is still stored")


def test_manager__runs_the_cleanup_pass_as_a_named_task_and_releases_held_jobs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    live: set[str] = set()
    monkeypatch.setattr(manager_module, "actor_exists", lambda name, ns: name in live)

    async def scenario() -> None:
        options = JobsOptions(cleanup_interval=0.05)
        core = manager_module.ManagerCore(
            "s", "n", f"sqlite:///{tmp_path / 'jobs.db'}", options.model_dump_json(), "ns"
        )
        storage = core.storage
        try:
            await storage.create_job(aged("old", JobStatus.FAILED, timedelta(days=8), StagedJob))
            await storage.create_job(aged("exiting", JobStatus.FAILED, timedelta(days=9),
                                          StagedJob))  # fmt: skip
            live.add("job/exiting")
            await storage.create_job(aged("done", JobStatus.COMPLETED_SUCCESSFULLY,
                                          timedelta(seconds=1), NotKeptJob))  # fmt: skip
            core.start_cleanup()
            assert {t.get_name() for t in core.tasks.tasks} == {"jobs-manager/s/n: cleanup"}
            core.release("done")
            await gone(storage, "old", "done")
            stats: dict[str, Any] = core.cleanup_stats()
            assert stats["removed"] == {"old": "retention", "done": "not kept"}
            assert stats["failures"] == {}
            assert await storage.get_job("exiting") is not None  # its actor lives
            live.clear()
            await gone(storage, "exiting")
        finally:
            core.tasks.cancel_all()
            await storage.close()

    asyncio.run(asyncio.wait_for(scenario(), 20))


def test_manager__no_cleanup_task_when_the_pass_is_off(tmp_path: Path) -> None:
    async def scenario() -> None:
        off = JobsOptions(terminal_job_retention=None, dead_job_threshold=0)
        for options in (JobsOptions(cleanup_interval=None), off):
            core = manager_module.ManagerCore(
                "s", "n", f"sqlite:///{tmp_path / 'jobs.db'}", options.model_dump_json(), "ns"
            )
            core.start_cleanup()
            assert not core.tasks.tasks
            await core.storage.close()

    asyncio.run(scenario())

"""Retention and dead-job cleanup on real Ray (issue 12, item 3): a jobs manager with a short
`cleanup_interval` removes an old terminal job and a dead PREPARING job, with their records,
and leaves running, stopped, removing and recent ones; a job type with `keep_after_completed`
off drops its records as it completes, and when the scheduler runs it, only after its run
settled as a success. Ages are set through storage: jobs are seeded with old status changes."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import ray

import choreography_ray as cr
from choreography_ray.storage import CountedKind, Storage
from tests.runtime.retention_jobs import NotKept
from tests.runtime.sample_jobs import FanOut, FanOutRequest
from tests.support import RAY_NAMESPACE, eventually, in_storage

pytestmark = pytest.mark.timeout(120)

S = cr.JobStatus
NAMESPACE = "retention"
JOB_TYPE = "tests.runtime.sample_jobs:FanOut"
#: The cleanup pass every half second; nothing is rehydrated or reconciled behind the test's back.
CLEANUP = {"cleanup_interval": 0.5, "reconciliation_interval": 0}


def aged(
    scope: str, job_id: str, status: cr.JobStatus, age: timedelta, **fields: Any
) -> cr.JobState:
    reached = datetime.now(UTC) - age
    history = (cr.StatusChange(status=S.PREPARING_JOB, occurred=reached - timedelta(days=1)),
               cr.StatusChange(status=status, occurred=reached))  # fmt: skip
    return cr.JobState(id=f"{scope}-{job_id}", scope=scope, namespace=NAMESPACE, type=JOB_TYPE,
                       status=status, status_changes=history,
                       created=reached - timedelta(days=1), **fields)  # fmt: skip


def seed(url: str, *jobs: cr.JobState, steps: int = 0) -> None:
    async def write(storage: Storage) -> None:
        for job in jobs:
            await storage.create_job(job)
            records = [cr.StepState(job_id=job.id, step_id=f"{n:06}", type=JOB_TYPE,
                                    status=cr.StepStatus.FAILED) for n in range(steps)]  # fmt: skip
            if records:
                await storage.insert_steps(records)
                await storage.add_counted(job.id, CountedKind.COMPLETED, ["000000"])

    in_storage(url, write)


def stored(url: str, job_id: str) -> tuple[cr.JobState | None, int, int]:
    """The job's record, its step records and its counted records, as storage holds them."""

    async def read(storage: Storage) -> tuple[cr.JobState | None, int, int]:
        counted = await storage.list_counted(job_id, CountedKind.COMPLETED)
        return await storage.get_job(job_id), len(await storage.list_steps(job_id)), len(counted)

    return in_storage(url, read)


def cleanup_stats(scope: str) -> Any:
    handle = ray.get_actor(f"jobs-manager/{scope}/{NAMESPACE}", namespace=RAY_NAMESPACE)
    return ray.get(handle.cleanup_stats.remote())


@pytest.fixture
def manager_actors(scope: str) -> Iterator[list[str]]:
    """Names of the detached managers a test made: killed after it (they would run a cleanup
    pass on this test's storage every half second for the rest of the session)."""
    names: list[str] = []
    yield names
    for name in names:
        with contextlib.suppress(ValueError):  # gone already
            ray.kill(ray.get_actor(name, namespace=RAY_NAMESPACE), no_restart=True)


def test_cleanup__removes_old_terminal_and_dead_jobs_and_leaves_running_and_stopped_ones(
    connect,
    storage_url: str,
    scope: str,
    manager_actors: list[str],  # type: ignore[no-untyped-def]
) -> None:
    week = timedelta(days=8)
    seed(storage_url, aged(scope, "done", S.COMPLETED_SUCCESSFULLY, week), steps=2)
    seed(storage_url, aged(scope, "failed", S.FAILED, week))
    seed(storage_url, aged(scope, "dead", S.PREPARING_JOB, timedelta(hours=2)))
    kept = [
        aged(scope, "running", S.RUNNING, week),
        aged(scope, "stopped", S.STOPPED, week, stop_finalized=True),
        aged(scope, "removing", S.REMOVING, week),
        aged(scope, "recent", S.COMPLETED_SUCCESSFULLY, timedelta(days=1)),
        aged(scope, "preparing", S.PREPARING_JOB, timedelta(minutes=10)),
    ]
    seed(storage_url, *kept)
    seed(storage_url, aged(scope, "planning", S.PREPARING_STEPS, timedelta(hours=2)), steps=1)
    jobs = connect(**CLEANUP)
    manager = jobs.manager(scope, NAMESPACE)
    manager_actors.append(f"jobs-manager/{scope}/{NAMESPACE}")
    # A job run now, to completion: recent, so kept.
    started = manager.start(FanOut, FanOutRequest(count=2))
    assert manager.wait(started.job_id, timeout=60).status is S.COMPLETED_SUCCESSFULLY

    remaining = {j.id for j in kept} | {f"{scope}-planning", started.job_id}
    eventually(lambda: {j.id for j in manager.list()} == remaining, 30, "the cleanup pass")

    for name in ("done", "failed", "dead"):
        assert stored(storage_url, f"{scope}-{name}") == (None, 0, 0), name
    assert stored(storage_url, f"{scope}-planning")[1] == 1
    stats = cleanup_stats(scope)
    assert stats["removed"] == {f"{scope}-done": "retention", f"{scope}-failed": "retention",
                                f"{scope}-dead": "dead"}  # fmt: skip
    assert stats["failures"] == {}
    passes = stats["passes"]
    eventually(lambda: cleanup_stats(scope)["passes"] >= passes + 2, 10, "two more passes")
    assert {j.id for j in manager.list()} == remaining


def test_keep_after_completed_off__a_finished_job_drops_its_records(
    connect,
    storage_url: str,
    scope: str,
    manager_actors: list[str],  # type: ignore[no-untyped-def]
) -> None:
    jobs = connect(**CLEANUP)
    manager = jobs.manager(scope, NAMESPACE)
    manager_actors.append(f"jobs-manager/{scope}/{NAMESPACE}")
    started = manager.start(NotKept, FanOutRequest(count=3))
    eventually(lambda: stored(storage_url, started.job_id) == (None, 0, 0), 60, "the drop")
    with pytest.raises(cr.JobOperationError) as gone:
        manager.get(started.job_id)
    assert gone.value.error is cr.JobLookupError.JOB_NOT_FOUND


def test_keep_after_completed_off__a_scheduler_run_settles_as_a_success_then_its_job_goes(
    connect,
    storage_url: str,
    scope: str,
    manager_actors: list[str],  # type: ignore[no-untyped-def]
) -> None:
    fast = cr.SchedulerOptions(manifest_cycle=0.5, dispatch_interval=0.25, lock_ttl=3)
    jobs = connect(scheduler=fast, **CLEANUP)
    sched = jobs.scheduler(scope)
    manager_actors.extend([f"scheduler/{scope}", f"jobs-manager/{scope}/default"])
    sched.schedule("not-kept", NotKept, FanOutRequest(count=2), every=timedelta(minutes=10))

    (run,) = eventually(lambda: [r for r in sched.runs("not-kept") if r.ended_at], 60, "the run")
    assert run.status is cr.RunStatus.SUCCEEDED, run
    assert run.job_id is not None
    eventually(lambda: stored(storage_url, run.job_id) == (None, 0, 0), 30, "the release")
    assert sched.runs("not-kept")[0].status is cr.RunStatus.SUCCEEDED

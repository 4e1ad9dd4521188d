"""The scheduler and `keep_after_completed` (issue 12, item 3): a run is settled from its job's
stored outcome and only then is the job released (its records may go), so a job type that does
not keep its records never turns a success into a cancellation."""

from __future__ import annotations

from choreography_ray.scheduler.schedules import Every
from choreography_ray.scheduler.status import RunStatus
from tests.unit.scheduler.harness import JOB, Harness, run


def test_a_settled_run_releases_its_job_after_the_run_is_saved() -> None:
    async def scenario() -> None:
        h = Harness()
        core = await h.start()
        seen: list[list[RunStatus]] = []
        release = h.jobs.release_job

        async def release_job(scope: str, namespace: str, job_type: str, job_id: str) -> None:
            seen.append([r.status for r in await core.runs("m")])
            await release(scope, namespace, job_type, job_id)

        h.jobs.release_job = release_job  # type: ignore[method-assign]
        await core.schedule("m", JOB, {}, Every.minutes(10))
        await h.run_for(5)

        (started,) = h.jobs.started
        assert h.jobs.released == [started.job_id]
        assert seen == [[RunStatus.SUCCEEDED]]

    run(scenario)


def test_a_run_whose_job_was_removed_is_cancelled_and_releases_nothing() -> None:
    async def scenario() -> None:
        h = Harness()
        core = await h.start()

        async def removed_at_once(job_id: str) -> None:
            del h.jobs.jobs[job_id]

        h.jobs.on_start = removed_at_once
        await core.schedule("m", JOB, {}, Every.minutes(10))
        await h.run_for(5)

        (settled,) = await core.runs("m")
        assert settled.status is RunStatus.CANCELLED
        assert h.jobs.released == []

    run(scenario)


def test_a_release_that_fails_leaves_the_run_settled_and_the_cycle_going() -> None:
    async def scenario() -> None:
        h = Harness()
        core = await h.start()
        h.jobs.release_error = ConnectionError("the jobs manager is unreachable")
        await core.schedule("m", JOB, {}, Every.minutes(1))
        await h.run_for(130)

        runs = await core.runs("m")
        assert len(runs) >= 2
        assert {r.status for r in runs[1:]} == {RunStatus.SUCCEEDED}
        assert h.jobs.released == []

    run(scenario)

"""Operators' operations through `SchedulerCore` on the memory storage: what a requeue, a
trigger and a resume run, and how their runs count, to the letter of the spec."""

from __future__ import annotations

from choreography_ray.scheduler.port import JobView
from choreography_ray.scheduler.schedules import Every
from choreography_ray.scheduler.status import DeadLetterStatus, RunStatus
from choreography_ray.status import JobStatus
from tests.unit.scheduler.harness import JOB, Harness, run

FAILS = JobView(JobStatus.FAILED)


def test_requeue_execution__its_failure_counts_toward_no_manifests_retries() -> None:
    async def scenario() -> None:
        h = Harness(default_retry_delay=2)
        h.jobs.ends_as = FAILS
        core = await h.start()
        await core.schedule("m", JOB, {}, Every.minutes(10), max_retries=0)
        await h.run_for(2)
        (letter,) = await core.dead_letters("m")
        await core.acknowledge(letter.id, "known outage")
        assert letter.run_id is not None
        again = await core.requeue_execution(letter.run_id)
        await h.run_for(3)
        requeued = await h.storage.get_run(again.run_id)
        assert requeued is not None and requeued.status is RunStatus.FAILED
        # Not the manifest's failure: no second dead letter, and no retry of it.
        assert [d.status for d in await core.dead_letters("m")] == [DeadLetterStatus.ACKNOWLEDGED]
        assert len(h.starts()) == 2

    run(scenario)

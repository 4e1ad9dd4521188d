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


def test_trigger__a_run_in_flight_answers_and_no_second_run_starts() -> None:
    async def scenario() -> None:
        h = Harness()
        h.jobs.ends_as = JobView(JobStatus.RUNNING)
        core = await h.start()
        await core.schedule("m", JOB, {}, Every.hours(1))
        await h.run_for(1)
        (running,) = await core.runs("m")
        assert running.status is RunStatus.RUNNING
        answer = await core.trigger("m")
        assert answer.run_id == running.id and answer.already_dispatched
        await h.run_for(1)
        assert len(h.starts()) == 1

    run(scenario)


def test_trigger__an_operators_queued_requeue_is_the_run_in_flight() -> None:
    async def scenario() -> None:
        h = Harness()
        h.jobs.ends_as = FAILS
        core = await h.start()
        await core.schedule("m", JOB, {}, Every.hours(1), max_retries=0)
        await h.run_for(1.5)  # it failed and is dead-lettered: nothing else is queued
        (failed,) = await core.runs("m")
        assert failed.status is RunStatus.FAILED
        again = await core.requeue_execution(failed.id)  # queued: holds no manifest key
        answer = await core.trigger("m")
        assert answer.run_id == again.run_id and answer.already_dispatched
        assert [e.run_id for e in await h.storage.queued_entries("s", "m")] == [again.run_id]

    run(scenario)

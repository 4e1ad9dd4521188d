"""Checkpoints through `SchedulerCore` (spec 003, "Retries resume from a checkpoint"): a failed
run of a job type with `checkpoint_stages` stores its latest completed stage; its retry, a
requeue of its dead letter and `resume_execution` start their job after it; a job that ran from
the top (its layout changed) leaves its run with no `resumed_from`."""

from __future__ import annotations

from datetime import timedelta

from choreography_ray.model import StageProgress
from choreography_ray.scheduler.port import JobView
from choreography_ray.scheduler.schedules import Cron, Every
from choreography_ray.scheduler.status import RunStatus
from choreography_ray.status import JobStatus
from tests.unit.scheduler.harness import JOB, Harness, run

#: Stage 0 completed, stage 1 failed, stage 2 never ran.
FAILS_IN_STAGE_1 = JobView(
    JobStatus.COMPLETED_WITH_FAILURES,
    stages=(
        StageProgress(stage=0, is_started=True, total_steps=2, successful_steps=2),
        StageProgress(stage=1, is_started=True, total_steps=1, failed_steps=1),
        StageProgress(stage=2, total_steps=1, unreachable_steps=1),
    ),
)


def checkpointing(**options: object) -> Harness:
    h = Harness(**{"default_retry_delay": 2, **options})
    h.jobs.ends_as = FAILS_IN_STAGE_1
    h.jobs.checkpointing = {JOB}
    return h


def test_a_retry_resumes_after_the_latest_checkpoint_and_a_second_failure_from_the_same() -> None:
    async def scenario() -> None:
        h = checkpointing()
        core = await h.start()
        await core.schedule("m", JOB, {}, Every.minutes(10), max_retries=2)
        await h.run_for(30)
        first, second, third = sorted(await core.runs("m"), key=lambda r: r.queued_at)
        assert [s.resume_after is None for s in h.jobs.started] == [True, False, False]
        assert [s.resume_after.stage for s in h.jobs.started[1:]] == [0, 0]  # type: ignore[union-attr]
        assert h.jobs.started[1].resume_after.source == first.id  # type: ignore[union-attr]
        assert [r.resumed_from for r in (first, second, third)] == [None, first.id, second.id]
        (point,) = await h.storage.list_checkpoints(first.id)
        assert point.stage == 0 and [s.steps for s in point.layout] == [2, 1, 1]
        assert await core.dead_letters("m")  # resuming changes nothing of the counting

    run(scenario)


def test_a_job_type_that_does_not_opt_in_stores_no_checkpoint_and_reruns_from_the_top() -> None:
    async def scenario() -> None:
        h = checkpointing()
        h.jobs.checkpointing = set()
        core = await h.start()
        await core.schedule("m", JOB, {}, Every.minutes(10), max_retries=1)
        await h.run_for(10)
        runs = await core.runs("m")
        assert len(runs) == 2
        assert all(s.resume_after is None for s in h.jobs.started)
        assert all(r.resumed_from is None for r in runs)
        assert await h.storage.list_checkpoints(runs[-1].id) == []

    run(scenario)


def test_a_run_whose_job_ran_from_the_top_has_no_resumed_from() -> None:
    """The job found its plan's layout changed and ran every stage (its view says it did not
    resume): its run is settled with `resumed_from` cleared, so no chain leads through it."""

    async def scenario() -> None:
        h = checkpointing()

        async def from_the_top(job_id: str) -> None:
            h.jobs.jobs[job_id] = FAILS_IN_STAGE_1

        h.jobs.on_start = from_the_top
        core = await h.start()
        await core.schedule("m", JOB, {}, Every.minutes(10), max_retries=1)
        await h.run_for(10)
        _, second = sorted(await core.runs("m"), key=lambda r: r.queued_at)
        assert h.jobs.started[1].resume_after is not None
        assert second.status is RunStatus.FAILED and second.resumed_from is None

    run(scenario)


def test_a_requeued_dead_letter_and_resume_execution_start_after_the_checkpoint() -> None:
    async def scenario() -> None:
        h = checkpointing()
        core = await h.start()
        await core.schedule("m", JOB, {}, Cron(expression="0 3 * * *"), max_retries=0)
        await core.trigger("m")
        await h.run_for(2)
        (letter,) = await core.dead_letters("m")
        requeued = await core.requeue(letter.id)
        await h.run_for(1.5)  # started, then settled FAILED: only a finished run resumes
        assert h.jobs.started[-1].resume_after is not None
        assert h.jobs.started[-1].resume_after.source == letter.run_id
        assert (await h.storage.get_run(requeued)).resumed_from == letter.run_id  # type: ignore[union-attr]

        resumed = await core.resume_execution(requeued)
        await h.run_for(1)
        assert h.jobs.started[-1].resume_after is not None
        assert (await h.storage.get_run(resumed)).resumed_from == requeued  # type: ignore[union-attr]

    run(scenario)


def test_resume_execution_of_a_run_without_a_checkpoint_runs_from_the_top() -> None:
    async def scenario() -> None:
        h = checkpointing()
        h.jobs.ends_as = JobView(JobStatus.FAILED)  # failed before any stage completed
        core = await h.start()
        await core.schedule("m", JOB, {}, Cron(expression="0 3 * * *"))
        await core.trigger("m")
        await h.run_for(1.5)
        (failed,) = await core.runs("m")
        resumed = await core.resume_execution(failed.id)
        await h.run_for(1)
        assert h.jobs.started[-1].resume_after is None
        assert (await h.storage.get_run(resumed)).resumed_from is None  # type: ignore[union-attr]

    run(scenario)


#: Stage 0 completed, stage 1 still running (a run past its timeout).
RUNS_IN_STAGE_1 = JobView(
    JobStatus.RUNNING,
    stages=(
        StageProgress(stage=0, is_started=True, total_steps=2, successful_steps=2),
        StageProgress(stage=1, is_started=True, total_steps=1),
        StageProgress(stage=2, total_steps=1),
    ),
)


def test_a_run_cancelled_by_its_timeout_stores_its_checkpoint_and_resumes_after_it() -> None:
    """Issue 36, item 3: a CANCELLED run (a run timeout) keeps its checkpoint, so
    `resume_execution` of it skips the stages it completed, as docs/scheduler.md says."""

    async def scenario() -> None:
        h = checkpointing()
        h.jobs.ends_as = RUNS_IN_STAGE_1
        core = await h.start()
        await core.schedule(
            "m", JOB, {}, Cron(expression="0 0 1 1 *"), timeout=timedelta(seconds=5)
        )
        await core.trigger("m")
        await h.run_for(10)
        (cancelled,) = await core.runs("m")
        assert cancelled.status is RunStatus.CANCELLED and cancelled.timed_out_at is not None
        (point,) = await h.storage.list_checkpoints(cancelled.id)
        assert point.stage == 0

        resumed = await core.resume_execution(cancelled.id)
        await h.run_for(2)
        assert h.jobs.started[-1].resume_after is not None
        assert h.jobs.started[-1].resume_after.stage == 0
        assert (await h.storage.get_run(resumed)).resumed_from == cancelled.id  # type: ignore[union-attr]

    run(scenario)

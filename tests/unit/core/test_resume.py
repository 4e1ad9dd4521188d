"""Resume, recover and retry-failed: two at once run the resume hook once (issue 9, item 2);
retry_failed_steps stores its steps before it returns (item 13)."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Callable, Coroutine
from typing import Any

import pytest

from choreography_ray.core.mode import Mode
from choreography_ray.errors import (
    JobOperationError,
    ResumeJobError,
    RetryFailedStepsError,
    StorageError,
)
from choreography_ray.model import JobState
from choreography_ray.status import JobStatus, StepStatus
from choreography_ray.storage import StatusCounts
from tests.unit.core.conftest import Activations
from tests.unit.core.fakes import FAILED, FaultyStorage
from tests.unit.core.harness import Harness
from tests.unit.core.jobs import Plan, RetryableJob, StagedJob

pytestmark = pytest.mark.timeout(30)


async def stopped_job(activations: Activations, sizes: list[int]) -> Harness:
    """A job started, stopped and finalized: every running step honoured the stop."""
    h = await activations.new(StagedJob, Plan(sizes=sizes))
    await h.c.start()
    await h.settle()
    await h.c.stop()
    await h.hosts.stop_cancelled()
    await h.settle()
    stored = await h.stored()
    assert (stored.status, stored.stop_finalized) == (JobStatus.STOPPED, True)
    return h


def starts_per_step(h: Harness) -> Counter[str]:
    return Counter(s.step_id for s in h.hosts.started)


# -- item 2 ---------------------------------------------------------------------------------------


def test_resume__two_at_once_run_the_hook_once(activations: Activations) -> None:
    async def scenario() -> None:
        h = await stopped_job(activations, [3])
        hook = h.control("on_before_resuming_job_steps", gate=asyncio.Event())

        first = asyncio.create_task(h.c.resume())
        second = asyncio.create_task(h.c.resume())
        await hook.entered.wait()
        await h.settle()
        assert hook.gate is not None
        hook.gate.set()
        await asyncio.gather(first, second)
        await h.settle()

        assert h.calls["on_before_resuming_job_steps"] == 1
        assert hook.peak == 1
        # Each step ran once before the stop and once since.
        assert starts_per_step(h) == {"000000": 2, "000001": 2, "000002": 2}
        await h.hosts.finish_all()
        await h.settle()
        assert (await h.status()) is JobStatus.COMPLETED_SUCCESSFULLY
        assert h.calls["on_completed"] == 1

    activations.run(scenario)


def test_recover__two_at_once_after_a_reactivation_run_the_hook_once_and_adopt_running_steps(
    activations: Activations,
) -> None:
    """The job's actor was lost while its steps ran; two rehydrations reach the new one."""

    async def scenario() -> None:
        h = await activations.new(StagedJob, Plan(sizes=[3]))
        await h.c.start()
        await h.hosts.finish("000000")
        await h.activate(reconstructed=False)
        hook = h.control("on_before_resuming_job_steps", gate=asyncio.Event())

        first = asyncio.create_task(h.c.recover())
        second = asyncio.create_task(h.c.recover())
        await hook.entered.wait()
        await h.settle()
        assert hook.gate is not None
        hook.gate.set()
        await asyncio.gather(first, second)
        await h.settle()

        assert h.calls["on_before_resuming_job_steps"] == 1
        # Still running on their hosts: adopted, never started twice.
        assert starts_per_step(h) == {"000000": 1, "000001": 1, "000002": 1}
        await h.hosts.finish_all()
        await h.settle()
        stored = await h.stored()
        assert stored.status is JobStatus.COMPLETED_SUCCESSFULLY
        assert stored.progress.successful_steps == 3

    activations.run(scenario)


def test_resume__and_a_recover_at_once_on_a_stopped_job_resume_it_once(
    activations: Activations,
) -> None:
    async def scenario() -> None:
        h = await stopped_job(activations, [2])
        hook = h.control("on_before_resuming_job_steps", gate=asyncio.Event())

        resume = asyncio.create_task(h.c.resume())
        recover = asyncio.create_task(h.c.recover())
        await hook.entered.wait()
        assert hook.gate is not None
        hook.gate.set()
        await asyncio.gather(resume, recover)
        await h.settle()

        assert h.calls["on_before_resuming_job_steps"] == 1
        assert starts_per_step(h) == {"000000": 2, "000001": 2}

    activations.run(scenario)


def test_resume__a_stopped_job_whose_hook_fails_is_stopped_again_and_never_resumed_by_the_watchdog(
    activations: Activations,
) -> None:
    """R43 (docs/decisions.md): "A job reverted to `Stopped`, or stopped later, is never resumed
    by the watchdog." An explicit resume of a stopped job whose `on_before_resuming_job_steps`
    throws reverts it to Stopped (its stop final again) and answers the hook's error; a later
    resume runs it."""

    async def scenario() -> None:
        h = await stopped_job(activations, [2])
        h.control("on_before_resuming_job_steps", raises=1)
        with pytest.raises(JobOperationError) as refused:
            await h.c.resume()
        assert refused.value.error is ResumeJobError.UNKNOWN
        assert "on_before_resuming_job_steps" in str(refused.value)
        await h.settle()
        stored = await h.stored()
        assert (stored.status, stored.stop_finalized) == (JobStatus.STOPPED, True)
        assert stored.progress.stopped_steps == 2
        for _ in range(3):
            await h.c.watchdog_tick()
            await h.settle()
        assert h.calls["on_before_resuming_job_steps"] == 1  # the watchdog never resumed it
        assert len(h.hosts.started) == 2  # none since the stop

        await h.c.resume()  # asked again, the hook succeeds
        await h.settle()
        assert starts_per_step(h) == {"000000": 2, "000001": 2}
        assert (await h.all_succeed()) == (JobStatus.COMPLETED_SUCCESSFULLY, 2)

    activations.run(scenario)


def test_recover__a_hook_that_fails_is_retried_by_the_watchdog_before_any_step_starts(
    activations: Activations,
) -> None:
    """The spec: "When `OnBeforeResumingJobSteps` throws for a job that is `Running`, the job
    stays `Running` and the watchdog retries the resume" (a rehydration's resume)."""

    async def scenario() -> None:
        h = await activations.new(StagedJob, Plan(sizes=[2]))
        await h.c.start()
        await h.settle()
        await h.activate(reconstructed=False)  # the actor was lost while its steps ran
        h.control("on_before_resuming_job_steps", raises=1)
        await h.c.recover()
        await h.settle()
        assert ((await h.status()), h.c.mode) == (JobStatus.RUNNING, Mode.HOOK_OWED)
        await h.c.watchdog_tick()
        await h.settle()
        assert h.calls["on_before_resuming_job_steps"] == 2
        assert h.c.mode == Mode.RUNNING
        assert (await h.all_succeed()) == (JobStatus.COMPLETED_SUCCESSFULLY, 2)

    activations.run(scenario)


# -- item 13 --------------------------------------------------------------------------------------


async def completed_with_one_failure(activations: Activations, **kwargs: object) -> Harness:
    h = await activations.new(RetryableJob, Plan(sizes=[3]), **kwargs)  # type: ignore[arg-type]
    await h.c.start()
    await h.hosts.finish("000000")
    await h.hosts.finish("000001", FAILED, "boom")
    await h.hosts.finish("000002")
    await h.settle()
    assert (await h.status()) is JobStatus.COMPLETED_WITH_FAILURES
    return h


def test_retry_failed_steps__stores_the_steps_scheduled_at_the_next_attempt_before_returning(
    activations: Activations,
) -> None:
    async def scenario() -> None:
        h = await completed_with_one_failure(activations)
        h.hosts.start_gate = asyncio.Event()  # nothing the pump starts gets stored RUNNING

        assert await h.c.retry_failed_steps() == 1

        step = (await h.steps())["000001"]
        assert (step.status, step.attempt) == (StepStatus.SCHEDULED, 2)
        stored = await h.stored()
        assert stored.status is JobStatus.RUNNING
        assert stored.records_counted_steps
        assert not h.c.exit is not None
        h.hosts.start_gate.set()
        await h.settle()
        assert [(s.step_id, s.attempt) for s in h.hosts.started][-1] == ("000001", 2)
        await h.hosts.finish("000001")
        await h.settle()
        stored = await h.stored()
        assert stored.status is JobStatus.COMPLETED_SUCCESSFULLY
        assert (stored.progress.successful_steps, stored.progress.failed_steps) == (3, 0)
        assert h.calls["on_completed"] == 2  # once per execution

    activations.run(scenario)


def test_retry_failed_steps__a_lost_activation_runs_them_after_recovery(
    activations: Activations,
) -> None:
    async def scenario() -> None:
        h = await completed_with_one_failure(activations)
        h.hosts.start_gate = asyncio.Event()  # the actor is lost before the step starts
        await h.c.retry_failed_steps()
        await h.activate(reconstructed=True)  # reactivation recovers
        h.hosts.start_gate.set()
        await h.settle()

        assert ("000001", 2) in [(s.step_id, s.attempt) for s in h.hosts.started]
        await h.hosts.finish("000001")
        await h.settle()
        stored = await h.stored()
        assert stored.status is JobStatus.COMPLETED_SUCCESSFULLY
        assert (stored.progress.successful_steps, stored.progress.failed_steps) == (3, 0)

    activations.run(scenario)


def test_retry_failed_steps__a_failed_schedule_write_raises_and_the_job_completes_again(
    activations: Activations,
) -> None:
    async def scenario() -> None:
        storage = FaultyStorage()
        h = await completed_with_one_failure(activations, storage=storage)
        storage.fail("update_steps", 1)  # the SCHEDULED write fails, on purpose

        with pytest.raises(JobOperationError) as raised:
            await h.c.retry_failed_steps()
        assert raised.value.error is RetryFailedStepsError.COULD_NOT_PERSIST
        await h.settle()

        stored = await h.stored()
        assert stored.status is JobStatus.COMPLETED_WITH_FAILURES
        assert (stored.progress.successful_steps, stored.progress.failed_steps) == (2, 1)
        assert (await h.steps())["000001"].status is StepStatus.FAILED
        assert await h.c.retry_failed_steps() == 1

    activations.run(scenario)


def test_retry_failed_steps__a_failed_running_save_changes_nothing(
    activations: Activations,
) -> None:
    async def scenario() -> None:
        storage = FaultyStorage()
        h = await completed_with_one_failure(activations, storage=storage)
        storage.fail("save_job", 1)

        with pytest.raises(JobOperationError) as raised:
            await h.c.retry_failed_steps()
        assert raised.value.error is RetryFailedStepsError.COULD_NOT_PERSIST
        assert h.c.stages[0].failed == 1
        stored = await h.stored()
        assert stored.status is JobStatus.COMPLETED_WITH_FAILURES
        assert (await h.steps())["000001"].status is StepStatus.FAILED

    activations.run(scenario)


def test_resume__a_duplicate_stop_report_of_the_earlier_execution_does_not_start_it_twice(
    activations: Activations,
) -> None:
    async def scenario() -> None:
        h = await activations.new(StagedJob, Plan(sizes=[1]))
        await h.c.start()
        await h.c.stop()
        (stopped,) = await h.hosts.stop_cancelled()
        await h.settle()
        await h.c.resume()
        await h.settle()
        assert h.hosts.running_ids() == {"000000"}

        await h.hosts.report(stopped)  # the earlier execution's report, delivered again
        await h.settle()

        assert len(h.hosts.running_steps()) == 1, "the step runs twice at once"
        await h.hosts.finish_all()
        await h.settle()
        stored = await h.stored()
        assert stored.status is JobStatus.COMPLETED_SUCCESSFULLY
        assert (stored.progress.successful_steps, stored.progress.stopped_steps) == (1, 0)

    activations.run(scenario)


def test_recover__a_stage_change_not_saved_before_a_reactivation_still_stops_its_steps(
    activations: Activations,
) -> None:
    async def scenario() -> None:
        h = await activations.new(StagedJob, Plan(sizes=[1, 1]))
        await h.c.start()
        await h.hosts.finish("000000")  # stage 1 begins: its step runs
        await h.settle()
        assert h.hosts.running_ids() == {"000001"}
        h.control("on_before_resuming_job_steps", raises=1)
        await h.activate(reconstructed=True)  # lost before the periodic save
        await h.c.stop()
        await h.settle()

        assert any("host-" in " ".join(hosts) for hosts, _ in h.hosts.cancels), h.hosts.cancels
        assert not (await h.stored()).stop_finalized, "final while a step still runs"
        await h.hosts.stop_cancelled()
        await h.settle()
        stored = await h.stored()
        assert stored.stop_finalized
        assert (stored.progress.successful_steps, stored.progress.stopped_steps) == (1, 1)

    activations.run(scenario)


def test_recover__a_stop_while_the_resume_hook_is_owed_counts_the_steps_never_started(
    activations: Activations,
) -> None:
    async def scenario() -> None:
        h = await activations.new(StagedJob, Plan(sizes=[2]), max_active_steps_per_job=1)
        await h.c.start()
        assert h.hosts.running_ids() == {"000000"}  # 000001 waits for the window
        h.control("on_before_resuming_job_steps", raises=1)
        await h.activate(reconstructed=True)  # the actor is lost; the hook fails on recovery
        assert h.c.mode is Mode.HOOK_OWED
        await h.c.stop()
        await h.hosts.stop_cancelled()
        await h.settle()

        stored = await h.stored()
        assert stored.stop_finalized
        assert stored.progress.stopped_steps == 2
        assert stored.progress.is_stopped

    activations.run(scenario)


def test_recover__a_host_dying_while_the_resume_hook_is_owed_starts_its_steps_once(
    activations: Activations,
) -> None:
    async def scenario() -> None:
        h = await activations.new(StagedJob, Plan(sizes=[3]), step_batch_size=2)
        await h.c.start()
        assert {r.start.step_id for r in h.hosts.running_steps() if r.host == "host-0"} == {
            "000000",
            "000001",
        }
        h.control("on_before_resuming_job_steps", raises=1)
        await h.activate(reconstructed=True)  # adopts the three running steps; the hook fails
        h.hosts.kill("host-0")
        await h.settle()
        await h.c.watchdog_tick()  # the hook runs again, and succeeds
        await h.settle()

        assert starts_per_step(h) == {"000000": 2, "000001": 2, "000002": 1}
        assert len(h.hosts.running_steps()) == 3

    activations.run(scenario)


def test_resume__a_duplicate_stop_report_of_an_adopted_step_does_not_start_it_twice(
    activations: Activations,
) -> None:
    async def scenario() -> None:
        h = await activations.new(StagedJob, Plan(sizes=[1]))
        await h.c.start()
        await h.c.stop()
        await h.c.resume()  # the step still runs (told to stop): adopted
        await h.settle()
        assert starts_per_step(h) == {"000000": 1}
        (stopped,) = await h.hosts.stop_cancelled()  # it honours the stop: started again
        await h.settle()
        assert starts_per_step(h) == {"000000": 2}

        await h.hosts.report(stopped)  # the same report, delivered again
        await h.settle()

        assert len(h.hosts.running_steps()) == 1, "the step runs twice at once"
        await h.hosts.finish_all()
        await h.settle()
        stored = await h.stored()
        assert stored.status is JobStatus.COMPLETED_SUCCESSFULLY
        assert (stored.progress.successful_steps, stored.progress.stopped_steps) == (1, 0)

    activations.run(scenario)


def test_recover__a_reactivation_whose_recover_fails_is_recovered_by_the_watchdog(
    activations: Activations,
) -> None:
    async def scenario() -> None:
        storage = FaultyStorage()
        h = await activations.new(StagedJob, Plan(sizes=[1]), storage=storage)
        await h.c.start()
        storage.fail("count_by_status", 1)  # the recount of the recovery fails, on purpose
        await h.activate(reconstructed=True)
        await h.c.watchdog_tick()
        await h.settle()

        await h.hosts.finish("000000")
        await h.settle()
        assert (await h.status()) is JobStatus.COMPLETED_SUCCESSFULLY

    activations.run(scenario)


def test_resume__a_failed_resume_of_a_stopping_job_keeps_its_running_steps(
    activations: Activations,
) -> None:
    async def scenario() -> None:
        storage = FaultyStorage()
        h = await activations.new(StagedJob, Plan(sizes=[1]), storage=storage)
        await h.c.start()
        await h.c.stop()  # the step runs on, told to stop
        storage.fail("list_steps", 1)  # the resume's read of the stage fails, on purpose
        with pytest.raises(StorageError):
            await h.c.resume()
        await h.hosts.stop_cancelled()
        await h.settle()

        stored = await h.stored()
        assert stored.status is JobStatus.STOPPED
        assert stored.stop_finalized
        assert stored.progress.stopped_steps == 1

    activations.run(scenario)


def test_resume__a_failed_resume_of_a_stopping_job_keeps_its_counts(
    activations: Activations,
) -> None:
    async def scenario() -> None:
        storage = FaultyStorage()
        h = await activations.new(StagedJob, Plan(sizes=[1]), storage=storage)
        await h.c.start()
        await h.c.stop()
        await h.hosts.stop_cancelled()  # its stop is counted
        await h.c.resume()  # it runs again
        await h.settle()
        await h.c.stop()  # and is told to stop again
        storage.fail("list_steps", 1)  # the resume's read of the stage fails, on purpose
        with pytest.raises(StorageError):
            await h.c.resume()
        await h.hosts.stop_cancelled()
        await h.settle()

        stored = await h.stored()
        assert stored.stop_finalized
        assert stored.progress.stopped_steps == 1
        assert stored.progress.is_stopped

    activations.run(scenario)


def test_resume__a_failed_running_save_of_a_resume_keeps_the_running_steps(
    activations: Activations,
) -> None:
    async def scenario() -> None:
        storage = FaultyStorage()
        h = await activations.new(StagedJob, Plan(sizes=[1]), storage=storage)
        await h.c.start()
        await h.c.stop()  # the step runs on, told to stop
        storage.fail("save_job", 1)  # the resume's RUNNING save fails, on purpose
        with pytest.raises(StorageError):
            await h.c.resume()
        await h.hosts.stop_cancelled()
        await h.settle()

        stored = await h.stored()
        assert stored.stop_finalized
        assert stored.progress.stopped_steps == 1

    activations.run(scenario)


def test_retry_failed_steps__a_stop_counts_each_retried_step_once(
    activations: Activations,
) -> None:
    """A step whose type is missing failed to start, was retried and failed again; after
    RetryFailedSteps the stage's feed reads it and it fails to start at once, counted failed
    once, while the other retried step is stopped (found by the state machine test: its first
    execution's retry still marked it as a retry waiting for a host, and a stop counted it
    twice)."""

    async def scenario() -> None:
        h = await activations.new(
            RetryableJob, Plan(sizes=[2], missing=[1]), max_step_attempts=2,
            max_active_steps_per_job=1,
        )  # fmt: skip
        await h.c.start()
        for _ in range(2):
            await h.hosts.finish("000000", FAILED, "boom")
            await h.settle()
        assert (await h.stored()).status is JobStatus.COMPLETED_WITH_FAILURES
        h.hosts.start_gate = asyncio.Event()  # "000000" is being started when the stop comes

        assert await h.c.retry_failed_steps() == 2
        await h.settle()
        await h.c.stop()
        h.hosts.start_gate.set()
        await h.settle()
        await h.hosts.finish("000000", StepStatus.STOPPED)
        await h.settle()

        progress = (await h.stored()).progress
        assert (progress.failed_steps, progress.stopped_steps) == (1, 1)
        assert not h.c.counting.counted & h.c.counting.stopped

    activations.run(scenario)


def test_recover__a_retry_the_lost_activation_was_starting_never_runs_after_its_failure_counted(
    activations: Activations,
) -> None:
    """Soak 105's race: the lost activation's retry waits on its host while the new one counts
    the step's stored failure. The resume fences the hosts, so the retry never runs then: its
    success would be dropped by the job while storage showed it (counted failed, stored
    succeeded)."""

    async def scenario() -> None:
        h = await activations.new(StagedJob, Plan(sizes=[2]), max_step_attempts=2)
        await h.c.start()
        await h.hosts.finish("000000")
        h.hosts.start_gate = asyncio.Event()  # the retry's start waits on its host
        await h.hosts.finish("000001", FAILED, "boom")
        await h.settle()
        assert [(s.step_id, s.attempt) for s in h.hosts.calls[-1][1]] == [("000001", 2)]

        await h.activate(reconstructed=True)  # recovers: counts the stored failure
        h.hosts.start_gate.set()
        await h.settle()

        assert ("000001", 2) not in [(s.step_id, s.attempt) for s in h.hosts.started]
        stored = await h.stored()
        assert stored.status is JobStatus.COMPLETED_WITH_FAILURES
        assert (stored.progress.successful_steps, stored.progress.failed_steps) == (1, 1)
        assert (await h.steps())["000001"].status is StepStatus.FAILED

    activations.run(scenario)


class StepEndsAfterTheCount(FaultyStorage):
    """A step of the job ends (persisted, then reported) right after the recount read storage:
    soak 3023's race."""

    def __init__(self) -> None:
        super().__init__()
        self.ends: Callable[[], Coroutine[Any, Any, object]] | None = None
        self.ended: asyncio.Task[object] | None = None

    async def count_by_status(self, job_id: str) -> StatusCounts:
        counts = await super().count_by_status(job_id)
        if self.ends is not None:
            ends, self.ends = self.ends, None
            self.ended = asyncio.create_task(ends())
            for _ in range(10):  # as far as it goes: its write, unless a fence holds it
                await asyncio.sleep(0)
        return counts


def test_recover__a_step_ending_while_the_resume_reads_storage_counts_once(
    activations: Activations,
) -> None:
    """The recount and the steps adopted are one picture: a step whose outcome was stored
    after the recount and before the running steps were read was neither counted nor adopted
    (its report dropped), and a stop right after kept the job one success short."""

    async def scenario() -> None:
        storage = StepEndsAfterTheCount()
        h = await activations.new(StagedJob, Plan(sizes=[3]), storage=storage)
        await h.c.start()
        await h.hosts.finish("000000")
        storage.ends = lambda: h.hosts.finish("000001")

        await h.activate(reconstructed=True)  # recovers: the step ends during its reads
        await h.settle()
        assert storage.ended is not None and storage.ended.done()
        await h.c.stop()
        await h.hosts.stop_cancelled()
        await h.settle()

        stored = await h.stored()
        assert (stored.status, stored.stop_finalized) == (JobStatus.STOPPED, True)
        progress = stored.progress
        assert (progress.successful_steps, progress.stopped_steps) == (2, 1)
        assert set(await h.steps()) == {"000002"}

    activations.run(scenario)


class StoppedSaveFails(FaultyStorage):
    """Faulty storage whose next `stopped_failures` saves of a STOPPED record raise."""

    stopped_failures = 0

    async def save_job(self, job: JobState) -> JobState:
        if job.status is JobStatus.STOPPED and self.stopped_failures:
            self.stopped_failures -= 1
            raise self.error("saving STOPPED failed (fault injected on purpose)")
        return await super().save_job(job)


def test_resume__a_stopped_job_whose_hook_fails_and_whose_stopped_save_fails_owes_the_hook(
    activations: Activations,
) -> None:
    """R43's fallback: saving STOPPED again fails, so the job stays RUNNING with its hook owed,
    asked again by the watchdog (never RUNNING with its steps held and nothing to start them)."""

    async def scenario() -> None:
        storage = StoppedSaveFails()
        h = await activations.new(StagedJob, Plan(sizes=[2]), storage=storage)
        await h.c.start()
        await h.settle()
        await h.c.stop()
        await h.hosts.stop_cancelled()
        await h.settle()
        h.control("on_before_resuming_job_steps", raises=1)
        storage.stopped_failures = 1
        with pytest.raises(JobOperationError):
            await h.c.resume()
        await h.settle()
        assert ((await h.status()), h.c.mode) == (JobStatus.RUNNING, Mode.HOOK_OWED)
        await h.c.watchdog_tick()
        await h.settle()
        assert h.calls["on_before_resuming_job_steps"] == 2
        assert (await h.all_succeed()) == (JobStatus.COMPLETED_SUCCESSFULLY, 2)

    activations.run(scenario)

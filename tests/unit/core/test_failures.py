"""Failures at scale in the core (no Ray): RetryFailedSteps of one signature or of chosen steps,
in jobs with stages too, stage success thresholds, and the failures-by-signature metric."""

from __future__ import annotations

import asyncio

import pytest

from choreography_ray.core.metrics import Counter
from choreography_ray.errors import JobOperationError, RetryFailedStepsError
from choreography_ray.status import JobStatus, StepStatus
from tests.unit.core.conftest import Activations
from tests.unit.core.fakes import FAILED, FaultyStorage, RecordingMetrics
from tests.unit.core.harness import Harness
from tests.unit.core.jobs import AtLeast90Job, AtLeast95Job, Plan, RetryableJob, StagedJob

pytestmark = pytest.mark.timeout(30)

KEY_ERROR = "KeyError: '<v>'"


async def three_kinds(activations: Activations, **kwargs: object) -> Harness:
    """Six steps: two KeyErrors, two timeouts, one coded failure, one success."""
    h = await activations.new(RetryableJob, Plan(sizes=[6]), **kwargs)  # type: ignore[arg-type]
    await h.c.start()
    await h.hosts.finish("000000", FAILED, "KeyError: 'doc-0'")
    await h.hosts.finish("000001", FAILED, "TimeoutError: after 30 s")
    await h.hosts.finish("000002", FAILED, "KeyError: 'doc-2'")
    await h.hosts.finish("000003", FAILED, "TimeoutError: after 31 s")
    await h.hosts.finish("000004", StepStatus.COMPLETED_WITH_FAILURE, "quota of 5 hit", code="Q")
    await h.hosts.finish("000005")
    await h.settle()
    assert (await h.status()) is JobStatus.COMPLETED_WITH_FAILURES
    return h


def test_retry_failed_steps__of_one_signature_runs_exactly_those_and_counts_them_once(
    activations: Activations,
) -> None:
    async def scenario() -> None:
        h = await three_kinds(activations)
        started = len(h.hosts.started)

        assert await h.c.retry_failed_steps(signature=KEY_ERROR) == 2
        await h.settle()

        retried = [(s.step_id, s.attempt) for s in h.hosts.started[started:]]
        assert sorted(retried) == [("000000", 2), ("000002", 2)]
        await h.hosts.finish("000000")
        await h.hosts.finish("000002", FAILED, "KeyError: 'doc-2'")
        await h.settle()
        stored = await h.stored()
        assert stored.status is JobStatus.COMPLETED_WITH_FAILURES
        progress = stored.progress
        assert (progress.successful_steps, progress.failed_steps) == (2, 4)
        clusters = {c.signature: c.count for c in await h.storage.failure_clusters(h.job_id)}
        assert clusters == {KEY_ERROR: 1, "TimeoutError: after <n> s": 2, "Q": 1}

    activations.run(scenario)


def test_retry_failed_steps__of_chosen_steps_runs_only_the_failed_ones_among_them(
    activations: Activations,
) -> None:
    async def scenario() -> None:
        h = await three_kinds(activations)
        started = len(h.hosts.started)

        # 000005 succeeded and "nope" does not exist: neither runs.
        assert await h.c.retry_failed_steps(step_ids=["000004", "000005", "nope"]) == 1
        # With a signature too: those of the signature among them.
        await h.settle()
        assert [s.step_id for s in h.hosts.started[started:]] == ["000004"]
        await h.hosts.finish("000004")
        await h.settle()
        assert await h.c.retry_failed_steps(signature=KEY_ERROR, step_ids=["000000", "000001"]) == 1
        await h.settle()
        assert [s.step_id for s in h.hosts.started[started + 1 :]] == ["000000"]

    activations.run(scenario)


def test_retry_failed_steps__nothing_selected_changes_nothing(activations: Activations) -> None:
    async def scenario() -> None:
        h = await three_kinds(activations)
        before = await h.stored()

        assert await h.c.retry_failed_steps(signature="no such failure") == 0

        after = await h.stored()
        assert (after.status, after.version) == (JobStatus.COMPLETED_WITH_FAILURES, before.version)

    activations.run(scenario)


def test_retry_failed_steps__still_refused_for_a_type_that_does_not_allow_it(
    activations: Activations,
) -> None:
    async def scenario() -> None:
        h = await activations.new(StagedJob, Plan(sizes=[1]))
        await h.c.start()
        await h.hosts.finish("000000", FAILED, "boom")
        await h.settle()
        with pytest.raises(JobOperationError) as refused:
            await h.c.retry_failed_steps(signature="boom")
        assert refused.value.error is RetryFailedStepsError.NOT_SUPPORTED

    activations.run(scenario)


def test_retry_failed_steps__a_barrier_stage_retried_runs_on_into_the_stages_it_held_back(
    activations: Activations,
) -> None:
    """Stage 0's failure made stages 1 and 2 UNREACHABLE; once the retried step succeeds, they
    run (they never ran); had it failed again, they would be UNREACHABLE again."""

    async def scenario() -> None:
        h = await activations.new(RetryableJob, Plan(sizes=[2, 2, 1]))
        await h.c.start()
        await h.hosts.finish("000000")
        await h.hosts.finish("000001", FAILED, "boom")
        await h.settle()
        stored = await h.stored()
        assert (stored.status, stored.progress.unreachable_steps) == (
            JobStatus.COMPLETED_WITH_FAILURES,
            3,
        )

        assert await h.c.retry_failed_steps() == 1
        await h.settle()
        assert (await h.stored()).stage == 0
        assert h.hosts.running_ids() == {"000001"}
        await h.hosts.finish("000001")
        await h.settle()
        assert h.hosts.running_ids() == {"000002", "000003"}
        await h.hosts.finish_all()
        await h.settle()
        await h.hosts.finish_all()
        await h.settle()

        stored = await h.stored()
        assert stored.status is JobStatus.COMPLETED_SUCCESSFULLY
        assert (stored.progress.successful_steps, stored.progress.unreachable_steps) == (5, 0)

    activations.run(scenario)


def test_retry_failed_steps__a_later_stage_that_ran_is_not_run_again(
    activations: Activations,
) -> None:
    """Stages that go on at 50 %: stage 0 and stage 1 each have a failure; retrying stage 0's
    runs it and then passes through stage 1 without running any of its steps again."""

    async def scenario() -> None:
        h = await activations.new(HalfJob, Plan(sizes=[2, 2]))
        await h.c.start()
        await h.hosts.finish("000000")
        await h.hosts.finish("000001", FAILED, "first stage")
        await h.settle()
        await h.hosts.finish("000002")
        await h.hosts.finish("000003", FAILED, "second stage")
        await h.settle()
        assert (await h.status()) is JobStatus.COMPLETED_WITH_FAILURES
        started = len(h.hosts.started)

        assert await h.c.retry_failed_steps(signature="first stage") == 1
        await h.settle()
        await h.hosts.finish("000001")
        await h.settle()

        assert [s.step_id for s in h.hosts.started[started:]] == ["000001"]
        stored = await h.stored()
        assert stored.status is JobStatus.COMPLETED_WITH_FAILURES
        assert (stored.progress.successful_steps, stored.progress.failed_steps) == (3, 1)
        assert stored.stage == 1

    activations.run(scenario)


class HalfJob(RetryableJob):
    def get_min_success_ratio(self, stage: int) -> float | None:
        return 0.5


@pytest.mark.parametrize(("job_type", "goes_on"), [(AtLeast90Job, True), (AtLeast95Job, False)])
def test_min_success_ratio__a_stage_goes_on_at_the_share_and_is_a_barrier_below_it(
    activations: Activations, job_type: type[AtLeast90Job], goes_on: bool
) -> None:
    """Nine of ten steps succeeded: 90 % is enough for the first job and not for the second."""

    async def scenario() -> None:
        h = await activations.new(job_type, Plan(sizes=[10, 1]))
        await h.c.start()
        await h.hosts.finish("000000", FAILED, "boom")
        for n in range(1, 10):
            await h.hosts.finish(f"{n:06d}")
        await h.settle()

        assert (h.hosts.running_ids() == {"000010"}) is goes_on
        await h.hosts.finish_all()
        await h.settle()
        progress = (await h.stored()).progress
        assert (await h.status()) is JobStatus.COMPLETED_WITH_FAILURES
        assert (progress.successful_steps, progress.unreachable_steps) == (
            (10, 0) if goes_on else (9, 1)
        )

    activations.run(scenario)


def test_metrics__failures_counted_by_signature(activations: Activations) -> None:
    async def scenario() -> None:
        metrics = RecordingMetrics()
        await three_kinds(activations, metrics=metrics)

        assert metrics.tagged == {
            (Counter.STEP_FAILURES, KEY_ERROR): 2,
            (Counter.STEP_FAILURES, "TimeoutError: after <n> s"): 2,
            (Counter.STEP_FAILURES, "Q"): 1,
        }
        assert metrics.total(Counter.STEPS_FAILED) == 5

    activations.run(scenario)


def test_retry_failed_steps__a_failed_save_of_the_stage_leaves_the_steps_to_the_watchdog(
    activations: Activations,
) -> None:
    """The retried steps are stored SCHEDULED and the job RUNNING when the stage's own save
    fails: the retry answers how many, and the watchdog starts them."""

    async def scenario() -> None:
        storage = FaultyStorage()
        h = await three_kinds(activations, storage=storage)
        started = len(h.hosts.started)
        admission = h.control("admit_stage", gate=asyncio.Event())

        retry = asyncio.create_task(h.c.retry_failed_steps(signature=KEY_ERROR))
        await admission.entered.wait()
        storage.fail("save_job")
        assert admission.gate is not None
        admission.gate.set()

        assert await retry == 2
        assert len(h.hosts.started) == started
        await h.c.watchdog_tick()
        await h.settle()
        assert sorted(s.step_id for s in h.hosts.started[started:]) == ["000000", "000002"]

    activations.run(scenario)

"""Metrics as the core records them, through a recording port (no Ray): once per batch, tagged
with the job's scope, namespace and type, and equal to what the job's progress counts."""

from __future__ import annotations

import asyncio

import pytest

from choreography_ray.core.metrics import (
    GAUGED_STATUSES,
    BatchKind,
    Counter,
    Histogram,
    Labels,
    Tally,
    TimedWrites,
    WriteOperation,
    jobs_gauge,
)
from choreography_ray.errors import StorageUnavailableError
from choreography_ray.model import JobState
from choreography_ray.status import JobStatus
from choreography_ray.types import type_path
from tests.unit.core.conftest import Activations
from tests.unit.core.fakes import FAILED, STOPPED, FaultyStorage, RecordingMetrics
from tests.unit.core.jobs import Plan, StagedJob

pytestmark = pytest.mark.timeout(30)

LABELS = Labels("unit", "core", type_path(StagedJob))


def test_metrics__one_call_per_batch_with_the_jobs_labels_equal_to_its_progress(
    activations: Activations,
) -> None:
    async def scenario() -> None:
        metrics = RecordingMetrics()
        h = await activations.new(StagedJob, Plan(sizes=[4]), metrics=metrics)
        await h.c.start()
        await h.settle()
        ids = sorted(h.hosts.running_ids())
        outcomes = [await h.hosts.finish(step_id, deliver=0) for step_id in ids[:3]]
        outcomes.append(await h.hosts.finish(ids[3], FAILED, "boom", deliver=0))
        await h.hosts.report(*outcomes)  # one report of four outcomes
        await h.settle()

        stored = await h.stored()
        assert stored.status is JobStatus.COMPLETED_WITH_FAILURES
        assert metrics.calls(Counter.STEPS_STARTED) == [4]
        assert metrics.calls(Counter.STEPS_SUCCEEDED) == [stored.progress.successful_steps] == [3]
        assert metrics.calls(Counter.STEPS_FAILED) == [stored.progress.failed_steps] == [1]
        assert metrics.total(Counter.STEPS_RETRIED) == 0
        assert metrics.observed(Histogram.BATCH_SIZE, BatchKind.START) == [4]
        assert metrics.observed(Histogram.BATCH_SIZE, BatchKind.OUTCOMES) == [4]
        assert {labels for _, _, labels in metrics.counts} == {LABELS}
        assert {labels for _, _, labels, _ in metrics.observations} == {LABELS}
        assert h.hosts.labels == [LABELS], "the start batch carries the job's labels"

    activations.run(scenario)


def test_metrics__storage_writes_of_the_job_are_timed_by_operation(
    activations: Activations,
) -> None:
    async def scenario() -> None:
        metrics = RecordingMetrics()
        h = await activations.new(StagedJob, Plan(sizes=[2]), metrics=metrics)
        await h.c.start()
        await h.hosts.finish_all()
        await h.settle()

        assert (await h.status()) is JobStatus.COMPLETED_SUCCESSFULLY
        seconds = Histogram.STORAGE_WRITE_SECONDS
        assert len(metrics.observed(seconds, WriteOperation.INSERT_PLAN)) == 1
        saves = metrics.observed(seconds, WriteOperation.SAVE_JOB)
        assert len(saves) >= 4  # PREPARING_STEPS, STARTING_STEPS, the stage, RUNNING, ...
        assert all(s >= 0 for s in saves)

    activations.run(scenario)


def test_metrics__a_retried_attempt_counts_as_retried_and_started_again(
    activations: Activations,
) -> None:
    async def scenario() -> None:
        metrics = RecordingMetrics()
        h = await activations.new(StagedJob, Plan(sizes=[1]), metrics=metrics, max_step_attempts=2)
        await h.c.start()
        await h.hosts.finish("000000", FAILED, "attempt 1")
        await h.settle()
        await h.hosts.finish("000000", FAILED, "attempt 2")
        await h.settle()

        stored = await h.stored()
        assert stored.progress.failed_steps == 1
        assert metrics.calls(Counter.STEPS_RETRIED) == [1]
        assert metrics.calls(Counter.STEPS_STARTED) == [1, 1]
        assert metrics.total(Counter.STEPS_FAILED) == 1

    activations.run(scenario)


def test_metrics__a_stop_counts_running_and_never_started_steps_once(
    activations: Activations,
) -> None:
    async def scenario() -> None:
        metrics = RecordingMetrics()
        h = await activations.new(
            StagedJob, Plan(sizes=[3]), metrics=metrics, max_active_steps_per_job=2
        )
        await h.c.start()
        await h.c.stop()
        assert metrics.calls(Counter.STEPS_STOPPED) == [1], "the never-started step, at once"
        first, second = sorted(h.hosts.running_ids())
        stops = [await h.hosts.finish(first, STOPPED, deliver=0)]
        stops.append(await h.hosts.finish(second, STOPPED, deliver=0))
        await h.hosts.report(*stops, stops[0])  # a duplicate in the batch counts once
        await h.settle()

        stored = await h.stored()
        assert stored.stop_finalized
        assert metrics.calls(Counter.STEPS_STOPPED) == [1, 2]
        assert metrics.total(Counter.STEPS_STOPPED) == stored.progress.stopped_steps == 3

    activations.run(scenario)


def test_metrics__a_step_restarted_by_its_lease_counts_once(activations: Activations) -> None:
    async def scenario() -> None:
        metrics = RecordingMetrics()
        h = await activations.new(
            StagedJob, Plan(sizes=[1]), metrics=metrics, step_lease_timeout=0.2
        )
        await h.c.start()
        h.hosts.kill("host-0")
        await h.settle()
        await asyncio.sleep(0.3)  # the lease of the dead host's step expires
        await h.c.watchdog_tick()
        await h.settle()

        assert metrics.calls(Counter.STEPS_RESTARTED_BY_LEASE) == [1]
        await h.hosts.finish_all()
        await h.settle()
        assert (await h.status()) is JobStatus.COMPLETED_SUCCESSFULLY
        assert metrics.calls(Counter.STEPS_STARTED) == [1, 1]
        assert metrics.calls(Counter.STEPS_SUCCEEDED) == [1]

    activations.run(scenario)


def test_metrics__off_by_default_in_the_core_and_storage_is_not_wrapped(
    activations: Activations,
) -> None:
    async def scenario() -> None:
        h = await activations.new(StagedJob, Plan(sizes=[1]))
        await h.c.start()
        assert h.c.storage is h.storage
        assert h.c.labels == LABELS

    activations.run(scenario)


# -- the pure parts -------------------------------------------------------------------------------


def test_tally__records_only_what_moved_and_starts_again_from_zero() -> None:
    metrics = RecordingMetrics()
    tally = Tally(started=5, failed=2)

    tally.record(metrics, LABELS)
    tally.record(metrics, LABELS)

    assert metrics.counts == [
        (Counter.STEPS_STARTED, 5, LABELS),
        (Counter.STEPS_FAILED, 2, LABELS),
    ]
    assert tally == Tally()


def test_jobs_gauge__every_known_type_keeps_a_series_per_status_at_zero_once_empty() -> None:
    counts = {("pkg:A", JobStatus.RUNNING): 2, ("pkg:A", JobStatus.STOPPED): 1}

    gauge = jobs_gauge(counts, known_types={"pkg:B"})

    assert len(gauge) == 2 * len(GAUGED_STATUSES)
    assert ("pkg:A", JobStatus.RUNNING, 2) in gauge
    assert ("pkg:A", JobStatus.STOPPED, 1) in gauge
    assert ("pkg:A", JobStatus.REMOVING, 0) in gauge
    assert ("pkg:B", JobStatus.RUNNING, 0) in gauge
    assert not any(status.is_terminal for _, status, _ in gauge)


def test_timed_writes__a_failed_write_raises_and_observes_nothing() -> None:
    async def scenario() -> None:
        storage = FaultyStorage()
        metrics = RecordingMetrics()
        timed = TimedWrites(storage, metrics, LABELS)
        job = JobState(id="j", scope="unit", namespace="core", type="pkg:A")
        created = await timed.create_job(job)  # not a timed write: passed through
        storage.fail("save_job")
        with pytest.raises(StorageUnavailableError):
            await timed.save_job(created)
        assert metrics.observations == []
        await timed.save_job(created)
        assert metrics.observed(Histogram.STORAGE_WRITE_SECONDS, WriteOperation.SAVE_JOB)
        assert timed.url == storage.url

    asyncio.run(scenario())

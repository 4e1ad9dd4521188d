"""Issue 36, item 12: a trigger of a dead-lettered or disabled manifest is refused; before, it
queued a run that replayed the dead letter's failed run beside the unresolved dead letter."""

from __future__ import annotations

import pytest

from choreography_ray.errors import SchedulerError, SchedulerOperationError
from choreography_ray.scheduler.port import JobView
from choreography_ray.scheduler.schedules import Every
from choreography_ray.scheduler.status import DeadLetterStatus
from choreography_ray.status import JobStatus
from tests.unit.scheduler.harness import JOB, Harness, run


def test_a_dead_lettered_manifest_is_not_triggered_until_its_dead_letter_is_resolved() -> None:
    async def scenario() -> None:
        h = Harness(default_retry_delay=1)
        h.jobs.ends_as = JobView(JobStatus.FAILED)
        core = await h.start()
        await core.schedule("m", JOB, {}, Every.hours(1), max_retries=0)
        await h.run_for(3)
        (letter,) = await core.dead_letters("m")
        started = len(h.jobs.started)

        with pytest.raises(SchedulerOperationError) as refused:
            await core.trigger("m")
        assert refused.value.error is SchedulerError.MANIFEST_DEAD_LETTERED
        assert letter.id in str(refused.value)
        await h.run_for(3)
        assert len(h.jobs.started) == started
        assert [d.status for d in await core.dead_letters("m")] == [
            DeadLetterStatus.AWAITING_INTERVENTION
        ]

        await core.acknowledge(letter.id, "seen")
        h.jobs.ends_as = JobView(JobStatus.COMPLETED_SUCCESSFULLY)
        result = await core.trigger("m")  # resolved: triggered, asking afresh
        assert result.run_id is not None and result.replay_decisions_of is None

    run(scenario)


def test_a_disabled_manifest_is_not_triggered() -> None:
    async def scenario() -> None:
        h = Harness()
        core = await h.start()
        await core.schedule("m", JOB, {}, Every.hours(1), enabled=False)
        with pytest.raises(SchedulerOperationError) as refused:
            await core.trigger("m")
        assert refused.value.error is SchedulerError.MANIFEST_DISABLED
        await h.run_for(3)
        assert h.jobs.started == [] and await core.runs("m") == []

    run(scenario)

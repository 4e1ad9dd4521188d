"""`keep_after_completed` and `keep_after_completed_with_failures` (issue 12, item 3): a job type
that turns one off drops its records (job, steps, counted steps) in the turn that saved the
matching outcome; a FAILED job and the other outcome keep them; a job held by its starter (the
scheduler) keeps them until it is released."""

from __future__ import annotations

import pytest

from choreography_ray.core.cleanup import Claims, Cleanup, CleanupPolicy, Removal
from choreography_ray.model import JobsManagerKey
from choreography_ray.status import JobStatus
from choreography_ray.storage import CountedKind
from tests.unit.core.conftest import Activations
from tests.unit.core.fakes import FAILED, FaultyStorage
from tests.unit.core.harness import Harness
from tests.unit.core.jobs import NotKeptJob, NotKeptWithFailuresJob, Plan, StagedJob

pytestmark = pytest.mark.timeout(30)


async def complete(h: Harness, *, failing: bool = False) -> None:
    await h.c.start()
    await h.hosts.finish("000000", FAILED, "boom") if failing else await h.hosts.finish("000000")
    await h.hosts.finish("000001")
    await h.settle()


async def gone(h: Harness) -> bool:
    records = await h.storage.get_job(h.job_id), await h.steps()
    counted = [await h.counted(kind) for kind in CountedKind]
    return records == (None, {}) and counted == [[], []]


def test_keep_after_completed_off__a_success_drops_every_record_of_the_job(
    activations: Activations,
) -> None:
    async def scenario() -> None:
        h = await activations.new(NotKeptJob, Plan(sizes=[2]))
        # Counted records exist once a job resumed: they go too.
        await h.storage.add_counted(h.job_id, CountedKind.COMPLETED, ["000000"])
        await complete(h)

        assert await gone(h)
        assert h.calls["on_completed"] == 1
        assert h.c.state is not None and h.c.state.status is JobStatus.COMPLETED_SUCCESSFULLY
        assert h.c.exit is not None

    activations.run(scenario)


def test_keep_after_completed_off__a_completion_with_failures_is_kept(
    activations: Activations,
) -> None:
    async def scenario() -> None:
        h = await activations.new(NotKeptJob, Plan(sizes=[2]))
        await complete(h, failing=True)

        assert await h.status() is JobStatus.COMPLETED_WITH_FAILURES
        assert list(await h.steps()) == ["000000"]  # the failed step's record

    activations.run(scenario)


def test_keep_after_completed_with_failures_off__drops_only_a_completion_with_failures(
    activations: Activations,
) -> None:
    async def scenario() -> None:
        failing = await activations.new(NotKeptWithFailuresJob, Plan(sizes=[2]))
        await complete(failing, failing=True)
        assert await gone(failing)

        succeeding = await activations.new(NotKeptWithFailuresJob, Plan(sizes=[2]))
        await complete(succeeding)
        assert await succeeding.status() is JobStatus.COMPLETED_SUCCESSFULLY

    activations.run(scenario)


def test_keep_off__a_failed_job_is_kept(activations: Activations) -> None:
    async def scenario() -> None:
        h = await activations.new(NotKeptJob, Plan(sizes=[2]))
        h.control("on_completed", raises=1)
        await complete(h)

        stored = await h.stored()
        assert stored.status is JobStatus.FAILED
        assert stored.error is not None and "on_completed failed on purpose" in stored.error

    activations.run(scenario)


def test_keep_on__the_default_keeps_every_outcome(activations: Activations) -> None:
    async def scenario() -> None:
        h = await activations.new(StagedJob, Plan(sizes=[2]))
        await complete(h)
        assert await h.status() is JobStatus.COMPLETED_SUCCESSFULLY

    activations.run(scenario)


def test_keep_off__a_drop_that_fails_leaves_the_completed_job_to_retention(
    activations: Activations,
) -> None:
    async def scenario() -> None:
        storage = FaultyStorage()
        h = await activations.new(NotKeptJob, Plan(sizes=[2]), storage=storage)
        await h.c.start()
        await h.hosts.finish("000000")
        storage.fail("remove_job_steps")
        await h.hosts.finish("000001")
        await h.settle()

        # The outcome was saved before the drop: the job is completed, not failed, and exits.
        assert await h.status() is JobStatus.COMPLETED_SUCCESSFULLY
        assert h.c.exit is not None

    activations.run(scenario)


def test_keep_off_but_held__the_records_stay_until_the_starter_releases_the_job(
    activations: Activations,
) -> None:
    """The scheduler settles its run from the stored outcome: a success must not vanish
    before a cycle has read it (a removed job settles its run as cancelled)."""

    async def scenario() -> None:
        h = await activations.new(NotKeptJob, Plan(sizes=[2]), held=True)
        await complete(h)
        assert await h.status() is JobStatus.COMPLETED_SUCCESSFULLY  # the scheduler reads it

        active = {h.job_id}

        async def is_active(job_id: str) -> bool:
            return job_id in active

        key = JobsManagerKey(scope="unit", namespace="core")
        cleanup = Cleanup(h.storage, key, CleanupPolicy(), Claims(), is_active)
        assert await cleanup._release(h.job_id) is None  # its actor is still exiting
        active.clear()
        assert await cleanup.release(h.job_id) is True

        assert await gone(h)
        assert cleanup.removed == {h.job_id: Removal.NOT_KEPT}

    activations.run(scenario)

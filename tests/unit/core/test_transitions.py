"""The job status table: an illegal transition raises `IllegalTransitionError`."""

from __future__ import annotations

import itertools

import pytest

from choreography_ray.core import job_record
from choreography_ray.core.transitions import TRANSITIONS, check_transition
from choreography_ray.errors import (
    IllegalTransitionError,
    JobOperationError,
    ResumeJobError,
    StopJobError,
)
from choreography_ray.status import JobStatus
from tests.unit.core.conftest import Activations
from tests.unit.core.jobs import Plan, StagedJob

pytestmark = pytest.mark.timeout(30)


def test_transitions__every_status_has_its_row() -> None:
    assert set(TRANSITIONS) == set(JobStatus)


@pytest.mark.parametrize(
    ("old", "new"),
    [
        (old, new)
        for old, new in itertools.product(JobStatus, JobStatus)
        if new not in TRANSITIONS[old]
    ],
)
def test_transitions__an_illegal_one_raises(old: JobStatus, new: JobStatus) -> None:
    with pytest.raises(IllegalTransitionError, match=f"from {old} to {new}"):
        check_transition("job", old, new)


def test_transitions__nothing_leaves_removing_and_a_completed_job_only_goes_away() -> None:
    assert TRANSITIONS[JobStatus.REMOVING] == frozenset()
    assert TRANSITIONS[JobStatus.COMPLETED_SUCCESSFULLY] == {JobStatus.REMOVING}


def test_transitions__an_illegal_status_change_of_the_core_raises_and_saves_nothing(
    activations: Activations,
) -> None:
    async def scenario() -> None:
        h = await activations.new(StagedJob, Plan(sizes=[1]))
        await h.c.start()
        before = await h.stored()

        with pytest.raises(IllegalTransitionError):
            await job_record.set_status(h.c, JobStatus.PREPARING_JOB)
        assert (await h.stored()) == before
        assert h.c.job_state.status is JobStatus.RUNNING

    activations.run(scenario)


def test_transitions__operations_on_a_job_being_removed_are_refused(
    activations: Activations,
) -> None:
    async def scenario() -> None:
        h = await activations.new(StagedJob, Plan(sizes=[1]))
        await h.c.start()
        await h.c.remove()

        with pytest.raises(JobOperationError) as resumed:
            await h.c.resume()
        assert resumed.value.error is ResumeJobError.JOB_IS_BEING_REMOVED
        with pytest.raises(JobOperationError) as stopped:
            await h.c.stop()
        assert stopped.value.error is StopJobError.JOB_IS_NOT_RUNNING
        assert (await h.status()) is JobStatus.REMOVING

    activations.run(scenario)

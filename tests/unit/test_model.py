"""The shared records: progress arithmetic, status history, old records, immutability."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pydantic
import pytest
from hypothesis import given
from hypothesis import strategies as st

from choreography_ray import (
    JobProgress,
    JobsManagerKey,
    JobState,
    JobStatus,
    Lease,
    StageProgress,
    StatusChange,
    StepState,
    StepStatus,
)
from choreography_ray.model import SCHEMA_VERSION


def progress(
    *,
    total: int,
    successful: int = 0,
    failed: int = 0,
    unreachable: int = 0,
    stopped: int = 0,
    stages: tuple[StageProgress, ...] = (),
) -> JobProgress:
    return JobProgress(
        total_steps=total,
        successful_steps=successful,
        failed_steps=failed,
        unreachable_steps=unreachable,
        stopped_steps=stopped,
        stages=stages,
    )


# --- JobProgress: examples -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("successful", "failed", "unreachable", "expected"),
    [
        (10, 0, 0, True),
        (7, 3, 0, True),
        (4, 3, 3, True),
        (0, 0, 10, True),
        (9, 0, 0, False),
        (6, 3, 0, False),
        (0, 0, 0, False),
    ],
)
def test_is_completed__outcomes_add_up_to_total(
    successful: int, failed: int, unreachable: int, expected: bool
) -> None:
    p = progress(total=10, successful=successful, failed=failed, unreachable=unreachable)
    assert p.is_completed is expected


def test_is_completed__stopped_steps_are_not_outcomes() -> None:
    p = progress(total=10, successful=8, stopped=2)
    assert not p.is_completed
    assert p.is_stopped


def test_is_completed__a_job_without_steps_is_not_completed() -> None:
    # A fresh record (nothing prepared yet) must not read as a finished job.
    assert not JobProgress().is_completed


def test_is_stopped__counts_the_steps_of_stages_never_started() -> None:
    stages = (
        StageProgress(stage=0, is_started=True, total_steps=1, successful_steps=1),
        StageProgress(stage=10, is_started=True, total_steps=4, successful_steps=2),
        StageProgress(stage=20, is_started=False, total_steps=1),
    )
    running = progress(total=6, successful=3, stages=stages)
    assert not running.is_stopped
    stopped = progress(total=6, successful=3, stopped=2, stages=stages)
    assert stopped.is_stopped
    assert not stopped.is_completed


def test_is_stopped__a_started_stage_is_not_counted_as_stopped() -> None:
    stages = (StageProgress(stage=0, is_started=True, total_steps=5),)
    assert not progress(total=5, successful=2, stopped=2, stages=stages).is_stopped
    assert progress(total=5, successful=2, stopped=3, stages=stages).is_stopped


@pytest.mark.parametrize(
    ("failed", "unreachable", "expected"),
    [(0, 0, False), (1, 0, True), (0, 1, True), (2, 3, True)],
)
def test_has_failures__failed_or_unreachable(failed: int, unreachable: int, expected: bool) -> None:
    p = progress(
        total=10, successful=10 - failed - unreachable, failed=failed, unreachable=unreachable
    )
    assert p.has_failures is expected


def test_has_failures__stopped_steps_are_not_failures() -> None:
    assert not progress(total=4, successful=1, stopped=3).has_failures


def test_stage_progress__is_completed_when_its_outcomes_add_up() -> None:
    stage = StageProgress(stage=10, is_started=True, total_steps=3, successful_steps=1)
    assert not stage.is_completed
    done = stage.model_copy(update={"failed_steps": 1, "unreachable_steps": 1})
    assert done.is_completed


# --- JobProgress: properties -----------------------------------------------------------------


@st.composite
def stage_counts(draw: st.DrawFn, stage: int) -> StageProgress:
    """A consistent stage: counts never exceed the total; a stage not started has none."""
    total = draw(st.integers(min_value=0, max_value=50))
    if not draw(st.booleans()):
        return StageProgress(stage=stage, is_started=False, total_steps=total)
    successful = draw(st.integers(0, total))
    failed = draw(st.integers(0, total - successful))
    unreachable = draw(st.integers(0, total - successful - failed))
    stopped = draw(st.integers(0, total - successful - failed - unreachable))
    return StageProgress(
        stage=stage,
        is_started=True,
        total_steps=total,
        successful_steps=successful,
        failed_steps=failed,
        unreachable_steps=unreachable,
        stopped_steps=stopped,
    )


@st.composite
def job_progress(draw: st.DrawFn) -> JobProgress:
    """A consistent job: its counters are the sums of its stages' and it has at least one step."""
    count = draw(st.integers(min_value=1, max_value=4))
    stages = tuple(draw(stage_counts(stage=10 * i)) for i in range(count))
    total = sum(s.total_steps for s in stages)
    if total == 0:
        first = stages[0].model_copy(update={"total_steps": 1})
        stages = (first, *stages[1:])
        total = 1
    return progress(
        total=total,
        successful=sum(s.successful_steps for s in stages),
        failed=sum(s.failed_steps for s in stages),
        unreachable=sum(s.unreachable_steps for s in stages),
        stopped=sum(s.stopped_steps for s in stages),
        stages=stages,
    )


def _outcomes(p: JobProgress) -> int:
    return p.successful_steps + p.failed_steps + p.unreachable_steps


@given(job_progress())
def test_property__is_completed_iff_outcomes_equal_total(p: JobProgress) -> None:
    assert p.is_completed == (_outcomes(p) == p.total_steps)


@given(job_progress())
def test_property__is_stopped_iff_outcomes_stops_and_unstarted_stages_equal_total(
    p: JobProgress,
) -> None:
    not_started = sum(s.total_steps for s in p.stages if not s.is_started)
    assert p.is_stopped == (_outcomes(p) + p.stopped_steps + not_started == p.total_steps)


@given(job_progress())
def test_property__has_failures_iff_a_step_failed_or_is_unreachable(p: JobProgress) -> None:
    assert p.has_failures == (p.failed_steps + p.unreachable_steps > 0)


@given(job_progress())
def test_property__a_completed_job_is_also_stopped(p: JobProgress) -> None:
    if p.is_completed:
        assert p.is_stopped


@given(job_progress(), st.sampled_from(["successful_steps", "failed_steps", "unreachable_steps"]))
def test_property__counting_every_remaining_outcome_completes_the_job(
    p: JobProgress, outcome: str
) -> None:
    remaining = p.total_steps - _outcomes(p)
    finished = p.model_copy(update={outcome: getattr(p, outcome) + remaining, "stopped_steps": 0})
    assert finished.is_completed
    assert finished.is_stopped
    assert finished.has_failures == (finished.failed_steps + finished.unreachable_steps > 0)
    if remaining > 0:
        one_short = p.model_copy(
            update={outcome: getattr(p, outcome) + remaining - 1, "stopped_steps": 0}
        )
        assert not one_short.is_completed


@given(job_progress())
def test_property__progress_survives_a_json_round_trip(p: JobProgress) -> None:
    # The dump carries the computed flags; loading it back must ignore them, not refuse them.
    assert JobProgress.model_validate_json(p.model_dump_json()) == p


# --- JobState: status history ----------------------------------------------------------------


def job(**fields: Any) -> JobState:
    base: dict[str, Any] = {
        "id": "job-1",
        "scope": "studio",
        "namespace": "tenant-a",
        "type": "m:J",
    }
    return JobState(**(base | fields))


def test_with_status__appends_one_change_and_leaves_the_original_alone() -> None:
    original = job()
    before = datetime.now(UTC)
    preparing = original.with_status(JobStatus.PREPARING_JOB)
    running = preparing.with_status(JobStatus.RUNNING)

    assert original.status is JobStatus.NONE
    assert original.status_changes == ()
    assert preparing.status is JobStatus.PREPARING_JOB
    assert running.status is JobStatus.RUNNING
    assert [c.status for c in running.status_changes] == [
        JobStatus.PREPARING_JOB,
        JobStatus.RUNNING,
    ]
    assert running.status_changes[0] == preparing.status_changes[0]
    assert all(
        c.occurred >= before and c.occurred.tzinfo is not None for c in running.status_changes
    )


def test_with_status__records_exception_messages() -> None:
    failed = job().with_status(JobStatus.FAILED, "boom", "and then")
    assert failed.status_changes[-1].exception_messages == ("boom", "and then")
    assert job().with_status(JobStatus.RUNNING).status_changes[-1].exception_messages == ()


def test_with_status__keeps_every_other_field() -> None:
    original = job(stage=10, version=7, request={"index": "docs"})
    moved = original.with_status(JobStatus.STOPPED)
    assert moved.model_dump(exclude={"status", "status_changes"}) == original.model_dump(
        exclude={"status", "status_changes"}
    )


def test_key_is_the_jobs_scope_and_namespace() -> None:
    assert job().key == JobsManagerKey(scope="studio", namespace="tenant-a")
    assert str(job().key) == "studio/tenant-a"


# --- old records load with defaults ----------------------------------------------------------


def test_job_record_without_newer_fields_loads_with_defaults() -> None:
    old = {
        "_id": "job-1",
        "id": "job-1",
        "scope": "studio",
        "namespace": "tenant-a",
        "type": "pkg.mod:RebuildIndex",
        "status": "Running",
        "created": "2024-01-01T00:00:00+00:00",
        "status_changes": [{"status": "Running", "occurred": "2024-01-01T00:00:01+00:00"}],
        "progress": {"total_steps": 3, "successful_steps": 1},
        "request": {"index": "docs"},
    }
    state = JobState.model_validate(old)

    assert state.status is JobStatus.RUNNING
    assert state.stop_finalized is False
    assert state.completed_steps_counted == ()
    assert state.stopped_steps_counted == ()
    assert state.records_counted_steps is False
    assert state.has_plan is False
    assert state.error is None
    assert state.stage == 0
    assert state.version == 0
    assert state.schema_version == SCHEMA_VERSION
    assert state.progress.stages == ()
    assert state.progress.failed_steps == 0
    assert state.status_changes[0].exception_messages == ()


def test_step_record_without_newer_fields_loads_with_defaults() -> None:
    old = {"job_id": "job-1", "step_id": "s-1", "type": "pkg.mod:RebuildShard", "status": "Running"}
    step = StepState.model_validate(old)

    assert step.status is StepStatus.RUNNING
    assert step.attempt == 0
    assert step.lease is None
    assert step.stage == 0
    assert step.is_prepared is True
    assert step.request == {}
    assert step.status_changes == ()
    assert step.key == "job-1/s-1"


def test_record_with_fields_from_a_newer_release_still_loads() -> None:
    newer = {"id": "job-1", "scope": "s", "namespace": "n", "type": "m:J", "added_later": 1}
    assert JobState.model_validate(newer).id == "job-1"


def test_job_state_survives_a_json_round_trip() -> None:
    state = job(
        progress=progress(
            total=2,
            successful=1,
            stages=(StageProgress(stage=0, is_started=True, total_steps=2, successful_steps=1),),
        ),
        completed_steps_counted=("s-1",),
    ).with_status(JobStatus.RUNNING, "note")
    assert JobState.model_validate_json(state.model_dump_json()) == state


def test_unknown_status_is_refused() -> None:
    with pytest.raises(pydantic.ValidationError):
        JobState.model_validate(
            {"id": "j", "scope": "s", "namespace": "n", "type": "m:J", "status": "Exploded"}
        )


# --- immutability ----------------------------------------------------------------------------


def _lease() -> Lease:
    return Lease(silo="node-1", activation="actor-1/0", heartbeat=datetime.now(UTC))


@pytest.mark.parametrize(
    ("record", "field", "value"),
    [
        (job(), "status", JobStatus.RUNNING),
        (job(), "version", 2),
        (progress(total=1), "successful_steps", 1),
        (StageProgress(stage=0), "is_started", True),
        (StepState(job_id="j", step_id="s", type="m:S"), "attempt", 2),
        (StepState(job_id="j", step_id="s", type="m:S"), "lease", None),
        (_lease(), "heartbeat", datetime.now(UTC) + timedelta(seconds=1)),
        (StatusChange(status="Running"), "status", "Stopped"),
        (JobsManagerKey(scope="s", namespace="n"), "scope", "t"),
    ],
    # Ids that do not depend on the clock: every collection (each xdist worker's) names them alike.
    ids=lambda v: type(v).__name__ if isinstance(v, pydantic.BaseModel | datetime) else str(v),
)
def test_records_refuse_mutation(record: pydantic.BaseModel, field: str, value: object) -> None:
    before = getattr(record, field)
    with pytest.raises(pydantic.ValidationError, match="frozen"):
        setattr(record, field, value)
    assert getattr(record, field) == before


def test_record_collections_are_immutable_tuples() -> None:
    state = job().with_status(JobStatus.RUNNING)
    assert isinstance(state.status_changes, tuple)
    assert isinstance(state.completed_steps_counted, tuple)
    assert isinstance(state.progress.stages, tuple)


def test_jobs_manager_keys_are_hashable_values() -> None:
    a = JobsManagerKey(scope="s", namespace="n")
    assert {a, JobsManagerKey(scope="s", namespace="n")} == {a}

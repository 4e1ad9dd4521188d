"""The jobs manager as connections and finished jobs meet it (issue 9, items 11 and 12), on real
Ray: a connection whose settings differ from the running manager's is refused, and an operation
the stored job refuses creates no job actor."""

from __future__ import annotations

import asyncio
import shutil
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import ray

import choreography_ray as cr
from choreography_ray.errors import JobsManagerConflictError
from tests.runtime.lifecycle_jobs import TRACES, Plan, Retryable, Traced, Work
from tests.runtime.sample_jobs import FanOut, FanOutRequest
from tests.support import RAY_NAMESPACE, eventually, left_behind, seed_job

pytestmark = pytest.mark.timeout(120)

S = cr.JobStatus


def live_job_actors(job_ids: list[str]) -> list[str]:
    """The job actors of these jobs that Ray's GCS lists as alive (the session's Ray has no
    dashboard, so no state API)."""
    names = {f"job/{job_id}" for job_id in job_ids}
    return [
        actor["name"]
        for actor in ray.util.list_named_actors(all_namespaces=True)
        if actor["namespace"] == RAY_NAMESPACE and actor["name"] in names
    ]


def refusal(call: Any, job_id: str) -> object:
    with pytest.raises(cr.JobOperationError) as refused:
        call(job_id)
    return refused.value.error


# -- item 11: one manager, one set of settings ----------------------------------------------------


def test_connect_with_other_options__same_scope__refused_naming_the_fields(
    connect: Any, scope: str
) -> None:
    first = connect(max_step_attempts=1)
    manager = first.manager(scope, "tenant")
    job = manager.start(FanOut, FanOutRequest(count=2))
    assert manager.wait(job.job_id, timeout=30).status is S.COMPLETED_SUCCESSFULLY

    other = connect(max_step_attempts=3, max_concurrent_rehydration=2)
    with pytest.raises(JobsManagerConflictError) as refused:
        other.manager(scope, "tenant")
    assert isinstance(refused.value, cr.ChoreographyError)
    assert isinstance(refused.value, ValueError)
    assert refused.value.fields == ["max_step_attempts", "max_concurrent_rehydration"]
    message = str(refused.value)
    assert f"jobs-manager/{scope}/tenant" in message
    assert "max_step_attempts: running 1, asked 3" in message
    assert "same storage and options" in message and "another scope" in message

    # The same settings, and another scope with the other settings, are fine.
    assert connect(max_step_attempts=1).manager(scope, "tenant").get(job.job_id).id == job.job_id
    assert other.manager(f"{scope}-b", "tenant").list() == []


def test_connect_with_other_storage__same_scope__refused_naming_the_storage(
    connect: Any, scope: str, tmp_path: Path
) -> None:
    connect().manager(scope, "tenant")
    elsewhere = cr.Jobs.connect(
        storage=f"sqlite:///{tmp_path / 'other.db'}",
        options=connect().options,
        namespace=RAY_NAMESPACE,
    )
    with pytest.raises(JobsManagerConflictError) as refused:
        elsewhere.manager(scope, "tenant")
    assert refused.value.fields == ["storage"]
    assert "other.db" in str(refused.value)


def test_async_manager_with_other_options__its_first_call_is_refused(
    connect: Any, scope: str
) -> None:
    connect(max_step_attempts=1).manager(scope, "tenant")
    other = connect(max_step_attempts=2).async_manager(scope, "tenant")
    with pytest.raises(JobsManagerConflictError):
        asyncio.run(other.list())
    same = connect(max_step_attempts=1).async_manager(scope, "tenant")
    assert asyncio.run(same.list()) == []


# -- item 12: refused from storage, no actor -------------------------------------------------------


def test_stop_resume_retry_on_finished_jobs__answered_from_storage__no_job_actor_created(
    connect: Any, scope: str
) -> None:
    manager = connect().manager(scope, "finished")
    succeeded = manager.start(Retryable, Plan(steps=[Work(n=0), Work(n=1)])).job_id
    failed_no_retry = manager.start(
        Traced, Plan(steps=[Work(n=0, always_fail=True), Work(n=1)])
    ).job_id
    ids = [succeeded, failed_no_retry]
    assert manager.wait(succeeded, timeout=30).status is S.COMPLETED_SUCCESSFULLY
    for job_id in ids[1:]:
        assert manager.wait(job_id, timeout=30).status is S.COMPLETED_WITH_FAILURES
    eventually(lambda: not live_job_actors(ids), 15, "the finished jobs' actors to exit")

    for job_id in ids:
        assert refusal(manager.stop, job_id) is cr.StopJobError.JOB_IS_NOT_RUNNING
        assert manager.resume(job_id) is None  # resuming a completed job does nothing
    assert refusal(manager.retry_failed_steps, succeeded) is (
        cr.RetryFailedStepsError.JOB_IS_NOT_COMPLETED_WITH_FAILURES
    )
    assert refusal(manager.retry_failed_steps, failed_no_retry) is (
        cr.RetryFailedStepsError.NOT_SUPPORTED
    )

    # Each call above returned after its answer: an actor it created would be listed now.
    assert live_job_actors(ids) == []
    assert [manager.get(j).status for j in ids] == [
        S.COMPLETED_SUCCESSFULLY,
        S.COMPLETED_WITH_FAILURES,
    ]
    for job_id in ids:
        shutil.rmtree(TRACES / job_id, ignore_errors=True)


def test_stop_and_resume_of_a_job_being_removed__refused_from_storage(
    connect: Any, scope: str, storage_url: str
) -> None:
    manager = connect().manager(scope, "removing")
    state, steps = left_behind(
        scope=scope,
        namespace="removing",
        status=S.REMOVING,
        job_type="tests.runtime.sample_jobs:FanOut",
        step_type="tests.runtime.sample_jobs:Noop",
        steps=[(0, cr.StepStatus.STOPPED)],
        step_request={"n": 0},
        created=datetime.now(UTC),
        job_id=uuid.uuid4().hex,
    )
    job_id = seed_job(storage_url, state, steps)

    assert refusal(manager.stop, job_id) is cr.StopJobError.JOB_IS_NOT_RUNNING
    assert refusal(manager.resume, job_id) is cr.ResumeJobError.JOB_IS_BEING_REMOVED
    assert live_job_actors([job_id]) == []
    # A removal always goes to the job: on a job being removed it runs the finish again.
    with pytest.raises(cr.JobOperationError):
        manager.remove(job_id)
    eventually(lambda: not manager.list(), 30, "the removal to finish")

"""The client rides out a jobs manager that Ray restarts (issue 10): calls wait for the next
incarnation within a bound, the spec's errors come out as raised, and no Ray exception type
reaches the caller."""

from __future__ import annotations

import time
from typing import Any

import pytest
import ray

import choreography_ray as cr
from choreography_ray.runtime.names import manager_name
from tests.runtime.lifecycle_jobs import Plan, Traced, Work
from tests.support import RAY_NAMESPACE

pytestmark = pytest.mark.timeout(120)


def test_client__a_killed_manager_is_waited_for__no_ray_error_reaches_the_caller(
    connect: Any, scope: str
) -> None:
    with connect() as jobs:
        manager = jobs.manager(scope, "restart")
        job_id = manager.start(Traced, Plan(steps=[Work(n=0)])).job_id
        assert manager.wait(job_id, timeout=30).status is cr.JobStatus.COMPLETED_SUCCESSFULLY
        handle = ray.get_actor(manager_name(scope, "restart"), namespace=RAY_NAMESPACE)
        answers = 0
        for _ in range(3):
            ray.kill(handle, no_restart=False)
            deadline = time.monotonic() + 3
            while time.monotonic() < deadline:
                assert manager.get(job_id).id == job_id  # raises nothing from Ray
                answers += 1
        assert answers > 0
        with pytest.raises(cr.JobOperationError) as caught:
            manager.stop(job_id)
        assert type(caught.value) is cr.JobOperationError
        assert caught.value.error is cr.StopJobError.JOB_IS_NOT_RUNNING

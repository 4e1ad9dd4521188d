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

#: Seconds Ray may take to restart the killed manager.
RESTART_SECONDS = 30.0
#: Calls the restarted manager answers before the next kill.
NEXT_ANSWERS = 5


def actor_state(actor_id: str) -> dict[str, Any]:
    # The GCS's own record (the public state API needs the dashboard, off in these tests).
    from ray._private import state

    return state.actors(actor_id)


def test_client__a_killed_manager_is_waited_for__no_ray_error_reaches_the_caller(
    connect: Any, scope: str
) -> None:
    with connect() as jobs:
        manager = jobs.manager(scope, "restart")
        job_id = manager.start(Traced, Plan(steps=[Work(n=0)])).job_id
        assert manager.wait(job_id, timeout=30).status is cr.JobStatus.COMPLETED_SUCCESSFULLY
        handle = ray.get_actor(manager_name(scope, "restart"), namespace=RAY_NAMESPACE)
        actor_id = handle._actor_id.hex()
        for _ in range(3):
            restarts = actor_state(actor_id)["NumRestarts"]
            ray.kill(handle, no_restart=False)
            # Calls right after the kill, through the restart, and on until the new
            # incarnation has answered a few: the first call that meets the dead actor waits.
            deadline = time.monotonic() + RESTART_SECONDS
            answered_by_the_next = 0
            while answered_by_the_next < NEXT_ANSWERS:
                assert manager.get(job_id).id == job_id  # raises nothing from Ray
                state = actor_state(actor_id)
                if state["NumRestarts"] > restarts and state["State"] == "ALIVE":
                    answered_by_the_next += 1
                assert time.monotonic() < deadline, f"Ray did not restart the manager: {state}"
        with pytest.raises(cr.JobOperationError) as caught:
            manager.stop(job_id)
        assert type(caught.value) is cr.JobOperationError
        assert caught.value.error is cr.StopJobError.JOB_IS_NOT_RUNNING

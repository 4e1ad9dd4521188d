"""A job actor takes one operation at a time (issue 9), on real Ray: the interleavings that
broke the first runtime, forced through the public API."""

from __future__ import annotations

import contextlib
import threading
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
import ray

import choreography_ray as cr
from tests.runtime.lifecycle_jobs import TRACES, Plan, Work, read, set_flag
from tests.runtime.turns_jobs import AdmissionFailsOnce, SlowPlan, SlowResumeHook, SlowToPrepare
from tests.support import RAY_NAMESPACE, eventually

pytestmark = pytest.mark.timeout(120)

#: The background watchdog practically off: nothing but the turns themselves moves the job.
NO_WATCHDOG = 3600.0
S = cr.JobStatus


def live_job_actors(job_ids: list[str]) -> list[str]:
    names = {f"job/{job_id}" for job_id in job_ids}
    return [
        actor["name"]
        for actor in ray.util.list_named_actors(all_namespaces=True)
        if actor["namespace"] == RAY_NAMESPACE and actor["name"] in names
    ]


def test_admission__raises_once_for_a_later_stage__the_job_still_completes(
    connect: Any, scope: str
) -> None:
    with connect(job_watchdog_interval=NO_WATCHDOG) as jobs:
        manager = jobs.manager(scope, "default")
        plan = Plan(steps=[Work(n=0, stage=0), Work(n=1, stage=10)])
        job_id = manager.start(AdmissionFailsOnce, plan).job_id
        state = manager.wait(job_id, timeout=30)
    assert state.status is S.COMPLETED_SUCCESSFULLY
    assert [e["stage"] for e in read(job_id, "admit_stage")] == [0, 10, 10]


def test_stop__while_prepare_steps_runs__the_job_stops_and_no_step_starts(
    connect: Any, scope: str
) -> None:
    token = uuid.uuid4().hex
    token_file = TRACES / f"token-{token}"
    with connect(job_watchdog_interval=NO_WATCHDOG) as jobs, ThreadPoolExecutor(2) as pool:
        manager = jobs.manager(scope, "default")
        plan = SlowPlan(token=token, steps=[Work(n=n) for n in range(5)])
        started = pool.submit(manager.start, SlowToPrepare, plan)
        eventually(token_file.exists, 30, "prepare_steps to run")
        job_id = token_file.read_text()
        stopping = pool.submit(manager.stop, job_id)
        threading.Event().wait(0.5)  # the stop is queued behind the prepare turn
        set_flag(job_id, "prepare")
        assert started.result(timeout=30).error is None
        stopping.result(timeout=30)
        state = manager.wait(job_id, timeout=30)
        assert state.status is S.STOPPED and state.stop_finalized
        assert state.progress.successful_steps == 0
        assert read(job_id, "starts") == []
        assert len(read(job_id, "on_stopped")) == 1
        eventually(lambda: not live_job_actors([job_id]), 15, "the stopped job's actor to exit")
    token_file.unlink(missing_ok=True)


def test_resume__two_at_once_on_a_stopped_job__the_hook_runs_once(connect: Any, scope: str) -> None:
    with connect(job_watchdog_interval=NO_WATCHDOG) as jobs, ThreadPoolExecutor(2) as pool:
        manager = jobs.manager(scope, "default")
        job_id = manager.start(SlowResumeHook, Plan(steps=[Work(n=0, block=True)])).job_id
        eventually(lambda: read(job_id, "starts"), 15, "the step to start")
        manager.stop(job_id)
        assert manager.wait(job_id, timeout=30).status is S.STOPPED
        resumes = [pool.submit(manager.resume, job_id) for _ in range(2)]
        for resume in resumes:
            resume.result(timeout=30)
        set_flag(job_id, "go")
        state = manager.wait(job_id, timeout=30)
    assert state.status is S.COMPLETED_SUCCESSFULLY
    assert len(read(job_id, "on_before_resuming_job_steps")) == 1
    assert len(read(job_id, "on_completed")) == 1


def test_stop__then_stop_resume_and_retry_on_finished_jobs__no_job_actor_stays(
    connect: Any, scope: str
) -> None:
    with connect() as jobs:
        manager = jobs.manager(scope, "default")
        stopped = manager.start(SlowResumeHook, Plan(steps=[Work(n=0, block=True)])).job_id
        eventually(lambda: read(stopped, "starts"), 15, "the step to start")
        manager.stop(stopped)
        done = manager.start(SlowResumeHook, Plan(steps=[Work(n=0)])).job_id
        assert manager.wait(done, timeout=30).status is S.COMPLETED_SUCCESSFULLY
        assert manager.wait(stopped, timeout=30).stop_finalized
        eventually(lambda: not live_job_actors([stopped, done]), 15, "both job actors to exit")
        for call in (manager.stop, manager.resume, manager.retry_failed_steps):
            with contextlib.suppress(cr.JobOperationError):
                call(done)
        eventually(lambda: not live_job_actors([stopped, done]), 15, "no job actor to stay")

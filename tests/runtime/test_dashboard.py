"""The dashboard's actions against real jobs managers and a real scheduler on Ray: each POST
goes through `RayActions` to the running actors, and a refusal comes back as its error code."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest

import choreography_ray as cr
from choreography_ray.dashboard import RayActions, create_app
from choreography_ray.model import JobState, utcnow
from choreography_ray.scheduler.records import DeadLetter
from choreography_ray.scheduler.status import DeadLetterStatus, RunStatus
from choreography_ray.status import JobStatus
from choreography_ray.storage import open_storage
from choreography_ray.storage.scheduler import scheduler_storage
from tests.dashboard.client import TOKEN, Client
from tests.runtime.sample_jobs import FanOut, FanOutRequest
from tests.support import RAY_NAMESPACE, eventually, in_storage

#: A job that runs for about 20 s at 4 steps at a time: long enough to act on while it runs.
SLOW = FanOutRequest(count=400, sleep=0.2)


@pytest.fixture
def runner() -> Iterator[asyncio.Runner]:
    with asyncio.Runner() as loop_runner:
        yield loop_runner


@pytest.fixture
def dashboard(ray_cluster: None, storage_url: str, runner: asyncio.Runner) -> Iterator[Client]:
    """A logged-in client of a dashboard whose actions go to this cluster's actors."""
    actions = RayActions(storage_url, ray_namespace=RAY_NAMESPACE)
    app = create_app(open_storage(storage_url), token=TOKEN, actions=actions,
                     allowed_hosts=["127.0.0.1"])  # fmt: skip
    client = Client(app, runner)
    client.log_in()
    yield client
    client.close()


def act(client: Client, path: str, **fields: str) -> Any:
    return client.post(path, data={"csrf": client.csrf(path), **fields})


def test_job_actions__stop_refusals_resume_and_remove_through_the_jobs_manager(
    connect: Any, scope: str, dashboard: Client
) -> None:
    manager = connect(max_active_steps_per_job=4).manager(scope, "dash")
    job_id = manager.start(FanOut, SLOW).job_id
    eventually(lambda: manager.get(job_id).progress.successful_steps > 0, 30, "steps to run")

    stopped = act(dashboard, f"/jobs/{job_id}/stop")
    assert stopped.status_code == 303, stopped.text
    state = eventually(lambda: (s := manager.get(job_id)).stop_finalized and s, 30, "the stop")
    assert state.status is JobStatus.STOPPED
    assert "Stop of job" in dashboard.get(f"/jobs/{job_id}").text

    again = act(dashboard, f"/jobs/{job_id}/stop")
    assert again.status_code == 409 and 'id="error-code">JobIsNotRunning<' in again.text
    retry = act(dashboard, f"/jobs/{job_id}/retry-failed")
    assert retry.status_code == 409 and 'id="error-code">NotSupported<' in retry.text

    assert act(dashboard, f"/jobs/{job_id}/resume").status_code == 303
    eventually(lambda: manager.get(job_id).status is JobStatus.RUNNING, 30, "the job to resume")
    assert act(dashboard, f"/jobs/{job_id}/stop").status_code == 303
    eventually(lambda: manager.get(job_id).stop_finalized, 30, "the second stop")
    removed = act(dashboard, f"/jobs/{job_id}/remove")
    assert removed.status_code == 303 and removed.headers["location"] == "/"
    eventually(lambda: dashboard.get(f"/jobs/{job_id}").status_code == 404, 30, "the removal")


def test_job_actions__a_job_whose_manager_does_not_run_is_refused_by_name(
    ray_cluster: None, storage_url: str, dashboard: Client
) -> None:
    async def orphan(storage):  # type: ignore[no-untyped-def]
        await storage.create_job(JobState(id="orphan", scope="nobody-runs", namespace="this",
                                          type="a:B", status=JobStatus.STOPPED))  # fmt: skip

    in_storage(storage_url, orphan)
    answer = act(dashboard, "/jobs/orphan/resume")
    assert answer.status_code == 409
    assert 'id="error-code">NoJobsManager<' in answer.text
    assert "jobs-manager/nobody-runs/this" in answer.text


def test_dead_letters__requeue_and_acknowledge_through_the_scheduler(
    connect: Any, scope: str, storage_url: str, dashboard: Client
) -> None:
    scheduler = connect().scheduler(scope)
    # One dead letter awaits per manifest (storage refuses a second): one manifest each.
    letters_of = {"dl-requeue": "later", "dl-acknowledge": "later-too"}
    for name in letters_of.values():
        scheduler.schedule(
            name, FanOut, FanOutRequest(count=2), once_at=utcnow() + timedelta(days=1)
        )

    async def letters(storage):  # type: ignore[no-untyped-def]
        for letter_id, name in letters_of.items():
            assert await scheduler_storage(storage).add_dead_letter(DeadLetter(
                id=letter_id, scope=scope, manifest=name, retry_count_at_dead_letter=4,
                reason="4 failures in 24 h",
            ))  # fmt: skip

    in_storage(storage_url, letters)
    base = f"/schedules/{scope}/dead-letters"
    page = dashboard.get(f"/schedules/dead-letters?scope={scope}").text
    assert f"{base}/dl-requeue/requeue" in page

    requeued = act(dashboard, f"{base}/dl-requeue/requeue", ask_afresh="on")
    assert requeued.status_code == 303, requeued.text
    assert "requeued as run" in dashboard.get(requeued.headers["location"]).text
    acknowledged = act(dashboard, f"{base}/dl-acknowledge/acknowledge", note="known outage")
    assert acknowledged.status_code == 303, acknowledged.text
    twice = act(dashboard, f"{base}/dl-acknowledge/acknowledge", note="again")
    assert twice.status_code == 409 and 'id="error-code">DeadLetterAlreadyResolved<' in twice.text

    resolved = {d.id: d for name in letters_of.values() for d in scheduler.dead_letters(name)}
    assert resolved["dl-requeue"].status is DeadLetterStatus.RETRIED
    assert resolved["dl-acknowledge"].status is DeadLetterStatus.ACKNOWLEDGED
    assert resolved["dl-acknowledge"].note == "known outage"
    runs = eventually(lambda: scheduler.runs("later"), 30, "the requeued run")
    assert runs[0].status in (RunStatus.QUEUED, RunStatus.RUNNING, RunStatus.SUCCEEDED)
    # With the scheduler running, failures are counted with its options.
    assert "the running scheduler's options" in dashboard.get(f"/schedules?scope={scope}").text


def test_limits_page__shows_a_limit_set_live_on_the_cluster(dashboard: Client, connect) -> None:
    """The limits page asks the cluster's limiter through `RayActions.limits`."""
    name = "test-dashboard-limit"  # a limit set live outlives its test: no other test names it
    with connect() as jobs:
        jobs.set_limit(name, cr.Limit(max_concurrent=3))
        eventually(lambda: f'data-limit="{name}"' in dashboard.get("/limits").text, 20,
                   "the limit on the page")  # fmt: skip
        page = dashboard.get("/limits").text
        assert "3 at once" in page

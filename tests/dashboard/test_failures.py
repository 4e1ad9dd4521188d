"""A job's failures by signature on its page, the steps of one signature, and "Retry these"
(to the recording stand-in of the actions; `RayActions.retry_failures` to a stand-in manager)."""

from __future__ import annotations

import asyncio
import re
from html import unescape
from typing import Any

import pytest
from markupsafe import escape

from choreography_ray.dashboard import ActionRefused
from choreography_ray.dashboard.actions import RayActions
from choreography_ray.errors import JobOperationError, RetryFailedStepsError
from choreography_ray.failures import failure_signature
from choreography_ray.status import JobStatus, StepStatus
from choreography_ray.storage import StepUpdate, Storage
from tests.dashboard.client import Client, RecordingActions, csrf_of
from tests.dashboard.seed import FAILED_STEPS, RUNNING_JOB

DISK_FULL = "shard <n> refused: disk full"
NO_SHARD = "no such shard"
RETRY = f"/jobs/{RUNNING_JOB}/failures/retry"


def sign_failures(storage: Storage, runner: asyncio.Runner) -> None:
    """Stores the signatures of the seeded job's failed steps: 30 of one, 2 of another."""
    updates = [StepUpdate(RUNNING_JOB, f"step-{n:03d}", StepStatus.FAILED, 2,
                          failure_signature=failure_signature(f"shard {n} refused: disk full"))
               for n in range(FAILED_STEPS)]  # fmt: skip
    updates += [StepUpdate(RUNNING_JOB, f"step-{n:03d}", StepStatus.COMPLETED_WITH_FAILURE, 1,
                           failure_signature=failure_signature(NO_SHARD))
                for n in (40, 41)]  # fmt: skip
    runner.run(storage.update_steps(updates))


def complete_with_failures(storage: Storage, runner: asyncio.Runner) -> None:
    job = runner.run(storage.get_job(RUNNING_JOB))
    assert job is not None
    runner.run(storage.save_job(job.with_status(JobStatus.COMPLETED_WITH_FAILURES)))


def clusters_on(page: str) -> list[tuple[str, str]]:
    """The (signature, count) rows of a job page's Failures table, in order."""
    rows = re.findall(r'<tr data-signature="([^"]+)">\s*<td class="num">([\d,]+)</td>', page)
    return [(unescape(signature), count) for signature, count in rows]


def step_ids(page: str) -> list[str]:
    return re.findall(r'<td class="id"><code>(step-\d+)</code>', page)


def link_to(page: str, pattern: str) -> str:
    found = re.search(rf'<a [^>]*href="({pattern})"', page)
    assert found, f"no link {pattern}"
    return unescape(found[1])


def test_job_page__failures_by_signature_most_frequent_first_with_an_example(
    reader: Client, storage: Storage, runner: asyncio.Runner
) -> None:
    assert 'id="failures"' not in reader.get(f"/jobs/{RUNNING_JOB}").text  # none signed yet

    sign_failures(storage, runner)
    page = reader.get(f"/jobs/{RUNNING_JOB}").text

    assert 'id="failures"' in page
    assert clusters_on(page) == [(DISK_FULL, "30"), (NO_SHARD, "2")]
    example = re.search(r"step <code>(step-\d+)</code><pre>([^<]*)</pre>", page)
    assert example and example.groups() == ("step-000", "shard 0 refused: disk full")
    assert "Retry these" not in page  # read only
    assert step_ids(page) == [f"step-{n:03d}" for n in range(25)]  # the cluster's are apart


def test_job_page__a_signatures_link_lists_only_its_failed_steps_page_by_page(
    reader: Client, storage: Storage, runner: asyncio.Runner
) -> None:
    sign_failures(storage, runner)
    page = reader.get(f"/jobs/{RUNNING_JOB}").text

    rare = reader.get(link_to(page, r"/jobs/[^\"]+\?signature=no[^\"]+")).text
    assert step_ids(rare) == ["step-040", "step-041"]
    assert "2 shown of 2 failed" in rare and 'rel="next"' not in rare
    assert "Failed steps of signature <code>no such shard</code>" in rare

    frequent = reader.get(link_to(page, r"/jobs/[^\"]+\?signature=shard[^\"]+")).text
    assert step_ids(frequent) == [f"step-{n:03d}" for n in range(25)]
    assert "25 shown of 30 failed" in frequent
    following = link_to(frequent, r"[^\"]+steps_after=[^\"]+")
    assert "signature=shard" in following
    rest = reader.get(following).text
    assert step_ids(rest) == [f"step-{n:03d}" for n in range(25, FAILED_STEPS)]  # no step-040
    first = re.search(r'<a href="([^"]+)#failed-steps">first</a>', rest)
    assert first and "signature=shard" in first[1] and "steps_after" not in first[1]
    assert link_to(rest, r"/jobs/job-running#failed-steps")  # all failed steps again


def test_retry_these__confirmed_retries_one_signature_through_the_manager(
    operator: Client, actions: RecordingActions, storage: Storage, runner: asyncio.Runner
) -> None:
    sign_failures(storage, runner)
    complete_with_failures(storage, runner)
    operator.log_in()
    page = operator.get(f"/jobs/{RUNNING_JOB}").text
    assert page.count(">Retry these</a>") == 2

    confirmation = operator.get(link_to(page, rf"{RETRY}\?signature=shard[^\"]+"))
    assert confirmation.status_code == 200
    assert "The 30 failed step(s) of this failure signature" in confirmation.text
    assert f'<code id="signature">{escape(DISK_FULL)}</code>' in confirmation.text
    assert f'<form method="post" action="{RETRY}"' in confirmation.text
    form = {"csrf": csrf_of(confirmation.text), "signature": DISK_FULL}
    done = operator.post(RETRY, data=form)

    assert done.status_code == 303 and done.headers["location"] == f"/jobs/{RUNNING_JOB}"
    assert actions.calls == [("retry_failures", "studio", "tenant-a", RUNNING_JOB, DISK_FULL)]
    shown = operator.get(done.headers["location"]).text
    assert escape(f"failures {DISK_FULL} of {RUNNING_JOB} retried") in shown


def test_retry_these__offered_only_with_actions_for_a_job_completed_with_failures(
    operator: Client, reader: Client, storage: Storage, runner: asyncio.Runner
) -> None:
    sign_failures(storage, runner)
    operator.log_in()
    assert "Retry these" not in operator.get(f"/jobs/{RUNNING_JOB}").text  # still running
    complete_with_failures(storage, runner)
    assert "Retry these" in operator.get(f"/jobs/{RUNNING_JOB}").text
    reader.log_in()
    assert "Retry these" not in reader.get(f"/jobs/{RUNNING_JOB}").text
    assert reader.get(f"{RETRY}?signature=x").status_code == 403


def test_retry_these__refused_checked_and_without_a_signature(
    operator: Client, actions: RecordingActions, storage: Storage, runner: asyncio.Runner
) -> None:
    sign_failures(storage, runner)
    operator.log_in()
    csrf = operator.csrf(f"{RETRY}?signature=x")

    assert operator.post(RETRY, data={"signature": NO_SHARD}).status_code == 403  # no CSRF
    assert operator.get(RETRY).status_code == 400
    assert operator.post(RETRY, data={"csrf": csrf}).status_code == 400
    assert operator.post("/jobs/nobody/failures/retry",
                         data={"csrf": csrf, "signature": NO_SHARD}).status_code == 404  # fmt: skip
    assert actions.calls == []

    actions.refuse["retry_failures"] = ActionRefused("NotSupported", "the type does not allow it")
    refused = operator.post(RETRY, data={"csrf": csrf, "signature": NO_SHARD})
    assert refused.status_code == 409
    assert 'id="error-code">NotSupported</span>' in refused.text
    assert "The 2 failed step(s)" in refused.text
    assert f'name="signature" value="{NO_SHARD}"' in refused.text  # to confirm again


class StandInManager:
    def __init__(self, error: Exception | None = None) -> None:
        self.calls: list[tuple[Any, ...]] = []
        self.error = error

    async def retry_failed_steps(self, job_id: str, signature: str | None = None) -> int:
        self.calls.append((job_id, signature))
        if self.error is not None:
            raise self.error
        return 1234


def test_ray_actions__retry_failures_asks_the_manager_for_one_signature(
    runner: asyncio.Runner,
) -> None:
    actions = RayActions("sqlite:///jobs.db")
    manager = actions._managers["studio", "tenant-a"] = StandInManager()  # type: ignore[assignment]

    said = runner.run(actions.retry_failures("studio", "tenant-a", "job-1", DISK_FULL))

    assert manager.calls == [("job-1", DISK_FULL)]
    assert said == f"1,234 failed step(s) of job job-1 with failure {DISK_FULL!r} run again"
    error = JobOperationError(RetryFailedStepsError.NOT_SUPPORTED)
    actions._managers["studio", "tenant-a"] = StandInManager(error)  # type: ignore[assignment]
    with pytest.raises(ActionRefused) as refused:
        runner.run(actions.retry_failures("studio", "tenant-a", "job-1", DISK_FULL))
    assert refused.value.code == RetryFailedStepsError.NOT_SUPPORTED.value
    assert ("studio", "tenant-a") in actions._managers  # an operation's refusal keeps it

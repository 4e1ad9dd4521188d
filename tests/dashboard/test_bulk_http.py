"""The bulk form at `/bulk`: a preview (dry run) of the jobs the filters select, then one
operation on each through the actions, with a single job action's guard."""

from __future__ import annotations

import asyncio
import re
from datetime import timedelta

import pytest

from choreography_ray.dashboard import ActionRefused, JobOperation
from choreography_ray.model import JobState, StatusChange, utcnow
from choreography_ray.status import JobStatus
from choreography_ray.storage import Storage
from tests.dashboard.client import TOKEN, Client, RecordingActions
from tests.dashboard.seed import REBUILD, RUNNING_JOB

pytestmark = pytest.mark.timeout(60)

#: Jobs that reached their status 3 hours ago; every seeded job reached its own just now.
OLD_STOPPED, OLD_FAILED = "old-stopped", "old-failed"
PREVIEW = "/bulk?op=remove&older_than=2h"


class PickyActions(RecordingActions):
    """Refuses the jobs in `refused_jobs`, does the others."""

    refused_jobs: set[str] = {OLD_FAILED}

    async def operate(self, scope: str, namespace: str, job_id: str, op: JobOperation) -> str:
        if job_id in self.refused_jobs:
            self.calls.append((op.value, scope, namespace, job_id))
            raise ActionRefused("JobIsAlreadyBeingRemoved", f"{job_id} is being removed")
        return await super().operate(scope, namespace, job_id, op)


@pytest.fixture
def actions() -> RecordingActions:
    return PickyActions()


@pytest.fixture(autouse=True)
def old_jobs(storage: Storage, runner: asyncio.Runner) -> None:
    for n, (job_id, status) in enumerate([(OLD_STOPPED, JobStatus.STOPPED),
                                          (OLD_FAILED, JobStatus.FAILED)]):  # fmt: skip
        at = utcnow() - timedelta(hours=3, minutes=n)
        runner.run(storage.create_job(JobState(
            id=job_id, scope="studio", namespace="tenant-a", type=REBUILD, status=status,
            created=at, status_changes=(StatusChange(status=status, occurred=at),),
        )))  # fmt: skip


def hidden_fields(page: str) -> dict[str, list[str]]:
    fields: dict[str, list[str]] = {}
    for name, value in re.findall(r'<input type="hidden" name="(\w+)" value="([^"]*)">', page):
        fields.setdefault(name, []).append(value)
    return fields


def listed(page: str) -> list[str]:
    return re.findall(r'<tr data-job="([^"]+)">', page)


def test_preview__lists_what_the_filters_select_and_does_nothing(
    operator: Client, actions: RecordingActions
) -> None:
    operator.log_in()
    page = operator.get(PREVIEW)

    assert page.status_code == 200
    assert listed(page.text) == [OLD_STOPPED, OLD_FAILED]  # newest first
    assert "Would remove 2 job(s)" in page.text and 'id="confirm"' in page.text
    stopped = operator.get("/bulk?op=stop&older_than=2h&status=stopped&scope=studio").text
    assert listed(stopped) == [OLD_STOPPED]
    assert listed(operator.get("/bulk?op=stop&status=running").text) == [RUNNING_JOB]
    assert 'id="confirm"' not in operator.get("/bulk?op=stop&scope=studio").text  # no filter
    assert operator.get("/bulk?older_than=soon").status_code == 400
    assert actions.calls == []


def test_confirm__acts_on_each_previewed_job_and_reports_a_refusal(
    operator: Client, actions: RecordingActions
) -> None:
    operator.log_in()
    fields = hidden_fields(operator.get(PREVIEW).text)
    assert fields["job"] == [OLD_STOPPED, OLD_FAILED] and fields["op"] == ["remove"]

    done = operator.post("/bulk", data={**fields, "job": [*fields["job"], RUNNING_JOB]})

    assert done.status_code == 200
    assert actions.calls == [("remove", "studio", "tenant-a", OLD_STOPPED),
                             ("remove", "studio", "tenant-a", OLD_FAILED)]  # fmt: skip
    assert "Remove: 1 of 3 job(s) done" in done.text
    assert f"remove of {OLD_STOPPED} done" in done.text
    assert "JobIsAlreadyBeingRemoved" in done.text
    # A job the filters do not select is never acted on, even when the form names it.
    assert re.search(rf'data-job="{RUNNING_JOB}">.*?NoLongerSelected', done.text, re.S)


def test_confirm__the_token_csrf_and_read_only_guard_it(
    operator: Client, reader: Client, actions: RecordingActions
) -> None:
    page = operator.get(PREVIEW).text
    assert 'name="token"' in page  # not logged in
    fields = hidden_fields(page)

    assert operator.post("/bulk", data={**fields, "csrf": []}).status_code == 403
    assert operator.post("/bulk", data={**fields, "token": "wrong"}).status_code == 403
    foreign = operator.post("/bulk", data=fields, headers={"origin": "http://evil.example"})
    assert foreign.status_code == 403
    assert actions.calls == []
    assert operator.post("/bulk", data={**fields, "token": TOKEN}).status_code == 200
    assert len(actions.calls) == 2

    assert reader.get(PREVIEW).status_code == 403
    answer = reader.post("/bulk", data={**fields, "csrf": reader.csrf("/login"), "token": TOKEN})
    assert answer.status_code == 403 and "--address" in answer.text


def test_jobs_page__offers_the_bulk_form_with_its_filters_when_actions_are_on(
    operator: Client, reader: Client
) -> None:
    page = operator.get("/?status=FAILED&scope=studio").text
    form = re.search(r'<form method="get" action="/bulk".*?</form>', page, re.S)
    assert form is not None
    assert 'name="status" value="FAILED"' in form[0] and 'name="scope" value="studio"' in form[0]
    assert 'action="/bulk"' not in reader.get("/").text

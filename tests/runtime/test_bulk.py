"""Acting on many jobs through the Python API on real Ray: `jobs.select_jobs` and
`jobs.act_on_jobs` (and its async twin) over a few small jobs: a dry run, a refusal reported
beside a success, and a bulk removal."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

import pytest

import choreography_ray as cr
from tests.runtime.cli_jobs import Held, HoldRequest
from tests.support import eventually, in_storage

pytestmark = pytest.mark.timeout(120)


def test_act_on_jobs__dry_run_refusal_reported_and_bulk_remove(
    connect: Any, scope: str, storage_url: str
) -> None:
    jobs = connect()
    manager = jobs.manager(scope, "default")
    failing = manager.start(Held, HoldRequest(count=2, seconds=0, fail_first=True)).job_id
    succeeded = manager.start(Held, HoldRequest(count=1, seconds=0)).job_id
    assert manager.wait(failing, timeout=60).status is cr.JobStatus.COMPLETED_WITH_FAILURES
    assert manager.wait(succeeded, timeout=60).status is cr.JobStatus.COMPLETED_SUCCESSFULLY
    mine = cr.JobSelection(scope=scope, types={"Held"})

    assert {j.id for j in jobs.select_jobs(mine)} == {failing, succeeded}
    assert jobs.select_jobs(mine.model_copy(update={"older_than": timedelta(hours=1)})) == []
    with_failures = mine.model_copy(update={"statuses": {cr.JobStatus.COMPLETED_WITH_FAILURES}})
    dry = jobs.act_on_jobs("retry_failed_steps", with_failures, dry_run=True)
    assert [(r.job_id, r.acted) for r in dry] == [(failing, False)]
    assert manager.get(failing).status is cr.JobStatus.COMPLETED_WITH_FAILURES

    retried = {r.job_id: r for r in jobs.act_on_jobs(cr.BulkOperation.RETRY_FAILED_STEPS, mine)}

    assert (retried[failing].acted, retried[failing].retried_steps) == (True, 2), retried[failing]
    refused = retried[succeeded]
    assert not refused.acted
    assert refused.error is cr.RetryFailedStepsError.JOB_IS_NOT_COMPLETED_WITH_FAILURES
    assert manager.wait(failing, timeout=60).status is cr.JobStatus.COMPLETED_SUCCESSFULLY

    removed = asyncio.run(jobs.act_on_jobs_async("remove", cr.JobSelection(scope=scope)))
    assert sorted((r.job_id, r.acted) for r in removed) == sorted([(failing, True),
                                                                   (succeeded, True)])  # fmt: skip
    eventually(lambda: not in_storage(storage_url, lambda s: s.list_jobs(scope, "default")), 60,
               "both jobs removed")  # fmt: skip

"""Acting on many jobs (`choreography_ray.bulk`) on the memory provider: which jobs a
`JobSelection` names (type by path or class name, status, scope, namespace, age since the
status was reached, across pages) and how one operation's outcome per job is reported."""

from __future__ import annotations

import asyncio
from datetime import timedelta

import pytest

import choreography_ray as cr
from choreography_ray import bulk
from choreography_ray.model import utcnow
from choreography_ray.storage.memory import MemoryStorage

pytestmark = pytest.mark.timeout(10)

NOW = utcnow()
REINDEX = "pkg.jobs:Reindex"


def job(job_id: str, status: cr.JobStatus, *, hours: float, **fields: object) -> cr.JobState:
    """A job that reached `status` `hours` ago (and was created a day before that)."""
    return cr.JobState.model_validate({
        "id": job_id, "scope": "ops", "namespace": "a", "type": REINDEX, "status": status,
        "created": NOW - timedelta(hours=hours + 24),
        "status_changes": [cr.StatusChange(status=status, occurred=NOW - timedelta(hours=hours))],
        **fields,
    })  # fmt: skip


JOBS = [
    job("running-3h", cr.JobStatus.RUNNING, hours=3),
    job("done-10m", cr.JobStatus.COMPLETED_SUCCESSFULLY, hours=1 / 6),
    job("done-2d", cr.JobStatus.COMPLETED_SUCCESSFULLY, hours=48, scope="lab",
        type="pkg.jobs:Embed"),
    job("failed-5h", cr.JobStatus.FAILED, hours=5, namespace="b"),
]  # fmt: skip


def selected(selection: cr.JobSelection) -> set[str]:
    async def run() -> list[cr.JobState]:
        storage = MemoryStorage()
        for state in JOBS:
            await storage.create_job(state)
        return await bulk.select_jobs(storage, selection, now=NOW)

    return {state.id for state in asyncio.run(run())}


def test_select__by_age_since_the_status_was_reached_not_since_created() -> None:
    done = frozenset({cr.JobStatus.COMPLETED_SUCCESSFULLY})
    assert selected(cr.JobSelection(statuses=done)) == {"done-10m", "done-2d"}
    assert selected(cr.JobSelection(statuses=done, older_than=timedelta(hours=1))) == {"done-2d"}
    # Every job was created over a day ago: the age is the status's.
    assert selected(cr.JobSelection(older_than=timedelta(hours=4))) == {"done-2d", "failed-5h"}


def test_select__type_by_path_or_class_name_scope_and_namespace() -> None:
    reindex = {"running-3h", "done-10m", "failed-5h"}
    assert selected(cr.JobSelection(types={"Reindex"})) == reindex
    assert selected(cr.JobSelection(types={REINDEX})) == reindex
    assert selected(cr.JobSelection(types={"Reindex", "Embed"})) == {j.id for j in JOBS}
    assert selected(cr.JobSelection(types={"pkg.jobs"})) == set()
    assert selected(cr.JobSelection(scope="lab")) == {"done-2d"}
    assert selected(cr.JobSelection(scope="ops", namespace="b")) == {"failed-5h"}


def test_select__reads_every_page(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(bulk, "PAGE", 1)
    assert selected(cr.JobSelection(older_than=timedelta(minutes=30))) == {
        "running-3h", "done-2d", "failed-5h"}  # fmt: skip


def test_act_on__a_refusal_is_reported_and_the_others_still_run() -> None:
    done: list[str] = []

    async def perform(state: cr.JobState) -> int | None:
        if state.id == "done-10m":
            raise cr.JobOperationError(cr.StopJobError.JOB_IS_NOT_RUNNING, "it is completed")
        if state.id == "done-2d":
            raise cr.JobsManagerUnavailableError("no answer")
        done.append(state.id)
        return 2

    results = asyncio.run(bulk.act_on(cr.BulkOperation.STOP, JOBS, perform))

    assert done == ["running-3h", "failed-5h"]
    assert [(r.job_id, r.acted, r.retried_steps, r.error) for r in results] == [
        ("running-3h", True, 2, None),
        ("done-10m", False, None, cr.StopJobError.JOB_IS_NOT_RUNNING),
        ("done-2d", False, None, None),
        ("failed-5h", True, 2, None),
    ]  # fmt: skip
    assert results[1].message == "it is completed"
    assert results[2].message == "JobsManagerUnavailableError: no answer"
    assert results[2].scope == "lab" and results[2].operation is cr.BulkOperation.STOP


def test_act_on__a_dry_run_acts_on_none() -> None:
    results = asyncio.run(bulk.act_on(cr.BulkOperation.REMOVE, JOBS, None))
    assert [(r.job_id, r.acted, r.error) for r in results] == [(j.id, False, None) for j in JOBS]

"""A job's priority and fairness key at its start, without Ray: the type's and the record's
defaults, `ManagerCore.start` (on SQLite, its job actor faked) storing both or refusing the start
with INVALID_REQUEST before anything is stored, and the CLI's `--priority` range."""

from __future__ import annotations

import asyncio
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from typer.testing import CliRunner

import choreography_ray as cr
from choreography_ray.cli import app
from choreography_ray.core.sharing import DEFAULT_PRIORITY
from choreography_ray.errors import JobOperationError, StartJobError
from choreography_ray.model import JobState
from choreography_ray.runtime import manager as manager_module
from choreography_ray.types import type_path
from tests.runtime.sharing_jobs import (
    BadPriorityJob,
    BrokenKeyJob,
    PlainJob,
    ScopedKeyJob,
    TenantJob,
    TenantRequest,
)

pytestmark = pytest.mark.timeout(30)


def test_job_type__priority_3_and_no_fairness_key_by_default() -> None:
    assert cr.Job.priority == DEFAULT_PRIORITY == 3
    assert PlainJob().fairness_key(TenantRequest(tenant="a")) is None


def test_job_state__a_record_without_the_fields_is_priority_3_keyed_by_its_namespace() -> None:
    old = JobState.model_validate({"id": "j", "scope": "s", "namespace": "n", "type": "a:B"})
    assert (old.priority, old.fairness_key, old.share_key) == (3, "", "n")
    assert old.model_copy(update={"fairness_key": "tenant-a"}).share_key == "tenant-a"


async def _no_actor_start() -> None:
    return None


async def _job_actor(job_id: str) -> Any:
    """A job actor whose start does nothing: the record is what these tests read."""
    return SimpleNamespace(start=SimpleNamespace(remote=_no_actor_start))


def start(
    path: Path, job_type: type, request: dict[str, Any], priority: Any = None
) -> tuple[JobOperationError | None, list[JobState]]:
    """What `ManagerCore.start` of manager s/tenants raises (None: it started), and the jobs it
    stored."""

    async def scenario() -> tuple[JobOperationError | None, list[JobState]]:
        options = cr.JobsOptions(spare_job_actors=0)
        core = manager_module.ManagerCore(
            "s", "tenants", f"sqlite:///{path}", options.model_dump_json(), "ns"
        )
        core.job_actor = _job_actor  # type: ignore[method-assign]
        refused = None
        try:
            await core.start(type_path(job_type), request, priority=priority)
        except JobOperationError as error:
            refused = error
        try:
            return refused, await core.storage.list_jobs("s", "tenants")
        finally:
            core.tasks.cancel_all()
            await core.storage.close()

    return asyncio.run(scenario())


@pytest.mark.parametrize(
    ("job_type", "request_fields", "priority", "stored"),
    [
        (PlainJob, {}, None, (3, "tenants")),
        (PlainJob, {}, 1, (1, "tenants")),
        (TenantJob, {"tenant": "tenant-a"}, None, (2, "tenant-a")),
        (TenantJob, {}, 5, (5, "tenants")),
        (ScopedKeyJob, {"tenant": "a"}, None, (3, "s/a")),
    ],
)
def test_start__the_priority_given_else_the_types_and_the_types_key_else_the_namespace(
    tmp_path: Path,
    job_type: type,
    request_fields: dict[str, Any],
    priority: int | None,
    stored: tuple[int, str],
) -> None:
    refused, jobs = start(tmp_path / "jobs.db", job_type, request_fields, priority)
    assert refused is None
    (job,) = jobs
    assert (job.priority, job.fairness_key) == stored


@pytest.mark.parametrize("priority", [0, 6, -1, True, 2.0, "1"])
def test_start__a_priority_not_an_int_from_1_to_5_is_refused_and_nothing_is_stored(
    tmp_path: Path, priority: object
) -> None:
    refused, jobs = start(tmp_path / "jobs.db", PlainJob, {}, priority)
    assert refused is not None and refused.error is StartJobError.INVALID_REQUEST
    assert f"priority must be an int from 1 (first) to 5, not {priority!r}" in refused.message
    assert jobs == []


def test_start__a_type_whose_priority_is_out_of_range_is_refused_naming_it(
    tmp_path: Path,
) -> None:
    for priority in (None, 2):  # a start's priority does not hide the type's
        refused, jobs = start(tmp_path / "jobs.db", BadPriorityJob, {}, priority)
        assert refused is not None and refused.error is StartJobError.INVALID_REQUEST
        assert f"{type_path(BadPriorityJob)}.priority: priority must be" in refused.message
        assert jobs == []


def test_start__a_fairness_key_that_raises_or_returns_no_str_is_refused_naming_the_type(
    tmp_path: Path,
) -> None:
    refused, jobs = start(tmp_path / "jobs.db", BrokenKeyJob, {"tenant": "x"})
    assert refused is not None and refused.error is StartJobError.INVALID_REQUEST
    assert refused.message == (
        f"{type_path(BrokenKeyJob)}.fairness_key raised LookupError(\"no tenant 'x'\")"
    )
    assert jobs == []

    refused, jobs = start(tmp_path / "jobs.db", BrokenKeyJob, {"tenant": "int"})
    assert refused is not None and refused.error is StartJobError.INVALID_REQUEST
    assert refused.message == (
        f"{type_path(BrokenKeyJob)}.fairness_key returned 7, not a str or None"
    )
    assert jobs == []


@pytest.mark.parametrize("priority", ["0", "6", "first"])
def test_cli_run__a_priority_out_of_range_exits_2_before_ray_starts(priority: str) -> None:
    result = CliRunner().invoke(
        app, ["run", type_path(PlainJob), "--priority", priority], terminal_width=200
    )
    assert result.exit_code == 2
    assert "--priority" in result.output

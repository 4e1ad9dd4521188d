"""`choreography-ray status JOB_ID` and `choreography-ray list`: jobs as stored.

Both read the storage directly and start no Ray: the job record is the truth (the job actor's
counters are a cache of it), and a finished job has no actor to ask. `memory://` lives inside a
Ray cluster's actor, so it cannot be read this way.
"""

from __future__ import annotations

import asyncio
from typing import Annotated

import typer

from choreography_ray.cli._common import (
    StorageOption,
    console,
    fail,
    open_stored,
    parse_member,
    state_json,
)
from choreography_ray.cli._render import (
    FAILED_STEPS_SHOWN,
    failed_steps_table,
    jobs_table,
    outcome,
)
from choreography_ray.errors import StorageError
from choreography_ray.model import JobState, StepState
from choreography_ray.status import FAILED_STEP, JobStatus, StepStatus
from choreography_ray.storage import Storage

_FAILED = FAILED_STEP | {StepStatus.UNREACHABLE}


def parse_status(text: str) -> JobStatus:
    """A job status by member name or stored value, in any case: RUNNING, Running, running."""
    return parse_member(JobStatus, text, "job status")


def _open(storage: str | None) -> Storage:
    return open_stored(storage, "status and list")


async def _read_job(store: Storage, job_id: str) -> tuple[JobState | None, list[StepState]]:
    try:
        state = await store.get_job(job_id)
        failed: list[StepState] = []
        if state is not None and state.progress.has_failures:
            failed = await store.list_steps(job_id, statuses=_FAILED, limit=FAILED_STEPS_SHOWN)
        return state, failed
    finally:
        await store.close()


async def _read_jobs(
    store: Storage, scope: str | None, namespace: str | None, status: JobStatus | None
) -> list[JobState]:
    try:
        keys = await store.list_manager_keys()
        jobs: list[JobState] = []
        for key in keys:
            if (scope is None or key.scope == scope) and (
                namespace is None or key.namespace == namespace
            ):
                jobs += await store.list_jobs(key.scope, key.namespace, status)
        return sorted(jobs, key=lambda j: j.created)
    finally:
        await store.close()


def status(
    job_id: Annotated[str, typer.Argument(help="The job's id.")],
    storage: StorageOption = None,
    as_json: Annotated[
        bool, typer.Option("--json", help="Print the job state as JSON instead of tables.")
    ] = False,
) -> None:
    """Show a job's status, counts per stage, and its first failed steps' messages."""
    store = _open(storage)
    try:
        state, failed = asyncio.run(_read_job(store, job_id))
    except StorageError as error:
        fail(str(error))
    if state is None:
        fail(f"no job {job_id} in {store.url}")
    if as_json:
        typer.echo(state_json(state))
        return
    console.print(outcome(state))
    if failed:
        failed_total = state.progress.failed_steps + state.progress.unreachable_steps
        console.print()
        console.print(failed_steps_table(failed, failed_total))


def list_jobs(
    storage: StorageOption = None,
    scope: Annotated[
        str | None,
        typer.Option(help="Only this scope.", show_default="every scope"),
    ] = None,
    namespace: Annotated[
        str | None,
        typer.Option(help="Only this namespace.", show_default="every namespace"),
    ] = None,
    status_filter: Annotated[
        str | None,
        typer.Option(
            "--status",
            metavar="STATUS",
            show_default=False,
            help="Only jobs in this status (RUNNING or Running, ...).",
        ),
    ] = None,
) -> None:
    """List the stored jobs, oldest first."""
    wanted = parse_status(status_filter) if status_filter is not None else None
    store = _open(storage)
    try:
        jobs = asyncio.run(_read_jobs(store, scope, namespace, wanted))
    except StorageError as error:
        fail(str(error))
    if jobs:
        console.print(jobs_table(jobs))
    else:
        console.print(f"No jobs in {store.url}", highlight=False, soft_wrap=True)


def register(app: typer.Typer) -> None:
    app.command("status")(status)
    app.command("list")(list_jobs)

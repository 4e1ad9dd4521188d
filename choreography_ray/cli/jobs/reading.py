"""`jobs list`, `jobs show ID`, `jobs steps ID`, `jobs failures ID`: jobs, steps and failure
clusters as stored.

They read the storage directly, opened read-only (it creates nothing), and start no Ray: the
job record is the truth (a job actor's counters are a cache of it), and a finished job has no
actor to ask. `memory://` lives inside a cluster's storage actor, so they refuse it.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Collection, Sequence
from datetime import datetime
from typing import Annotated

import typer
from rich import box
from rich.table import Table

from choreography_ray.cli._cluster import job_pools
from choreography_ray.cli._common import (
    console,
    fail,
    note,
    open_stored,
    parse_member,
    print_json,
    read_job,
    state_data,
    state_json,
    where,
)
from choreography_ray.cli._options import (
    JobIdArgument,
    JobNamespaceCheck,
    JobScopeCheck,
    JsonOption,
    NamespaceFilter,
    RayNamespaceOption,
    ScopeFilter,
    StatusFilter,
    StorageOption,
    TypeFilter,
    parse_since,
    parse_status,
)
from choreography_ray.cli._render import (
    FAILED_STEPS_SHOWN,
    failed_steps_table,
    history_table,
    jobs_table,
    outcome,
    pools_table,
    steps_table,
    summary,
    when,
)
from choreography_ray.core.stopping import settled
from choreography_ray.failures import FailureCluster
from choreography_ray.model import JobState, StepState
from choreography_ray.runtime.names import DEFAULT_NAMESPACE
from choreography_ray.status import FAILED_STEP, JobStatus, StepStatus
from choreography_ray.storage import Storage

#: The steps `--status failed` (the default of `jobs steps`) means.
FAILED = FAILED_STEP | {StepStatus.UNREACHABLE}
#: At most this many jobs or steps unless `--limit` says otherwise.
DEFAULT_LIMIT = 100
#: The failure clusters (most frequent first) `jobs show` lists; `jobs failures` lists all.
CLUSTERS_SHOWN = 3

LimitOption = Annotated[int, typer.Option("--limit", min=1, help="At most this many.")]
SignatureFilter = Annotated[
    str | None,
    typer.Option(
        "--signature",
        metavar="SIGNATURE",
        show_default=False,
        help="Only the failed steps of this failure signature (as `jobs failures` prints it).",
    ),
]


def type_matches(job_type: str, wanted: str) -> bool:
    """`wanted` is the job's import path or its class name."""
    return wanted in (job_type, job_type.rpartition(":")[2])


async def read_jobs(
    store: Storage,
    *,
    scope: str | None = None,
    namespace: str | None = None,
    statuses: Collection[JobStatus] = (),
    job_type: str | None = None,
    since: datetime | None = None,
) -> list[JobState]:
    """The matching jobs of every jobs manager in the storage's key catalog, newest first."""
    jobs: list[JobState] = []
    for key in await store.list_manager_keys():
        if scope not in (None, key.scope) or namespace not in (None, key.namespace):
            continue
        if len(statuses) == 1:
            (status,) = statuses
            jobs += await store.list_jobs(key.scope, key.namespace, status)
        else:
            jobs += [j for j in await store.list_jobs(key.scope, key.namespace)
                     if not statuses or j.status in statuses]  # fmt: skip
    if job_type is not None:
        jobs = [j for j in jobs if type_matches(j.type, job_type)]
    if since is not None:
        jobs = [j for j in jobs if j.created >= since]
    return sorted(jobs, key=lambda j: j.created, reverse=True)


def list_jobs(
    storage: StorageOption = None,
    scope: ScopeFilter = None,
    namespace: NamespaceFilter = None,
    status: StatusFilter = None,
    job_type: TypeFilter = None,
    since: Annotated[
        str | None,
        typer.Option(
            metavar="WHEN",
            show_default=False,
            help="Only jobs created since: a duration back (90s, 15m, 2h, 7d) or an ISO date.",
        ),
    ] = None,
    limit: LimitOption = DEFAULT_LIMIT,
    as_json: JsonOption = False,
) -> None:
    """List the stored jobs, newest first."""
    statuses = {parse_status(s) for s in status or ()}
    after = parse_since(since) if since is not None else None
    store = open_stored(storage, "jobs list")

    async def read() -> list[JobState]:
        try:
            return await read_jobs(store, scope=scope, namespace=namespace, statuses=statuses,
                                   job_type=job_type, since=after)  # fmt: skip
        finally:
            await store.close()

    found = asyncio.run(read())
    shown = found[:limit]
    if as_json:
        print_json([state_data(j) for j in shown])
    elif shown:
        console.print(jobs_table(shown))
    else:
        console.print(f"No jobs in {store.url}", highlight=False, soft_wrap=True)
    if len(found) > limit:
        note(f"showing the newest {limit} of {len(found)} jobs; --limit shows more")


def show(
    job_id: JobIdArgument,
    storage: StorageOption = None,
    scope: JobScopeCheck = None,
    namespace: JobNamespaceCheck = None,
    as_json: Annotated[
        bool, typer.Option("--json", help="Print the job state as JSON (as `run` does).")
    ] = False,
    address: Annotated[
        str | None,
        typer.Option(
            "--address",
            help="The Ray cluster the job runs in: also show the pools its steps run on.",
            show_default="$RAY_ADDRESS, else the pools are not shown",
        ),
    ] = None,
    ray_namespace: RayNamespaceOption = DEFAULT_NAMESPACE,
) -> None:
    """Show a job: its status, counts per stage, status history, error, first failed steps and
    most frequent failure signatures; with a cluster address, the pools its steps run on."""
    store = open_stored(storage, "jobs show")

    async def read() -> tuple[JobState | None, list[StepState], list[FailureCluster]]:
        try:
            state = await read_job(store, job_id, scope, namespace)
            if state is None or not state.progress.has_failures or as_json:
                return state, [], []
            failed = await store.list_steps(job_id, statuses=FAILED, limit=FAILED_STEPS_SHOWN)
            return state, failed, await store.failure_clusters(job_id)
        finally:
            await store.close()

    state, failed, clusters = asyncio.run(read())
    if state is None:
        fail(f"no job {job_id} in {where(store, scope, namespace)}")
    if as_json:
        typer.echo(state_json(state))
        return
    console.print(summary(state))
    console.print()
    console.print(outcome(state))
    console.print()
    console.print(history_table(state))
    address = address or os.environ.get("RAY_ADDRESS")
    if address and not settled(state):
        found = job_pools(state.id, address, ray_namespace)
        if found:
            console.print()
            console.print(pools_table(found))
    if failed:
        failed_total = state.progress.failed_steps + state.progress.unreachable_steps
        console.print()
        console.print(failed_steps_table(failed, failed_total))
        if failed_total > len(failed):
            console.print(f"All of them: choreography-ray jobs steps {state.id}",
                          highlight=False, soft_wrap=True)  # fmt: skip
    if clusters:
        console.print()
        console.print(clusters_table(clusters[:CLUSTERS_SHOWN], len(clusters), full=False))
        if len(clusters) > CLUSTERS_SHOWN:
            console.print(f"All of them: choreography-ray jobs failures {state.id}",
                          highlight=False, soft_wrap=True)  # fmt: skip


def parse_step_statuses(texts: list[str] | None) -> frozenset[StepStatus] | None:
    """`--status` of `jobs steps`: `failed` (every failure and unreachable, the default),
    `all` (None: every stored step), or step statuses by name or stored value."""
    wanted: set[StepStatus] = set()
    for text in texts or ["failed"]:
        key = text.lower()
        if key == "all":
            return None
        if key == "failed":
            wanted |= FAILED
        else:
            wanted.add(parse_member(StepStatus, text, "step status (or failed, all)"))
    return frozenset(wanted)


def steps(
    job_id: JobIdArgument,
    storage: StorageOption = None,
    scope: JobScopeCheck = None,
    namespace: JobNamespaceCheck = None,
    status: Annotated[
        list[str] | None,
        typer.Option(
            "--status",
            metavar="STATUS",
            show_default="failed",
            help="failed (failed, completed with failure, unreachable), all, or a step status "
            "(RUNNING, SCHEDULED, ...); repeatable.",
        ),
    ] = None,
    limit: LimitOption = DEFAULT_LIMIT,
    after: Annotated[
        str | None,
        typer.Option(metavar="STEP_ID", show_default=False, help="Only steps after this id."),
    ] = None,
    signature: SignatureFilter = None,
    as_json: JsonOption = False,
) -> None:
    """List a job's stored steps (failed ones by default) with their attempts and messages.

    A step that succeeded is not stored any more, so `all` lists the steps without success."""
    if signature is not None and status:
        raise typer.BadParameter("--signature lists failed steps: leave out --status",
                                 param_hint="--status")  # fmt: skip
    wanted = parse_step_statuses(status)
    store = open_stored(storage, "jobs steps")

    async def read() -> tuple[JobState | None, list[StepState]]:
        try:
            state = await read_job(store, job_id, scope, namespace)
            if state is None:
                return None, []
            if signature is not None:
                return state, await store.list_failed(job_id, signature, after=after,
                                                      limit=limit)  # fmt: skip
            return state, await store.list_steps(job_id, statuses=wanted, after=after,
                                                 limit=limit)  # fmt: skip
        finally:
            await store.close()

    state, found = asyncio.run(read())
    if state is None:
        fail(f"no job {job_id} in {where(store, scope, namespace)}")
    if as_json:
        print_json([s.model_dump(mode="json") for s in found])
        return
    which = "stored" if wanted is None else ", ".join(sorted(s.name for s in wanted))
    if signature is not None:
        which = f"failed with signature {signature}"
    console.print(steps_table(found, f"{len(found)} step(s) of job {job_id} ({which})"))
    if len(found) == limit:
        console.print(f"More may follow: --after {found[-1].step_id}", highlight=False)


def clusters_table(clusters: Sequence[FailureCluster], total: int, *, full: bool) -> Table:
    """Failure clusters, most frequent first: each signature's count and example step; `full`
    adds when the first and last were stored and the example's whole message."""
    if full:
        table = Table(title=f"{total:,} failure signature(s)", title_justify="left",
                      box=box.SIMPLE_HEAD)  # fmt: skip
    else:
        table = Table(title=f"Failures by signature ({len(clusters)} of {total:,})",
                      title_justify="left")  # fmt: skip
    table.add_column("Count", justify="right", no_wrap=True)
    table.add_column("Signature", overflow="fold")
    if full:
        table.add_column("First seen (UTC)", no_wrap=True)
        table.add_column("Last seen (UTC)", no_wrap=True)
    table.add_column("Example step", no_wrap=True)
    if full:
        table.add_column("Example message", overflow="fold")
    for cluster in clusters:
        seen = [when(cluster.first_seen), when(cluster.last_seen)] if full else []
        message = [cluster.example_message or "-"] if full else []
        table.add_row(f"{cluster.count:,}", cluster.signature, *seen, cluster.example_step_id,
                      *message)  # fmt: skip
    return table


def failures(
    job_id: JobIdArgument,
    storage: StorageOption = None,
    scope: JobScopeCheck = None,
    namespace: JobNamespaceCheck = None,
    as_json: JsonOption = False,
) -> None:
    """List a job's failed steps grouped by failure signature, most frequent first, each with
    when its first and last failure were stored and one example step with its whole message."""
    store = open_stored(storage, "jobs failures")

    async def read() -> tuple[JobState | None, list[FailureCluster]]:
        try:
            state = await read_job(store, job_id, scope, namespace)
            if state is None:
                return None, []
            return state, await store.failure_clusters(job_id)
        finally:
            await store.close()

    state, clusters = asyncio.run(read())
    if state is None:
        fail(f"no job {job_id} in {where(store, scope, namespace)}")
    if as_json:
        print_json([c.model_dump(mode="json") for c in clusters])
        return
    if not clusters:
        console.print(f"No stored failed step of job {job_id}", highlight=False, soft_wrap=True)
        return
    console.print(clusters_table(clusters, len(clusters), full=True))
    console.print(f"The steps of one: choreography-ray jobs steps {job_id} --signature "
                  "SIGNATURE\nRun them again: choreography-ray jobs retry-failed "
                  f"{job_id} --signature SIGNATURE", highlight=False, soft_wrap=True)  # fmt: skip

"""`choreography-ray scheduler ...`: a scope's manifests, runs and dead letters, and the operator's
actions on them.

`manifests`, `runs` and `dead-letters` read the storage directly and start no Ray, as `status`
and `list` do: the records are the truth. `trigger`, `requeue` and `acknowledge` change state,
so they go through the running scheduler actor `scheduler/{scope}` of the cluster at `--address`
(or `$RAY_ADDRESS`); the CLI never creates a scheduler (it would run with this command's
options), and refuses one that runs on another storage.
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Callable, Coroutine, Sequence
from datetime import datetime
from typing import Annotated, Any, TypeVar

import typer
from pydantic import BaseModel
from rich import box
from rich.table import Table

from choreography_ray.cli._cluster import init_ray
from choreography_ray.cli._common import (
    ExitCode,
    console,
    fail,
    open_stored,
    parse_member,
    resolve_storage,
)
from choreography_ray.cli._options import AddressOption, StorageOption
from choreography_ray.errors import (
    ChoreographyError,
    SchedulerError,
    SchedulerOperationError,
    StorageError,
)
from choreography_ray.runtime.names import DEFAULT_NAMESPACE, scheduler_name
from choreography_ray.scheduler.records import DeadLetter, Manifest, ManifestRun
from choreography_ray.scheduler.schedules import After, Cron, Every, OnceAt
from choreography_ray.scheduler.status import DeadLetterStatus
from choreography_ray.scheduler_client import AsyncScheduler
from choreography_ray.storage.scheduler import SchedulerStorage, scheduler_storage

T = TypeVar("T")

#: The scope a command reads or acts on unless `--scope` says otherwise.
DEFAULT_SCOPE = "default"
#: A refusal whose subject does not exist is bad input; any other is the scheduler's no.
_NOT_FOUND = frozenset({SchedulerError.MANIFEST_NOT_FOUND, SchedulerError.RUN_NOT_FOUND,
                        SchedulerError.DEAD_LETTER_NOT_FOUND})  # fmt: skip

ScopeOption = Annotated[str, typer.Option(help="The scheduler's scope.")]
JsonOption = Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")]
RayNamespaceOption = Annotated[
    str, typer.Option(help="The Ray namespace of the job system's actors.")
]

app = typer.Typer(
    name="scheduler",
    help="A scope's manifests, runs and dead letters; trigger, requeue, acknowledge.",
    no_args_is_help=True,
)


# -- reading storage --------------------------------------------------------------------------


def _read(storage: str | None, read: Callable[[SchedulerStorage], Coroutine[Any, Any, T]]) -> T:
    store = open_stored(storage, "manifests, runs and dead-letters")

    async def run() -> T:
        try:
            return await read(scheduler_storage(store))
        finally:
            await store.close()

    try:
        return asyncio.run(run())
    except StorageError as error:
        fail(str(error))


def _print_json(records: Sequence[BaseModel]) -> None:
    typer.echo(json.dumps([r.model_dump(mode="json") for r in records], indent=2))


def _when(at: datetime | None) -> str:
    return "-" if at is None else at.strftime("%Y-%m-%d %H:%M:%S")


def describe_schedule(manifest: Manifest) -> str:
    schedule = manifest.schedule
    if isinstance(schedule, Every):
        return f"every {schedule.interval}"
    if isinstance(schedule, Cron):
        return f"cron {schedule.expression!r} {schedule.tz}"
    if isinstance(schedule, OnceAt):
        return f"once at {_when(schedule.at)}"
    assert isinstance(schedule, After)
    return f"after {schedule.parent}"


def _table(title: str, columns: Sequence[str], rows: Sequence[Sequence[str]]) -> Table:
    table = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD)
    for column in columns:
        table.add_column(column)
    for row in rows:
        table.add_row(*row)
    return table


@app.command("manifests")
def manifests(
    storage: StorageOption = None, scope: ScopeOption = DEFAULT_SCOPE, as_json: JsonOption = False
) -> None:
    """List the scope's manifests, by name."""
    found = _read(storage, lambda s: s.list_manifests(scope))
    if as_json:
        return _print_json(found)
    rows = [(m.name, describe_schedule(m), m.job_type, m.namespace, str(m.max_retries),
             "yes" if m.enabled else "no", "yes" if m.replay_decisions_on_retry else "no")
            for m in found]  # fmt: skip
    columns = ("Name", "Schedule", "Job type", "Namespace", "Max retries", "Enabled", "Replay")
    console.print(_table(f"{len(found)} manifest(s) in scope {scope}", columns, rows))


@app.command("runs")
def runs(
    name: Annotated[str | None, typer.Argument(help="Only this manifest's runs.")] = None,
    storage: StorageOption = None,
    scope: ScopeOption = DEFAULT_SCOPE,
    limit: Annotated[int, typer.Option(min=1, help="At most this many runs.")] = 100,
    as_json: JsonOption = False,
) -> None:
    """List the scope's runs, newest first."""
    found: list[ManifestRun] = _read(storage, lambda s: s.list_runs(scope, name, limit))
    if as_json:
        return _print_json(found)
    rows = [(r.id, r.manifest, r.status.name, r.job_id or "-", _when(r.queued_at),
             _when(r.started_at), _when(r.ended_at), "yes" if r.is_retry else "no",
             r.replays or "-") for r in found]  # fmt: skip
    columns = ("Run", "Manifest", "Status", "Job", "Queued", "Started", "Ended", "Retry",
               "Replays")  # fmt: skip
    console.print(_table(f"{len(found)} run(s) in scope {scope}", columns, rows))


def parse_dead_letter_status(text: str) -> DeadLetterStatus:
    return parse_member(DeadLetterStatus, text, "dead letter status")


@app.command("dead-letters")
def dead_letters(
    name: Annotated[str | None, typer.Argument(help="Only this manifest's dead letters.")] = None,
    storage: StorageOption = None,
    scope: ScopeOption = DEFAULT_SCOPE,
    status: Annotated[
        str | None,
        typer.Option(
            metavar="STATUS",
            show_default=False,
            help="Only dead letters in this status (AWAITING_INTERVENTION, ...).",
        ),
    ] = None,
    as_json: JsonOption = False,
) -> None:
    """List the scope's dead letters, newest first."""
    wanted = parse_dead_letter_status(status) if status is not None else None
    found: list[DeadLetter] = _read(storage, lambda s: s.list_dead_letters(scope, name, wanted))
    if as_json:
        return _print_json(found)
    rows = [(d.id, d.manifest, d.status.name, str(d.retry_count_at_dead_letter),
             _when(d.dead_lettered_at), _when(d.resolved_at), d.note or "-", d.reason)
            for d in found]  # fmt: skip
    columns = ("Dead letter", "Manifest", "Status", "Failures", "Dead-lettered", "Resolved",
               "Note", "Reason")  # fmt: skip
    console.print(_table(f"{len(found)} dead letter(s) in scope {scope}", columns, rows))


# -- acting through the scheduler actor -------------------------------------------------------


def _act(
    storage: str | None,
    scope: str,
    address: str | None,
    ray_namespace: str,
    action: Callable[[AsyncScheduler], Coroutine[Any, Any, T]],
) -> T:
    """`action` on the running scheduler of `scope`; one clear error line and an exit code for
    whatever goes wrong."""
    address = address or os.environ.get("RAY_ADDRESS")
    if not address:
        fail("this command acts through the running scheduler: give --address (or set "
             "$RAY_ADDRESS) of the Ray cluster it runs in")  # fmt: skip
    url = resolve_storage(storage)
    import ray

    init_ray(address, ray_namespace)
    try:
        try:
            handle = ray.get_actor(scheduler_name(scope), namespace=ray_namespace)
        except ValueError:
            fail(f"no scheduler {scheduler_name(scope)} runs in the cluster at {address} "
                 f"(Ray namespace {ray_namespace})", ExitCode.JOB_NOT_SUCCESSFUL)  # fmt: skip
        client = AsyncScheduler(handle, scope)

        async def run() -> T:
            running = await client._call("config")
            if running["storage"] != url:
                fail(f"the scheduler {scheduler_name(scope)} runs on another storage than "
                     f"{url}", ExitCode.BAD_INPUT)  # fmt: skip
            return await action(client)

        try:
            return asyncio.run(run())
        except SchedulerOperationError as error:
            code = ExitCode.BAD_INPUT if error.error in _NOT_FOUND else ExitCode.JOB_NOT_SUCCESSFUL
            fail(str(error), code)
        except ChoreographyError as error:
            fail(str(error), ExitCode.JOB_NOT_SUCCESSFUL)
    finally:
        ray.shutdown()


@app.command("trigger")
def trigger(
    name: Annotated[str, typer.Argument(help="The manifest to run now.")],
    ask_afresh: Annotated[
        bool, typer.Option(help="Ask its deciders afresh rather than replay a failed run.")
    ] = False,
    storage: StorageOption = None,
    scope: ScopeOption = DEFAULT_SCOPE,
    address: AddressOption = None,
    ray_namespace: RayNamespaceOption = DEFAULT_NAMESPACE,
    as_json: JsonOption = False,
) -> None:
    """Run a manifest now, off its schedule (never a second queued run)."""
    result = _act(storage, scope, address, ray_namespace, lambda s: s.trigger(name, ask_afresh))
    if as_json:
        return typer.echo(json.dumps(result.model_dump(mode="json"), indent=2))
    if result.already_dispatched:
        console.print(f"run {result.run_id} of {name} is in flight already; it "
                      f"replays the decisions of {result.replay_decisions_of or 'no run'}",
                      highlight=False, soft_wrap=True)  # fmt: skip
    else:
        console.print(f"run {result.run_id} of {name} is queued to run now",
                      highlight=False, soft_wrap=True)  # fmt: skip


@app.command("requeue")
def requeue(
    dead_letter_id: Annotated[str, typer.Argument(help="The dead letter to retry.")],
    ask_afresh: Annotated[
        bool, typer.Option(help="Ask its deciders afresh rather than replay the failed run.")
    ] = False,
    storage: StorageOption = None,
    scope: ScopeOption = DEFAULT_SCOPE,
    address: AddressOption = None,
    ray_namespace: RayNamespaceOption = DEFAULT_NAMESPACE,
    as_json: JsonOption = False,
) -> None:
    """Retry a dead-lettered manifest at once; its failure count starts afresh."""
    run_id = _act(storage, scope, address, ray_namespace,
                  lambda s: s.requeue(dead_letter_id, ask_afresh))  # fmt: skip
    if as_json:
        return typer.echo(json.dumps({"run_id": run_id, "dead_letter": dead_letter_id}))
    console.print(f"dead letter {dead_letter_id} requeued as run {run_id}",
                  highlight=False, soft_wrap=True)  # fmt: skip


@app.command("acknowledge")
def acknowledge(
    dead_letter_id: Annotated[str, typer.Argument(help="The dead letter to resolve.")],
    note: Annotated[str, typer.Option(help="Why it is acknowledged (kept with it).")],
    storage: StorageOption = None,
    scope: ScopeOption = DEFAULT_SCOPE,
    address: AddressOption = None,
    ray_namespace: RayNamespaceOption = DEFAULT_NAMESPACE,
    as_json: JsonOption = False,
) -> None:
    """Resolve a dead letter without a retry; the schedule carries on."""
    _act(storage, scope, address, ray_namespace, lambda s: s.acknowledge(dead_letter_id, note))
    if as_json:
        return typer.echo(json.dumps({"dead_letter": dead_letter_id, "acknowledged": True}))
    console.print(f"dead letter {dead_letter_id} acknowledged", highlight=False, soft_wrap=True)


@app.command("requeue-all")
def requeue_all(
    manifest: Annotated[
        str | None, typer.Argument(help="Only this manifest's (default: the whole scope's).")
    ] = None,
    ask_afresh: Annotated[
        bool, typer.Option(help="Ask their deciders afresh rather than replay the failed runs.")
    ] = False,
    storage: StorageOption = None,
    scope: ScopeOption = DEFAULT_SCOPE,
    address: AddressOption = None,
    ray_namespace: RayNamespaceOption = DEFAULT_NAMESPACE,
    as_json: JsonOption = False,
) -> None:
    """Retry every dead letter awaiting intervention at once, oldest first."""
    run_ids = _act(storage, scope, address, ray_namespace,
                   lambda s: s.requeue_all(manifest, ask_afresh))  # fmt: skip
    if as_json:
        return typer.echo(json.dumps({"run_ids": run_ids}))
    console.print(f"{len(run_ids)} dead letter(s) requeued", highlight=False, soft_wrap=True)


@app.command("acknowledge-all")
def acknowledge_all(
    note: Annotated[str, typer.Option(help="Why they are acknowledged (kept with each).")],
    manifest: Annotated[
        str | None, typer.Argument(help="Only this manifest's (default: the whole scope's).")
    ] = None,
    storage: StorageOption = None,
    scope: ScopeOption = DEFAULT_SCOPE,
    address: AddressOption = None,
    ray_namespace: RayNamespaceOption = DEFAULT_NAMESPACE,
    as_json: JsonOption = False,
) -> None:
    """Resolve every dead letter awaiting intervention without a retry."""
    count = _act(storage, scope, address, ray_namespace,
                 lambda s: s.acknowledge_all(manifest, note=note))  # fmt: skip
    if as_json:
        return typer.echo(json.dumps({"acknowledged": count}))
    console.print(f"{count} dead letter(s) acknowledged", highlight=False, soft_wrap=True)


def register(root: typer.Typer) -> None:
    root.add_typer(app)

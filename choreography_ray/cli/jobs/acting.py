"""`jobs stop|resume|remove|retry-failed [JOB_ID]` and `jobs rehydrate`: through the jobs manager.

These change jobs, so they go through the jobs manager that runs for the job's (scope,
namespace) in the cluster at `--address` (or `$RAY_ADDRESS`), as the Python client does; they
never create a manager (`_cluster.py` says why) and refuse one on another storage.

Which jobs: one `JOB_ID` (its scope and namespace are read from storage unless both are given),
or every job `--status`, `--type` and `--older-than` select (narrowed by `--scope`,
`--namespace`), read from storage by `choreography_ray.bulk.select_jobs`, the selection of the
Python API's `jobs.act_on_jobs` and the dashboard's bulk form. `--dry-run` lists them and
touches nothing (no Ray). A bulk form asks before it acts when stdin is a terminal; elsewhere
it needs `--yes`. `retry-failed --signature/--step` narrow the steps retried in each job.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Annotated, Any

import typer

from choreography_ray.bulk import JobSelection, select_jobs
from choreography_ray.cli._cluster import (
    NoManagerError,
    joined,
    required_address,
    running_manager,
)
from choreography_ray.cli._command import describe
from choreography_ray.cli._common import (
    ExitCode,
    console,
    fail,
    log,
    open_stored,
    print_json,
    resolve_storage,
)
from choreography_ray.cli._options import (
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
from choreography_ray.cli._render import jobs_table
from choreography_ray.client import AsyncJobsManager
from choreography_ray.errors import ChoreographyError
from choreography_ray.logs import ids
from choreography_ray.model import JobsManagerKey, JobState, utcnow
from choreography_ray.runtime.names import DEFAULT_NAMESPACE
from choreography_ray.status import JobStatus

ClusterAddressOption = Annotated[
    str | None,
    typer.Option(
        "--address",
        help="The Ray cluster the jobs manager runs in (host:port, ray://host:port, auto).",
        show_default="$RAY_ADDRESS; one of them is needed (not for --dry-run)",
    ),
]
JobIdOption = Annotated[
    str | None,
    typer.Argument(
        metavar="JOB_ID",
        help="The job; leave it out to select jobs with --status/--type/--older-than.",
        show_default=False,
    ),
]  # fmt: skip
JobScopeOption = Annotated[
    str | None,
    typer.Option(
        "--scope",
        help="The job's scope (read from storage unless given); with filters, only this scope.",
        show_default=False,
    ),
]
JobNamespaceOption = Annotated[
    str | None,
    typer.Option(
        "--namespace",
        help="The job's namespace (read from storage unless given); with filters, only this "
        "namespace.",
        show_default=False,
    ),
]
DryRunOption = Annotated[
    bool, typer.Option("--dry-run", help="List the jobs it would touch, and touch none.")
]
OlderThanOption = Annotated[
    str | None,
    typer.Option(
        "--older-than",
        metavar="DURATION",
        help="Only jobs that reached their status at least this long ago (30m, 2h, 7d) or "
        "before this ISO date.",
        show_default=False,
    ),
]
SignatureOption = Annotated[
    str | None,
    typer.Option(
        "--signature",
        metavar="S",
        help="Only the failed steps of this failure signature (`jobs failures` lists them).",
        show_default="every failed step",
    ),
]
StepOption = Annotated[
    list[str] | None,
    typer.Option(
        "--step",
        metavar="STEP_ID",
        help="Only this failed step; repeatable.",
        show_default="every failed step",
    ),
]
YesOption = Annotated[
    bool, typer.Option("--yes", "-y", help="Act on the selected jobs without asking.")
]


@dataclass(frozen=True)
class Operation:
    """One acting command: the client method it calls and what it says when done."""

    command: str
    method: str
    verb: str
    done: Callable[[str, Any], str]
    help: str


OPERATIONS = (
    Operation("stop", "stop", "stop",
              lambda job, _: f"job {job}: stop requested; its running steps are told to stop "
                             f"(`jobs watch {job}` shows when the stop is final)",
              "Stop a job: its running steps are told to stop, the others never start."),
    Operation("resume", "resume", "resume", lambda job, _: f"job {job}: resumed",
              "Resume a stopped or interrupted job: its unfinished steps run again."),
    Operation("remove", "remove", "remove", lambda job, _: f"job {job}: removed",
              "Remove a job: stop it if it runs, then delete its records."),
    Operation("retry-failed", "retry_failed_steps", "retry the failed steps of",
              lambda job, n: f"job {job}: {n} failed step(s) started again",
              "Run a job's failed steps again (a job COMPLETED_WITH_FAILURES whose type allows "
              "it: can_retry_failed_steps)."),
)  # fmt: skip


#: The statuses a resume does nothing to (the manager says so by returning nothing).
COMPLETED = frozenset({JobStatus.COMPLETED_SUCCESSFULLY, JobStatus.COMPLETED_WITH_FAILURES})


@dataclass(frozen=True)
class Target:
    job_id: str
    scope: str
    namespace: str
    #: The stored job, when it was read.
    state: JobState | None = None


@dataclass
class Result:
    target: Target
    code: ExitCode
    message: str
    value: Any = None

    def data(self, operation: str) -> dict[str, Any]:
        data = {"job_id": self.target.job_id, "scope": self.target.scope,
                "namespace": self.target.namespace, "operation": operation,
                "done": self.code is ExitCode.OK, "message": self.message}  # fmt: skip
        if isinstance(self.value, int) and not isinstance(self.value, bool):
            data["retried_steps"] = self.value
        return data


def parse_older_than(text: str) -> timedelta:
    """`--older-than`: a duration (`90s`, `30m`, `2h`, `7d`, `1w`), or an ISO date or time as
    `--since` reads it, made the age of a job that reached its status then."""
    now = utcnow()
    try:
        age = now - parse_since(text, now)
    except typer.BadParameter as error:
        raise typer.BadParameter(error.message, param_hint="--older-than") from None
    if age < timedelta(0):
        raise typer.BadParameter(f"{text!r} is in the future", param_hint="--older-than")
    return age


def select(
    job_id: str | None,
    storage: str | None,
    scope: str | None,
    namespace: str | None,
    status: list[str] | None,
    job_type: str | None,
    command: str,
    older_than: str | None = None,
) -> tuple[list[Target], bool]:
    """The jobs to act on, and whether they were selected in bulk (by filters)."""
    if job_id is not None and (status or job_type or older_than):
        raise typer.BadParameter("give a JOB_ID or --status/--type/--older-than, not both")
    if job_id is None and not status and not job_type and not older_than:
        raise typer.BadParameter(
            f"give a JOB_ID, or --status, --type and/or --older-than to {command} the jobs "
            "they select (--dry-run lists them)"
        )
    if job_id is not None and scope is not None and namespace is not None:
        return [Target(job_id, scope, namespace)], False
    if resolve_storage(storage).lower().startswith("memory:"):
        fail("memory:// storage cannot be read from outside the cluster: give the JOB_ID "
             "with --scope and --namespace")  # fmt: skip
    selection = JobSelection(
        scope=scope,
        namespace=namespace,
        types=None if job_type is None else {job_type},
        statuses={parse_status(s) for s in status} if status else None,
        older_than=None if older_than is None else parse_older_than(older_than),
    )
    store = open_stored(storage, f"jobs {command}")

    async def read() -> list[JobState]:
        try:
            if job_id is not None:
                state = await store.get_job(job_id)
                return [] if state is None else [state]
            return await select_jobs(store, selection)
        finally:
            await store.close()

    states = asyncio.run(read())
    if job_id is not None and not states:
        fail(f"no job {job_id} in {store.url}")
    return [Target(s.id, s.scope, s.namespace, s) for s in states], job_id is None


def confirm(operation: Operation, targets: Sequence[Target], yes: bool) -> None:
    """Asks before a bulk operation (stdin a terminal), or insists on `--yes`."""
    if yes:
        return
    if not sys.stdin.isatty():
        fail(f"{operation.command} of {len(targets)} job(s) needs --yes when stdin is not a "
             "terminal (--dry-run lists them)")  # fmt: skip
    typer.confirm(f"{operation.verb.capitalize()} {len(targets)} job(s)?", abort=True)


class Managers:
    """The running managers of the keys met so far (or why there is none)."""

    def __init__(self, storage_url: str, ray_namespace: str) -> None:
        self.storage_url = storage_url
        self.ray_namespace = ray_namespace
        self._found: dict[tuple[str, str], AsyncJobsManager | NoManagerError] = {}

    async def get(self, scope: str, namespace: str) -> AsyncJobsManager:
        key = (scope, namespace)
        if key not in self._found:
            try:
                self._found[key] = await running_manager(
                    scope, namespace, self.ray_namespace, self.storage_url
                )
            except NoManagerError as error:
                self._found[key] = error
        found = self._found[key]
        if isinstance(found, NoManagerError):
            raise found
        return found


async def carry_out(
    operation: Operation, targets: Sequence[Target], managers: Managers, **extra: Any
) -> list[Result]:
    """`operation` on each target, with `extra` (retry-failed's signature and step ids)."""
    results: list[Result] = []
    for target in targets:
        try:
            manager = await managers.get(target.scope, target.namespace)
            value = await getattr(manager, operation.method)(target.job_id, **extra)
        except NoManagerError as error:
            results.append(Result(target, ExitCode.REFUSED, str(error)))
        except ChoreographyError as error:
            message, code = describe(error)
            results.append(Result(target, code, f"job {target.job_id}: {message}"))
        else:
            log.info("%s: done", operation.command, extra=ids(target.job_id))
            message = operation.done(target.job_id, value)
            state = target.state
            if operation.command == "resume" and state and state.status in COMPLETED:
                # The manager answers a resume of a completed job by doing nothing.
                message = f"job {state.id}: nothing to resume, it is {state.status.name}"
            results.append(Result(target, ExitCode.OK, message, value))
    return results


def overall(codes: Sequence[ExitCode]) -> ExitCode:
    """A bulk form's exit code: 0 when every job was done, else 4 when a manager could not
    be reached, else 1."""
    if all(code is ExitCode.OK for code in codes):
        return ExitCode.OK
    return ExitCode.UNAVAILABLE if ExitCode.UNAVAILABLE in codes else ExitCode.REFUSED


def operate(
    operation: Operation,
    job_id: str | None,
    *,
    storage: str | None,
    scope: str | None,
    namespace: str | None,
    status: list[str] | None,
    job_type: str | None,
    dry_run: bool,
    yes: bool,
    address: str | None,
    ray_namespace: str,
    as_json: bool,
    older_than: str | None = None,
    **extra: Any,
) -> None:
    targets, bulk = select(job_id, storage, scope, namespace, status, job_type,
                           operation.command, older_than)  # fmt: skip
    if dry_run:
        return print_selection(operation, targets, as_json)
    if bulk and not targets:
        if as_json:
            return print_json([])
        console.print(f"No jobs to {operation.verb}", highlight=False)
        return None
    if bulk:
        confirm(operation, targets, yes)
    address = required_address(address, f"jobs {operation.command} acts through the jobs manager")
    managers = Managers(resolve_storage(storage), ray_namespace)
    with joined(address, ray_namespace):
        results = asyncio.run(carry_out(operation, targets, managers, **extra))
    if not bulk:
        (result,) = results
        if as_json:
            print_json(result.data(operation.command))
        if result.code is not ExitCode.OK:
            fail(result.message, result.code)
        if not as_json:
            console.print(result.message, highlight=False, soft_wrap=True)
        return None
    if as_json:
        print_json([r.data(operation.command) for r in results])
    else:
        for r in results:
            console.print(("" if r.code is ExitCode.OK else "refused: ") + r.message,
                          highlight=False, soft_wrap=True)  # fmt: skip
        done = sum(r.code is ExitCode.OK for r in results)
        console.print(f"{done} of {len(results)} job(s) done", highlight=False)
    raise typer.Exit(overall([r.code for r in results]))


def print_selection(operation: Operation, targets: Sequence[Target], as_json: bool) -> None:
    if as_json:
        print_json([{"job_id": t.job_id, "scope": t.scope, "namespace": t.namespace,
                     "status": None if t.state is None else t.state.status.value,
                     "type": None if t.state is None else t.state.type}
                    for t in targets])  # fmt: skip
        return
    states = [t.state for t in targets if t.state is not None]
    if len(states) == len(targets) and states:
        table = jobs_table(states)
        table.title = f"Would {operation.verb} {len(states)} job(s) (dry run: nothing was done)"
        console.print(table)
        return
    for t in targets:
        console.print(f"would {operation.verb} job {t.job_id} in {t.scope}/{t.namespace}",
                      highlight=False, soft_wrap=True)  # fmt: skip
    if not targets:
        console.print(f"No jobs to {operation.verb} (dry run)", highlight=False)


def make_command(operation: Operation) -> Callable[..., None]:
    def command(
        job_id: JobIdOption = None,
        status: StatusFilter = None,
        job_type: TypeFilter = None,
        scope: JobScopeOption = None,
        namespace: JobNamespaceOption = None,
        older_than: OlderThanOption = None,
        dry_run: DryRunOption = False,
        yes: YesOption = False,
        storage: StorageOption = None,
        address: ClusterAddressOption = None,
        ray_namespace: RayNamespaceOption = DEFAULT_NAMESPACE,
        as_json: JsonOption = False,
    ) -> None:
        operate(operation, job_id, storage=storage, scope=scope, namespace=namespace,
                status=status, job_type=job_type, dry_run=dry_run, yes=yes, address=address,
                ray_namespace=ray_namespace, as_json=as_json, older_than=older_than)  # fmt: skip

    def retry_command(
        job_id: JobIdOption = None,
        status: StatusFilter = None,
        job_type: TypeFilter = None,
        scope: JobScopeOption = None,
        namespace: JobNamespaceOption = None,
        older_than: OlderThanOption = None,
        signature: SignatureOption = None,
        step: StepOption = None,
        dry_run: DryRunOption = False,
        yes: YesOption = False,
        storage: StorageOption = None,
        address: ClusterAddressOption = None,
        ray_namespace: RayNamespaceOption = DEFAULT_NAMESPACE,
        as_json: JsonOption = False,
    ) -> None:
        operate(operation, job_id, storage=storage, scope=scope, namespace=namespace,
                status=status, job_type=job_type, dry_run=dry_run, yes=yes, address=address,
                ray_namespace=ray_namespace, as_json=as_json, older_than=older_than,
                signature=signature, step_ids=step or None)  # fmt: skip

    made = retry_command if operation.method == "retry_failed_steps" else command
    made.__name__ = operation.method
    made.__doc__ = (
        f"{operation.help}\n\nExit codes: 0 done; 1 refused (the error code says why) or no "
        "jobs manager runs; 2 no such job, no --address, another storage; 4 the cluster or "
        "the storage cannot be reached."
    )
    return made


def rehydrate(
    scope: ScopeFilter = None,
    namespace: NamespaceFilter = None,
    storage: StorageOption = None,
    address: ClusterAddressOption = None,
    ray_namespace: RayNamespaceOption = DEFAULT_NAMESPACE,
    as_json: JsonOption = False,
) -> None:
    """Have the running jobs managers load their interrupted jobs again.

    The jobs resume in the background. Every manager in the storage's key catalog, or those
    --scope and --namespace select (both given, the catalog is not read)."""
    url = resolve_storage(storage)
    if scope is not None and namespace is not None:
        keys = [JobsManagerKey(scope=scope, namespace=namespace)]
    else:
        if url.lower().startswith("memory:"):
            fail("memory:// storage cannot be read from outside the cluster: give --scope "
                 "and --namespace")  # fmt: skip
        store = open_stored(storage, "jobs rehydrate")

        async def read() -> list[JobsManagerKey]:
            try:
                return await store.list_manager_keys()
            finally:
                await store.close()

        keys = [k for k in asyncio.run(read())
                if scope in (None, k.scope) and namespace in (None, k.namespace)]  # fmt: skip
    if not keys:
        fail(f"no jobs manager in {url} matches", ExitCode.BAD_INPUT)
    address = required_address(address, "jobs rehydrate acts through the jobs managers")
    managers = Managers(url, ray_namespace)

    async def each() -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        for key in keys:
            entry: dict[str, Any] = {"scope": key.scope, "namespace": key.namespace}
            try:
                entry["job_ids"] = await (await managers.get(key.scope, key.namespace)).rehydrate()
            except NoManagerError as error:
                entry["error"], entry["code"] = str(error), ExitCode.REFUSED
            except ChoreographyError as error:
                entry["error"], entry["code"] = describe(error)
            out.append(entry)
        return out

    with joined(address, ray_namespace):
        results = asyncio.run(each())
    if as_json:
        print_json([{k: v for k, v in r.items() if k != "code"} for r in results])
    else:
        for r in results:
            name = f"{r['scope']}/{r['namespace']}"
            if "error" in r:
                console.print(f"{name}: not rehydrated: {r['error']}", highlight=False,
                              soft_wrap=True)  # fmt: skip
            elif r["job_ids"]:
                listed = ", ".join(r["job_ids"])
                console.print(f"{name}: {len(r['job_ids'])} job(s) rehydrated: {listed}",
                              highlight=False, soft_wrap=True)  # fmt: skip
            else:
                console.print(f"{name}: no interrupted job", highlight=False)
    raise typer.Exit(overall([r.get("code", ExitCode.OK) for r in results]))


def register(app: typer.Typer) -> None:
    for operation in OPERATIONS:
        app.command(operation.command)(make_command(operation))
    app.command("rehydrate")(rehydrate)

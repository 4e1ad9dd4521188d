"""`choreography-ray run MODULE:CLASS --request request.json`: start a job, wait, print its state.

Made for batch pipelines on a cluster:

    ray job submit -- choreography-ray run pkg.module:MyJob --request request.json

Everything that can be checked before Ray starts is checked first (the job type imports and is a
`Job`, the request file reads, parses and validates, the storage URL is known), so that bad input
costs no cluster connection and stores nothing. The job's final state is printed on stdout as
JSON; messages go to stderr.

Ctrl-C while it waits asks whether to stop the job or detach from it (`--on-interrupt`); with
stdin not a terminal, `ask` stops it.
"""

from __future__ import annotations

import enum
import json
import os
import sys
from pathlib import Path
from typing import Annotated, Any

import ray
import typer
from pydantic import BaseModel, ValidationError
from rich.prompt import Prompt

import choreography_ray as cr
from choreography_ray.cli._cluster import init_ray
from choreography_ray.cli._common import (
    ExitCode,
    check_storage,
    err_console,
    exit_code_for,
    fail,
    note,
    resolve_storage,
    state_json,
)
from choreography_ray.cli._options import AddressOption, StorageOption
from choreography_ray.client import JobsManager
from choreography_ray.errors import (
    ChoreographyError,
    JobOperationError,
    JobTimeoutError,
    StartJobError,
    TypeImportError,
)
from choreography_ray.job import Job
from choreography_ray.runtime.names import DEFAULT_NAMESPACE
from choreography_ray.types import import_type

#: The jobs manager a job starts under unless `--scope` / `--namespace` say otherwise.
DEFAULT_SCOPE = "default"
DEFAULT_JOB_NAMESPACE = "default"
#: How long an interrupted `run` waits for the stop it asked for to be final, in seconds.
STOP_WAIT_SECONDS = 60.0


class OnInterrupt(enum.StrEnum):
    """What Ctrl-C (SIGINT) while `run` waits does to the job."""

    #: Ask on the terminal (stop is the default answer); stop when stdin is not a terminal.
    ASK = "ask"
    #: Stop the job, wait for the stop to be final, print its state.
    STOP = "stop"
    #: Leave the job running and exit (as `--no-wait` would have).
    DETACH = "detach"


def choose(policy: OnInterrupt, job_id: str) -> OnInterrupt:
    """`policy`, or the user's answer to `ask`; Ctrl-C (or end of input) at the question
    detaches."""
    if policy is not OnInterrupt.ASK:
        return policy
    if not sys.stdin.isatty():
        return OnInterrupt.STOP
    try:
        answer = Prompt.ask(
            f"\nInterrupted: stop job {job_id}, or detach and leave it running?",
            choices=[OnInterrupt.STOP.value, OnInterrupt.DETACH.value],
            default=OnInterrupt.STOP.value,
            console=err_console,
        )
    except (KeyboardInterrupt, EOFError):
        return OnInterrupt.DETACH
    return OnInterrupt(answer)


def interrupted(
    manager: JobsManager,
    job_id: str,
    policy: OnInterrupt,
    started: dict[str, str],
    address: str | None,
) -> None:
    """Ctrl-C while waiting: stops the job (and prints its state) or detaches (and prints
    what `--no-wait` prints); exits 130 either way."""
    if choose(policy, job_id) is OnInterrupt.DETACH:
        typer.echo(json.dumps(started, indent=2))
        note(f"detached: job {job_id} runs on (choreography-ray jobs watch {job_id} "
             f"--storage {started['storage']})")  # fmt: skip
        if (address or os.environ.get("RAY_ADDRESS") or "local") == "local":
            note("if this command started its own local Ray, the job is interrupted when it "
                 "exits, until a jobs manager on this storage rehydrates it")  # fmt: skip
        raise typer.Exit(ExitCode.INTERRUPTED)
    note(f"stopping job {job_id} ...")
    try:
        manager.stop(job_id)
    except JobOperationError as error:
        note(f"job {job_id} was not stopped: {error}")
    try:
        state = manager.wait(job_id, timeout=STOP_WAIT_SECONDS)
    except JobTimeoutError:
        state = manager.get(job_id)
        note(f"the stop of job {job_id} is not final after {STOP_WAIT_SECONDS:g} s")
    except KeyboardInterrupt:
        note(f"leaving; the stop of job {job_id} goes on")
        raise typer.Exit(ExitCode.INTERRUPTED) from None
    typer.echo(state_json(state))
    raise typer.Exit(ExitCode.INTERRUPTED)


def load_job_type(path: str) -> type[Job[Any]]:
    """The `Job` subclass `path` names; exits 2 with a clear message when there is none."""
    try:
        cls = import_type(path)
    except TypeImportError as error:
        fail(f"unknown job type: {error}")
    if not issubclass(cls, Job):
        fail(f"{path!r} is a class but not a choreography_ray.Job")
    return cls


def read_request(source: str | None) -> Any:
    """The request JSON from a file, from stdin for `-`, or `{}` when no file is given."""
    if source is None:
        return {}
    name = "stdin" if source == "-" else source
    try:
        text = sys.stdin.read() if source == "-" else Path(source).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as error:
        fail(f"cannot read the request {name}: {error}")
    try:
        return json.loads(text)
    except json.JSONDecodeError as error:
        fail(f"the request {name} is not valid JSON: {error}")


def validate_request(job_type: type[Job[Any]], path: str, data: Any) -> BaseModel:
    try:
        return job_type.request_type().model_validate(data)
    except TypeError as error:  # the Job subclass names no request model
        fail(f"{path!r}: {error}")
    except ValidationError as error:
        fail(f"invalid request for {path}: {error}")


def run(
    job_type: Annotated[
        str, typer.Argument(metavar="MODULE:CLASS", help="The job type's import path.")
    ],
    request: Annotated[
        str | None,
        typer.Option(
            "--request",
            "-r",
            metavar="FILE",
            help="The request as a JSON file, or - for stdin.",
            show_default="{}",
        ),
    ] = None,
    storage: StorageOption = None,
    scope: Annotated[str, typer.Option(help="The jobs manager's scope.")] = DEFAULT_SCOPE,
    namespace: Annotated[
        str, typer.Option(help="The jobs manager's namespace.")
    ] = DEFAULT_JOB_NAMESPACE,
    address: AddressOption = None,
    ray_namespace: Annotated[
        str, typer.Option(help="The Ray namespace of the job system's actors.")
    ] = DEFAULT_NAMESPACE,
    wait: Annotated[
        bool, typer.Option(help="Wait for the job to end and print its state as JSON.")
    ] = True,
    timeout: Annotated[
        float | None,
        typer.Option(
            min=0, help="Give up waiting after this many seconds (exit 3).", show_default=False
        ),
    ] = None,
    on_interrupt: Annotated[
        OnInterrupt,
        typer.Option(
            case_sensitive=False,
            help="Ctrl-C while waiting: ask, stop the job, or detach from it (ask stops it "
            "when stdin is not a terminal).",
        ),
    ] = OnInterrupt.ASK,
    priority: Annotated[
        int | None,
        typer.Option(
            min=1,
            max=5,
            help="Where steps wait for capacity, 1 goes first ... 5.",
            show_default="the job type's",
        ),
    ] = None,
) -> None:
    """Start a job from a request file; wait for it and print its final state as JSON.

    Exit codes:
    0 the job completed successfully;
    1 it completed with failures, failed, was stopped, or could not be started;
    2 bad input: nothing was started or stored;
    3 --timeout passed first;
    4 the Ray cluster or the storage cannot be reached;
    130 interrupted (the job stopped, or left running with --on-interrupt detach).
    """
    cls = load_job_type(job_type)
    validated = validate_request(cls, job_type, read_request(request))
    url = resolve_storage(storage)
    check_storage(url)

    init_ray(address, ray_namespace)
    try:
        _start_and_wait(cls, job_type, validated, priority, url, scope, namespace, address,
                        ray_namespace, wait, timeout, on_interrupt)  # fmt: skip
    finally:
        ray.shutdown()


def _start_and_wait(
    cls: type[Job[Any]],
    job_type: str,
    validated: BaseModel,
    priority: int | None,
    url: str,
    scope: str,
    namespace: str,
    address: str | None,
    ray_namespace: str,
    wait: bool,
    timeout: float | None,
    on_interrupt: OnInterrupt,
) -> None:
    with cr.Jobs.connect(storage=url, address=address, namespace=ray_namespace) as jobs:
        manager = jobs.manager(scope, namespace)
        try:
            started = manager.start(cls, validated, priority)
        except JobOperationError as error:
            code = ExitCode.BAD_INPUT
            if error.error is not StartJobError.INVALID_REQUEST:
                code = ExitCode.JOB_NOT_SUCCESSFUL
            fail(f"the job did not start: {error}", code)
        except ChoreographyError as error:
            fail(f"the job did not start: {error}", ExitCode.JOB_NOT_SUCCESSFUL)
        summary = {"job_id": started.job_id, "scope": scope, "namespace": namespace,
                   "storage": url}  # fmt: skip
        # From the line that says the job started, Ctrl-C stops (or detaches from) that job.
        try:
            err_console.print(
                f"started job {started.job_id} ({job_type}) in {scope}/{namespace}, storage {url}",
                highlight=False, soft_wrap=True,
            )  # fmt: skip
            if started.error is not None:
                err_console.print(
                    f"warning: {started.error.name} when starting the first stage; the job runs "
                    "on", highlight=False, soft_wrap=True,
                )  # fmt: skip
            if not wait:
                typer.echo(json.dumps(summary, indent=2))
                return
            state = manager.wait(started.job_id, timeout=timeout)
        except JobTimeoutError as error:
            typer.echo(state_json(manager.get(started.job_id)))
            fail(str(error), ExitCode.TIMEOUT)
        except KeyboardInterrupt:
            interrupted(manager, started.job_id, on_interrupt, summary, address)

    typer.echo(state_json(state))
    raise typer.Exit(exit_code_for(state.status))


def register(app: typer.Typer) -> None:
    app.command("run")(run)

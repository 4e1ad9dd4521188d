"""`choreography-ray run MODULE:CLASS --request request.json`: start a job, wait, print its state.

Made for batch pipelines on a cluster:

    ray job submit -- choreography-ray run pkg.module:MyJob --request request.json

Everything that can be checked before Ray starts is checked first (the job type imports and is a
`Job`, the request file reads, parses and validates, the storage URL is known), so that bad input
costs no cluster connection and stores nothing. The job's final state is printed on stdout as
JSON; messages go to stderr.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, Any

import typer
from pydantic import BaseModel, ValidationError

import choreography_ray as cr
from choreography_ray.cli._common import (
    AddressOption,
    ExitCode,
    StorageOption,
    check_storage,
    err_console,
    exit_code_for,
    fail,
    resolve_storage,
    state_json,
)
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
) -> None:
    """Start a job from a request file; wait for it and print its final state as JSON.

    Exit codes:
    0 the job completed successfully;
    1 it completed with failures, failed, was stopped, or could not be started;
    2 bad input: nothing was started or stored;
    3 --timeout passed first.
    """
    cls = load_job_type(job_type)
    validated = validate_request(cls, job_type, read_request(request))
    url = resolve_storage(storage)
    check_storage(url)

    with cr.Jobs.connect(storage=url, address=address, namespace=ray_namespace) as jobs:
        manager = jobs.manager(scope, namespace)
        try:
            started = manager.start(cls, validated)
        except JobOperationError as error:
            code = ExitCode.BAD_INPUT
            if error.error is not StartJobError.INVALID_REQUEST:
                code = ExitCode.JOB_NOT_SUCCESSFUL
            fail(f"the job did not start: {error}", code)
        except ChoreographyError as error:
            fail(f"the job did not start: {error}", ExitCode.JOB_NOT_SUCCESSFUL)
        err_console.print(
            f"started job {started.job_id} ({job_type}) in {scope}/{namespace}, storage {url}",
            highlight=False, soft_wrap=True,
        )  # fmt: skip
        if started.error is not None:
            err_console.print(
                f"warning: {started.error.name} when starting the first stage; the job runs on",
                highlight=False, soft_wrap=True,
            )  # fmt: skip
        if not wait:
            typer.echo(
                json.dumps(
                    {
                        "job_id": started.job_id,
                        "scope": scope,
                        "namespace": namespace,
                        "storage": url,
                    },
                    indent=2,
                )
            )
            return
        try:
            state = manager.wait(started.job_id, timeout=timeout)
        except JobTimeoutError as error:
            typer.echo(state_json(manager.get(started.job_id)))
            fail(str(error), ExitCode.TIMEOUT)

    typer.echo(state_json(state))
    raise typer.Exit(exit_code_for(state.status))


def register(app: typer.Typer) -> None:
    app.command("run")(run)

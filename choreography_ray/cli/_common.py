"""What the command groups share: exit codes, consoles, JSON output, reading one stored job,
and the one-line errors (a traceback only with `--debug`: see `_command.py`)."""

from __future__ import annotations

import asyncio
import enum
import json
import sys
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn, TypeVar

import typer
from rich.console import Console
from rich.text import Text

from choreography_ray.client import resolve_storage_url
from choreography_ray.logs import get_logger
from choreography_ray.model import JobState
from choreography_ray.status import JobStatus
from choreography_ray.storage import Storage, open_storage, redact_url

log = get_logger("choreography_ray.cli")

#: The width of human output that goes to a pipe or file, in characters.
PIPED_WIDTH = 160

#: Human output (tables, progress) goes to stdout; diagnostics go to stderr, so that the JSON
#: `run` and `status --json` print on stdout stays parseable.
console = Console()
err_console = Console(stderr=True)
if not console.is_terminal:
    # Piped or captured: no terminal to fit, so tables are not squeezed to 80 columns.
    console.width = max(console.width, PIPED_WIDTH)


class ExitCode(enum.IntEnum):
    """The exit codes of every command (docs/cli.md lists them)."""

    #: The job completed successfully (`run`), or the command did what it was asked.
    OK = 0
    #: The job ended COMPLETED_WITH_FAILURES, FAILED or STOPPED, or could not be started; or
    #: the operation was refused (the jobs manager's error code says why); or an unexpected
    #: error.
    JOB_NOT_SUCCESSFUL = 1
    REFUSED = 1
    #: Bad input: unreadable or invalid request, unknown job type, bad storage URL, no such
    #: job or storage file, no `--address`. (click's usage errors exit 2 as well.)
    BAD_INPUT = 2
    #: `--timeout` passed before the job reached a terminal or stopped status.
    TIMEOUT = 3
    #: Unavailable: the storage, the Ray cluster or the jobs manager cannot be reached; the
    #: same command may work later.
    UNAVAILABLE = 4
    #: Interrupted (Ctrl-C), as a shell reports SIGINT.
    INTERRUPTED = 130


@dataclass
class GlobalFlags:
    """`--debug`, `-v`/`-vv` and `--log-json`, as the root or the command was given them."""

    debug: bool = False
    verbosity: int = 0
    log_json: bool = False


#: This process's global flags (one command per process).
flags = GlobalFlags()


def resolve_storage(url: str | None) -> str:
    """The storage URL the actors get (see `resolve_storage_url`)."""
    return resolve_storage_url(url)


def check_storage(url: str) -> None:
    """Exits 2 when `url` names no storage provider. Nothing is opened or created: providers
    connect on first use."""
    try:
        storage = open_storage(url)
    except ValueError as error:
        fail(str(error))
    asyncio.run(storage.close())


def open_stored(url: str | None, commands: str) -> Storage:
    """The storage that read-only `commands` read directly, without Ray, opened read-only: it
    creates nothing (no SQLite file, table or column, no MongoDB index). Exits 2 for
    `memory://` (it lives inside a running cluster), a URL that names no provider and an
    SQLite file that does not exist."""
    resolved = resolve_storage(url)
    if resolved.lower().startswith("memory:"):
        fail(f"memory:// storage lives inside a running Ray cluster; {commands} read "
             "sqlite:// or mongodb:// storage")  # fmt: skip
    try:
        storage = open_storage(resolved, read_only=True)
    except ValueError as error:
        fail(str(error))
    path = getattr(storage, "path", None)
    if isinstance(path, Path) and not path.is_file():
        fail(f"no SQLite database at {path} (nothing is stored there yet; nothing was "
             "created): check --storage or $CHOREOGRAPHY_STORAGE")  # fmt: skip
    log.debug("reading %s (read-only)", redact_url(resolved))
    return storage


E = TypeVar("E", bound=enum.Enum)


def parse_member(kind: type[E], text: str, what: str) -> E:
    """A member of `kind` by name or stored value, in any case, with or without underscores or
    dashes: RUNNING, Running, running; a usage error naming the choices otherwise."""
    key = text.replace("_", "").replace("-", "").lower()
    for member in kind:
        if key in (member.name.replace("_", "").lower(), str(member.value).lower()):
            return member
    raise typer.BadParameter(
        f"{text!r} is not a {what}; use one of {', '.join(m.name for m in kind)}",
        param_hint="--status",
    )


def fail(message: str, code: ExitCode = ExitCode.BAD_INPUT) -> NoReturn:
    """Prints `message` on stderr as one line (one JSON record with `--log-json`) and exits
    with `code`. With `--debug`, the traceback of the error being handled comes first."""
    error = sys.exc_info()[1]
    if flags.debug and error is not None and not isinstance(error, typer.Exit):
        traceback.print_exception(error, file=sys.stderr)
    if flags.log_json:
        log.error("%s", message)
    else:
        err_console.print(Text.assemble(("error: ", "bold red"), message), soft_wrap=True)
    raise typer.Exit(code)


def note(message: str) -> None:
    """A diagnostic line on stderr (a log record with `--log-json`, so stderr stays JSON)."""
    if flags.log_json:
        log.warning("%s", message)
    else:
        err_console.print(message, highlight=False, soft_wrap=True)


def state_data(state: JobState) -> dict[str, Any]:
    """A job state as the JSON commands print it. The counted-step lists are left out: they
    hold one id per step of a resumed job, up to hundreds of thousands."""
    data: dict[str, Any] = state.model_dump(
        mode="json", exclude={"completed_steps_counted", "stopped_steps_counted"}
    )
    return data


def state_json(state: JobState) -> str:
    """A job state as the JSON `run` and `jobs show --json` print."""
    return json.dumps(state_data(state), indent=2)


def print_json(data: Any) -> None:
    typer.echo(json.dumps(data, indent=2))


def exit_code_for(status: JobStatus) -> ExitCode:
    return (
        ExitCode.OK if status is JobStatus.COMPLETED_SUCCESSFULLY else ExitCode.JOB_NOT_SUCCESSFUL
    )


async def read_job(
    store: Storage, job_id: str, scope: str | None, namespace: str | None
) -> JobState | None:
    """The stored job, or None when there is none in `scope`/`namespace` (when given)."""
    state = await store.get_job(job_id)
    if (
        state is None
        or scope not in (None, state.scope)
        or namespace not in (None, state.namespace)
    ):
        return None
    return state


def where(store: Storage, scope: str | None, namespace: str | None) -> str:
    """The storage (and the scope/namespace asked for) a job was looked for in."""
    asked = "/".join(filter(None, (scope, namespace)))
    return f"{store.url}" + (f" ({asked})" if asked else "")

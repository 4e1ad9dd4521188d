"""What the command groups share: exit codes, the storage option, consoles, JSON output."""

from __future__ import annotations

import asyncio
import enum
import json
from typing import Annotated, Any, NoReturn, TypeVar

import typer
from rich.console import Console
from rich.text import Text

from choreography_ray.client import resolve_storage_url
from choreography_ray.model import JobState
from choreography_ray.status import JobStatus
from choreography_ray.storage import Storage, open_storage

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
    #: The job ended COMPLETED_WITH_FAILURES, FAILED or STOPPED, or could not be started.
    JOB_NOT_SUCCESSFUL = 1
    #: Bad input: unreadable or invalid request, unknown job type, bad storage URL, no such job.
    #: (click's usage errors exit 2 as well.)
    BAD_INPUT = 2
    #: `--timeout` passed before the job reached a terminal or stopped status.
    TIMEOUT = 3
    #: Interrupted (Ctrl-C), as a shell reports SIGINT.
    INTERRUPTED = 130


StorageOption = Annotated[
    str | None,
    typer.Option(
        "--storage",
        help="Storage URL: sqlite:///path.db, mongodb://host/db or memory://.",
        show_default="$CHOREOGRAPHY_STORAGE, else ~/.local/share/choreography-ray/jobs.db",
    ),
]


AddressOption = Annotated[
    str | None,
    typer.Option(
        "--address",
        help="The Ray cluster to join, as ray.init takes it ('local' starts a new one).",
        show_default="$RAY_ADDRESS (ray job submit sets it), else a running local cluster, "
        "else a new local Ray",
    ),
]


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
    """The storage that read-only `commands` read directly, without Ray; exits 2 for
    `memory://` (it lives inside a running cluster) and a URL that names no provider."""
    resolved = resolve_storage(url)
    if resolved.lower().startswith("memory:"):
        fail(f"memory:// storage lives inside a running Ray cluster; {commands} read "
             "sqlite:// or mongodb:// storage")  # fmt: skip
    try:
        return open_storage(resolved)
    except ValueError as error:
        fail(str(error))


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
    """Prints `message` on stderr and exits with `code`."""
    err_console.print(Text.assemble(("error: ", "bold red"), message), soft_wrap=True)
    raise typer.Exit(code)


def state_json(state: JobState) -> str:
    """A job state as the JSON `run` and `status --json` print. The counted-step lists are left
    out: they hold one id per step of a resumed job, up to hundreds of thousands."""
    data: dict[str, Any] = state.model_dump(
        mode="json", exclude={"completed_steps_counted", "stopped_steps_counted"}
    )
    return json.dumps(data, indent=2)


def exit_code_for(status: JobStatus) -> ExitCode:
    return (
        ExitCode.OK if status is JobStatus.COMPLETED_SUCCESSFULLY else ExitCode.JOB_NOT_SUCCESSFUL
    )

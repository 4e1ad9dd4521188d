"""The `choreography-ray` command line: one typer app, one module per command group.

A command group lives in its own module here (`demo.py`, `run.py`, `bench.py`, ...) and exposes
`register(app)`, which adds its commands to the app: top-level commands with `app.command()`, or
a sub-app with `app.add_typer(...)`. Adding a group is two lines in this file: import the module
and list it in `_COMMAND_GROUPS`. Modules never import `app` from here, so no import is circular
and `choreography-ray --help` imports only the groups it lists.
"""

from __future__ import annotations

from typing import Annotated, Protocol

import typer

from choreography_ray import __version__
from choreography_ray.cli import (
    bench,
    chaos,
    dashboard,
    demo,
    jobs,
    limits,
    pools,
    run,
    scheduler,
)
from choreography_ray.cli._command import (
    DebugOption,
    LogJsonOption,
    VerboseOption,
    apply_flags,
    install,
    reset_flags,
)

#: The name the console script is installed under (see `[project.scripts]`).
PROG_NAME = "choreography-ray"


class CommandGroup(Protocol):
    """A module of commands: `register` adds them to the app."""

    def register(self, app: typer.Typer) -> None: ...


app = typer.Typer(
    name=PROG_NAME,
    help="A durable job system for large fan-out on Ray.",
    no_args_is_help=True,
    add_completion=False,
    # A traceback is for --debug (cli/_command.py); locals could show a storage password.
    pretty_exceptions_show_locals=False,
)


def _print_version(value: bool) -> None:
    if value:
        typer.echo(f"{PROG_NAME} {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    ctx: typer.Context,
    version: Annotated[
        bool,
        typer.Option(
            "--version",
            help="Print the version and exit.",
            callback=_print_version,
            is_eager=True,
        ),
    ] = False,
    debug: DebugOption = False,
    verbose: VerboseOption = 0,
    log_json: LogJsonOption = False,
) -> None:
    """A durable job system for large fan-out on Ray."""
    apply_flags(debug, verbose, log_json)
    ctx.call_on_close(reset_flags)


# Command groups, in the order `--help` lists them. Each is a module of this package with
# `register(app)`; e.g. `from choreography_ray.cli import demo` above and `demo,` here.
_COMMAND_GROUPS: tuple[CommandGroup, ...] = (
    demo,
    run,
    jobs,
    pools,
    limits,
    scheduler,
    dashboard,
    bench,
    chaos,
)

for _group in _COMMAND_GROUPS:
    _group.register(app)
# Every command takes the global options and reports errors as one line (cli/_command.py).
install(app)


def main() -> None:
    """The console script `choreography-ray`."""
    app(prog_name=PROG_NAME)


__all__ = ["CommandGroup", "app", "main"]

"""What every command gets without declaring it: the global options and one-line errors.

`install(app)` wraps the callback of every command of the app and its sub-apps (after the
groups registered them), so each command takes `--debug`, `-v`/`--verbose` and `--log-json`
after its own options (the root takes them too, before the command) and no error reaches the
user as a traceback:

- a `ChoreographyError` (or Ray's `ConnectionError`) becomes one line on stderr and the exit
  code of its kind (`describe`): bad input 2, refused 1, unavailable 4;
- anything else becomes "unexpected ..." and exit 1;
- Ctrl-C that the command does not handle itself exits 130.

With `--debug` the traceback is printed first (see `_common.fail`).
"""

from __future__ import annotations

import functools
import inspect
import logging
from collections.abc import Callable
from typing import Annotated, Any

import typer

from choreography_ray import logs
from choreography_ray.cli._common import ExitCode, fail, flags
from choreography_ray.errors import (
    ChoreographyError,
    InvalidRequestError,
    JobLookupError,
    JobOperationError,
    JobsManagerConflictError,
    JobsManagerUnavailableError,
    JobTimeoutError,
    SchedulerUnavailableError,
    StorageError,
    StorageUnavailableError,
    TypeImportError,
)

#: The help panel the global options are listed under.
PANEL = "Global options"

DebugOption = Annotated[
    bool,
    typer.Option("--debug", help="On an error, print its traceback too.", rich_help_panel=PANEL),
]
VerboseOption = Annotated[
    int,
    typer.Option(
        "--verbose",
        "-v",
        count=True,
        help="Log more on stderr: -v info, -vv debug (default: warnings and errors).",
        rich_help_panel=PANEL,
    ),
]
LogJsonOption = Annotated[
    bool,
    typer.Option(
        "--log-json",
        help="Log records (and errors) on stderr as one JSON object per line.",
        rich_help_panel=PANEL,
    ),
]

#: What a refused operation's error code means, and what to do about it.
HINTS = {
    "StopJobError.JOB_IS_NOT_RUNNING": "it has finished or is stopped already",
    "ResumeJobError.JOB_IS_COMPLETED": "a completed job is not resumed (retry-failed reruns "
    "the failed steps of one that allows it)",
    "ResumeJobError.JOB_IS_BEING_REMOVED": "a job being removed is never resumed",
    "RemoveJobError.JOB_IS_ALREADY_BEING_REMOVED": "its removal was run again; try once more "
    "if it stays",
    "RetryFailedStepsError.NOT_SUPPORTED": "its job type does not allow it "
    "(can_retry_failed_steps)",
    "RetryFailedStepsError.JOB_IS_NOT_COMPLETED_WITH_FAILURES": "only a job that completed "
    "with failures has failed steps to retry",
    "CannotResumeJobError.MISSING_STEP_PLAN": "it was interrupted before its plan was stored: "
    "inspect it with `jobs show`, or remove it",
}


def apply_flags(debug: bool, verbosity: int, log_json: bool) -> None:
    """Records the global flags and configures this process's logging; with `-v` or
    `--log-json`, the actors of a Ray that this command starts get the same settings
    (`CHOREOGRAPHY_LOG_LEVEL`, `CHOREOGRAPHY_LOG_FORMAT` in their runtime env)."""
    flags.debug = flags.debug or debug
    flags.verbosity = max(flags.verbosity, verbosity)
    flags.log_json = flags.log_json or log_json
    logs.configure(flags.verbosity, flags.log_json)


def reset_flags() -> None:
    """Back to no global flags and the logging as it was: the root runs it once the command
    ended, for a command run inside another program (a test's `CliRunner`)."""
    flags.debug, flags.verbosity, flags.log_json = False, 0, False
    logs.unconfigure()


def actor_log_env() -> dict[str, str]:
    """The log settings for actors this command creates: none unless `-v` or `--log-json`."""
    if not flags.verbosity and not flags.log_json:
        return {}
    return {
        logs.LEVEL_ENV: logging.getLevelName(logs.level_for(flags.verbosity)),
        logs.FORMAT_ENV: "json" if flags.log_json else "text",
    }


def describe(error: BaseException) -> tuple[str, ExitCode]:
    """One line for `error`, and the exit code of its kind."""
    if isinstance(error, JobOperationError):
        if isinstance(error.error, JobLookupError):
            return f"{error.message or error}", ExitCode.BAD_INPUT
        code = f"{type(error.error).__name__}.{error.error.name}"
        hint = HINTS.get(code)
        return f"refused: {error}" + (f" ({hint})" if hint else ""), ExitCode.REFUSED
    if isinstance(error, StorageUnavailableError):
        # pymongo appends its whole topology description: the reason comes before it.
        reason = str(error).split(", Timeout: ", 1)[0]
        return (f"{reason}; check that the database can be reached and that --storage (or "
                "$CHOREOGRAPHY_STORAGE) names it"), ExitCode.UNAVAILABLE  # fmt: skip
    if isinstance(error, JobsManagerUnavailableError | SchedulerUnavailableError):
        return str(error), ExitCode.UNAVAILABLE
    if isinstance(error, JobsManagerConflictError | TypeImportError | InvalidRequestError):
        return str(error), ExitCode.BAD_INPUT
    if isinstance(error, JobTimeoutError):
        return str(error), ExitCode.TIMEOUT
    if isinstance(error, StorageError | ChoreographyError):
        return str(error), ExitCode.REFUSED
    if isinstance(error, ConnectionError):
        return f"cannot reach the Ray cluster: {error}", ExitCode.UNAVAILABLE
    return (f"unexpected {type(error).__name__}: {error} (run again with --debug for the "
            "traceback)"), ExitCode.REFUSED  # fmt: skip


def guarded(command: Callable[..., Any]) -> Callable[..., Any]:
    """`command` with the global options added to its signature and its errors turned into
    one line and an exit code."""
    if getattr(command, "__guarded__", False):
        return command

    @functools.wraps(command)
    def run(*args: Any, debug: bool = False, verbose: int = 0, log_json: bool = False,
            **kwargs: Any) -> Any:  # fmt: skip
        apply_flags(debug, verbose, log_json)
        try:
            return command(*args, **kwargs)
        except (typer.Exit, typer.Abort, typer.TyperException):
            raise
        except KeyboardInterrupt:
            fail("interrupted", ExitCode.INTERRUPTED)
        except Exception as error:
            message, code = describe(error)
            fail(message, code)

    signature = inspect.signature(command, eval_str=True)
    extra = [
        inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=kind)
        for name, default, kind in (
            ("debug", False, DebugOption),
            ("verbose", 0, VerboseOption),
            ("log_json", False, LogJsonOption),
        )
    ]
    parameters = [*signature.parameters.values(), *extra]
    run.__signature__ = signature.replace(parameters=parameters)  # type: ignore[attr-defined]
    run.__annotations__ = {p.name: p.annotation for p in parameters}
    run.__guarded__ = True  # type: ignore[attr-defined]
    return run


def install(app: typer.Typer) -> None:
    """Guards every command of `app` and of its sub-apps, registered so far."""
    for info in app.registered_commands:
        if info.callback is not None:
            info.callback = guarded(info.callback)
    for group in app.registered_groups:
        if group.typer_instance is not None:
            install(group.typer_instance)

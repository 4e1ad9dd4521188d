"""The options more than one command takes, and the parsers of their values.

Every command module imports its shared options from here and never from another command
module, so the command modules import none of each other (`pools` and the `jobs` groups once
did, in a circle).
"""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from typing import Annotated

import typer

from choreography_ray.cli._common import parse_member
from choreography_ray.status import JobStatus

#: Seconds in one unit of a `--since` / `--older-than` duration.
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}

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
RayNamespaceOption = Annotated[
    str, typer.Option(help="The Ray namespace of the job system's actors.")
]
ScopeFilter = Annotated[
    str | None, typer.Option("--scope", help="Only this scope.", show_default="every scope")
]
NamespaceFilter = Annotated[
    str | None,
    typer.Option("--namespace", help="Only this namespace.", show_default="every namespace"),
]
StatusFilter = Annotated[
    list[str] | None,
    typer.Option(
        "--status",
        metavar="STATUS",
        show_default=False,
        help="Only jobs in this status (RUNNING, Running, running, ...); repeatable.",
    ),
]
TypeFilter = Annotated[
    str | None,
    typer.Option(
        "--type",
        metavar="TYPE",
        show_default=False,
        help="Only jobs of this type: its import path (pkg.module:Class) or class name.",
    ),
]
JobIdArgument = Annotated[str, typer.Argument(metavar="JOB_ID", help="The job's id.")]
JobScopeCheck = Annotated[
    str | None,
    typer.Option("--scope", help="The job's scope: another scope's job is not found.",
                 show_default="any (a job id is unique)"),
]  # fmt: skip
JobNamespaceCheck = Annotated[
    str | None,
    typer.Option("--namespace", help="The job's namespace: another one's job is not found.",
                 show_default="any"),
]  # fmt: skip
JsonOption = Annotated[bool, typer.Option("--json", help="Print JSON instead of tables.")]


def parse_status(text: str) -> JobStatus:
    """A job status by member name or stored value, in any case: RUNNING, Running, running."""
    return parse_member(JobStatus, text, "job status")


def parse_since(text: str, now: datetime | None = None) -> datetime:
    """`--since`: a duration back from now (`90s`, `15m`, `2h`, `7d`, `1w`) or an ISO-8601 date
    or time (`2026-01-31`, `2026-01-31T12:00`; UTC unless it names a zone)."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smhdw])\s*", text.lower())
    if match:
        seconds = float(match.group(1)) * _UNITS[match.group(2)]
        return (now or datetime.now(UTC)) - timedelta(seconds=seconds)
    try:
        at = datetime.fromisoformat(text.strip())
    except ValueError:
        raise typer.BadParameter(
            f"{text!r} is neither a duration (90s, 15m, 2h, 7d, 1w) nor an ISO-8601 date or "
            "time (2026-01-31, 2026-01-31T12:00)",
            param_hint="--since",
        ) from None
    return at if at.tzinfo is not None else at.replace(tzinfo=UTC)

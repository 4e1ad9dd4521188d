"""The `jobs` commands' small rules, in process: `--since`, addresses, the error lines and exit
codes, a bulk form's exit code, and the global options on every command."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
import typer
from typer.testing import CliRunner

from choreography_ray.cli import app
from choreography_ray.cli._cluster import host_port
from choreography_ray.cli._command import describe
from choreography_ray.cli._common import ExitCode
from choreography_ray.cli._options import parse_since
from choreography_ray.cli.jobs.acting import overall
from choreography_ray.cli.jobs.reading import parse_step_statuses, type_matches
from choreography_ray.errors import (
    JobLookupError,
    JobOperationError,
    JobsManagerUnavailableError,
    RetryFailedStepsError,
    StopJobError,
    StorageUnavailableError,
)
from choreography_ray.status import StepStatus

NOW = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)


def test_since__durations_back_from_now_and_iso_dates() -> None:
    assert parse_since("90s", NOW) == NOW - timedelta(seconds=90)
    assert parse_since("2h", NOW) == NOW - timedelta(hours=2)
    assert parse_since("1.5d", NOW) == NOW - timedelta(hours=36)
    assert parse_since("1w", NOW) == NOW - timedelta(days=7)
    assert parse_since("2026-01-31") == datetime(2026, 1, 31, tzinfo=UTC)
    assert parse_since("2026-01-31T12:00+01:00").utcoffset() == timedelta(hours=1)
    with pytest.raises(typer.BadParameter):
        parse_since("last tuesday")


def test_type_and_step_status_filters() -> None:
    assert type_matches("pkg.jobs:Reindex", "Reindex")
    assert type_matches("pkg.jobs:Reindex", "pkg.jobs:Reindex")
    assert not type_matches("pkg.jobs:Reindex", "pkg.jobs")
    failed = {StepStatus.FAILED, StepStatus.COMPLETED_WITH_FAILURE, StepStatus.UNREACHABLE}
    assert parse_step_statuses(None) == frozenset(failed)
    assert parse_step_statuses(["all"]) is None
    waiting = frozenset({StepStatus.RUNNING, StepStatus.SCHEDULED})
    assert parse_step_statuses(["running", "Scheduled"]) == waiting


def test_address_forms_tried_with_tcp_first() -> None:
    assert host_port("10.0.0.5:6379") == ("10.0.0.5", 6379)
    assert host_port("ray://head.internal:10001") == ("head.internal", 10001)
    assert host_port("[::1]:6379") == ("::1", 6379)
    assert host_port("auto") is None and host_port("local") is None
    assert host_port("http://head:8265") is None


@pytest.mark.parametrize(
    ("error", "code", "words"),
    [
        (JobOperationError(JobLookupError.JOB_NOT_FOUND, "no job x in ops/a"),
         ExitCode.BAD_INPUT, "no job x"),
        (JobOperationError(StopJobError.JOB_IS_NOT_RUNNING, "job x is Stopped"),
         ExitCode.REFUSED, "refused: StopJobError.JOB_IS_NOT_RUNNING"),
        (JobOperationError(RetryFailedStepsError.NOT_SUPPORTED),
         ExitCode.REFUSED, "can_retry_failed_steps"),
        (StorageUnavailableError("MongoDB at mongodb://h/db is unavailable: refused, Timeout: "
                                 "5s, Topology Description: <...>"),
         ExitCode.UNAVAILABLE, "unavailable: refused; check that the database can be reached"),
        (JobsManagerUnavailableError("did not answer"), ExitCode.UNAVAILABLE, "did not answer"),
        (ConnectionError("GCS down"), ExitCode.UNAVAILABLE, "cannot reach the Ray cluster"),
        (KeyError("x"), ExitCode.REFUSED, "unexpected KeyError"),
    ],
)  # fmt: skip
def test_describe__one_line_and_the_exit_code_of_its_kind(
    error: BaseException, code: ExitCode, words: str
) -> None:
    message, got = describe(error)
    assert got is code and words in message and "\n" not in message
    assert "Topology" not in message


def test_bulk_exit_code() -> None:
    assert overall([ExitCode.OK, ExitCode.OK]) is ExitCode.OK
    assert overall([ExitCode.OK, ExitCode.REFUSED]) is ExitCode.REFUSED
    assert overall([ExitCode.REFUSED, ExitCode.UNAVAILABLE]) is ExitCode.UNAVAILABLE


@pytest.mark.parametrize(
    "command",
    [["jobs", "list"], ["jobs", "show"], ["jobs", "steps"], ["jobs", "failures"],
     ["jobs", "watch"], ["jobs", "stop"], ["jobs", "resume"], ["jobs", "remove"],
     ["jobs", "retry-failed"], ["jobs", "rehydrate"],
     ["status"], ["list"], ["run"], ["demo"], ["scheduler", "manifests"]],
)  # fmt: skip
def test_every_command__has_help_and_the_global_options(command: list[str]) -> None:
    result = CliRunner().invoke(app, [*command, "--help"], terminal_width=200)
    assert result.exit_code == 0, result.output
    for option in ("--debug", "--verbose", "--log-json"):
        assert option in result.output, (command, option)
    if command[-1] not in ("watch", "demo", "run"):
        assert "--json" in result.output or command == ["jobs", "watch"], command
    assert "--storage" in result.output


def test_a_command_run_in_process__leaves_the_logging_and_flags_as_they_were() -> None:
    import logging

    from choreography_ray import logs
    from choreography_ray.cli._common import flags

    package = logging.getLogger("choreography_ray")
    before = (package.level, package.propagate)
    result = CliRunner().invoke(app, ["-vv", "jobs", "list", "--storage", "memory://", "--debug"])
    assert result.exit_code == 2
    assert (package.level, package.propagate) == before and logs._handler is None
    assert (flags.debug, flags.verbosity, flags.log_json) == (False, 0, False)

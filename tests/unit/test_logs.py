"""Logging: every record of the package's loggers carries its job and step ids (from `extra`,
else the process's binding), the JSON and text formats, and the actors' configuration from the
environment."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator

import pytest

from choreography_ray import logs


@pytest.fixture(autouse=True)
def reset() -> Iterator[None]:
    package = logging.getLogger(logs.ROOT)
    before = (package.level, package.propagate)
    yield
    logs.bind_process(None)
    logs.unconfigure()
    assert (package.level, package.propagate) == before and logs._handler is None


def captured(verbosity: int = 1, json_lines: bool = False) -> io.StringIO:
    stream = io.StringIO()
    logs.configure(verbosity, json_lines, stream=stream)
    return stream


def test_records__carry_the_ids_of_extra_else_of_the_process() -> None:
    records: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record)

    log = logs.get_logger("choreography_ray.core.somewhere")
    keep = Keep()
    log.addHandler(keep)
    try:
        log.warning("plain")
        log.warning("about a step", extra=logs.ids("job-1", "step-7"))
        logs.bind_process("job-2")
        log.warning("in a job actor")
        log.warning("another job here", extra=logs.ids("job-3"))
    finally:
        log.removeHandler(keep)
    assert [(r.choreography_job_id, r.choreography_step_id) for r in records] == [  # type: ignore[attr-defined]
        (None, None), ("job-1", "step-7"), ("job-2", None), ("job-3", None)]  # fmt: skip
    assert logs.get_logger("choreography_ray.core.somewhere").filters.count(logs._FILTER) == 1


def test_json_lines__one_object_per_record_with_the_ids_when_known() -> None:
    stream = captured(json_lines=True)
    log = logs.get_logger("choreography_ray.runtime.step_host")
    log.info("persisted", extra=logs.ids("job-1", "s-1"))
    log.debug("not at -v")
    try:
        raise RuntimeError("boom")
    except RuntimeError:
        log.exception("failed\non two lines")
    first, second = (json.loads(line) for line in stream.getvalue().splitlines())
    assert first["level"] == "INFO" and first["logger"] == "choreography_ray.runtime.step_host"
    assert first["message"] == "persisted"
    assert (first["job_id"], first["step_id"]) == ("job-1", "s-1")
    assert first["time"].endswith("+00:00")
    assert "job_id" not in second and second["message"] == "failed\non two lines"
    assert "RuntimeError: boom" in second["exception"]


def test_text__ids_at_the_end_and_quiet_by_default() -> None:
    stream = captured(verbosity=0)
    log = logs.get_logger("choreography_ray.core.job")
    log.info("hidden at the default level")
    log.warning("slow save", extra=logs.ids("job-9", "s-2"))
    (line,) = stream.getvalue().splitlines()
    assert line.endswith("WARNING choreography_ray.core.job: slow save [job job-9 step s-2]")
    assert logs.level_for(1) == logging.INFO and logs.level_for(2) == logging.DEBUG


def test_configure_from_env__only_when_asked(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv(logs.LEVEL_ENV, raising=False)
    monkeypatch.delenv(logs.FORMAT_ENV, raising=False)
    logs.configure_from_env()
    assert logs._handler is None

    monkeypatch.setenv(logs.LEVEL_ENV, "info")
    monkeypatch.setenv(logs.FORMAT_ENV, "json")
    logs.configure_actor("job-4")
    logs.get_logger("choreography_ray.runtime.job_actor").info("activated")
    (record,) = [json.loads(line) for line in capsys.readouterr().err.splitlines()]
    assert record["message"] == "activated" and record["job_id"] == "job-4"

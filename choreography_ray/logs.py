"""Logging: standard `logging`, every record of the runtime tagged with its job and step.

Every module of the package logs through `get_logger(__name__)`, a plain `logging.Logger` with
`ContextFilter` attached, so each record it makes carries two attributes, whatever handler
formats it:

- `choreography_job_id`: the job the record is about, or None;
- `choreography_step_id`: the step, or None.

(Not `job_id`: Ray's own logging filter sets `record.job_id` to the Ray job's id.) They come,
first found first, from the call's `extra` (`log.warning(..., extra=ids(job_id, step_id))`,
used where one process serves many jobs: step hosts, managers), else from the process
(`bind_process`: a job actor's process serves one job, so each of its records is that job's).
Nothing is computed on the hot path: a record that is not emitted costs its level check, and
`extra` is built only where a record is made (failures, retries).

The package attaches no handler (a library's records go where the application sends them) but
for two opt-ins:

- `configure(verbosity, json_lines)`, which the CLI calls for `-v`, `-vv` and `--log-json`;
- `configure_from_env()`, which each actor runs when it starts: `CHOREOGRAPHY_LOG_LEVEL`
  (`WARNING` unless set) and `CHOREOGRAPHY_LOG_FORMAT` (`text` or `json`) in the environment of
  the actor's process (a node's environment, or a runtime env's `env_vars`) give the actor a
  stderr handler of that level and format; without either, nothing changes.

`--log-json` and `CHOREOGRAPHY_LOG_FORMAT=json` write one JSON object per line: `time`
(ISO-8601, UTC, milliseconds), `level`, `logger`, `message`, then `job_id` and `step_id` when
known and `exception` (the formatted traceback) when there is one.
"""

from __future__ import annotations

import json
import logging
import os
import sys
from datetime import UTC, datetime
from typing import Any, TextIO

#: The package's root logger: every module's logger is below it.
ROOT = "choreography_ray"
#: The record attributes `ContextFilter` sets.
JOB_ATTR = "choreography_job_id"
STEP_ATTR = "choreography_step_id"
#: The environment an actor's logging is configured from (`configure_from_env`).
LEVEL_ENV = "CHOREOGRAPHY_LOG_LEVEL"
FORMAT_ENV = "CHOREOGRAPHY_LOG_FORMAT"
#: The text format: time, level, logger, message, then `[job ... step ...]` when known.
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s%(choreography_context)s"

#: The ids every record of this process is about (`bind_process`), or None.
_process_ids: dict[str, str | None] = {JOB_ATTR: None, STEP_ATTR: None}


def ids(job_id: str | None, step_id: str | None = None) -> dict[str, str | None]:
    """`extra` for a record about `job_id` (and `step_id`) in a process of many jobs."""
    return {JOB_ATTR: job_id, STEP_ATTR: step_id}


def bind_process(job_id: str | None, step_id: str | None = None) -> None:
    """Tags every later record of this process with `job_id` (and `step_id`) where the call
    names none: for a process that serves one job (a job actor)."""
    _process_ids[JOB_ATTR] = job_id
    _process_ids[STEP_ATTR] = step_id


def configure_actor(job_id: str | None = None, step_id: str | None = None) -> None:
    """What each actor runs as it starts: `configure_from_env`, then `bind_process` for an
    actor that serves one job (`job_id`) or one step."""
    configure_from_env()
    if job_id is not None:
        bind_process(job_id, step_id)


class ContextFilter(logging.Filter):
    """Sets `choreography_job_id` and `choreography_step_id` on every record (None when
    unknown). Attached to each logger `get_logger` returns; add it to a handler to tag the
    records of other loggers of a job actor's process too."""

    def filter(self, record: logging.LogRecord) -> bool:
        for attr in (JOB_ATTR, STEP_ATTR):
            if getattr(record, attr, None) is None:
                setattr(record, attr, _process_ids[attr])
        return True


_FILTER = ContextFilter()


def get_logger(name: str) -> logging.Logger:
    """`logging.getLogger(name)` with `ContextFilter` attached (once)."""
    logger = logging.getLogger(name)
    if _FILTER not in logger.filters:
        logger.addFilter(_FILTER)
    return logger


def context_of(record: logging.LogRecord) -> dict[str, str]:
    """The record's job and step ids, those that are known."""
    found = {"job_id": getattr(record, JOB_ATTR, None) or _process_ids[JOB_ATTR],
             "step_id": getattr(record, STEP_ATTR, None) or _process_ids[STEP_ATTR]}  # fmt: skip
    return {key: value for key, value in found.items() if value}


class TextFormatter(logging.Formatter):
    """`TEXT_FORMAT`: one line per record (a traceback follows it), ids at the end."""

    def __init__(self) -> None:
        super().__init__(TEXT_FORMAT)

    def format(self, record: logging.LogRecord) -> str:
        context = context_of(record)
        record.choreography_context = (
            " [" + " ".join(f"{k.removesuffix('_id')} {v}" for k, v in context.items()) + "]"
            if context
            else ""
        )
        return super().format(record)


class JsonFormatter(logging.Formatter):
    """One JSON object per record, on one line (a traceback is a field, not more lines)."""

    def format(self, record: logging.LogRecord) -> str:
        data: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
            **context_of(record),
        }
        if record.exc_info:
            data["exception"] = self.formatException(record.exc_info)
        elif record.exc_text:
            data["exception"] = record.exc_text
        return json.dumps(data, default=str)


#: The handler `configure` or `configure_from_env` installed on the package's logger, and the
#: logger's level and propagation before the first `configure` (what `unconfigure` restores).
_handler: logging.Handler | None = None
_before: tuple[int, bool] | None = None


def level_for(verbosity: int) -> int:
    """Quiet by default: warnings and errors; `-v` adds info, `-vv` debug."""
    return logging.WARNING if verbosity <= 0 else logging.INFO if verbosity == 1 else logging.DEBUG


def configure(
    verbosity: int = 0,
    json_lines: bool = False,
    stream: TextIO | None = None,
    level: int | None = None,
) -> logging.Handler:
    """Sends the package's records at `level` (else `level_for(verbosity)`) and above to
    `stream` (stderr) as text or JSON lines, through one handler of its own; the records no
    longer propagate to the root logger, so they are not written twice. Calling it again
    replaces the handler."""
    global _handler, _before
    logger = logging.getLogger(ROOT)
    if _before is None:
        _before = (logger.level, logger.propagate)
    if _handler is not None:
        logger.removeHandler(_handler)
    handler = logging.StreamHandler(stream if stream is not None else sys.stderr)
    handler.setFormatter(JsonFormatter() if json_lines else TextFormatter())
    handler.addFilter(_FILTER)
    logger.addHandler(handler)
    logger.setLevel(level if level is not None else level_for(verbosity))
    logger.propagate = False
    _handler = handler
    return handler


def unconfigure() -> None:
    """Undoes `configure`: the handler goes, the level and propagation are restored (for a
    command run inside another program, such as a test)."""
    global _handler, _before
    logger = logging.getLogger(ROOT)
    if _handler is not None:
        logger.removeHandler(_handler)
        _handler = None
    if _before is not None:
        logger.setLevel(_before[0])
        logger.propagate = _before[1]
        _before = None


def configure_from_env() -> None:
    """`configure` from `CHOREOGRAPHY_LOG_LEVEL` and `CHOREOGRAPHY_LOG_FORMAT`, when either is
    set (each actor calls it as it starts); an unknown value is ignored with a warning."""
    level_name = os.environ.get(LEVEL_ENV, "").strip().upper()
    style = os.environ.get(FORMAT_ENV, "").strip().lower()
    if not level_name and not style:
        return
    level = logging.getLevelName(level_name or "WARNING")
    if not isinstance(level, int):
        level = logging.WARNING
    configure(json_lines=style == "json", level=level)
    if style not in ("", "text", "json"):
        get_logger(__name__).warning("%s=%r is not text or json; text is used", FORMAT_ENV, style)


__all__ = [
    "FORMAT_ENV",
    "LEVEL_ENV",
    "ContextFilter",
    "JsonFormatter",
    "TextFormatter",
    "bind_process",
    "configure",
    "configure_actor",
    "configure_from_env",
    "context_of",
    "get_logger",
    "ids",
    "level_for",
    "unconfigure",
]

"""Records for the scheduler's unit tests, with defaults a test overrides by keyword."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from choreography_ray.scheduler.records import DeadLetter, Manifest, ManifestRun
from choreography_ray.scheduler.schedules import Every
from choreography_ray.scheduler.status import DeadLetterStatus, RunStatus

T0 = datetime(2025, 6, 1, 12, 0, tzinfo=UTC)
JOB = "pkg.jobs:Reindex"
REQUEST: dict[str, Any] = {"index": "docs"}


def manifest(name: str = "m", **fields: Any) -> Manifest:
    values: dict[str, Any] = {
        "scope": "s", "name": name, "job_type": JOB, "request": REQUEST,
        "schedule": Every.hours(1), "created": T0 - timedelta(days=30),
    }  # fmt: skip
    return Manifest.model_validate({**values, **fields})


def run(
    status: RunStatus,
    started: datetime,
    *,
    minutes: float = 1,
    manifest_name: str = "m",
    **fields: Any,
) -> ManifestRun:
    """A run of `manifest_name` that started at `started` and, when finished, took `minutes`."""
    values: dict[str, Any] = {
        "scope": "s", "manifest": manifest_name, "job_type": JOB, "request": REQUEST,
        "status": status, "queued_at": started, "started_at": started,
        "ended_at": started + timedelta(minutes=minutes) if status.is_finished else None,
    }  # fmt: skip
    return ManifestRun.model_validate({**values, **fields})


def failed(started: datetime, **fields: Any) -> ManifestRun:
    return run(RunStatus.FAILED, started, **fields)


def succeeded(started: datetime, **fields: Any) -> ManifestRun:
    return run(RunStatus.SUCCEEDED, started, **fields)


def dead_letter(
    status: DeadLetterStatus, resolved_at: datetime | None = None, **fields: Any
) -> DeadLetter:
    values: dict[str, Any] = {
        "scope": "s", "manifest": "m", "status": status, "retry_count_at_dead_letter": 4,
        "reason": "out of retries", "resolved_at": resolved_at,
    }  # fmt: skip
    return DeadLetter.model_validate({**values, **fields})


def newest_first(*runs: ManifestRun) -> list[ManifestRun]:
    return sorted(runs, key=lambda r: r.queued_at, reverse=True)

"""When a manifest is next due, by its schedule alone.

A schedule counts from the latest point that *settled* it (`Settled`): a success, a cancelled
run, a failure that no longer counts, an acknowledged dead letter. A failed run that still counts
settles nothing, so a manifest that failed while due is still due: its retry is the manifest's
next due run (the spec's "When a retry runs").

- `Every`: due `interval` after the latest settled point (its occurrence when it has one);
  never settled: due from the manifest's creation.
- `Cron`: due at the first occurrence after that point, read in the schedule's time zone
  (cronsim: a time skipped by a spring-forward runs at the first minute after it; a fall-back's
  repeated hour runs once).
- `OnceAt`: due at `at` until something settles it.
- `After`: due at the parent's latest success (after this manifest was created) while no
  settled run of this manifest was started for it.

Due while the cluster was down, a manifest runs once: `Due.occurrence` is the latest occurrence
not after `now`, not the first missed one.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from cronsim import CronSim

from choreography_ray.scheduler.records import Manifest, ManifestRun
from choreography_ray.scheduler.schedules import After, Cron, Every, OnceAt

#: cronsim's resolution: an occurrence is a whole second.
_SECOND = timedelta(seconds=1)


@dataclass(frozen=True, slots=True)
class Settled:
    """A point the schedule counts from."""

    at: datetime
    occurrence: datetime | None = None
    #: For a dependent: the parent's run whose success this consumed.
    parent_run: str | None = None

    @property
    def point(self) -> datetime:
        return self.occurrence or self.at


@dataclass(frozen=True, slots=True)
class Due:
    """The manifest is due from `at`; a run queued now runs for `occurrence`."""

    at: datetime
    occurrence: datetime | None = None
    parent_run: str | None = None


def next_due(
    manifest: Manifest,
    settled: Sequence[Settled],
    now: datetime,
    parent_success: ManifestRun | None = None,
) -> Due | None:
    """When the manifest is due (possibly in the past), or None when it never is again."""
    schedule = manifest.schedule
    anchor = max((s.point for s in settled), default=None)
    if isinstance(schedule, Every):
        at = manifest.created if anchor is None else anchor + schedule.interval
        return Due(at, _latest_interval(at, schedule.interval, now))
    if isinstance(schedule, Cron):
        first = next_occurrence(schedule, anchor or manifest.created)
        if first is None:
            return None
        latest = latest_occurrence(schedule, now)
        return Due(first, latest if latest is not None and latest >= first else first)
    if isinstance(schedule, OnceAt):
        return None if anchor is not None else Due(schedule.at, schedule.at)
    assert isinstance(schedule, After)
    return _after_parent(manifest, settled, parent_success)


def next_occurrence(schedule: Cron, after: datetime) -> datetime | None:
    """The first occurrence strictly after `after`, in UTC."""
    local = after.astimezone(schedule.zone)
    try:
        return next(CronSim(schedule.expression, local)).astimezone(UTC)
    except StopIteration:
        return None


def latest_occurrence(schedule: Cron, now: datetime) -> datetime | None:
    """The latest occurrence not after `now`, in UTC."""
    # A whole-second `now` is an occurrence itself: reverse iteration starts just before it.
    local = (now + _SECOND).replace(microsecond=0).astimezone(schedule.zone)
    try:
        found = next(CronSim(schedule.expression, local, reverse=True)).astimezone(UTC)
    except StopIteration:
        return None
    return found if found <= now else None


def _latest_interval(due: datetime, interval: timedelta, now: datetime) -> datetime:
    if now <= due:
        return due
    return due + interval * ((now - due) // interval)


def _after_parent(
    manifest: Manifest, settled: Sequence[Settled], parent_success: ManifestRun | None
) -> Due | None:
    if parent_success is None or parent_success.ended_at is None:
        return None
    if parent_success.ended_at < manifest.created:
        return None
    consumed = any(
        s.parent_run == parent_success.id
        or (s.parent_run is None and s.at >= parent_success.ended_at)
        for s in settled
    )
    return None if consumed else Due(parent_success.ended_at, None, parent_success.id)

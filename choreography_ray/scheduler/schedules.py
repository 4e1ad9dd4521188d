"""A manifest's schedule: an interval, a cron expression in an IANA time zone, once at a time,
or after each new success of another manifest. Stored as JSON with a `kind` discriminator."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Annotated, Literal
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from cronsim import CronSim, CronSimError
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, field_validator

from choreography_ray.durations import Duration


class _Schedule(BaseModel):
    model_config = ConfigDict(frozen=True, extra="ignore")


class Every(_Schedule):
    """Every `interval`, counted from the last success (a failed run does not move it)."""

    kind: Literal["every"] = "every"
    interval: Annotated[Duration, AfterValidator(lambda d: _positive(d))]

    @classmethod
    def seconds(cls, n: float) -> Every:
        return cls(interval=timedelta(seconds=n))

    @classmethod
    def minutes(cls, n: float) -> Every:
        return cls(interval=timedelta(minutes=n))

    @classmethod
    def hours(cls, n: float) -> Every:
        return cls(interval=timedelta(hours=n))


class Cron(_Schedule):
    """A five-field cron expression (or six, with seconds first) read in the IANA zone `tz`."""

    kind: Literal["cron"] = "cron"
    expression: str
    tz: str = "UTC"

    @field_validator("tz")
    @classmethod
    def _known_zone(cls, tz: str) -> str:
        try:
            ZoneInfo(tz)
        except (ZoneInfoNotFoundError, ValueError) as exc:
            raise ValueError(f"unknown IANA time zone {tz!r}") from exc
        return tz

    @field_validator("expression")
    @classmethod
    def _valid_expression(cls, expression: str) -> str:
        try:
            CronSim(expression, datetime(2000, 1, 1, tzinfo=UTC))
        except CronSimError as exc:
            raise ValueError(f"not a cron expression {expression!r}: {exc}") from exc
        return expression

    @property
    def zone(self) -> ZoneInfo:
        return ZoneInfo(self.tz)


class OnceAt(_Schedule):
    """Once, at `at` (a naive time reads as UTC), until a run of it succeeds."""

    kind: Literal["once"] = "once"
    at: datetime

    @field_validator("at")
    @classmethod
    def _aware(cls, at: datetime) -> datetime:
        return at.replace(tzinfo=UTC) if at.tzinfo is None else at.astimezone(UTC)


class After(_Schedule):
    """After each new success of the manifest named `parent` (of the same scope)."""

    kind: Literal["after"] = "after"
    parent: str = Field(min_length=1)


Schedule = Annotated[Every | Cron | OnceAt | After, Field(discriminator="kind")]


def schedule_of(
    *,
    every: timedelta | float | None = None,
    cron: str | None = None,
    tz: str | None = None,
    once_at: datetime | None = None,
    after: str | None = None,
) -> Every | Cron | OnceAt | After:
    """The schedule the client's keywords name; exactly one of them, and `tz` only with cron."""
    given = [k for k, v in (("every", every), ("cron", cron), ("once_at", once_at),
                            ("after", after)) if v is not None]  # fmt: skip
    if len(given) != 1:
        raise ValueError(f"name exactly one of every, cron, once_at, after (given: {given})")
    if tz is not None and cron is None:
        raise ValueError("tz is only read with cron")
    if every is not None:
        return Every.model_validate({"interval": every})
    if cron is not None:
        return Cron(expression=cron, tz=tz or "UTC")
    if once_at is not None:
        return OnceAt(at=once_at)
    assert after is not None
    return After(parent=after)


def _positive(interval: timedelta) -> timedelta:
    if interval <= timedelta(0):
        raise ValueError("an interval must be positive")
    return interval

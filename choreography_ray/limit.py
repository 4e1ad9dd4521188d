"""`Limit`: a named limit several step types take permits of (`JobsOptions.limits`,
`JobStep.limits`, `Jobs.set_limit`), and `LimitState`, what `Jobs.limits()` tells of each limit
of the cluster (docs/pools.md#limits-across-the-cluster)."""

from __future__ import annotations

from datetime import timedelta
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from choreography_ray.durations import Duration


class Limit(BaseModel):
    """At most `max_concurrent` steps running at once (0 holds every new start back), and at
    most `rate` starts per `per`, in bursts of at most `burst` starts (default: one `per`'s
    worth of `rate`, at least 1). None: no such bound."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    max_concurrent: int | None = Field(default=None, ge=0)
    rate: float | None = Field(default=None, gt=0, allow_inf_nan=False)
    per: Duration = timedelta(seconds=1)
    burst: int | None = Field(default=None, ge=1)

    @field_validator("per")
    @classmethod
    def _per_positive(cls, per: timedelta) -> timedelta:
        if per <= timedelta(0) or per == timedelta.max:
            raise ValueError(f"per must be a positive duration, not {per}")
        return per

    @property
    def per_second(self) -> float | None:
        """Starts a second the bucket fills with (None: no rate)."""
        return None if self.rate is None else self.rate / self.per.total_seconds()

    @property
    def bucket(self) -> float:
        """Starts the bucket holds at most."""
        if self.burst is not None:
            return float(self.burst)
        return max(1.0, self.rate or 0.0)

    def describe(self) -> str:
        """`50 at once, 600 per 60 s (burst 50)`; `none` for a limit that bounds nothing."""
        parts = []
        if self.max_concurrent is not None:
            parts.append(f"{self.max_concurrent} at once")
        if self.rate is not None:
            parts.append(
                f"{self.rate:g} per {self.per.total_seconds():g} s (burst {self.bucket:g})"
            )
        return ", ".join(parts) or "none"


class LimitKey(BaseModel):
    """A concurrency key of a limit: its permits held and its steps waiting for one."""

    model_config = ConfigDict(frozen=True)

    key: str
    held: int
    waiting: int


class LimitState(BaseModel):
    """A limit of the cluster as its limiter counts it now. `kind`: `named` (a `Limit` of
    `JobsOptions.limits`, or set live: `live`), `type` (a step type's `max_concurrent` and
    `max_per_second`; `name` is the type's import path) or `per-key` (a step type's
    `max_concurrent_per_key`, each key counted alone; `held` and `waiting` are over every key).
    `held`: permits held by steps (running, or granted to a host and about to run); `waiting`:
    steps the hosts asked a permit for and did not get yet; `top_keys`: the concurrency keys with
    the most held and waiting, at most 10."""

    model_config = ConfigDict(frozen=True)

    name: str
    kind: Literal["named", "type", "per-key"]
    limit: Limit
    held: int
    waiting: int
    top_keys: tuple[LimitKey, ...] = ()
    live: bool = False

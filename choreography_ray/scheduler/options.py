"""`SchedulerOptions` (on `JobsOptions.scheduler`): the loops, retries and dead letters."""

from __future__ import annotations

from datetime import timedelta

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator

from choreography_ray.durations import Duration

#: Options that must be longer than zero: zero or less would spin a loop, refuse every write,
#: never dead-letter, or delete what it keeps (issue 36).
POSITIVE = (
    "manifest_cycle", "dispatch_interval", "failure_count_window", "dispatch_timeout",
    "replay_answers_for", "dead_letter_retention", "lock_ttl", "default_run_timeout",
    "run_retention",
)  # fmt: skip
#: Options that may be zero but not less.
NOT_NEGATIVE = (
    "default_retry_delay", "max_retry_delay", "dispatch_retry_delay", "max_dispatch_retry_delay",
)  # fmt: skip


class SchedulerOptions(BaseModel):
    """Durations are `timedelta`; plain numbers read as seconds."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    #: How often the manifest manager decides what is due and queues work entries.
    manifest_cycle: Duration = timedelta(seconds=5)
    #: How often the dispatcher claims due work entries and starts their runs.
    dispatch_interval: Duration = timedelta(seconds=2)
    #: The delay of the first retry of a failed run; zero stores no `scheduled_at`.
    default_retry_delay: Duration = timedelta(minutes=5)
    #: Each further counted failure multiplies the retry delay by this.
    retry_backoff_multiplier: float = Field(default=2.0, ge=1.0)
    #: The longest retry delay.
    max_retry_delay: Duration = timedelta(hours=1)
    #: Failures count toward a dead letter only while they started this recently (a manifest's
    #: own `failure_window` overrides it).
    failure_count_window: Duration = timedelta(hours=24)
    #: Retries after the first run, for a manifest that states none.
    default_max_retries: int = Field(default=3, ge=0)
    #: Dispatch attempts of one entry before its run counts as one failed run.
    max_dispatch_attempts: int = Field(default=5, ge=1)
    #: The first dispatch retry's delay; each further one doubles it.
    dispatch_retry_delay: Duration = timedelta(seconds=5)
    #: The longest delay between two dispatch attempts.
    max_dispatch_retry_delay: Duration = timedelta(minutes=5)
    #: How long the dispatcher waits for a jobs manager to answer a start. A start past it is
    #: settled like one whose answer was lost, and the namespace's other due entries wait for
    #: the next dispatch, so one stuck manager holds up no other namespace nor operation.
    dispatch_timeout: Duration = timedelta(seconds=30)
    #: How long a run may take from its start, for a manifest that states no `timeout`: a run
    #: past it is stopped through the jobs manager and settled CANCELLED. None: no limit.
    default_run_timeout: Duration | None = None
    #: A recorded decision replays into a retry only while it is younger than this.
    replay_answers_for: Duration = timedelta(hours=24)
    #: Resolved dead letters older than this are deleted.
    dead_letter_retention: Duration = timedelta(days=30)
    #: How long the scope's lock lasts without a renewal; it is renewed every third of this.
    #: A scheduler that dies is replaced by another cluster's after at most this long.
    lock_ttl: Duration = timedelta(seconds=30)
    #: Per manifest, its newest runs kept however old (see docs/retention.md).
    runs_kept: int = Field(default=100, ge=1)
    #: A finished run past the newest `runs_kept` of its manifest is deleted once it ended
    #: longer ago than this, with its decisions, checkpoints and work entry, unless a retry, a
    #: dead letter, a schedule or a checkpoint still needs it (see docs/retention.md).
    run_retention: Duration = timedelta(days=30)
    #: How often the manifest manager runs the run retention pass.
    run_cleanup_interval: Duration = timedelta(hours=1)

    @field_validator(*POSITIVE, "run_cleanup_interval")
    @classmethod
    def _positive(cls, value: timedelta | None, info: ValidationInfo) -> timedelta | None:
        if value is not None and value <= timedelta(0):
            raise ValueError(f"{info.field_name} must be longer than zero, not {value}")
        return value

    @field_validator(*NOT_NEGATIVE)
    @classmethod
    def _not_negative(cls, value: timedelta, info: ValidationInfo) -> timedelta:
        if value < timedelta(0):
            raise ValueError(f"{info.field_name} must not be negative, not {value}")
        return value

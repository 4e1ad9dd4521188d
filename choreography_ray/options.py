"""`JobsOptions`: every option of the spec, with its default."""

from __future__ import annotations

import math
from datetime import timedelta

from pydantic import BaseModel, ConfigDict, Field, field_validator

from choreography_ray.durations import Duration
from choreography_ray.limit import Limit
from choreography_ray.scheduler.options import SchedulerOptions


class JobsOptions(BaseModel):
    """Options of the job system. Durations are `timedelta`; plain numbers read as seconds."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    #: Steps of a job in start operations not yet answered by their step hosts: the load a
    #: burst of starts puts on storage and hosts (see docs/decisions.md for the default).
    max_concurrent_step_starts: int = 16_384
    #: Steps running at once per job; None = no window. Values below 1 are treated as 1.
    max_active_steps_per_job: int | None = None
    #: Deliveries of one outcome before the step leaves it to the job's watchdog.
    step_delivery_max_attempts: int = 10
    #: Delay before the second delivery; each further one doubles it.
    step_delivery_retry_delay: Duration = timedelta(seconds=1)
    #: The longest delay between two deliveries.
    max_step_delivery_retry_delay: Duration = timedelta(seconds=30)
    #: How often a running job checks its active steps and its stage in storage; zero, negative
    #: or infinite turns it off.
    job_watchdog_interval: Duration = timedelta(seconds=60)
    #: Attempts per step; 1 = a step never retries. Values below 1 are treated as 1.
    max_step_attempts: int = 1
    #: Delay before the second attempt; each further attempt doubles it.
    step_retry_backoff: Duration = timedelta(seconds=5)
    #: The longest delay between two attempts.
    max_step_retry_backoff: Duration = timedelta(minutes=5)
    #: Jobs resumed at once by one manager's rehydration drain.
    max_concurrent_rehydration: int = 8
    #: Lease timeout of a running step; zero turns leases off.
    step_lease_timeout: Duration = timedelta(0)
    #: Import paths ("pkg.mod:Class") of extra recovery key providers.
    keys_providers: tuple[str, ...] = ()
    #: When set, types imported from storage must start with one of these prefixes.
    allowed_type_prefixes: tuple[str, ...] | None = None
    #: How often the recovery actor looks for running jobs whose job actor is gone; 0 = off.
    reconciliation_interval: Duration = timedelta(seconds=60)
    #: Step hosts per node; None = one per CPU of the node.
    step_hosts_per_node: int | None = None
    #: Steps one step host runs at once.
    step_host_capacity: int = Field(default=4096, ge=1)
    #: A pool's host (`JobStep.resources`) that has run nothing for this long leaves, giving
    #: its resources back (an autoscaler may then remove its node); None: hosts stay.
    pool_idle_timeout: Duration | None = timedelta(seconds=60)
    #: Steps in one start RPC from a job to a step host.
    step_batch_size: int = Field(default=1024, ge=1)
    #: Steps of a plan read from `prepare_steps` before its first insert (they size the step
    #: ids); after them the plan is read and inserted 10,000 steps at a time (at most a chunk).
    #: A first run keeps two chunks in memory; a stage's steps are read back from storage in
    #: pages of at most 5,000 of them.
    plan_chunk_size: int = Field(default=50_000, ge=1)
    #: How long a step host's group commit round gathers writes before it is written when no
    #: write is in flight (0: at once; while a write is in flight, writes gather anyway).
    group_commit_delay: Duration = timedelta(0)
    #: An async `perform` that holds the event loop longer than this without awaiting is
    #: recorded as failed when it ends; zero turns the check off.
    step_event_loop_block_limit: Duration = timedelta(seconds=5)
    #: The largest request `start` takes, in bytes of its JSON: a request is stored whole in the
    #: job's record (MongoDB refuses documents over 16 MiB) and travels to every step it prepares.
    max_request_bytes: int = Field(default=1024 * 1024, ge=1)
    #: The largest output a step may return (`StepResult.succeeded(output=...)`), in bytes of
    #: its JSON: a bigger one fails the step with a message naming this limit (docs/outputs.md).
    max_output_bytes: int = Field(default=64 * 1024, ge=1)
    #: How often a job saves its progress while steps report (progress is a cache; the watchdog
    #: recounts from storage).
    progress_save_interval: Duration = timedelta(milliseconds=250)
    #: How often each jobs manager runs its cleanup pass (retention and dead jobs,
    #: docs/retention.md); None, zero, negative or infinite turns the pass off.
    cleanup_interval: Duration | None = timedelta(minutes=5)
    #: How long a terminal job (COMPLETED_SUCCESSFULLY, COMPLETED_WITH_FAILURES, FAILED) is kept
    #: after it reached that status; None, zero, negative or infinite keeps terminal jobs.
    terminal_job_retention: Duration | None = timedelta(days=7)
    #: Terminal jobs one cleanup pass removes at most, oldest first; None = every one due.
    max_terminal_jobs_per_cleanup: int | None = Field(default=100, ge=1)
    #: How long a job may stay PREPARING_JOB or PREPARING_STEPS without steps before the
    #: cleanup pass removes it as dead; None, zero, negative or infinite never removes one.
    dead_job_threshold: Duration | None = timedelta(hours=1)
    #: Removals one cleanup pass runs at once; None = no bound.
    max_concurrent_cleanup: int | None = Field(default=4, ge=1)
    #: Record metrics through `ray.util.metrics` (docs/metrics.md); off records nothing.
    metrics: bool = True
    #: Job actors each jobs manager keeps created ahead for the next jobs it starts, so a start
    #: does not wait for an actor to be created (docs/jobs.md); 0 = none.
    spare_job_actors: int = Field(default=1, ge=0)
    #: The scheduler's options: its loops, retry backoff, failure window and dead letters.
    scheduler: SchedulerOptions = SchedulerOptions()
    #: Weight of each fairness key where steps wait for capacity (docs/sharing.md): keys with
    #: waiting steps are served in proportion to their weights; a key not named weighs 1.0.
    fairness_weights: dict[str, float] = Field(default_factory=dict)
    #: Named limits step types take permits of (`JobStep.limits`), over every job and host of
    #: the cluster (docs/pools.md#limits-across-the-cluster); `Jobs.set_limit` changes one live.
    limits: dict[str, Limit] = Field(default_factory=dict)

    @field_validator("fairness_weights")
    @classmethod
    def _weights_positive(cls, weights: dict[str, float]) -> dict[str, float]:
        for key, weight in weights.items():
            if not (math.isfinite(weight) and weight > 0):
                raise ValueError(f"fairness_weights[{key!r}] must be a number > 0, not {weight!r}")
        return weights

    def fairness_weight(self, key: str) -> float:
        return self.fairness_weights.get(key, 1.0)

    @property
    def effective_max_step_attempts(self) -> int:
        return max(1, self.max_step_attempts)

    @property
    def effective_max_concurrent_step_starts(self) -> int:
        return max(1, self.max_concurrent_step_starts)

    @property
    def watchdog_seconds(self) -> float | None:
        """The watchdog interval in seconds, or None when it is off."""
        return _positive_seconds(self.job_watchdog_interval)

    @property
    def lease_seconds(self) -> float | None:
        return _positive_seconds(self.step_lease_timeout)

    @property
    def reconciliation_seconds(self) -> float | None:
        return _positive_seconds(self.reconciliation_interval)

    @property
    def cleanup_seconds(self) -> float | None:
        """The cleanup pass's interval in seconds, or None when it is off."""
        return _positive_seconds(self.cleanup_interval)

    @property
    def effective_terminal_job_retention(self) -> timedelta | None:
        """How long terminal jobs are kept, or None when they are kept for good."""
        return _positive(self.terminal_job_retention)

    @property
    def effective_dead_job_threshold(self) -> timedelta | None:
        """How old a dead preparing job is before it is removed, or None when never."""
        return _positive(self.dead_job_threshold)


def _positive(value: timedelta | None) -> timedelta | None:
    return None if _positive_seconds(value) is None else value


def _positive_seconds(value: timedelta | None) -> float | None:
    if value is None or value == timedelta.max:
        return None
    seconds = value.total_seconds()
    return seconds if 0 < seconds < math.inf else None


def window_size(configured: int | None) -> int | None:
    """The active window: None is no window; values below 1 are treated as 1."""
    return None if configured is None else max(1, configured)

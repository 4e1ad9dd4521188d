"""Dispatch failures: a dispatch that never reached the jobs manager (the actor could not be
reached, storage refused the job) is requeued with its own backoff, `dispatch_retry_delay` (5 s)
doubling to `max_dispatch_retry_delay` (5 min), as Trax's dispatcher does. It does not count as
a failure until it has used up `max_dispatch_attempts` (5); then its run is one failed run.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

from choreography_ray.core.backoff import Backoff
from choreography_ray.scheduler.options import SchedulerOptions


@dataclass(frozen=True, slots=True)
class DispatchRetry:
    """A failed dispatch's fate: requeue after `delay`, or (None) its run failed."""

    delay: timedelta | None

    @property
    def gives_up(self) -> bool:
        return self.delay is None


def after_dispatch_failure(attempts: int, options: SchedulerOptions) -> DispatchRetry:
    """`attempts`: the dispatch attempts made so far, the failed one included."""
    if attempts >= options.max_dispatch_attempts:
        return DispatchRetry(None)
    backoff = Backoff.of(options.dispatch_retry_delay, options.max_dispatch_retry_delay)
    return DispatchRetry(timedelta(seconds=backoff.delay(attempts)))
